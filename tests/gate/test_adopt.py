"""`ledger adopt`: a colleague's imported generation made live here, judged by the local gate."""

import json

import pytest

from ledger import adopt as adoptlib
from ledger import generations
from ledger.errors import BadInput, MissingObject, Refused
from ledger.store import Store
from tests.conftest import ledger_cmd


def _commit(store, adapter, base, note):
    with store.transaction("commit") as tx:
        generations.new_generation(tx, store, note=note, base=base, adapter=adapter)


def _colleague(world, tmp_path, adapter, name):
    """A colleague's store (a copy of the world) with `adapter` committed, pushed to a folder remote."""
    alice = Store.open(world.copy_to(tmp_path / name))
    _commit(alice, adapter, world.base, f"{name}'s model")
    remote = tmp_path / f"{name}-remote"
    for args in (("remote", "add", "team", remote), ("push", "team", "HEAD")):
        p = ledger_cmd("--store", alice.root, *args)
        assert p.returncode == 0, p.stderr
    return remote


def _pull(bob, remote):
    for args in (("remote", "add", "team", remote), ("pull", "team", "HEAD")):
        p = ledger_cmd("--store", bob.root, *args)
        assert p.returncode == 0, p.stderr


@pytest.mark.slow
def test_an_imported_generation_is_judged_and_adopted(world, wstore, tmp_path):
    _pull(wstore, _colleague(world, tmp_path, world.A, "alice"))
    assert "HEAD" not in wstore.state.refs
    res = adoptlib.adopt(Store.open(wstore.root), "team/HEAD")
    s = Store.open(wstore.root)
    head = generations.head(s)
    assert res.generation == head.name and res.forced is False and res.verdict
    assert head.adapter == world.A and head.base == world.base and head.note.startswith("adopted team/HEAD")
    assert s.get_json(res.verdict)["verdict"] == "Accept"
    kinds = [r["kind"] for r in s.journal.scan().records]
    assert kinds[-2:] == ["judge", "adopt"]
    p = ledger_cmd("--store", s.root, "verify", "--json")
    assert p.returncode == 0, p.stdout


@pytest.mark.slow
def test_a_gamed_import_is_refused_and_force_is_recorded(world, wstore, tmp_path):
    # G is gamed against A, the adapter it was fine-tuned from (tests/gate/test_judge.py): its
    # canaries get worse than A's. Against the bare base A's gain can carry G's canaries to
    # better than the base's (on a fresh machine, 2026-12-01, that verdict was Accept: 10/10
    # scored documents improved, the canaries not worse enough), so the local HEAD is A's
    # generation, as for a team that adopted A already.
    _commit(wstore, world.A, world.base, "bob's model")
    _pull(wstore, _colleague(world, tmp_path, world.G, "mallory"))
    before = Store.open(wstore.root).state.refs.get("HEAD")
    with pytest.raises(Refused, match="GamedTheEvaluator"):
        adoptlib.adopt(Store.open(wstore.root), "team/HEAD")
    s = Store.open(wstore.root)
    assert s.state.refs.get("HEAD") == before  # nothing made live
    assert [r["kind"] for r in s.journal.scan().records][-1] == "judge"  # the refusal is kept
    with pytest.raises(BadInput, match="reason"):
        adoptlib.adopt(s, "team/HEAD", force=True)
    res = adoptlib.adopt(s, "team/HEAD", force=True, reason="inspected by hand")
    rec = Store.open(wstore.root).journal.tail(1)[0]
    assert rec["kind"] == "adopt" and rec["payload"]["forced"] is True
    assert rec["payload"]["reason"] == "inspected by hand" and res.verdict is None


def test_adopt_refuses_what_is_not_an_imported_model(store):
    with pytest.raises(BadInput):
        adoptlib.adopt(store, "nothing/HEAD")
    oid = None
    with store.transaction("add") as tx:
        oid = tx.put_json({"kind": "generation", "n": 3, "parent": None, "base": "b3:" + "ab" * 32,
                           "adapter": None, "capabilities": {}, "kernels": {}, "receipt": None, "verdict": None,
                           "note": ""})
        tx.outputs.append(oid)
        tx.payload["name"] = "team/gen-3"
    with pytest.raises(MissingObject, match="its model is not"):
        adoptlib.adopt(store, oid)
    assert [r["kind"] for r in store.journal.scan().records] == ["init", "add"]
    json.dumps(store.state.refs)  # the state still folds
