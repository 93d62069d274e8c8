"""Directory remotes: round trip, only-missing transfers, interrupted push/pull resumed,
verify-on-arrival, and refusal of damaged or foreign remotes."""

from __future__ import annotations

from pathlib import Path

import pytest

from ledger import generations
from ledger.errors import CorruptObject, StoreCorrupt, UnknownRef, UnsupportedFormat
from ledger.sharing import fetch, push, sources
from ledger.sharing import remote as rm
from ledger.store import Store, canonical
from ledger.store.objects import hash_file
from tests.conftest import ledger_cmd

from .conftest import assert_clean, snapshot


def remote_objects(root: Path) -> dict[str, Path]:
    out = {}
    for p in (root / "objects").rglob("*"):
        if p.is_file():
            out["b3:" + p.parent.name + p.name] = p
    return out


def test_push_pull_round_trip(alice, bob, tmp_path):
    h = alice.history
    be = rm.DirBackend(tmp_path / "remote")
    res = push.push(alice, be, ["HEAD", h["gen_name"]])
    assert res.objects_sent == res.objects_total and not res.up_to_date
    objs = remote_objects(tmp_path / "remote")
    assert all(hash_file(p) == oid for oid, p in objs.items())
    assert set(objs) >= {h[k] for k in ("base", "data", "adapter", "receipt", "gen")}
    assert sorted(sources.remote_refs(be)) == ["HEAD", h["gen_name"]]
    head_before = bob.state.refs.get("HEAD")
    out = fetch.pull(bob, be, namespace="alice")
    assert len(out) == 1 and out[0].objects_new == res.objects_total
    bob = Store.open(bob.root)
    assert bob.state.refs.get("HEAD") == head_before
    assert bob.state.refs["alice/HEAD"] == h["gen"] and bob.state.refs[f"alice/{h['gen_name']}"] == h["gen"]
    assert bob.get_bytes(h["receipt"]) == alice.get_bytes(h["receipt"])
    assert_clean(bob.root)
    # pulling again moves nothing
    again = fetch.pull(bob, be, ["HEAD"], namespace="alice")
    assert again[0].objects_new == 0


def test_repush_of_an_up_to_date_store_moves_nothing(alice, tmp_path):
    be = rm.DirBackend(tmp_path / "remote")
    first = push.push(alice, be, ["HEAD"])
    mtimes = {k: p.stat().st_mtime_ns for k, p in remote_objects(tmp_path / "remote").items()}
    second = push.push(alice, be, ["HEAD"])
    assert second.up_to_date and second.objects_sent == 0 and second.bytes_sent == 0
    assert second.manifest == first.manifest
    assert {k: p.stat().st_mtime_ns for k, p in remote_objects(tmp_path / "remote").items()} == mtimes


def test_full_push_repairs_a_remote_that_lost_an_object(alice, bob, tmp_path):
    """The quick up-to-date check trusts the remote invariant; --full re-checks every object."""
    be = rm.DirBackend(tmp_path / "remote")
    push.push(alice, be, ["HEAD"])
    lost = remote_objects(tmp_path / "remote")[alice.history["data"]]
    lost.unlink()
    assert push.push(alice, be, ["HEAD"]).up_to_date
    with pytest.raises(StoreCorrupt, match="lacks") as ei:
        fetch.pull(bob, be, namespace="alice")
    assert "--full" in ei.value.hint
    res = push.push(alice, be, ["HEAD"], full=True)
    assert not res.up_to_date and res.objects_sent == 1
    fetch.pull(Store.open(bob.root), be, namespace="alice")
    assert_clean(bob.root)


def test_only_missing_objects_move(alice, tmp_path):
    be = rm.DirBackend(tmp_path / "remote")
    push.push(alice, be, ["HEAD"])
    before = set(remote_objects(tmp_path / "remote"))
    h = alice.history
    with alice.transaction("train") as tx:
        adapter = tx.put_bytes(b"a new adapter" * 1000)
        receipt = tx.put_json({"kind": "receipt", "base": h["base"], "dataset": h["data"], "adapter": adapter})
        tx.outputs.extend([adapter, receipt])
        tx.payload.update({"receipt": receipt, "adapter": adapter, "rung": "Learned", "unsandboxed": False,
                           "wall_s": 1.0})
    with alice.transaction("genesis") as tx:
        generations.new_generation(tx, alice, adapter=adapter, receipt=receipt)
    res = push.push(alice, be, ["HEAD"])
    after = set(remote_objects(tmp_path / "remote"))
    # new: adapter, receipt, generation manifest, segment and manifest — never base or data
    assert res.objects_sent == len(after - before) - 1  # the manifest is not counted as content
    assert h["base"] in before and res.bytes_sent < alice.objects.size(h["base"])


def test_verify_on_arrival_refuses_a_corrupt_remote_object(alice, bob, tmp_path):
    be = rm.DirBackend(tmp_path / "remote")
    push.push(alice, be, ["HEAD"])
    p = remote_objects(tmp_path / "remote")[alice.history["adapter"]]
    p.chmod(0o644)
    data = bytearray(p.read_bytes())
    data[100] ^= 0xFF
    p.write_bytes(bytes(data))
    before = snapshot(bob.root)
    with pytest.raises(CorruptObject) as ei:
        fetch.pull(bob, be, namespace="alice")
    assert ei.value.exit_code == 4 and alice.history["adapter"] in ei.value.message
    after = snapshot(bob.root)
    assert after[:2] == before[:2], "no record may commit"
    assert alice.history["adapter"] not in after[2], "the corrupt object must not be installed"


def test_missing_remote_object_and_lying_ref_are_refused(alice, bob, tmp_path):
    be = rm.DirBackend(tmp_path / "remote")
    push.push(alice, be, ["HEAD"])
    ref = tmp_path / "remote" / "refs" / "HEAD"
    body = canonical.loads(ref.read_bytes())
    body["target"] = alice.history["base"]
    ref.write_bytes(canonical.dumps(body))
    with pytest.raises(StoreCorrupt, match="manifest says"):
        fetch.pull(bob, be, namespace="alice")
    body["target"] = alice.history["gen"]
    ref.write_bytes(canonical.dumps(body))
    remote_objects(tmp_path / "remote")[alice.history["data"]].unlink()
    head = Store.open(bob.root).state.head
    with pytest.raises(StoreCorrupt, match="lacks"):
        fetch.pull(bob, be, namespace="alice")
    assert Store.open(bob.root).state.head == head


def test_foreign_remote_is_refused(alice, bob, tmp_path):
    root = tmp_path / "remote"
    be = rm.DirBackend(root)
    push.push(alice, be, ["HEAD"])
    (root / rm.MARKER).write_bytes(canonical.dumps({"format": "ledger-remote", "version": 1, "algorithm": "sha256"}))
    with pytest.raises(UnsupportedFormat):
        fetch.pull(bob, be, namespace="alice")
    with pytest.raises(UnsupportedFormat):
        push.push(alice, be, ["HEAD"])
    with pytest.raises(UnknownRef):
        fetch.pull(bob, rm.DirBackend(tmp_path / "empty"), namespace="x")


def _cli_store(store):
    return ["--store", str(store.root)]


def _probe_points(store, tmp_path, monkeypatch) -> list[str]:
    """The fault points a push of HEAD passes, in order (--jobs 1, batches of 2 objects)."""
    from ledger.store import faults

    trace = tmp_path / "probe-trace"
    monkeypatch.setenv("LEDGER_FAULT_TRACE", str(trace))
    monkeypatch.setenv("LEDGER_SHARE_BATCH", "2")
    faults.reset()
    push.push(store, rm.DirBackend(tmp_path / "probe"), ["HEAD"], jobs=1)
    monkeypatch.delenv("LEDGER_FAULT_TRACE")
    faults.reset()
    return [line.split()[1] for line in trace.read_text().splitlines()]


BATCH2 = {"LEDGER_SHARE_BATCH": "2"}


def test_interrupted_push_resumes_and_sends_only_the_rest(alice, tmp_path, monkeypatch):
    points = _probe_points(alice, tmp_path, monkeypatch)
    # SIGKILL while the second batch is being staged: the first batch is durable and visible,
    # the object being staged sits in tmp/ under a temporary name, no manifest and no ref.
    first_batch = points.index("push.batch")
    n = points.index("remote.object-staged", first_batch) + 1
    root = tmp_path / "remote"
    ledger_cmd(*_cli_store(alice), "remote", "add", "origin", root, check=True)
    p = ledger_cmd(*_cli_store(alice), "push", "origin", "HEAD", "--jobs", "1", "--json",
                   env={"LEDGER_FAULT_AT": str(n), **BATCH2})
    assert p.returncode == -9, (p.returncode, p.stderr)
    got = remote_objects(root)
    assert 1 <= len(got) <= 2, got
    assert all(hash_file(path) == oid for oid, path in got.items()), "a killed push published a partial object"
    assert not (root / "refs").exists()
    assert len(list((root / "tmp").iterdir())) == 1, "the object being staged stays in tmp/, invisible"
    p = ledger_cmd(*_cli_store(alice), "push", "origin", "HEAD", "--json", check=True)
    import json

    res = json.loads(p.stdout)
    assert res["objects_sent"] == res["objects_total"] - len(got)
    assert not res["up_to_date"]
    # the resumed remote is complete: a fresh store pulls and verifies
    c = Store.init(tmp_path / "carol")
    fetch.pull(c, rm.DirBackend(root), namespace="alice")
    assert Store.open(c.root).state.refs["alice/HEAD"] == alice.history["gen"]
    assert_clean(c.root)


def test_killed_push_at_each_kind_of_point_resumes(alice, tmp_path, monkeypatch):
    """Kill the push at each kind of point (mid-batch, after a batch is installed, after the
    manifest, after the ref); each rerun sends exactly what is not visible yet and the
    remote ends whole."""
    points = _probe_points(alice, tmp_path, monkeypatch)
    kinds = ("remote.object-staged", "push.object", "remote.batch-installed", "push.batch", "push.manifest", "push.ref")
    chosen = sorted({points.index(k) + 1 for k in kinds} | {len(points) // 2})
    for n in chosen:
        root = tmp_path / f"remote{n}"
        rm.add(Store.open(alice.root), f"r{n}", str(root))
        p = ledger_cmd(*_cli_store(alice), "push", f"r{n}", "HEAD", "--jobs", "1", "--json",
                       env={"LEDGER_FAULT_AT": str(n), **BATCH2})
        assert p.returncode == -9, (n, p.stderr)
        visible = set(remote_objects(root))
        assert all(hash_file(path) == oid for oid, path in remote_objects(root).items())
        res = push.push(Store.open(alice.root), rm.DirBackend(root), ["HEAD"])
        if res.up_to_date:
            assert res.manifest in visible and points[n - 1] in ("push.manifest", "push.ref")
        else:
            assert res.objects_sent == res.objects_total - len(visible - {res.manifest}), points[n - 1]
        c = Store.init(tmp_path / f"c{n}")
        fetch.pull(c, rm.DirBackend(root), namespace="alice")
        assert Store.open(c.root).state.refs["alice/HEAD"] == alice.history["gen"]
        assert_clean(c.root)


def test_interrupted_pull_resumes(alice, bob, tmp_path):
    root = tmp_path / "remote"
    push.push(alice, rm.DirBackend(root), ["HEAD"])
    ledger_cmd(*_cli_store(bob), "remote", "add", "alice", root, check=True)
    head = Store.open(bob.root).state.head
    before = {oid for oid, _ in bob.objects.iter_ids()}
    # --jobs 1, batches of 2: pull.object, pull.object, pull.batch (installed) … the 6th point
    # is the second batch's installation
    p = ledger_cmd(*_cli_store(bob), "pull", "alice", "--jobs", "1", "--json",
                   env={"LEDGER_FAULT_AT": "6", **BATCH2})
    assert p.returncode == -9
    b = Store.open(bob.root)
    assert b.state.head == head, "nothing committed"
    have = {oid for oid, _ in b.objects.iter_ids()} - before
    assert len(have) == 4, "the two batches verified and installed before the kill stay"
    assert not list((bob.root / "tmp").iterdir())
    # the dead holder's lock is broken by the next writer; the rerun fetches only the rest
    p = ledger_cmd(*_cli_store(bob), "pull", "alice", "--json", check=True)
    import json

    res = json.loads(p.stdout)[0]
    assert res["objects_new"] == res["objects_total"] - len(have)
    assert Store.open(bob.root).state.refs["alice/HEAD"] == alice.history["gen"]
    assert_clean(bob.root)


def test_remote_config_is_journaled(bob, tmp_path):
    rm.add(bob, "origin", str(tmp_path / "r"))
    assert rm.configured(Store.open(bob.root))["origin"].url == str((tmp_path / "r").resolve())
    rec = Store.open(bob.root).journal.records()[-1]
    assert rec["kind"] == "remote" and "remote:origin" in rec["payload"]["refs"]
    from ledger.errors import BadInput

    with pytest.raises(BadInput):
        rm.add(Store.open(bob.root), "origin", "/elsewhere")
    with pytest.raises(BadInput):
        rm.add(Store.open(bob.root), "web", "ftp://example.invalid/x")  # https:// is a read-only remote now
    rm.remove(Store.open(bob.root), "origin")
    assert rm.configured(Store.open(bob.root)) == {}
    assert_clean(bob.root)
