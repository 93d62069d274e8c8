"""Two colleagues, two independent stores: alice shares, bob reproduces with nothing but the
receipt id and the remote (or bundle)."""

from __future__ import annotations

import json

import pytest

from ledger.errors import Refused, UnknownRef
from ledger.sharing import bundle, fetch, keys, push
from ledger.sharing import remote as rm
from ledger.store import Store
from tests.conftest import ledger_cmd

from .conftest import assert_clean


def test_receipt_closure_by_id_from_a_remote_and_a_bundle(alice, bob, tmp_path):
    """bob asks for a receipt id alone; its whole closure arrives, verified, one record."""
    h = alice.history
    root = tmp_path / "shared"
    push.push(alice, rm.DirBackend(root), [h["receipt"]])
    res = fetch.fetch_closure(bob, str(root), [h["receipt"]])
    assert res.complete and res.fetched_objects >= 4
    b = Store.open(bob.root)
    for k in ("base", "data", "adapter", "receipt"):
        assert b.get_bytes(h[k]) == alice.get_bytes(h[k])
    assert_clean(bob.root)
    # nothing more to do the second time
    again = fetch.fetch_closure(b, str(root), [h["receipt"]])
    assert again.fetched_objects == 0 and again.record is None
    # the same from a bundle, into a third store
    out = tmp_path / "r.bundle"
    bundle.create(alice, [h["receipt"]], out, origin="alice")
    carol = Store.init(tmp_path / "carol")
    res = fetch.fetch_closure(carol, str(out), [h["receipt"]])
    assert res.complete and res.imports[0].namespace == "alice"
    assert_clean(carol.root)


def test_walk_for_an_id_no_push_named(alice, bob, tmp_path):
    """A receipt that reached the remote inside someone else's closure (pushed as part of
    HEAD) is found by walking objects; a store that requires signatures refuses the walk."""
    h = alice.history
    root = tmp_path / "shared"
    push.push(alice, rm.DirBackend(root), ["HEAD"])
    strict = Store.init(tmp_path / "strict")
    keys.set_signatures_required(strict, True)
    # HEAD's ref names the generation, not the receipt: no signed manifest names the receipt
    with pytest.raises(Refused):
        fetch.fetch_closure(Store.open(strict.root), str(root), [h["receipt"]])
    res = fetch.fetch_closure(bob, str(root), [h["receipt"]])
    assert res.complete and res.record and not res.imports
    assert Store.open(bob.root).journal.records()[-1]["payload"]["walked"] == res.fetched_objects
    assert_clean(bob.root)
    with pytest.raises(UnknownRef):
        fetch.fetch_closure(Store.open(bob.root), str(root), ["b3:" + "ab" * 32])


def test_two_colleagues_through_the_cli_with_signatures(alice, bob, tmp_path, cli):
    """alice: key, remote, signed push. bob: trust, require signatures, pull, fetch by id."""
    h = alice.history
    run = cli

    shared = tmp_path / "shared"
    assert run(alice, "key", "create", "alice").returncode == 0
    assert run(alice, "key", "export", "alice", "-o", tmp_path / "alice.pub").returncode == 0
    assert run(alice, "remote", "add", "team", shared).returncode == 0
    p = run(alice, "push", "team", "HEAD", h["receipt"], "--sign", "alice", "--json")
    assert p.returncode == 0, p.stderr
    assert json.loads(p.stdout)["signed_by"] == "alice"
    assert run(bob, "remote", "add", "alice", shared).returncode == 0
    assert run(bob, "key", "require", "on").returncode == 0
    p = run(bob, "pull", "alice", "--json")
    assert p.returncode == 3, "untrusted signer refused"
    assert run(bob, "key", "trust", tmp_path / "alice.pub").returncode == 0
    p = run(bob, "fetch", "alice", h["receipt"], "--json")
    assert p.returncode == 0, p.stderr
    res = json.loads(p.stdout)
    assert res["complete"] and res["imports"][0]["signers"][0]["trusted"]
    p = run(bob, "pull", "alice", "HEAD", "--json")
    assert p.returncode == 0, p.stderr
    assert json.loads(p.stdout)[0]["refs"] == {"alice/HEAD": h["gen"]}
    p = run(bob, "verify", "--read-data", "--json")
    assert p.returncode == 0, p.stdout


TINY = """
[data]
steps = 4
micro_batch = 4
[train]
checkpoint_every = 2
"""


@pytest.mark.slow
def test_two_colleagues_reproduce_a_real_training_run(tmp_path):
    """alice compiles and trains the tiny model, pushes the receipt to a directory remote;
    bob, in an independent store with nothing else, runs `ledger reproduce RECEIPT --from
    REMOTE` and gets Reproduced (bit-exact)."""
    pytest.importorskip("torch")
    from ledger.plan import compile as comp
    from ledger.plan import spec, targets
    from ledger.train import run as trainlib

    alice = Store.init(tmp_path / "alice")
    plan = comp.compile_spec(alice, spec.parse(TINY), targets.get("cpu")).plan
    trained = trainlib.train(alice, plan.id)
    receipt = trained.receipt_id
    rm.add(Store.open(alice.root), "team", str(tmp_path / "shared"))
    p = ledger_cmd("--store", alice.root, "push", "team", receipt, "--json")
    assert p.returncode == 0, p.stderr

    bob = Store.init(tmp_path / "bob")
    assert not bob.has(receipt)
    p = ledger_cmd("--store", bob.root, "reproduce", receipt, "--from", tmp_path / "shared", "--json")
    assert p.returncode == 0, p.stderr
    out = json.loads(p.stdout)
    assert out["outcome"] == "Reproduced", out
    b = Store.open(bob.root)
    cmp = b.get_json(out["comparison"])
    assert cmp["receipt"] == receipt and cmp["outcome"] == "Reproduced"
    # bob's re-run is his own receipt; its adapter bytes are alice's
    assert b.get_json(out["rerun_receipt"])["adapter"] == alice.get_json(receipt)["adapter"]
    # what bob fetched is one verified import; his store is exactly as complete as alice's
    kinds = [r["kind"] for r in b.journal.records()]
    assert kinds.count("import") == 1 and kinds[-1] == "reproduce"
