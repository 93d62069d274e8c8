"""Sharing a store whose objects are packed (ledger/store/packed.py): after `gc --prune` a small
object has no file of its own under objects/, so every sharing path must read it through the
store (verified) as a sender, and count it as held as a receiver — or, when its packed copy is
damaged, replace it with a loose verified copy, which reads then prefer."""

from __future__ import annotations

import os
import random
import threading

import pytest

from ledger.errors import CorruptObject
from ledger.sharing import bundle, fetch, keys, push
from ledger.sharing import remote as rm
from ledger.sharing.admit import held_state
from ledger.store import Store, canonical, gc, packed
from ledger.store.objects import hash_file

from .conftest import assert_clean

N = 320   # more than packed.MIN_LOOSE: gc --prune packs them


def _pile(store: Store, tag: str = "pile", n: int = N) -> tuple[str, dict[str, bytes]]:
    """n small objects (every other one structured, stored compressed where that pays; the rest
    blobs), one structured object of 210 KB that compresses to a few, and an index naming them
    all, under the ref name/<tag>, in one recorded add."""
    assert n > packed.MIN_LOOSE
    rnd = random.Random(tag)
    contents: dict[str, bytes] = {}
    with store.transaction("add") as tx:
        ids = []
        for i in range(n):
            if i % 2:
                data = canonical.dumps({"kind": "note", "i": i, "tag": tag, "text": "word " * (i % 60)})
                oid = tx.put_bytes(data, "note", compressed=True)
            else:
                data = rnd.randbytes(100 + (i * 37) % 3000)
                oid = tx.put_bytes(data, "blob")
            contents[oid] = data
            ids.append(oid)
        # larger than a packed object can be stored whole, but compressed small enough to be packed
        data = canonical.dumps({"kind": "note", "tag": tag, "text": "the same words again " * 10_000})
        oid = tx.put_bytes(data, "note", compressed=True)
        contents[oid] = data
        ids.append(oid)
        index = canonical.dumps({"kind": "pile", "tag": tag, "items": ids})
        top = tx.put_bytes(index, "pile", compressed=True)
        contents[top] = index
        tx.outputs.append(top)
        tx.refs[f"name/{tag}"] = top
        tx.payload.update({"path": f"{tag}.json", "kind": "file", "size": len(index)})
    return top, contents


def _stored(store: Store, oid: str) -> int | None:
    """The size of an object's own file (whole or compressed), None if it has none."""
    for p in (store.object_path(oid), store.objects.zpath(oid)):
        if os.path.lexists(p):
            return os.lstat(p).st_size
    return None


def _prune(store: Store, contents: dict[str, bytes]) -> Store:
    """gc --prune: every object of `contents` small enough as stored moves into a pack and
    loses its own file (a receiver stores arrivals whole: there the 210 KB one stays loose)."""
    small = {oid for oid in contents if _stored(store, oid) <= packed.MAX_STORED}
    assert len(small) >= len(contents) - 1
    gc.prune(store)
    s = Store.open(store.root)
    assert list(s.objects.packed.dir.glob("*" + packed.SUFFIX))
    for oid in contents:
        assert (_stored(s, oid) is None) == (oid in small) == s.objects.packed_only(oid)
    return s


def _loose(store: Store) -> set[str]:
    """Every file under objects/ (what a receiver that holds everything must not add to)."""
    return {os.path.join(d, f) for d, _, fs in os.walk(store.objects.dir) for f in fs}


def _reads_back(store: Store, contents: dict[str, bytes]) -> None:
    s = Store.open(store.root)
    for oid, data in contents.items():
        assert s.objects.get_bytes(oid) == data
        assert s.objects.intact(oid)


def _damage(store: Store, oid: str) -> None:
    """Flip one byte of a packed object's stored bytes inside its pack (mode 0444: chmod first)."""
    pack, loc = store.objects._packed(oid)
    os.chmod(pack.path, 0o644)
    with open(pack.path, "r+b") as f:
        f.seek(loc.offset + loc.length // 2)
        b = f.read(1)
        f.seek(loc.offset + loc.length // 2)
        f.write(bytes([b[0] ^ 0x01]))
    os.chmod(pack.path, 0o444)


class Counting(rm.DirBackend):
    """A directory remote that counts the objects downloaded from it."""

    def __init__(self, root):
        super().__init__(root)
        self.downloads: list[str] = []
        self._count = threading.Lock()

    def get_object(self, oid, dest, on_bytes, *, expect=None, limit=0):
        with self._count:
            self.downloads.append(oid)
        return super().get_object(oid, dest, on_bytes, expect=expect, limit=limit)


@pytest.fixture
def sender(tmp_path):
    """alice: a pile of small objects, packed by gc --prune (both forms: whole and compressed)."""
    s = Store.init(tmp_path / "alice")
    top, contents = _pile(s)
    s = _prune(s, contents)
    forms = {s.objects._packed(oid)[1].form for oid in contents}
    assert forms == {packed.WHOLE, packed.COMPRESSED}
    assert max(s.objects.size(oid) for oid in contents) > packed.MAX_STORED
    return s, top, contents


def test_push_from_a_packed_store_and_pull_into_a_fresh_one(sender, tmp_path):
    alice, top, contents = sender
    remote = tmp_path / "remote"
    res = push.push(alice, rm.DirBackend(remote), ["pile"])
    assert res.objects_sent == res.objects_total == len(contents) + 1      # + the journal segment
    for oid in contents:                                                   # plain objects on the remote
        assert hash_file(remote / rm.object_key(oid)) == oid
    assert not list(alice.tmp.iterdir())                                   # the staging folder is gone
    bob = Store.init(tmp_path / "bob")
    fetch.pull(bob, rm.DirBackend(remote), ["pile"], namespace="alice")
    _reads_back(bob, contents)
    assert Store.open(bob.root).state.refs["alice/name/pile"] == top
    assert_clean(bob.root)
    again = push.push(alice, rm.DirBackend(remote), ["pile"], full=True)   # everything there: nothing moves
    assert again.objects_sent == 0


def test_push_to_s3_from_a_packed_store_and_pull_into_a_fresh_one(sender, tmp_path, s3_server, s3_bucket):
    alice, top, contents = sender
    bucket, fs = s3_bucket
    url = f"s3://{bucket}/packed"
    res = push.push(alice, rm.open_backend(url, {"endpoint_url": s3_server}), ["pile"])
    assert res.objects_sent == res.objects_total
    assert fs.cat_file(f"{bucket}/packed/{rm.object_key(top)}") == contents[top]
    bob = Store.init(tmp_path / "bob")
    fetch.pull(bob, rm.open_backend(url, {"endpoint_url": s3_server}), ["pile"], namespace="alice")
    _reads_back(bob, contents)
    assert_clean(bob.root)


def test_a_damaged_packed_object_is_never_published(sender, tmp_path):
    alice, top, contents = sender
    victim = next(o for o in contents if alice.objects._packed(o)[1].form == packed.COMPRESSED)
    _damage(alice, victim)
    remote = tmp_path / "remote"
    with pytest.raises(CorruptObject):
        push.push(Store.open(alice.root), rm.DirBackend(remote), ["pile"])
    assert not (remote / rm.object_key(victim)).exists()
    assert not (remote / "refs").exists() or not any((remote / "refs").rglob("*"))   # no ref names it


def test_bundle_from_a_packed_store_and_again_into_a_packed_receiver(sender, tmp_path):
    alice, top, contents = sender
    out = tmp_path / "pile.bundle"
    bundle.create(alice, ["pile"], out, origin="alice")
    bob = Store.init(tmp_path / "bob")
    first = bundle.import_bundle(bob, out)
    assert first.objects_new == len(contents) + 1
    _reads_back(bob, contents)
    assert_clean(bob.root)
    # bob packs what arrived (the journal segment too); the same bundle again is all held
    bob = _prune(Store.open(bob.root), contents)
    before = _loose(bob)
    again = bundle.import_bundle(bob, out, namespace="again")
    assert again.objects_new == 0 and again.repaired == ()
    assert _loose(bob) == before                                           # nothing written out again
    assert Store.open(bob.root).state.refs["again/name/pile"] == top
    _reads_back(bob, contents)


def test_a_since_bundle_into_a_receiver_that_holds_its_base_packed(sender, tmp_path):
    alice, top, contents = sender
    bob = Store.init(tmp_path / "bob")
    bundle.create(alice, ["pile"], tmp_path / "base.bundle", origin="alice")
    bundle.import_bundle(bob, tmp_path / "base.bundle")
    bob = _prune(Store.open(bob.root), contents)
    with alice.transaction("add") as tx:                  # new work naming the old, packed objects
        note = canonical.dumps({"kind": "more", "pile": top, "first": next(iter(contents))})
        more = tx.put_bytes(note, "more", compressed=True)
        tx.outputs.append(more)
        tx.refs["name/more"] = more
        tx.payload.update({"path": "more.json", "kind": "file", "size": len(note)})
    res = bundle.create(alice, ["more"], tmp_path / "more.bundle", origin="alice", since=["pile"])
    assert res.base == (top,) and res.data_bytes < 64 << 10       # the new object and the segment only
    before = _loose(bob)
    imp = bundle.import_bundle(bob, tmp_path / "more.bundle")
    assert imp.objects_new == 2                                     # `more` and the segment
    assert len(_loose(bob) - before) == 3                           # those two and the manifest: nothing old
    _reads_back(bob, {**contents, more: note})


def test_a_pull_into_a_receiver_that_holds_everything_packed_moves_nothing(sender, tmp_path):
    alice, top, contents = sender
    be = Counting(tmp_path / "remote")
    push.push(alice, be, ["pile"])
    bob = Store.init(tmp_path / "bob")
    fetch.pull(bob, be, ["pile"], namespace="alice")
    assert len(be.downloads) == len(contents) + 1
    bob = _prune(Store.open(bob.root), contents)
    for oid in contents:
        assert held_state(bob, oid) == "intact"
    before = _loose(bob)
    be.downloads.clear()
    again = fetch.pull(bob, be, ["pile"], namespace="alice")
    assert again[0].objects_new == 0 and again[0].repaired == ()
    assert be.downloads == [] and _loose(bob) == before
    walked = fetch.fetch_closure(Store.open(bob.root), fetch.RemoteSource(be), [top])
    assert walked.complete and walked.fetched_objects == 0 and be.downloads == []
    _reads_back(bob, contents)


def test_a_walk_follows_the_ids_inside_a_held_packed_object(tmp_path):
    """fetch_closure's loose walk looks inside the objects it already holds for the ids they name:
    a held object that is packed names a leaf the receiver lacks, which must be fetched."""
    alice = Store.init(tmp_path / "alice")
    with alice.transaction("add") as tx:
        leaf = tx.put_bytes(b"a leaf nobody else names " * 4, "blob")
        mid_bytes = canonical.dumps({"kind": "mid", "leaf": leaf})
        mid = tx.put_bytes(mid_bytes, "mid", compressed=True)
        top = tx.put_json({"kind": "top", "mid": mid})
        wrap = tx.put_json({"kind": "wrap", "top": top})      # the ref names this, not `top`
        tx.outputs.append(wrap)
        tx.refs["name/wrap"] = wrap
        tx.payload.update({"path": "wrap.json", "kind": "file", "size": 1})
    remote = tmp_path / "remote"
    push.push(alice, rm.DirBackend(remote), ["wrap"])
    bob = Store.init(tmp_path / "bob")
    _, contents = _pile(bob, "bobs")
    with bob.transaction("add") as tx:                        # bob holds `mid`, not its leaf
        assert tx.put_bytes(mid_bytes, "mid") == mid
        tx.payload.update({"path": "mid.json", "kind": "file", "size": len(mid_bytes)})
    bob = _prune(bob, {**contents, mid: mid_bytes})
    res = fetch.fetch_closure(bob, str(remote), [top])
    assert res.imports == () and res.record is not None       # no manifest names `top`: the walk
    bob = Store.open(bob.root)
    assert res.complete and bob.objects.has(leaf), res
    assert bob.get_bytes(leaf) == alice.get_bytes(leaf) and bob.get_bytes(top) == alice.get_bytes(top)
    assert bob.objects.packed_only(mid)                       # held: not fetched again


def test_a_pull_replaces_a_damaged_packed_copy_with_a_loose_verified_one(sender, tmp_path):
    alice, top, contents = sender
    be = rm.DirBackend(tmp_path / "remote")
    push.push(alice, be, ["pile"])
    bob = Store.init(tmp_path / "bob")
    fetch.pull(bob, be, ["pile"], namespace="alice")
    bob = _prune(Store.open(bob.root), contents)
    blob = next(o for o, d in contents.items() if not d.startswith(b"{"))
    note = next(o for o, d in contents.items() if d.startswith(b"{") and o != top)
    for oid in (blob, note):
        _damage(bob, oid)
    bob = Store.open(bob.root)
    for oid in (blob, note):
        assert not bob.objects.intact(oid) and held_state(bob, oid) == "damaged"
        with pytest.raises(CorruptObject):
            bob.objects.get_bytes(oid)
    imp = fetch.pull(bob, be, ["pile"], namespace="alice")[0]
    assert sorted(imp.repaired) == sorted([blob, note]) and imp.objects_new == 0
    bob = Store.open(bob.root)
    for oid in (blob, note):
        assert bob.object_path(oid).is_file()                  # a loose copy, which reads prefer
        assert bob.objects.get_bytes(oid) == contents[oid]
        assert held_state(bob, oid) == "intact"
    _reads_back(bob, contents)
    assert bob.journal.records()[-1]["payload"]["repaired"] == sorted([blob, note])


def test_fetch_replaces_a_damaged_packed_copy_without_a_signature(sender, tmp_path):
    """Replacing a damaged object needs no signature (its id is the check): a store that
    requires signatures must still see a damaged packed copy as damaged, not as missing."""
    alice, top, contents = sender
    remote = tmp_path / "remote"
    push.push(alice, rm.DirBackend(remote), ["pile"])
    bob = Store.init(tmp_path / "bob")
    fetch.pull(bob, rm.DirBackend(remote), ["pile"], namespace="alice")
    bob = _prune(Store.open(bob.root), contents)
    keys.set_signatures_required(bob, True)
    blob = next(o for o, d in contents.items() if not d.startswith(b"{"))
    _damage(bob, blob)
    bob = Store.open(bob.root)
    assert fetch.needs(bob, [blob]) == (set(), {blob})
    res = fetch.fetch_closure(bob, str(remote), [blob])
    assert res.repaired == (blob,) and res.complete and res.fetched_objects == 0
    bob = Store.open(bob.root)
    assert bob.object_path(blob).is_file() and bob.objects.get_bytes(blob) == contents[blob]
