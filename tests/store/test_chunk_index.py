"""The persistent chunk index, cache/chunks.idx (ledger/store/chunks.py ChunkIndex;
docs/store-format.md C10): a writer learns which chunks exist from it instead of reading every
pack's trailer into a dict; it is written by writers, keyed by the store's id and the packs it
covers, and a missing, foreign, damaged, stale or forged one is never trusted blindly."""

import os

import pytest

from ledger.store import Store, chunks, gc
from ledger.store.verify import verify

MIB = 1 << 20


def _open(root) -> Store:
    s = Store.open(root)
    s.objects.chunked_min = 1 * MIB
    return s


def _add(root, data: bytes, name: str) -> tuple[str, Store]:
    s = _open(root)
    p = root.parent / name
    p.write_bytes(data)
    with s.transaction("add") as tx:
        oid = tx.put_file(p)
        tx.outputs.append(oid)
        tx.refs[f"name/{name}"] = oid
    return oid, s


@pytest.fixture
def root(tmp_path):
    return Store.init(tmp_path / "s").root


def _counting_trailers(monkeypatch) -> list:
    read = []
    real = chunks.PackStore.iter_trailer

    def counted(self, pack, *a, **kw):
        read.append(pack)
        return real(self, pack, *a, **kw)
    monkeypatch.setattr(chunks.PackStore, "iter_trailer", counted)
    return read


def _edit(root, name: str, at: int) -> bytes:
    data = bytearray(_open(root).get_bytes(_open(root).resolve(name)))
    data[at:at + 4096] = os.urandom(4096)
    return bytes(data)


def test_a_writer_uses_the_index_instead_of_every_trailer(root, monkeypatch):
    _add(root, os.urandom(4 * MIB), "v0")
    assert not (root / "cache" / chunks.CACHE_NAME).exists()    # one pack, nothing to share yet
    _, s1 = _add(root, _edit(root, "v0", MIB), "v1")
    assert s1.objects.packs.index_builds == 1                   # the second writer wrote it (a pack to cover)
    read = _counting_trailers(monkeypatch)
    oid, s2 = _add(root, _edit(root, "v1", 2 * MIB), "v2")
    packs = {name for name, _ in s2.objects.packs.iter_packs()}
    assert len(packs) == 3 and len(read) <= 1, read             # only v1's pack, which the index does not cover
    assert s2.objects.packs.chunks_written <= 6                 # and still shared: a few chunks and pages
    assert _open(root).get_bytes(oid) == _open(root).get_bytes(_open(root).resolve("v2"))
    assert verify(_open(root), read_data=True).ok


def _three(root):
    data = bytearray(os.urandom(4 * MIB))
    ids = []
    for i in range(3):
        data[i * MIB + 10:i * MIB + 10 + 4096] = os.urandom(4096)
        ids.append(_add(root, bytes(data), f"v{i}")[0])
    return ids, data


def test_an_index_of_another_store_is_not_used(root, tmp_path):
    _three(root)
    other = Store.init(tmp_path / "other").root
    _three(other)
    os.replace(other / "cache" / chunks.CACHE_NAME, root / "cache" / chunks.CACHE_NAME)
    idx = chunks.ChunkIndex.open(_open(root).objects.packs)
    assert idx.problem == "another store's" and idx.mm is None
    data = bytearray(_open(root).get_bytes(_open(root).resolve("v2")))
    data[5:5 + 4096] = os.urandom(4096)
    oid, s = _add(root, bytes(data), "v3")
    assert s.objects.packs.index_builds == 1 and s.objects.packs.chunks_written <= 6
    assert chunks.ChunkIndex.open(_open(root).objects.packs).problem is None
    assert verify(_open(root), read_data=True).ok


def test_a_forged_entry_is_a_miss_never_a_location_of_other_bytes(root):
    (v0, v1, v2), data = _three(root)
    s = _open(root)
    s.objects.packs.known()                                     # up to date: every pack covered
    path = root / "cache" / chunks.CACHE_NAME
    raw = bytearray(path.read_bytes())
    idx = chunks.ChunkIndex.open(s.objects.packs)
    start = idx._ent
    # every entry now claims the chunk at offset 0 of its pack: genuine bytes, the wrong ones
    for at in range(start, len(raw), chunks.CACHE_ENTRY.size):
        d, pack, off, n, i = chunks.CACHE_ENTRY.unpack_from(raw, at)
        raw[at:at + chunks.CACHE_ENTRY.size] = chunks.CACHE_ENTRY.pack(d, pack, 0, n, i)
    path.unlink()
    path.write_bytes(raw)
    data[3 * MIB:3 * MIB + 4096] = os.urandom(4096)
    oid, s = _add(root, bytes(data), "v3")
    assert _open(root).get_bytes(oid) == bytes(data)            # every chunk where its bytes are
    assert verify(_open(root), read_data=True).ok
    assert s.objects.packs.index_builds == 1                    # a hit that its trailer denied: rewritten
    s = _open(root)
    idx = s.objects.packs.known()
    d, loc = s.objects.chunk_entries(v0)[1]
    assert idx.get(d) is not None and idx.get(d)[1] != 0        # true locations again


def test_entries_of_packs_gc_removed_are_not_used(root):
    import blake3

    _three(root)
    s = _open(root)
    w = chunks.PackWriter(s.objects.packs)                      # a pack no object names (a crash's leftover)
    orphan = []
    for _ in range(5):
        blob = os.urandom(40_000)
        orphan.append(blake3.blake3(blob).digest())
        w.locate(orphan[-1], blob)
    w.close()
    s.objects.packs.rebuild_index()
    assert chunks.ChunkIndex.open(s.objects.packs).covered >= {w.name}
    assert len(gc.prune(_open(root)).packs) == 1
    s = _open(root)
    present = {name for name, _ in s.objects.packs.iter_packs()}
    idx = chunks.ChunkIndex.open(s.objects.packs)               # the file still lists the removed pack
    assert idx.covered - present == {w.name}
    idx.refresh(present)
    assert all(_entry_pack(idx, d) == w.name and idx.get(d) is None for d in orphan)
    assert idx.due()                                            # and the next writer rewrites it
    s.objects.packs.known()
    assert w.name not in chunks.ChunkIndex.open(s.objects.packs).covered


def _entry_pack(idx, digest):
    for i in range(idx.count):
        d, pack, *_ = chunks.CACHE_ENTRY.unpack_from(idx.mm, idx._ent + i * chunks.CACHE_ENTRY.size)
        if d == digest:
            return pack
    return None


def test_the_index_is_built_in_bounded_memory_the_same_as_in_memory(root, monkeypatch):
    _three(root)
    s = _open(root)
    s.objects.packs.rebuild_index()
    whole = (root / "cache" / chunks.CACHE_NAME).read_bytes()
    monkeypatch.setattr(chunks, "SPILL", 50)                    # many spill files of 50 entries each
    s.objects.packs.rebuild_index()
    assert (root / "cache" / chunks.CACHE_NAME).read_bytes() == whole
    assert not [p for p in s.tmp.iterdir()]                     # the spills are gone


def test_the_overlay_is_bounded_the_writer_rewrites_the_index(root, monkeypatch):
    monkeypatch.setattr(chunks, "OVERLAY_MIN", 10)
    for i in range(3):                                          # each add finds > 10 uncovered chunks
        _add(root, os.urandom(2 * MIB), f"r{i}")
    s = _open(root)
    idx = s.objects.packs.known()
    assert idx.covered == {name for name, _ in s.objects.packs.iter_packs()}
    assert not idx.overlay                                      # all in the file, none held in memory
    assert idx.count >= 3 * 2 * MIB // chunks.MAX_SIZE


def test_a_directory_in_the_index_place_is_a_typed_error_naming_it(root):
    from ledger.errors import StoreCorrupt

    _add(root, os.urandom(2 * MIB), "a")
    (root / "cache" / chunks.CACHE_NAME).mkdir()
    (root / "cache" / chunks.CACHE_NAME / "x").write_bytes(b"x")
    with pytest.raises(StoreCorrupt, match="is a directory, not the chunk index"):
        _add(root, os.urandom(2 * MIB), "b")
    assert "name/b" not in _open(root).state.refs                              # nothing of b committed
    assert not [f for f in _open(root).tmp.iterdir() if f.is_file()]           # nor left in tmp/
    (root / "cache" / chunks.CACHE_NAME / "x").unlink()
    (root / "cache" / chunks.CACHE_NAME).rmdir()
    _add(root, os.urandom(2 * MIB), "b")                                       # the hint's cure works
    assert verify(_open(root), read_data=True).ok
