"""Repair: a verified copy of a missing or damaged object replaces it atomically — by
`ledger repair --from SOURCE` (a directory remote, an S3 remote on loopback, a bundle), and
by pull, bundle import and fetch, which say so. What cannot be repaired is reported (exit 4)."""

from __future__ import annotations

import json
import os
import shutil

from ledger.sharing import bundle, fetch, push
from ledger.sharing import remote as rm
from ledger.sharing.admit import held_state
from ledger.store import Store
from ledger.store.verify import verify
from tests.conftest import ledger_cmd

from .conftest import assert_clean


def _corrupt(store, oid) -> bytes:
    """Flip one byte in place (same size, so only a rehash can tell)."""
    p = store.object_path(oid)
    os.chmod(p, 0o644)
    data = bytearray(p.read_bytes())
    data[len(data) // 2] ^= 0x01
    p.write_bytes(bytes(data))
    return bytes(data)


def damage(store, h) -> set[str]:
    """Three kinds of damage: wrong bytes, a missing file, and a FIFO where a file was."""
    _corrupt(store, h["base"])
    store.object_path(h["adapter"]).unlink()
    p = store.object_path(h["data"])
    p.unlink()
    os.mkfifo(p)
    return {h["base"], h["adapter"], h["data"]}


def _assert_repaired(bob_root, alice, h, damaged, out) -> None:
    assert out["ok"] is True and sorted(out["repaired"]) == sorted(damaged), out
    b = Store.open(bob_root)
    for k in ("base", "data", "adapter", "receipt", "gen"):
        assert b.get_bytes(h[k]) == alice.get_bytes(h[k])
    rec = b.journal.records()[-1]
    assert rec["kind"] == "repair" and sorted(rec["payload"]["repaired"]) == sorted(damaged)
    assert_clean(bob_root)


def test_repair_from_a_directory_remote(alice, bob, tmp_path):
    h = alice.history
    remote = tmp_path / "remote"
    push.push(alice, rm.DirBackend(remote), ["HEAD"])
    fetch.pull(bob, rm.DirBackend(remote), namespace="alice")
    damaged = damage(bob, h)
    v = ledger_cmd("--store", bob.root, "verify", "--read-data")
    assert v.returncode == 4 and "ledger repair --from" in v.stderr, v.stderr   # verify names the cure
    ledger_cmd("--store", bob.root, "remote", "add", "team", remote, check=True)
    r = ledger_cmd("--store", bob.root, "repair", "--from", "team", "--json")
    assert r.returncode == 0, r.stderr
    _assert_repaired(bob.root, alice, h, damaged, json.loads(r.stdout))
    again = ledger_cmd("--store", bob.root, "repair", "--from", "team", "--json")   # nothing left to do
    assert again.returncode == 0 and json.loads(again.stdout)["repaired"] == []


def test_repair_from_an_s3_remote_on_loopback(alice, bob, s3_server, s3_bucket):
    bucket, _ = s3_bucket
    url = f"s3://{bucket}/team"
    push.push(alice, rm.open_backend(url, {"endpoint_url": s3_server}), ["HEAD"])
    fetch.pull(bob, rm.open_backend(url, {"endpoint_url": s3_server}), namespace="alice")
    damaged = damage(bob, alice.history)
    ledger_cmd("--store", bob.root, "remote", "add", "s3team", url, "--endpoint-url", s3_server, check=True)
    r = ledger_cmd("--store", bob.root, "repair", "--from", "s3team", "--json")
    assert r.returncode == 0, r.stderr
    _assert_repaired(bob.root, alice, alice.history, damaged, json.loads(r.stdout))


def test_repair_from_a_bundle(alice, bob, tmp_path):
    h = alice.history
    out = tmp_path / "g.bundle"
    bundle.create(alice, ["HEAD"], out)
    bundle.import_bundle(bob, out, namespace="alice")
    damaged = damage(bob, h)
    r = ledger_cmd("--store", bob.root, "repair", "--from", out, "--json")
    assert r.returncode == 0, r.stderr
    _assert_repaired(bob.root, alice, h, damaged, json.loads(r.stdout))


def test_what_the_source_lacks_or_offers_wrong_is_reported_and_left_alone(alice, bob, tmp_path):
    """Exit 4 while damage remains: an object the source does not hold is named; a copy that
    does not hash to its id is refused, and the damaged file is not replaced by it."""
    h = alice.history
    remote = tmp_path / "remote"
    push.push(alice, rm.DirBackend(remote), ["HEAD"])
    fetch.pull(bob, rm.DirBackend(remote), namespace="alice")
    with bob.transaction("add") as tx:   # bob's own object, which alice's remote never had
        mine = tx.put_bytes(b"only bob has this")
        tx.outputs.append(mine)
        tx.refs["name/mine"] = mine
        tx.payload.update({"path": "mine.txt", "kind": "file", "size": 17})
    bob.object_path(mine).unlink()
    bad_local = _corrupt(bob, h["base"])
    remote_copy = remote / rm.object_key(h["base"])   # the remote's copy is damaged too
    os.chmod(remote_copy, 0o644)
    data = bytearray(remote_copy.read_bytes())
    data[0] ^= 0xFF
    remote_copy.write_bytes(bytes(data))
    bob.object_path(h["adapter"]).unlink()             # and this one it can repair
    r = ledger_cmd("--store", bob.root, "repair", "--from", remote, "--json")
    assert r.returncode == 4, (r.stdout, r.stderr)
    out = json.loads(r.stdout)
    assert out["repaired"] == [h["adapter"]] and out["not_held"] == [mine]
    assert [x["id"] for x in out["refused"]] == [h["base"]]
    assert {e.get("id") for e in out["remaining"]} == {mine, h["base"]}
    assert "2 fault(s) remain" in r.stderr and "repair again from another remote" in r.stderr
    assert bob.object_path(h["base"]).read_bytes() == bad_local   # not replaced by the bad copy
    assert Store.open(bob.root).get_bytes(h["adapter"]) == alice.get_bytes(h["adapter"])


def test_pull_replaces_a_damaged_object_and_says_so(alice, bob, tmp_path):
    h = alice.history
    be = rm.DirBackend(tmp_path / "remote")
    push.push(alice, be, ["HEAD"])
    fetch.pull(bob, be, namespace="alice")
    _corrupt(bob, h["base"])
    (res,) = fetch.pull(Store.open(bob.root), be, namespace="alice")
    assert res.repaired == (h["base"],)
    assert Store.open(bob.root).journal.records()[-1]["payload"]["repaired"] == [h["base"]]
    assert_clean(bob.root)


def test_bundle_import_replaces_a_damaged_object_and_says_so(alice, bob, tmp_path):
    h = alice.history
    out = tmp_path / "g.bundle"
    bundle.create(alice, ["HEAD"], out)
    bundle.import_bundle(bob, out, namespace="alice")
    p = bob.object_path(h["receipt"])
    p.unlink()
    p.mkdir()   # a directory where the receipt was
    r = ledger_cmd("--store", bob.root, "bundle", "import", out, "--as", "alice")
    assert r.returncode == 0, r.stderr
    assert "repaired 1 damaged object(s)" in r.stdout
    assert Store.open(bob.root).get_bytes(h["receipt"]) == alice.get_bytes(h["receipt"])
    assert_clean(bob.root)


def test_fetch_replaces_damaged_objects_in_the_closure(alice, bob, tmp_path):
    h = alice.history
    remote = tmp_path / "remote"
    push.push(alice, rm.DirBackend(remote), [h["receipt"]])
    fetch.fetch_closure(bob, str(remote), [h["receipt"]])
    _corrupt(bob, h["base"])
    res = fetch.fetch_closure(Store.open(bob.root), str(remote), [h["receipt"]])
    assert h["base"] in res.repaired and res.complete
    assert_clean(bob.root)


def test_a_repair_killed_at_any_point_leaves_no_half_object_and_a_rerun_finishes(alice, bob, tmp_path):
    """SIGKILL at every fault point a repair passes: afterwards each damaged object is either
    still as damaged as before or intact (never half-written), nothing else got worse, and
    `ledger repair` run again ends clean."""
    h = alice.history
    remote = tmp_path / "remote"
    push.push(alice, rm.DirBackend(remote), ["HEAD"])
    fetch.pull(bob, rm.DirBackend(remote), namespace="alice")
    _corrupt(bob, h["base"])
    bob.object_path(h["adapter"]).unlink()
    p = bob.object_path(h["receipt"])
    p.unlink()
    p.mkdir()
    damaged = {h["base"], h["adapter"], h["receipt"]}
    template = tmp_path / "template"
    shutil.copytree(bob.root.parent, template, symlinks=True)
    trace = tmp_path / "trace"
    ledger_cmd("--store", bob.root, "repair", "--from", remote, "--jobs", "1", env={"LEDGER_FAULT_TRACE": str(trace)},
               check=True)
    points = trace.read_text().splitlines()
    assert any("repair.installed" in x for x in points) and any("tx.committed" in x for x in points), points
    for n in range(1, len(points) + 1):
        work = tmp_path / f"run{n}"
        shutil.copytree(template, work, symlinks=True)
        root = work / ".ledger"
        r = ledger_cmd("--store", root, "repair", "--from", remote, "--jobs", "1", env={"LEDGER_FAULT_AT": str(n)})
        assert r.returncode == -9, (n, points[n - 1], r.stdout, r.stderr)
        s = Store.open(root)
        for oid in damaged:   # each either untouched-damaged or a whole, intact object
            if s.objects.intact(oid):
                continue
            assert held_state(s, oid) in ("missing", "damaged")
        faults = {e.get("id") for e in verify(s, read_data=True).errors}
        assert faults <= damaged, (n, points[n - 1], faults)
        again = ledger_cmd("--store", root, "repair", "--from", remote, "--json")
        assert again.returncode == 0, (n, points[n - 1], again.stderr)
        assert_clean(root)
