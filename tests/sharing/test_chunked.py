"""Chunked objects (ledger/store/chunks.py) through bundles and remotes: they travel as whole,
verified objects, and the receiver stores them as chunks, writing only the chunks it lacks
(docs/store-format.md, C7)."""

from __future__ import annotations

import os

from ledger.sharing import bundle, fetch, push
from ledger.sharing import remote as rm
from ledger.store import Store, chunks

from .conftest import assert_clean

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
