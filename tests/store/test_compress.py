"""Compressed structured objects (ledger/store/compress.py; docs/store-format.md Z1–Z6): the id
is the hash of the uncompressed bytes, every read decompresses bounded and rehashes, gc and
verify see through the encoding, a hostile `.z` file is a typed error, and format-1 stores are
read and upgraded."""

from __future__ import annotations

import json
import os
import resource
import struct

import pytest
import zstandard

from ledger.errors import CorruptObject
from ledger.store import Store, compress, gc
from ledger.store.ids import hash_bytes
from ledger.store.verify import verify


def turns(n: int, seed: int = 0) -> dict:
    """A turn batch shaped like experience.record's (repetitive JSON: what compression is for)."""
    return {"kind": "turns", "first": 1, "turns": [
        {"action": f"call adder.add({i}, {seed})", "generation": None, "id": f"t{i + 1}", "latency_ms": None,
         "outcome": str(i + seed), "refusal": False, "situation": f"user: what is {i} plus {seed}?",
         "time": f"2026-12-01T14:28:{i % 60:02d}.090674Z"} for i in range(n)]}


def put(store, obj, kind="turns"):
    with store.transaction("add") as tx:
        oid = tx.put_json(obj)
        tx.outputs.append(oid)
        tx.refs[f"name/{kind}-{oid[3:11]}"] = oid
        tx.payload.update({"path": "x.json", "kind": "file", "size": store.objects.size(oid)})
    return oid


def test_a_structured_object_is_stored_compressed_and_its_id_is_of_the_uncompressed_bytes(store):
    obj = turns(200)
    oid = put(store, obj)
    data = json.dumps(obj, sort_keys=True, separators=(",", ":")).encode()
    assert oid == hash_bytes(data)                                     # Z1: the id is the content's
    assert store.objects.compressed(oid) and not store.object_path(oid).exists()
    z = store.objects.zpath(oid)
    assert z.stat().st_size * 8 < len(data)                            # ~13x on a turn batch
    assert oct(z.stat().st_mode & 0o777) == "0o444"
    assert store.objects.size(oid) == len(data)                        # sizes are the content's
    assert store.get_bytes(oid) == data and store.get_json(oid) == obj
    assert b"".join(bytes(b) for b in store.objects.stream(oid)) == data
    assert store.objects.intact(oid)
    out = store.root.parent / "exported.json"
    store.export_file(oid, out)
    assert out.read_bytes() == data
    assert store.objects.files(oid) == [z]
    assert store.objects.resolve_prefix(oid[:12]) == oid
    assert oid in {o for o, _ in store.objects.iter_ids()}


def test_small_objects_and_blobs_are_stored_whole(store):
    small = put(store, {"kind": "spec", "lr": 0.01}, "spec")
    assert not store.objects.compressed(small) and store.object_path(small).is_file()
    with store.transaction("add") as tx:
        blob = tx.put_bytes(json.dumps(turns(200)).encode())           # a user's file: never compressed
        tx.outputs.append(blob)
    assert store.object_path(blob).is_file() and not store.objects.zpath(blob).exists()
    assert compress.encode(os.urandom(4000)) is None                   # gains less than 1/8: whole


def test_the_encoding_is_deterministic():
    data = json.dumps(turns(300)).encode()
    assert compress.encode(data) == compress.encode(data)
    assert compress.decode(compress.encode(data), hash_bytes(data), "x") == data


def test_verify_and_read_data_are_clean_and_name_a_damaged_compressed_object(store):
    oid = put(store, turns(200))
    rep = verify(store, read_data=True)
    assert rep.ok, rep.errors
    z = store.objects.zpath(oid)
    raw = bytearray(z.read_bytes())
    raw[-5] ^= 0x40                                                    # a bit flip inside the frame
    os.chmod(z, 0o644)
    z.write_bytes(bytes(raw))
    with pytest.raises(CorruptObject) as e:
        store.get_bytes(oid)
    assert e.value.exit_code == 4 and oid in str(e.value)
    assert not store.objects.intact(oid)
    rep = verify(Store.open(store.root), read_data=True, full=True)
    assert any(err.get("id") == oid for err in rep.errors), rep.errors


def test_a_decompression_bomb_is_bounded_by_the_declared_size(store, tmp_path):
    """Z4: a `.z` file planted under a real object's name whose frame inflates to 64 MiB, and one
    whose header declares more than MAX_SIZE: each is CorruptObject, read no further than the
    bound, and memory stays near the declared size."""
    oid = put(store, turns(200))
    z = store.objects.zpath(oid)
    os.chmod(z, 0o644)
    bomb = zstandard.ZstdCompressor(level=3, write_content_size=False).compress(b"{" + b" " * (64 << 20))
    assert len(bomb) < 1 << 20
    z.write_bytes(compress.HEADER.pack(compress.MAGIC, 40_000) + bomb)
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    with pytest.raises(CorruptObject) as e:
        store.get_bytes(oid)
    assert "more" in str(e.value)
    assert resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before < 32 << 10   # KiB: far below 64 MiB
    z.write_bytes(compress.HEADER.pack(compress.MAGIC, compress.MAX_SIZE + 1) + bomb)
    with pytest.raises(CorruptObject) as e:
        store.objects.size(oid)
    assert "declares" in str(e.value)
    with pytest.raises(CorruptObject):
        store.get_bytes(oid)
    z.write_bytes(b"not a header")
    with pytest.raises(CorruptObject):
        store.get_bytes(oid)
    rep = verify(Store.open(store.root), full=True)                   # header checked without --read-data
    assert any(err.get("id") == oid for err in rep.errors), rep.errors


def test_a_compressed_file_that_is_a_link_fifo_or_too_large_is_corrupt_never_followed(store, tmp_path):
    oid = put(store, turns(200))
    z = store.objects.zpath(oid)
    os.chmod(z, 0o644)
    z.unlink()
    target = tmp_path / "elsewhere"
    target.write_bytes(compress.encode(json.dumps(turns(200), sort_keys=True, separators=(",", ":")).encode()))
    z.symlink_to(target)
    with pytest.raises(CorruptObject):
        store.get_bytes(oid)
    z.unlink()
    os.mkfifo(z)
    with pytest.raises(CorruptObject):
        store.get_bytes(oid)                                           # never blocks on the FIFO
    z.unlink()
    with open(z, "wb") as f:                                           # larger than any .z can be
        f.truncate(compress.file_limit() + 1)
    with pytest.raises(CorruptObject):
        store.get_bytes(oid)


def test_gc_follows_ids_inside_compressed_objects_and_removes_unreachable_ones(store):
    orphan, _ = store.objects.put_bytes(json.dumps(turns(150, seed=7)).encode(), compressed=True)  # no record
    with store.transaction("add") as tx:
        child = tx.put_bytes(os.urandom(1000), "blob")
        parent = tx.put_json({**turns(100), "attached": child})        # names child only inside the .z
        tx.outputs.append(parent)
        tx.refs["name/parent"] = parent
        tx.payload.update({"path": "p.json", "kind": "file", "size": 1})
    assert store.objects.compressed(parent) and store.objects.compressed(orphan)
    done = gc.prune(store)
    assert orphan in {o for o, _ in done.unreachable} and parent not in {o for o, _ in done.unreachable}
    assert store.objects.has(child) and store.objects.intact(parent)  # reached through the compressed parent
    assert not store.objects.has(orphan) and not store.objects.zpath(orphan).exists()
    assert verify(Store.open(store.root), read_data=True, full=True).ok


def test_a_damaged_compressed_copy_is_repaired_by_a_re_put(store):
    obj = turns(200)
    oid = put(store, obj)
    z = store.objects.zpath(oid)
    os.chmod(z, 0o644)
    z.write_bytes(z.read_bytes()[:-10])
    assert not store.objects.intact(oid)
    put(store, obj)
    assert store.objects.intact(oid) and any(oid in w for w in store.warnings)   # replaced, and said so
    data = store.objects.get_bytes(oid)
    z.chmod(0o644)
    z.write_bytes(b"junk")
    assert store.objects.replace_damaged(oid, data) and store.objects.intact(oid)


def test_a_format_1_store_is_read_and_upgraded_by_its_next_writer(tmp_path):
    s = Store.init(tmp_path)
    cfg = json.loads((s.root / "config").read_text())
    assert cfg["format"] == 2
    with s.transaction("add") as tx:                                   # what a format-1 writer stored
        old = tx.put_bytes(json.dumps(turns(200), sort_keys=True, separators=(",", ":")).encode(), "turns")
        tx.outputs.append(old)
    os.chmod(s.root / "config", 0o644)
    (s.root / "config").write_text(json.dumps({**cfg, "format": 1}))
    s = Store.open(tmp_path)
    assert not s.compresses and s.get_bytes(old)                       # read as before
    new = put(s, turns(210))                                           # Z6: the writer upgrades it first
    assert json.loads((s.root / "config").read_text())["format"] == 2
    assert s.objects.compressed(new) and not s.objects.compressed(old)
    assert verify(Store.open(tmp_path), read_data=True, full=True).ok


def test_without_the_wheel_a_compressible_write_and_a_compressed_read_are_typed_errors(store, monkeypatch):
    from ledger.errors import UnsupportedFormat

    oid = put(store, turns(200))
    monkeypatch.setattr(compress, "zstandard", None)
    assert store.compresses                                           # the format says so, not the wheel
    before = sorted(p.name for p in (store.root / "objects").rglob("*"))
    with pytest.raises(UnsupportedFormat) as e:                       # Z5: never written whole instead
        put(store, turns(220))
    assert "zstandard" in str(e.value) and "pip install zstandard" in e.value.hint
    assert sorted(p.name for p in (store.root / "objects").rglob("*")) == before
    with pytest.raises(UnsupportedFormat) as e:
        store.get_bytes(oid)
    assert "zstandard" in str(e.value)
    small = put(store, {"a": 1})                                      # too small to compress: no wheel needed
    assert store.get_bytes(small)


def test_header_layout():
    data = json.dumps(turns(100)).encode()
    z = compress.encode(data)
    magic, size = struct.unpack(">16sQ", z[:24])
    assert magic == b"ledger-zstd\0\0\0\0\1" and size == len(data)
    assert z[24:28] == b"\x28\xb5\x2f\xfd"                              # one zstd frame follows
