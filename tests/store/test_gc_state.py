"""Rule 22 (docs/store-format.md): gc's saved reach state. gc folds only the records after it and
opens only the objects they reach first; a state that is not this store's, not this journal's,
rewritten by anything but gc, or damaged is not used (gc says why and walks everything), so a
forged state can never make gc delete a live object."""

from __future__ import annotations

import json
import os
import types

import numpy as np

from ledger.store import Store, canonical, gc, gcstate, reach
from ledger.store.ids import hash_bytes


def _put_loose(s: Store, data: bytes) -> str:
    """An object stored without any record naming it (what a tree's children are)."""
    oid, _ = s.objects.put_bytes(data)
    return oid


def _tree_store(tmp_path):
    """A record names `top` only; `top` names `mid`, which names `leaf`: two of the three are
    reachable only through the objects' contents."""
    s = Store.init(tmp_path)
    leaf = _put_loose(s, b"leaf bytes")
    mid = _put_loose(s, canonical.dumps({"kind": "x", "child": leaf}))
    top = _put_loose(s, canonical.dumps({"kind": "y", "nested": [{"m": mid}]}))
    with s.transaction("t") as tx:
        tx.payload["tree"] = top
    return s, (top, mid, leaf)


def _forget(s: Store) -> None:
    for name in gcstate.STATE, gcstate.SEAL:
        s.root.joinpath(*name).unlink(missing_ok=True)


def _cold(s: Store) -> gc.GcPlan:
    _forget(s)
    return gc.plan(Store.open(s.root))


def _counting(monkeypatch) -> list:
    opened = []
    real = reach.classify

    def counted(store, oid):
        opened.append(oid)
        return real(store, oid)

    monkeypatch.setattr(reach, "classify", counted)
    return opened


def test_gc_from_its_state_reads_only_new_records_and_equals_a_full_walk(tmp_path, monkeypatch):
    s, (top, mid, leaf) = _tree_store(tmp_path)
    assert gc.plan(s).unreachable == ()
    assert s.root.joinpath(*gcstate.STATE).exists() and s.root.joinpath(*gcstate.SEAL).exists()
    # new history: a record naming a new tree, and an object nothing names
    child = _put_loose(s, b"new child")
    parent = _put_loose(s, canonical.dumps({"kind": "z", "c": child}))
    junk = _put_loose(s, b"nobody names me")
    with s.transaction("t") as tx:
        tx.payload["tree"] = parent
    opened = _counting(monkeypatch)
    s2 = Store.open(s.root)
    warm = gc.plan(s2)
    assert not s2.warnings
    assert sorted(opened) == sorted([parent, child])     # the old tree was not opened again
    assert [o for o, _ in warm.unreachable] == [junk]
    monkeypatch.undo()
    cold = _cold(s)
    assert cold == warm


def test_gc_with_nothing_new_opens_nothing(tmp_path, monkeypatch):
    s, _ = _tree_store(tmp_path)
    gc.plan(s)
    opened = _counting(monkeypatch)
    assert gc.plan(Store.open(s.root)).unreachable == ()
    assert opened == []


def _forge_state_without(s: Store, oid: str) -> None:
    """Rewrite reach.bin as a forger would: drop `oid`'s key (a state claiming its parent has no
    children), with a correct digest, leaving the seal as gc wrote it."""
    path = s.root.joinpath(*gcstate.STATE)
    data = path.read_bytes()
    nl = data.index(b"\n")
    h = json.loads(data[:nl])
    keys = np.frombuffer(data[nl + 1:], dtype="<u8")
    a, b = h["counts"][0], h["counts"][0] + h["counts"][1]
    reach_keys = keys[:a][keys[:a] != np.uint64(reach.key(oid))]
    arrays = reach_keys.tobytes() + keys[a:b].tobytes() + keys[b:].tobytes()
    h["counts"][0] = len(reach_keys)
    h["digest"] = gcstate._digest(h, arrays)
    tmp = path.with_name("forged")
    tmp.write_bytes(canonical.dumps(h) + b"\n" + arrays)
    os.replace(tmp, path)
    seal = json.loads(s.root.joinpath(*gcstate.SEAL).read_bytes())
    seal["digest"] = h["digest"]   # the forger updates the digest it can see, not the file's identity
    s.root.joinpath(*gcstate.SEAL).write_bytes(canonical.dumps(seal))


def test_a_forged_state_claiming_an_object_has_no_children_is_detected_and_deletes_nothing(tmp_path):
    s, (top, mid, leaf) = _tree_store(tmp_path)
    gc.plan(s)
    _forge_state_without(s, leaf)
    s2 = Store.open(s.root)
    done = gc.prune(s2)
    assert done.unreachable == ()
    assert any("reach state was not used" in w and "rewritten" in w for w in s2.warnings)
    assert all(s.has(o) for o in (top, mid, leaf))


def test_a_state_without_its_seal_or_damaged_is_not_used(tmp_path):
    s, (top, mid, leaf) = _tree_store(tmp_path)
    gc.plan(s)
    s.root.joinpath(*gcstate.SEAL).unlink()
    s2 = Store.open(s.root)
    assert gc.plan(s2).unreachable == ()
    assert any("seal is missing" in w for w in s2.warnings)
    # damaged in place: the seal's identity no longer names the file
    path = s.root.joinpath(*gcstate.STATE)
    data = bytearray(path.read_bytes())
    data[-1] ^= 0xFF
    path.write_bytes(bytes(data))
    s3 = Store.open(s.root)
    assert gc.prune(s3).unreachable == ()
    assert any("reach state was not used" in w for w in s3.warnings)
    assert all(s.has(o) for o in (top, mid, leaf))


def test_a_state_of_another_store_is_not_used(tmp_path):
    a, _ = _tree_store(tmp_path / "a")
    b, (top, mid, leaf) = _tree_store(tmp_path / "b")
    gc.plan(a)
    for name in gcstate.STATE, gcstate.SEAL:   # moved over whole: its ctime changes, the seal names another file
        os.replace(a.root.joinpath(*name), b.root.joinpath(*name))
    s2 = Store.open(b.root)
    assert gc.prune(s2).unreachable == ()
    assert any("reach state was not used" in w for w in s2.warnings)
    # sealed in place as gc would, but for another store's id (empty: it reaches nothing)
    other = types.SimpleNamespace(root=b.root, tmp=b.tmp, store_id="store-" + "0" * 32)
    empty = np.empty(0, dtype=np.uint64)
    assert gcstate.save(other, Store.open(b.root).state, os.path.getsize(b.journal.path), empty, empty, empty,
                        (), ()) is None
    s3 = Store.open(b.root)
    assert gc.prune(s3).unreachable == ()
    assert any("another store" in w for w in s3.warnings)
    assert all(b.has(o) for o in (top, mid, leaf))


def test_a_state_of_another_history_is_not_used(tmp_path):
    s, (top, mid, leaf) = _tree_store(tmp_path)
    with s.transaction("t") as tx:
        tx.payload["n"] = 1
    gc.plan(s)
    # the journal rewritten: its last record replaced by another of the same seq
    lines = s.journal.path.read_bytes().splitlines(keepends=True)
    last = json.loads(lines[-1])
    last["payload"] = {"n": 2}
    last["time"] = "2026-01-01T00:00:00.000000Z"
    body = {k: last[k] for k in ("seq", "prev", "time", "kind", "inputs", "outputs", "actor", "payload")}
    last["id"] = hash_bytes(canonical.dumps(body))
    s.journal.path.write_bytes(b"".join(lines[:-1]) + canonical.dumps(last) + b"\n")
    s2 = Store.open(s.root)
    assert gc.plan(s2).unreachable == ()
    assert any("no longer holds its record" in w or "changed since its last commit" in w for w in s2.warnings)


def test_an_object_missing_when_reached_has_its_children_followed_once_it_arrives(tmp_path):
    s = Store.init(tmp_path)
    child = _put_loose(s, b"child bytes")
    parent_bytes = canonical.dumps({"kind": "x", "child": child})
    parent = hash_bytes(parent_bytes)
    with s.transaction("t") as tx:
        tx.payload["p"] = parent        # named before it is stored (a pull still to come)
    assert [o for o, _ in gc.plan(s).unreachable] == [child]
    _put_loose(s, parent_bytes)         # it arrives
    assert gc.plan(Store.open(s.root)).unreachable == ()   # the saved state looked at it again


def test_a_damaged_object_is_not_taken_as_a_leaf(tmp_path):
    """Children come only from bytes that hash to the id: a damaged copy (here: its bytes
    replaced by a leaf's) is unresolved, looked at again after its repair."""
    s, (top, mid, leaf) = _tree_store(tmp_path)
    path = s.objects.path(mid)
    os.chmod(path, 0o644)
    path.write_bytes(b"no ids in here")
    p = gc.plan(Store.open(s.root))
    assert [o for o, _ in p.unreachable] == [leaf]        # today's truth: nothing names it
    s.objects.replace_damaged(mid, canonical.dumps({"kind": "x", "child": leaf}))
    assert gc.plan(Store.open(s.root)).unreachable == ()  # the repaired object's child is followed
