"""Chunked objects (ledger/store/chunks.py) through bundles and remotes (docs/store-format.md,
C7–C9): a bundle carries the whole, verified object and the receiver writes only the chunks it
lacks; a remote holds a chunk list plus chunks, and push and pull move only the chunks the
other side lacks — counted here in bytes through an instrumented transport."""

from __future__ import annotations

import os
import threading

import pytest

from ledger.errors import CorruptObject, RemoteError
from ledger.sharing import bundle, chunked, fetch, push
from ledger.sharing import remote as rm
from ledger.store import Store, chunks

from .conftest import assert_clean, snapshot

BIG = chunks.THRESHOLD + (1 << 20)


def _add_big(store: Store, data: bytes, name: str) -> str:
    p = store.root.parent / name
    p.write_bytes(data)
    with store.transaction("add") as tx:
        oid = tx.put_file(p)
        tx.outputs.append(oid)
        tx.refs[f"name/{name}"] = oid
        tx.payload.update({"path": name, "kind": "file", "size": len(data), "name": name})
    return oid


def _chunks_written(store: Store) -> int:
    return store.objects.packs.chunks_written


def test_bundles_carry_chunked_objects_and_the_receiver_writes_only_missing_chunks(alice, bob, tmp_path):
    data = bytearray(os.urandom(BIG))
    v1 = _add_big(alice, bytes(data), "w1")
    assert alice.objects.chunked(v1)
    bundle.create(alice, ["w1"], tmp_path / "v1.bundle", origin="alice")
    bundle.import_bundle(bob, tmp_path / "v1.bundle")
    assert bob.objects.chunked(v1) and bob.get_bytes(v1) == bytes(data)
    first = _chunks_written(bob)
    assert first >= BIG // chunks.MAX_SIZE

    data[BIG // 2:BIG // 2 + 4096] = os.urandom(4096)     # a 4 KiB edit
    v2 = _add_big(alice, bytes(data), "w2")
    bundle.create(alice, ["w2"], tmp_path / "v2.bundle", origin="alice")
    imp = bundle.import_bundle(bob, tmp_path / "v2.bundle")
    assert imp.objects_new >= 1 and bob.get_bytes(v2) == bytes(data)
    new = _chunks_written(bob) - first
    assert new <= 6, new                                   # 1–2 chunks + 1–2 pages, not the whole file again
    assert_clean(bob.root)


def test_push_and_pull_of_a_chunked_object(alice, bob, tmp_path):
    data = os.urandom(BIG)
    v1 = _add_big(alice, data, "w1")
    be = rm.DirBackend(tmp_path / "remote")
    res = push.push(alice, be, ["w1"])
    assert res.objects_sent == res.objects_total
    assert not list(alice.tmp.iterdir())                   # the assembled copy was a work folder, gone
    fetch.pull(bob, be, ["w1"], namespace="alice")
    bob = Store.open(bob.root)
    assert bob.objects.chunked(v1) and bob.get_bytes(v1) == data
    assert_clean(bob.root)


class Counting(rm.DirBackend):
    """A directory remote that counts every byte that crosses it, both ways."""

    def __init__(self, root):
        super().__init__(root)
        self.up = self.down = 0
        self._count = threading.Lock()

    def _add(self, which: str, n: int) -> None:
        with self._count:
            setattr(self, which, getattr(self, which) + n)

    def put_object(self, oid, src, on_bytes):
        super().put_object(oid, src, lambda n: (self._add("up", n), on_bytes(n)))

    def write_small(self, key, data):
        self._add("up", len(data))
        super().write_small(key, data)

    def get_object(self, oid, dest, on_bytes, *, expect=None, limit=0):
        return super().get_object(oid, dest, lambda n: (self._add("down", n), on_bytes(n)), expect=expect, limit=limit)

    def read_small(self, key, limit):
        data = super().read_small(key, limit)
        self._add("down", len(data or b""))
        return data


def test_an_edited_version_pushed_and_pulled_moves_only_its_new_chunks(alice, bob, tmp_path):
    data = bytearray(os.urandom(BIG))
    v1 = _add_big(alice, bytes(data), "w1")
    be = Counting(tmp_path / "remote")
    push.push(alice, be, ["w1"])
    first_up = be.up
    assert first_up >= BIG                                  # the first version: every chunk
    assert be.exists(chunked.list_key(v1)) and not be.exists(rm.object_key(v1))
    fetch.pull(bob, be, ["w1"], namespace="alice")
    first_down = be.down
    assert first_down >= BIG

    data[BIG // 2:BIG // 2 + 4096] = os.urandom(4096)       # a 4 KiB edit
    v2 = _add_big(alice, bytes(data), "w2")
    be.up = be.down = 0
    res = push.push(alice, be, ["w2"])
    assert be.up < 1 << 20, be.up                            # a few chunks and the list, not 17 MiB
    assert res.bytes_sent <= be.up
    bob = Store.open(bob.root)
    before = bob.objects.packs.chunks_written
    fetch.pull(bob, be, ["w2"], namespace="alice")
    assert be.down < 1 << 20, be.down
    bob = Store.open(bob.root)
    assert bob.objects.chunked(v2) and bob.get_bytes(v2) == bytes(data)
    assert bob.objects.packs.chunks_written - before <= 6
    assert_clean(bob.root)

    be.up = 0
    again = push.push(alice, be, ["w2"], full=True)         # everything is there: nothing moves
    assert again.objects_sent == 0 and be.up < 4096


def _pushed(alice, tmp_path):
    v1 = _add_big(alice, os.urandom(BIG), "w1")
    be = rm.DirBackend(tmp_path / "remote")
    push.push(alice, be, ["w1"])
    key = tmp_path / "remote" / chunked.list_key(v1)
    size, entries = chunked.decode(key.read_bytes(), v1, "test")
    return v1, be, key, size, entries


def _replace(path, data: bytes) -> None:
    path.unlink()
    path.write_bytes(data)


def _refused(bob, be, error, match):
    before = snapshot(bob.root)
    with pytest.raises(error, match=match):
        fetch.pull(bob, be, ["w1"], namespace="alice")
    assert snapshot(bob.root) == before                     # no object, no record
    assert not list(bob.objects.packs.iter_packs())         # no chunk stored
    assert not [p for p in bob.tmp.iterdir() if p.is_file()]
    assert_clean(bob.root)


def test_a_chunk_with_the_wrong_bytes_is_refused_and_nothing_is_stored(alice, bob, tmp_path):
    v1, be, _, _, entries = _pushed(alice, tmp_path)
    d, n = entries[len(entries) // 2]
    _replace(tmp_path / "remote" / rm.object_key(chunked.chunk_id(d)), os.urandom(n))
    _refused(bob, be, CorruptObject, "a chunk of .* the wrong content")


def test_a_chunk_list_whose_whole_does_not_hash_to_the_id_is_refused(alice, bob, tmp_path):
    v1, be, key, size, entries = _pushed(alice, tmp_path)
    entries[0], entries[1] = entries[1], entries[0]         # every chunk genuine, the whole not
    _replace(key, chunked.encode(size, entries))
    _refused(bob, be, CorruptObject, "arrived with the wrong content")


def test_an_oversized_or_inconsistent_chunk_list_is_refused_before_any_chunk_moves(alice, bob, tmp_path):
    v1, be, key, size, entries = _pushed(alice, tmp_path)
    _replace(key, chunked.encode(size, entries + entries[:1] * (size // chunks.MIN_SIZE + 2)))
    _refused(bob, be, RemoteError, "larger than")            # more entries than the size allows: not read
    (d0, n0), (_, n1) = entries[0], entries[1]
    for lie, why in [(chunked.encode(size, [(d0, n0 + n1)] + entries[2:] + entries[:1]), "does not add up"),
                     (chunked.encode(size + 1, entries), "were announced"),
                     (chunked.encode(size, entries)[:-1], "bytes for"),
                     (b"x" * 64, "not a chunk list")]:
        _replace(key, lie)
        _refused(bob, be, CorruptObject, why)


def test_an_s3_remote_moves_only_the_new_chunks_too(alice, bob, s3_server, s3_bucket):
    bucket, fs = s3_bucket
    be = rm.open_backend(f"s3://{bucket}/team", {"endpoint_url": s3_server})
    data = bytearray(os.urandom(BIG))
    _add_big(alice, bytes(data), "w1")
    assert push.push(alice, be, ["w1"]).bytes_sent >= BIG
    fetch.pull(bob, be, ["w1"], namespace="alice")
    data[1000:1000 + 4096] = os.urandom(4096)
    v2 = _add_big(alice, bytes(data), "w2")
    res = push.push(alice, be, ["w2"])
    assert res.bytes_sent < 1 << 20, res.bytes_sent
    assert fs.exists(f"{bucket}/team/{chunked.list_key(v2)}")
    fetch.pull(Store.open(bob.root), be, ["w2"], namespace="alice")
    bob = Store.open(bob.root)
    assert bob.objects.chunked(v2) and bob.get_bytes(v2) == bytes(data)
    assert_clean(bob.root)


def test_a_loose_read_of_unknown_size_is_bounded_by_the_room_the_store_has(alice, tmp_path):
    v1, _, key, size, _ = _pushed(alice, tmp_path)
    assert chunked.decode(key.read_bytes(), v1, "test", limit=size)[0] == size
    with pytest.raises(CorruptObject, match="more than the"):
        chunked.decode(key.read_bytes(), v1, "test", limit=size - 1)


def test_the_chunk_list_is_written_only_after_its_chunks_and_a_rerun_sends_only_what_is_missing(
        alice, bob, tmp_path, monkeypatch):
    data = os.urandom(BIG)
    v1 = _add_big(alice, data, "w1")
    be = Counting(tmp_path / "remote")
    real = be.write_small

    def fail_on_lists(key, body):
        if key.startswith("chunked/"):
            raise RemoteError("the connection dropped")
        real(key, body)

    monkeypatch.setattr(be, "write_small", fail_on_lists)
    with pytest.raises(RemoteError):
        push.push(alice, be, ["w1"])
    entries = alice.objects.chunk_entries(v1)
    assert be.has_objects({chunked.chunk_id(d) for d, _ in entries}) == {chunked.chunk_id(d) for d, _ in entries}
    assert not be.exists(chunked.list_key(v1)) and not be.list("refs")      # nothing names the chunks yet
    monkeypatch.setattr(be, "write_small", real)
    be.up = 0
    push.push(alice, be, ["w1"])
    assert be.up < 1 << 20, be.up                                          # the list, not the chunks again
    fetch.pull(bob, be, ["w1"], namespace="alice")
    assert Store.open(bob.root).get_bytes(v1) == data
