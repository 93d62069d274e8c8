"""Chunked objects (ledger/store/chunks.py; docs/store-format.md rules C1–C6): versions share
chunks, the id is the whole content's BLAKE3, every chunk is verified on read, a crash leaves
nothing half-visible, gc removes packs nothing uses, and unchunked objects stay readable."""

import os
import random
import signal

import pytest

from ledger.errors import CorruptObject
from ledger.store import Store, chunks, gc
from ledger.store.ids import hash_bytes
from ledger.store.verify import verify
from tests.conftest import ledger_cmd
from tests.reliability.helpers import assert_consistent

MIB = 1 << 20


@pytest.fixture
def small(store):
    store.objects.chunked_min = 1 * MIB  # small files exercise the chunked path quickly
    return store


def _pack_bytes(store) -> int:
    return sum(p.stat().st_size for _, p in store.objects.packs.iter_packs())


def _add(store, path) -> str:
    with store.transaction("add") as tx:
        oid = tx.put_file(path)
        tx.outputs.append(oid)
    return oid


def flip_a_chunk_byte(store, oid: str, i: int = 5):
    """Flip one byte in the middle of the object's i-th chunk, in its pack; the pack's path."""
    _, (pack, off, n) = store.objects.chunk_entries(oid)[i]
    p = store.objects.packs.path(pack)
    os.chmod(p, 0o644)
    with open(p, "r+b") as f:
        f.seek(off + n // 2)
        b = f.read(1)
        f.seek(off + n // 2)
        f.write(bytes([b[0] ^ 1]))
    return p


def test_id_is_whole_content_hash_and_reads_are_exact(small, tmp_path):
    data = os.urandom(6 * MIB + 123)
    (tmp_path / "w").write_bytes(data)
    oid = _add(small, tmp_path / "w")
    assert oid == hash_bytes(data)                      # C1: the id names the whole content
    assert small.objects.chunked(oid) and not small.objects.path(oid).exists()
    assert small.objects.size(oid) == len(data)
    assert small.get_bytes(oid) == data
    small.export_file(oid, tmp_path / "out")
    assert (tmp_path / "out").read_bytes() == data
    assert small.objects.intact(oid)
    entries = small.objects.chunk_entries(oid)
    sizes = [loc[2] for _, loc in entries]
    assert sum(sizes) == len(data) and max(sizes) <= chunks.MAX_SIZE
    assert 32 << 10 <= len(data) / len(entries) <= 128 << 10   # ~64 KiB average (FastCDC)
    assert not list(small.tmp.iterdir())
    assert verify(small, read_data=True).ok


def test_a_4k_edit_shares_all_but_a_few_chunks(small, tmp_path):
    # seeded, not urandom: where FastCDC cuts depends on the bytes, and a random edit that lands
    # near a cut point shifts one more boundary now and then (the bounds below are for one layout)
    rng = random.Random(18)
    data = bytearray(rng.randbytes(16 * MIB))
    (tmp_path / "v1").write_bytes(data)
    v1 = _add(small, tmp_path / "v1")
    before, written = _pack_bytes(small), small.objects.packs.chunks_written
    data[9 * MIB:9 * MIB + 4096] = rng.randbytes(4096)   # a 4 KiB edit in the middle
    (tmp_path / "v2").write_bytes(data)
    v2 = _add(small, tmp_path / "v2")
    added = _pack_bytes(small) - before
    new_chunks = small.objects.packs.chunks_written - written
    index = small.objects.index_path(v2).stat().st_size
    assert v1 != v2 and small.get_bytes(v2) == bytes(data)
    assert new_chunks <= 6, new_chunks                   # 1–2 data chunks + 1–2 pages (+ boundary shifts)
    assert added + index <= 1 * MIB, (added, index)     # the bound (for 2 GiB; here 16 MiB)
    shared = {d for d, _ in small.objects.chunk_entries(v1)} & {d for d, _ in small.objects.chunk_entries(v2)}
    assert len(shared) >= len(small.objects.chunk_entries(v1)) - 3


def test_the_same_bytes_from_memory_and_from_a_file_are_one_object(small, tmp_path):
    data = os.urandom(3 * MIB)
    (tmp_path / "f").write_bytes(data)
    a = _add(small, tmp_path / "f")
    with small.transaction("t") as tx:
        b = tx.put_bytes(data)
    assert a == b and small.objects.packs.packs_written == 1   # nothing new to write the second time


def test_a_damaged_chunk_is_detected_on_read_naming_object_and_pack(small, tmp_path):
    data = os.urandom(4 * MIB)
    (tmp_path / "f").write_bytes(data)
    oid = _add(small, tmp_path / "f")
    p = flip_a_chunk_byte(small, oid)
    with pytest.raises(CorruptObject) as e:
        small.get_bytes(oid)
    assert e.value.exit_code == 4 and oid in e.value.message and str(p) in e.value.message
    with pytest.raises(CorruptObject):
        small.export_file(oid, tmp_path / "out")
    assert not (tmp_path / "out").exists()              # nothing half-written appears
    assert not small.objects.intact(oid)
    rep = verify(small, read_data=True)
    assert any(x["id"] == oid for x in rep.errors)


def test_a_missing_pack_is_named_by_verify_without_read_data(small, tmp_path):
    (tmp_path / "f").write_bytes(os.urandom(3 * MIB))
    oid = _add(small, tmp_path / "f")
    (_, path), = list(small.objects.packs.iter_packs())
    path.unlink()
    rep = verify(small)
    assert any(x["id"] == oid and str(path) in x["message"] for x in rep.errors), rep.errors
    with pytest.raises(CorruptObject):
        small.get_bytes(oid)


def test_a_damaged_index_is_corrupt_not_a_crash(small, tmp_path):
    (tmp_path / "f").write_bytes(os.urandom(3 * MIB))
    oid = _add(small, tmp_path / "f")
    p = small.objects.index_path(oid)
    os.chmod(p, 0o644)
    p.write_bytes(p.read_bytes()[:-7])
    with pytest.raises(CorruptObject) as e:
        small.get_bytes(oid)
    assert str(p) in e.value.message
    assert not verify(small).ok


def test_unchunked_objects_stay_readable(store, tmp_path):
    data = os.urandom(3 * MIB)
    (tmp_path / "f").write_bytes(data)
    oid = _add(store, tmp_path / "f")                   # below the default threshold: one whole file
    assert not store.objects.chunked(oid) and store.object_path(oid).is_file()
    store.objects.chunked_min = 1 * MIB                  # a later version chunks large objects...
    assert store.get_bytes(oid) == data and store.objects.intact(oid)   # ...and still reads this one
    assert _add(store, tmp_path / "f") == oid and not store.objects.index_path(oid).exists()
    assert verify(store, read_data=True).ok


def test_gc_removes_packs_no_object_uses_and_keeps_shared_ones(small, tmp_path):
    data = bytearray(os.urandom(4 * MIB))
    (tmp_path / "v1").write_bytes(data)
    v1 = small.objects.put_file(tmp_path / "v1")[0]     # written but never recorded: unreachable
    data[:4096] = os.urandom(4096)
    (tmp_path / "v2").write_bytes(data)
    v2 = _add(small, tmp_path / "v2")                    # mostly v1's chunks, in v1's pack
    lonely = small.objects.put_bytes(os.urandom(2 * MIB))[0]   # unreachable, sharing nothing
    p = gc.plan(small)
    assert {o for o, _ in p.unreachable} == {v1, lonely}
    assert len(p.packs) == 1                             # lonely's pack; v1's is v2's too
    done = gc.prune(small)
    assert done.packs == p.packs and not small.has(v1) and not small.has(lonely)
    assert small.get_bytes(v2) == bytes(data)
    assert small.journal.records()[-1]["payload"]["packs_removed"] == 1
    assert verify(small, read_data=True).ok


def test_crash_at_every_point_of_a_chunked_add_leaves_nothing_half_visible(tmp_path):
    """C4: SIGKILL anywhere in a chunked add leaves the object absent (no index) or whole."""
    big = 17 * MIB   # above chunks.THRESHOLD: the CLI's own threshold
    probe = tmp_path / "probe"
    probe.mkdir()
    Store.init(probe)
    (probe / "w.bin").write_bytes(os.urandom(big))
    trace = tmp_path / "trace"
    p = ledger_cmd("add", "w.bin", cwd=probe, env={"LEDGER_FAULT_TRACE": str(trace)})
    assert p.returncode == 0, p.stderr
    points = [line.split()[1] for line in trace.read_text().splitlines()]
    assert {"chunks.written", "pack.before-fsync", "pack.after-rename", "object.before-fsync",
            "object.before-rename", "tx.committed"} <= set(points)
    work = tmp_path / "w"
    work.mkdir()
    Store.init(work)
    for name in ("chunks.written", "pack.before-fsync", "pack.after-rename", "object.before-fsync",
                 "object.before-rename", "object.after-rename"):
        n = points.index(name) + 1
        data = os.urandom(big)
        (work / "w.bin").write_bytes(data)
        p = ledger_cmd("add", "w.bin", cwd=work, env={"LEDGER_FAULT_AT": str(n)})
        assert p.returncode == -signal.SIGKILL, (name, p.stderr)
        store = assert_consistent(work / ".ledger")
        oid = hash_bytes(data)
        if store.objects.has(oid):                       # renamed into place: complete and intact
            assert name == "object.after-rename" and store.objects.intact(oid)
        else:
            assert not store.objects.index_path(oid).exists()
        assert all(r["kind"] != "add" for r in store.journal.records())   # nothing committed
        gc.prune(store)                                   # the leftovers are unreachable, and go
        assert not list(store.objects.packs.iter_packs())
        assert verify(store).ok


@pytest.mark.parametrize("err", ["ENOSPC", "EIO"])
def test_injected_write_errors_in_a_chunked_add_leave_nothing_behind(tmp_path, err):
    """Rule 10 for chunked objects: a failed write at any point is a typed error (exit 6), the
    temporary copy and any unfinished pack are gone, nothing is committed, the store verifies."""
    Store.init(tmp_path)
    n = 0
    while True:
        n += 1
        data = os.urandom(chunks.THRESHOLD + MIB)
        (tmp_path / "w.bin").write_bytes(data)
        pre = Store.open(tmp_path).state.head
        p = ledger_cmd("add", "w.bin", cwd=tmp_path, env={"LEDGER_FAULT_ERRNO": f"{err}:{n}"})
        if p.returncode == 0:
            break
        assert p.returncode == 6 and "Traceback" not in p.stderr, p.stderr
        store = assert_consistent(tmp_path / ".ledger")
        assert store.state.head == pre            # nothing committed (the object may be, unreferenced: rule 4)
        assert not list(store.tmp.iterdir())
        if store.objects.has(hash_bytes(data)):    # installed before the failure: whole and intact
            assert store.objects.intact(hash_bytes(data))
        assert n < 12
    assert n > 2   # the copy, the pack and the index each failed once before it went through
    assert Store.open(tmp_path).get_bytes(hash_bytes(data)) == data


def test_a_pack_that_is_a_link_or_a_fifo_is_corrupt_never_a_hang(small, tmp_path):
    (tmp_path / "f").write_bytes(os.urandom(3 * MIB))
    oid = _add(small, tmp_path / "f")
    (_, path), = list(small.objects.packs.iter_packs())
    os.chmod(path, 0o644)
    path.unlink()
    os.mkfifo(path)
    with pytest.raises(CorruptObject) as e:
        small.get_bytes(oid)
    assert "FIFO" in e.value.message and str(path) in e.value.message
    assert not verify(small, read_data=True).ok
    path.unlink()
    path.symlink_to(tmp_path / "f")
    with pytest.raises(CorruptObject):
        small.get_bytes(oid)


def _forge_page(store, oid: str, edit) -> None:
    """Rewrite a chunked object's index so its first page is `edit(entries)`, stored in a pack
    of its own whose name and digest are right: what a local writer could plant (store-format C2)."""
    size, pages = store.objects._index(oid)
    d0, cov, k, loc = pages[0]
    entries = chunks.parse_page(store.objects.packs.read(loc, d0, oid), k, cov, oid, "test")
    entries = edit(entries)
    page = b"".join(chunks.ENTRY.pack(d, n, p, off) for d, (p, off, n) in entries)
    name = os.urandom(16)
    path = store.objects.packs.path(name)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(page)
    forged = [(chunks.blake3.blake3(page).digest(), sum(loc[2] for _, loc in entries), len(entries),
               (name, 0, len(page)))] + pages[1:]
    p = store.objects.index_path(oid)
    os.chmod(p, 0o644)
    p.write_bytes(chunks.index_bytes(size, forged))


def test_read_data_checks_every_chunk_against_its_name_not_only_the_whole(small, tmp_path):
    """A page naming a chunk by a wrong digest, over the right bytes: the whole still hashes to
    the id, but a read of that chunk fails (C2), so `intact` and `verify --read-data` must too."""
    (tmp_path / "f").write_bytes(os.urandom(4 * MIB))
    oid = _add(small, tmp_path / "f")
    assert small.objects.intact(oid)

    def rename_third(entries):
        d, loc = entries[3]
        return entries[:3] + [(bytes(32), loc)] + entries[4:]
    _forge_page(small, oid, rename_third)
    with pytest.raises(CorruptObject):
        small.get_bytes(oid)
    assert not small.objects.intact(oid)
    assert any(x["id"] == oid for x in verify(small, read_data=True).errors)


def test_read_data_never_maps_a_chunk_a_page_places_beyond_its_pack(small, tmp_path):
    """A planted page placing a chunk past its pack's end (touching such a mapped page would be
    SIGBUS): damage, reported, the process alive."""
    (tmp_path / "f").write_bytes(os.urandom(4 * MIB))
    oid = _add(small, tmp_path / "f")

    def push_last_out(entries):
        d, (p, off, n) = entries[-1]
        return entries[:-1] + [(d, (p, off + (64 << 20), n))]
    _forge_page(small, oid, push_last_out)
    assert not small.objects.intact(oid)
    assert any(x["id"] == oid for x in verify(small, read_data=True).errors)
