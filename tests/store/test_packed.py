"""Packed objects (ledger/store/packed.py, packing.py; docs/store-format.md, "Packed objects", P1–P8)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from ledger.errors import CorruptObject, MissingObject
from ledger.store import Store, canonical, gc, packed, packing
from ledger.store.ids import hash_bytes
from ledger.store.verify import verify

N = 300   # above packed.MIN_LOOSE


def _objects(s: Store, n: int = N, tag: str = "") -> list[str]:
    """n small objects, a third structured and compressed, named by one record."""
    ids = []
    with s.transaction("t") as tx:
        for i in range(n):
            if i % 3 == 0:
                oid, _ = s.objects.put_bytes(canonical.dumps({"kind": "turns", "i": i, "t": tag, "pad": "abc" * 300}),
                                             compressed=True)
            else:
                oid, _ = s.objects.put_bytes(f"blob {tag} {i} ".encode() * 30)
            ids.append(oid)
        tx.payload["objects_named"] = ids
    return ids


def _loose_files(s: Store) -> list[Path]:
    return [p for p in s.objects.dir.rglob("*") if p.is_file()]


def _packs(s: Store) -> list[Path]:
    d = s.root / packed.DIR
    return sorted(d.iterdir()) if d.is_dir() else []


def _packed_store(tmp_path, n: int = N):
    s = Store.init(tmp_path)
    ids = _objects(s, n)
    contents = {o: s.objects.get_bytes(o) for o in ids}
    p = gc.prune(Store.open(tmp_path))
    assert p.packing.objects == n and p.packing.written == 1
    return Store.open(tmp_path), ids, contents


def _flip(path: Path, at: int) -> None:
    os.chmod(path, 0o644)
    with open(path, "r+b") as f:
        f.seek(at)
        b = f.read(1)
        f.seek(at)
        f.write(bytes([b[0] ^ 0x55]))


# --- P1: every reader reads a packed object as it read the loose one ------------------------------

def test_every_reader_gives_a_packed_objects_bytes_verified(tmp_path):
    s, ids, contents = _packed_store(tmp_path)
    assert _loose_files(s) == [] and len(_packs(s)) == 1
    for oid in ids:
        data = contents[oid]
        assert s.objects.has(oid) and s.objects.packed_only(oid) and s.objects.intact(oid)
        assert s.objects.get_bytes(oid) == data
        assert s.objects.size(oid) == len(data)
        assert b"".join(bytes(b) for b in s.objects.stream(oid)) == data
        assert s.objects.structure(oid) == (data if data[:1] == b"{" else None)
        assert s.objects.check_data(oid) == (True, "whole")
        s.objects.verify_file(oid)
    out = tmp_path / "out.bin"
    s.objects.export_file(ids[1], out)
    assert out.read_bytes() == contents[ids[1]]
    assert s.objects.resolve_prefix(ids[4][:12]) == ids[4]


def test_a_damaged_packed_object_is_corrupt_naming_its_pack_never_other_bytes(tmp_path):
    s, ids, contents = _packed_store(tmp_path)
    pack = _packs(s)[0]
    hit = s.objects._packed(ids[1])
    _flip(pack, hit[1].offset + 5)
    s = Store.open(tmp_path)
    with pytest.raises(CorruptObject, match=str(pack)):
        s.objects.get_bytes(ids[1])
    assert not s.objects.intact(ids[1])
    assert s.objects.get_bytes(ids[2]) == contents[ids[2]]   # the others are untouched
    rep = verify(s, read_data=True)
    assert [e["id"] for e in rep.errors if e["what"] == "corrupt"] == [ids[1]]


def test_an_entry_placed_outside_its_pack_is_corrupt_before_anything_is_read(tmp_path):
    s, ids, _ = _packed_store(tmp_path)
    pack = _packs(s)[0]
    p = s.objects.packed.all()[0]
    i = next(j for j in range(p.count) if p.digest_at(j) == bytes.fromhex(ids[1][3:]))
    at = p.table + i * packed.ENTRY.size + 32
    os.chmod(pack, 0o644)
    with open(pack, "r+b") as f:
        f.seek(at)
        f.write((10 << 40).to_bytes(8, "big"))   # offset far past the file's end
    s = Store.open(tmp_path)
    with pytest.raises(CorruptObject, match="outside its bytes"):
        s.objects.get_bytes(ids[1])
    rep = verify(s)
    assert any("outside its bytes" in e["message"] for e in rep.errors)


@pytest.mark.parametrize("damage", ["footer", "header", "count", "unsorted"])
def test_a_pack_that_does_not_add_up_hides_nothing_from_verify(tmp_path, damage):
    s, ids, _ = _packed_store(tmp_path)
    pack = _packs(s)[0]
    size = pack.stat().st_size
    p = s.objects.packed.all()[0]
    os.chmod(pack, 0o644)
    with open(pack, "r+b") as f:
        if damage == "footer":
            f.seek(size - 1)
            f.write(b"\x07")
        elif damage == "header":
            f.seek(0)
            f.write(b"X")
        elif damage == "count":
            f.seek(size - packed.FOOT.size)
            f.write((packed.MAX_ENTRIES + 1).to_bytes(8, "big"))
        else:   # swap the first two entries of the table
            f.seek(p.table)
            a, b = f.read(packed.ENTRY.size), f.read(packed.ENTRY.size)
            f.seek(p.table)
            f.write(b + a)
    s = Store.open(tmp_path)
    rep = verify(s)
    assert not rep.ok
    if damage == "unsorted":
        assert any("not sorted" in e["message"] for e in rep.errors)
    else:
        assert any(e["what"] == "corrupt" and "holds nothing readable" in e["message"] for e in rep.errors)
        assert {e["id"] for e in rep.errors if e["what"] == "missing"} == set(ids)
        with pytest.raises(MissingObject):
            s.objects.get_bytes(ids[0])


@pytest.mark.parametrize("kind", ["symlink", "fifo", "dir"])
def test_a_pack_that_is_not_a_regular_file_is_never_followed_or_waited_on(tmp_path, kind):
    s, ids, contents = _packed_store(tmp_path)
    real = _packs(s)[0]
    elsewhere = tmp_path / "elsewhere.pack"
    os.rename(real, elsewhere)
    if kind == "symlink":
        real.symlink_to(elsewhere)
    elif kind == "fifo":
        os.mkfifo(real)
    else:
        real.mkdir()
    s = Store.open(tmp_path)
    assert not s.objects.has(ids[0])
    rep = verify(s)   # returns (a FIFO is never opened for reading without O_NONBLOCK)
    assert any("holds nothing readable" in e["message"] for e in rep.errors)


def test_foreign_files_in_packed_are_named_by_verify(tmp_path):
    s, _, _ = _packed_store(tmp_path)
    (s.root / packed.DIR / "notes.txt").write_text("hi")
    rep = verify(Store.open(tmp_path))
    assert any(e["what"] == "foreign-file" and "notes.txt" in e["message"] for e in rep.errors)


def test_a_compressed_entry_that_inflates_past_its_header_is_corrupt_bounded(tmp_path):
    s = Store.init(tmp_path)
    ids = _objects(s)
    gc.prune(Store.open(tmp_path))
    s = Store.open(tmp_path)
    oid = ids[0]   # compressed
    pack, loc = s.objects._packed(oid)
    assert loc.form == packed.COMPRESSED
    _flip(pack.path, loc.offset + 20)   # the declared size
    s = Store.open(tmp_path)
    with pytest.raises(CorruptObject):
        s.objects.get_bytes(oid)


# --- P2: a file of its own is preferred; a damaged packed copy is repaired by a put --------------

def test_a_loose_copy_is_read_first_and_a_put_repairs_a_damaged_packed_one(tmp_path):
    s, ids, contents = _packed_store(tmp_path)
    oid = ids[1]
    _flip(_packs(s)[0], s.objects._packed(oid)[1].offset)
    s = Store.open(tmp_path)
    assert not s.objects.intact(oid)
    assert s.objects.put_bytes(contents[oid]) == (oid, True)   # written loose
    assert s.objects.path(oid).is_file() and s.objects.get_bytes(oid) == contents[oid]
    rep = verify(Store.open(tmp_path), read_data=True)
    # the pack's copy is still damaged: a second copy, named
    assert [e["id"] for e in rep.errors] == [oid]


# --- P3: gc --prune packs, in the order the objects were written --------------------------------

def test_gc_packs_only_once_enough_small_objects_are_loose_and_records_it(tmp_path):
    s = Store.init(tmp_path)
    _objects(s, packed.MIN_LOOSE - 10)
    p = gc.prune(Store.open(tmp_path))
    assert p.packing.objects == 0 and _packs(s) == []
    _objects(s, 20, tag="more")
    p = gc.prune(Store.open(tmp_path))
    assert p.packing.objects == packed.MIN_LOOSE + 10
    last = json.loads(s.journal.path.read_bytes().splitlines()[-1])
    assert last["kind"] == "gc" and last["payload"]["objects_packed"] == packed.MIN_LOOSE + 10
    assert last["payload"]["object_packs_written"] == 1
    assert verify(Store.open(tmp_path), full=True).ok


def test_large_chunked_and_damaged_objects_stay_loose(tmp_path):
    s = Store.init(tmp_path)
    ids = _objects(s)
    with s.transaction("t") as tx:
        big, _ = s.objects.put_bytes(os.urandom(packed.MAX_STORED + 1))
        tx.payload["big"] = big
    bad = ids[1]
    path = s.objects.path(bad)
    os.chmod(path, 0o644)
    path.write_bytes(b"not its bytes")
    gc.prune(Store.open(tmp_path))
    s = Store.open(tmp_path)
    assert s.objects.path(big).is_file() and s.objects.path(bad).is_file()
    assert s.objects._packed(big) is None and s.objects._packed(bad) is None
    assert all(s.objects.packed_only(o) for o in ids if o != bad)


@pytest.mark.parametrize("slice_", [packing.SLICE, 64])
def test_packs_hold_objects_in_the_order_they_were_written(tmp_path, monkeypatch, slice_):
    """In slices of fan-out directories (bounded memory, however many are loose), each slice's
    pack in the order its objects were written."""
    monkeypatch.setattr(packing, "SLICE", slice_)
    monkeypatch.setattr(packed, "MIN_LOOSE", 10)
    s = Store.init(tmp_path)
    ids = _objects(s)
    for i, oid in enumerate(ids):   # mtimes in the order written, whatever the clock's grain
        for p in (s.objects.path(oid), s.objects.zpath(oid)):
            if p.exists():
                os.utime(p, ns=(10**18 + i, 10**18 + i), follow_symlinks=False)
    gc.prune(Store.open(tmp_path))
    s = Store.open(tmp_path)
    assert all(s.objects.packed_only(o) for o in ids)
    assert (len(_packs(s)) == 1) == (slice_ > N)
    by_pack: dict = {}
    for o in ids:
        pack, loc = s.objects._packed(o)
        by_pack.setdefault(pack.name, []).append(loc.offset)
    assert all(offsets == sorted(offsets) for offsets in by_pack.values())


def _gc_in_child(root: Path, env: dict) -> subprocess.CompletedProcess:
    code = "import sys; from ledger.store import Store, gc; gc.prune(Store.open(sys.argv[1]))"
    return subprocess.run([sys.executable, "-c", code, str(root)], env={**os.environ, **env},
                          capture_output=True, text=True, timeout=120)


def test_a_crash_at_every_point_of_packing_leaves_every_object_readable(tmp_path):
    base = tmp_path / "base"
    s = Store.init(base)
    ids = _objects(s)
    contents = {o: s.objects.get_bytes(o) for o in ids}
    trace = tmp_path / "trace"
    probe = tmp_path / "probe"
    subprocess.run(["cp", "-a", str(base), str(probe)], check=True)
    assert _gc_in_child(probe, {"LEDGER_FAULT_TRACE": str(trace)}).returncode == 0
    points = [line.split() for line in trace.read_text().splitlines()]
    ours = [int(n) for n, name in points if name.startswith("packed.")]
    assert len(ours) >= 3
    for n in ours:
        work = tmp_path / f"w{n}"
        subprocess.run(["cp", "-a", str(base), str(work)], check=True)
        r = _gc_in_child(work, {"LEDGER_FAULT_AT": str(n)})
        assert r.returncode == -9, (n, r.stderr)
        s2 = Store.open(work)
        for oid in ids:
            assert s2.objects.get_bytes(oid) == contents[oid], (n, oid)
        assert verify(s2, read_data=True).ok, n
        # a second gc finishes the job: every object in one place or the other, readable
        gc.prune(Store.open(work))
        s3 = Store.open(work)
        assert all(s3.objects.get_bytes(o) == contents[o] for o in ids)
        assert not [p for p in (work / ".ledger" / "tmp").iterdir() if p.is_file()]


# --- P4: what gc removes goes from its pack too; many packs are merged ---------------------------

def test_an_unreachable_packed_object_is_listed_and_its_pack_rewritten_without_it(tmp_path):
    s = Store.init(tmp_path)
    ids = _objects(s)
    junk = [s.objects.put_bytes(f"junk {i}".encode() * 10)[0] for i in range(3)]
    # pack the junk too: a crash's leftovers packed by an older gc are the same thing
    w = packing.Writer(s.root)
    for o in junk:
        w.add(bytes.fromhex(o[3:]), s.objects.get_bytes(o), packed.WHOLE)
    w.finish()
    for o in junk:
        s.objects.remove(o)
    s = Store.open(tmp_path)
    assert all(s.objects.packed_only(o) for o in junk)
    plan = gc.plan(s)
    assert {o for o, _ in plan.unreachable} == set(junk)
    p = gc.prune(Store.open(tmp_path))
    assert p.packing.replaced == 1
    s = Store.open(tmp_path)
    assert not any(s.objects.has(o) for o in junk)
    assert all(s.objects.has(o) for o in ids)
    assert gc.plan(s).unreachable == ()
    assert verify(s, read_data=True).ok


def test_more_than_max_packs_are_merged_into_one(tmp_path, monkeypatch):
    monkeypatch.setattr(packed, "MIN_LOOSE", 5)
    monkeypatch.setattr(packed, "MAX_PACKS", 3)
    s = Store.init(tmp_path)
    every = []
    for r in range(4):
        every += _objects(s, 10, tag=f"r{r}")
        p = gc.prune(Store.open(tmp_path))
    assert p.packing.replaced == 4 and p.packing.written == 2 and len(_packs(s)) == 1   # the new one merged too
    s = Store.open(tmp_path)
    assert all(s.objects.packed_only(o) and s.objects.intact(o) for o in every)


def test_a_damaged_entry_stops_a_rewrite_before_any_pack_is_removed(tmp_path, monkeypatch):
    monkeypatch.setattr(packed, "MIN_LOOSE", 5)
    monkeypatch.setattr(packed, "MAX_PACKS", 1)
    s = Store.init(tmp_path)
    first = _objects(s, 10, tag="a")
    gc.prune(Store.open(tmp_path))
    pack = _packs(s)[0]
    _flip(pack, Store.open(tmp_path).objects._packed(first[1])[1].offset)
    second = _objects(s, 10, tag="b")
    with pytest.raises(CorruptObject, match=first[1]):
        gc.prune(Store.open(tmp_path))   # packs the new ones, then the merge meets the damage
    assert pack in _packs(s) and len(_packs(s)) == 2
    s = Store.open(tmp_path)
    assert all(s.objects.intact(o) for o in second + first[2:])
    assert not [p for p in (s.root / "tmp").iterdir() if p.is_file()]


# --- P7: a reader finds what a gc packed after the reader looked ---------------------------------

def test_a_reader_that_listed_the_packs_before_a_gc_finds_what_it_packed(tmp_path):
    s = Store.init(tmp_path)
    ids = _objects(s)
    reader = Store.open(tmp_path)
    assert not reader.objects.has(hash_bytes(b"absent"))   # a miss lists the packs: none yet
    assert reader.objects.packed.listed == frozenset()
    gc.prune(Store.open(tmp_path))
    assert reader.objects.get_bytes(ids[1]) == Store.open(tmp_path).objects.get_bytes(ids[1])


# --- verify counts a packed store as it counted the loose one -----------------------------------

def test_verify_full_counts_a_packed_store_as_the_loose_one_and_names_dangling_ones(tmp_path):
    s = Store.init(tmp_path)
    _objects(s)
    before = verify(Store.open(tmp_path), full=True)
    gc.prune(Store.open(tmp_path))
    after = verify(Store.open(tmp_path), full=True)
    assert after.ok and after.stats["objects"] == before.stats["objects"]
    assert after.stats["bytes"] == before.stats["bytes"]
    s = Store.open(tmp_path)
    w = packing.Writer(s.root)
    junk = b"nobody names this"
    w.add(bytes.fromhex(hash_bytes(junk)[3:]), junk, packed.WHOLE)
    w.finish()
    rep = verify(Store.open(tmp_path), full=True)
    assert rep.ok and rep.stats["objects"] == before.stats["objects"] + 1
    assert [i for i in rep.info if i["what"] == "dangling"][0]["ids"] == [hash_bytes(junk)]


def test_table_parts_read_every_entry_and_unsound_names_unsorted_pieces(tmp_path, monkeypatch):
    monkeypatch.setattr(packing, "_PART", 7)   # pieces smaller than the table: the order across them is checked
    s, ids, _ = _packed_store(tmp_path)
    p = s.objects.packed.all()[0]
    got, before = [], None
    for part in packing.table_parts(p):
        assert packing.unsound(p, part, before) is None
        before = part.digest(len(part.keys) - 1)
        got += [part.digest(j) for j in range(len(part.keys))]
    assert got == sorted(bytes.fromhex(o[3:]) for o in ids)
    parts = list(packing.table_parts(p))
    assert packing.unsound(p, parts[1], parts[2].digest(0)) == "its entries are not sorted by digest"


def test_a_loose_copy_of_a_packed_object_goes_only_if_the_packed_one_is_intact(tmp_path):
    s, ids, contents = _packed_store(tmp_path)
    pack = _packs(s)[0]
    a, b = ids[1], ids[2]
    for o in (a, b):   # loose copies again (as an image's spawn writes them)
        Store.open(tmp_path).objects.loosen(o)
    _flip(pack, Store.open(tmp_path).objects._packed(b)[1].offset)   # b's packed copy damaged
    more = _objects(Store.open(tmp_path), N, tag="more")   # enough loose objects to pack again
    gc.prune(Store.open(tmp_path))
    s = Store.open(tmp_path)
    assert not s.objects.path(a).exists()            # the pack's copy is intact: the loose one went
    assert s.objects.path(b).is_file()               # the loose copy is the good one: kept
    assert s.objects.get_bytes(b) == contents[b] and s.objects.get_bytes(a) == contents[a]
    assert all(s.objects.packed_only(o) for o in more)
    # b's damaged copy went with a rewrite of its pack: nothing damaged is left, b is kept loose
    assert pack not in _packs(s) and len(_packs(s)) == 2
    assert s.objects._packed(b) is None and s.objects.path(b).is_file()
    assert verify(Store.open(tmp_path), read_data=True).ok


def _forget_gc_state(s: Store) -> None:
    from ledger.store import gcstate
    for name in gcstate.STATE, gcstate.SEAL:
        s.root.joinpath(*name).unlink(missing_ok=True)


def test_the_batched_lookups_of_a_long_pass_answer_as_the_plain_ones(tmp_path, monkeypatch):
    """verify's journal pass and gc's walk find a batch's packed objects in one lookup once a long
    pass is under way (packing.Reader.batch); the answers are those of the object-by-object path:
    a tree reached only through packed objects, a damaged compressed entry, a loose second copy,
    a missing object."""
    s = Store.init(tmp_path)
    ids = _objects(s)
    leaf = s.objects.put_bytes(b"leaf only a packed tree names" * 3)[0]
    tree = s.objects.put_bytes(canonical.dumps({"kind": "tree", "child": leaf, "pad": "t" * 600}))[0]
    with s.transaction("t") as tx:
        tx.payload["tree"] = tree
        tx.payload["gone"] = hash_bytes(b"never stored")
    gc.prune(Store.open(tmp_path))
    s = Store.open(tmp_path)
    assert s.objects.packed_only(tree) and s.objects.packed_only(leaf)
    Store.open(tmp_path).objects.loosen(ids[4])                        # a loose second copy
    _flip(_packs(s)[0], Store.open(tmp_path).objects._packed(ids[3])[1].offset + 20)   # compressed: damaged

    def answers():
        _forget_gc_state(Store.open(tmp_path))
        rep = verify(Store.open(tmp_path), full=True)
        plan = gc.plan(Store.open(tmp_path))
        return (sorted((e["what"], e["id"]) for e in rep.errors), rep.stats["objects"], rep.stats["bytes"],
                plan.unreachable, plan.reachable)

    monkeypatch.setattr(packing, "LOOSE_AFTER", 10**9)
    plain = answers()
    monkeypatch.setattr(packing, "LOOSE_AFTER", 0)
    calls = []
    real = packing.Reader.resolve
    monkeypatch.setattr(packing.Reader, "resolve", lambda self, oids: calls.append(len(oids)) or real(self, oids))
    assert answers() == plain
    assert sum(calls) > N   # the batched path ran, for verify and for gc
    assert ("corrupt", ids[3]) in plain[0] and ("missing", hash_bytes(b"never stored")) in plain[0]
    assert plain[3] == ()   # the leaf is reached through the packed tree


def test_gcs_walk_of_turn_batch_runs_reaches_through_packed_objects(tmp_path, monkeypatch):
    """gc's walk takes runs of turn-batch lines (each_run) and finds a run's packed objects in one
    lookup: what they name is reached exactly as the object-by-object path reaches it."""
    from ledger.store import blockcheck, journal
    from tests.store.test_blockcheck import _block

    monkeypatch.setattr(blockcheck, "MIN_LINES", 256)
    monkeypatch.setattr(packing, "LOOSE_AFTER", 0)
    s = Store.init(tmp_path)
    recs = [journal.make_record(1, None, "init", [], [], "root@vm", {"format": 2})]
    leaves, first = [], 1
    for seq in range(2, 1200):
        leaf = None
        if seq % 5 == 0:   # a batch whose turn names another object (an attachment)
            leaf = s.objects.put_bytes(f"attachment {seq}".encode() * 4)[0]
            leaves.append(leaf)
        batch = canonical.dumps({"kind": "turns", "first": first,
                                 "turns": [{"id": f"t{first}", "situation": f"see {leaf}" if leaf else "x"}]})
        oid = s.objects.put_bytes(batch)[0]
        payload = {"count": 1, "counters": {"turns": 1}, "first": first, "objects": [[oid, len(batch), "turns"]],
                   "turns": oid}
        recs.append(journal.make_record(seq, recs[-1]["id"], "record", [], [oid], "image", payload))
        first += 1
    s.journal.path.write_bytes(_block([canonical.dumps(r) for r in recs]))
    for cache in ("refs.json", "index.duckdb", "index.duckdb.wal"):
        (s.root / cache).unlink(missing_ok=True)
    junk = s.objects.put_bytes(b"no record reaches this" * 3)[0]
    monkeypatch.setattr(packed, "MIN_LOOSE", 10)
    gc.prune(Store(s.root))
    s = Store(s.root)
    assert all(s.objects.packed_only(o) for o in leaves)
    calls = []
    real = packing.Reader.resolve
    monkeypatch.setattr(packing.Reader, "resolve", lambda self, oids: calls.append(len(oids)) or real(self, oids))
    _forget_gc_state(s)
    plan = gc.plan(Store(s.root))
    assert calls and plan.unreachable == () and not s.objects.has(junk)
    assert plan.reachable == len(recs) - 1 + len(leaves)


def test_a_compressed_file_packed_between_the_look_and_the_read_is_read_from_its_pack(tmp_path, monkeypatch):
    """A lockless reader (push, say) saw the `.z` file, then a gc packed it and removed the file:
    the read finds it in the pack (durable before the file went), never MissingObject."""
    s, ids, contents = _packed_store(tmp_path)
    oid = ids[0]
    assert s.objects._packed(oid)[1].form == packed.COMPRESSED
    monkeypatch.setattr(type(s.objects), "compressed", lambda self, o: True)   # what it saw before the gc
    assert s.objects.get_bytes(oid) == contents[oid]
    assert s.objects.size(oid) == len(contents[oid])
    assert s.objects.structure(oid) == contents[oid]


# --- hostile packs (helper-47's findings, each a regression test) --------------------------------

def _craft(path: Path, entries: list, *, sort: bool = True) -> None:
    """A pack file of (digest, stored bytes, form) entries, or raw table rows (48-byte bytes)."""
    data, rows = bytearray(packed.MAGIC), []
    for e in entries:
        if isinstance(e, bytes):
            rows.append(e)
            continue
        digest, stored, form = e
        rows.append(packed.ENTRY.pack(digest, len(data), len(stored), form))
        data += stored
    if sort:
        rows.sort()
    path.parent.mkdir(exist_ok=True)
    path.write_bytes(bytes(data) + b"".join(rows) + packed.FOOT.pack(len(rows), packed.FOOT_MAGIC))


def test_more_packs_than_a_store_makes_is_a_typed_error_not_exhausted_descriptors(tmp_path, monkeypatch):
    from ledger.errors import StoreCorrupt
    monkeypatch.setattr(packed, "MAX_FILES", 3)
    s, ids, _ = _packed_store(tmp_path)
    for i in range(4):
        _craft(s.root / packed.DIR / f"{i:032x}.pack", [])
    with pytest.raises(StoreCorrupt, match="more than the 3"):
        Store.open(tmp_path).objects.get_bytes(ids[0])


def test_a_sparse_planted_table_is_never_listed_or_rewritten_by_gc(tmp_path):
    s, ids, _ = _packed_store(tmp_path)
    zero = bytes(packed.ENTRY.size)
    _craft(s.root / packed.DIR / ("0" * 32 + ".pack"), [zero] * 5000)   # 5000 equal entries: not sorted
    s = Store.open(tmp_path)
    assert gc.plan(s).unreachable == ()
    p = gc.prune(Store.open(tmp_path))
    assert p.unreachable == () and (s.root / packed.DIR / ("0" * 32 + ".pack")).exists()
    rep = verify(Store.open(tmp_path), full=True)
    assert any("not sorted" in e["message"] for e in rep.errors)


def test_a_link_in_a_packed_objects_place_is_never_granted(tmp_path):
    s, ids, _ = _packed_store(tmp_path)
    oid = ids[0]
    s.objects.zpath(oid).parent.mkdir(parents=True, exist_ok=True)
    s.objects.zpath(oid).symlink_to(_packs(s)[0])
    s = Store.open(tmp_path)
    with pytest.raises(CorruptObject, match="symbolic link"):
        s.objects.loosen(oid)
    with pytest.raises(CorruptObject, match="symbolic link"):
        s.objects.files(oid)


def test_a_fifo_for_the_keeper_lock_refuses_packing_at_once(tmp_path):
    from ledger.image import protocol
    s = Store.init(tmp_path)
    protocol.run_dir(s.root).mkdir()
    os.mkfifo(protocol.run_dir(s.root) / "keeper.lock")
    assert "not a regular file" in protocol.keeper_serving(s.root)   # returns: no blocking open


def test_a_damaged_copy_in_one_pack_does_not_hide_the_intact_one_in_another(tmp_path):
    s = Store.init(tmp_path)
    _objects(s)
    leaf = s.objects.put_bytes(b"the child of the tree" * 5)[0]
    tree = s.objects.put_bytes(canonical.dumps({"kind": "tree", "child": leaf}))[0]
    with s.transaction("t") as tx:
        tx.payload["tree"] = tree
    gc.prune(Store.open(tmp_path))
    data = Store.open(tmp_path).objects.get_bytes(tree)
    # a damaged copy of the tree in a pack that sorts first (a crash's second copy, rotted)
    _craft(s.root / packed.DIR / ("0" * 32 + ".pack"), [(bytes.fromhex(tree[3:]), b"X" + data[1:], packed.WHOLE)])
    s = Store.open(tmp_path)
    assert s.objects.get_bytes(tree) == data
    _forget_gc_state(s)
    assert gc.plan(Store.open(tmp_path)).unreachable == ()
    gc.prune(Store.open(tmp_path))
    assert Store.open(tmp_path).objects.get_bytes(leaf)


def test_after_the_advised_repair_gc_drops_the_damaged_copy_and_verify_is_clean(tmp_path):
    s, ids, contents = _packed_store(tmp_path)
    oid = ids[1]
    _flip(_packs(s)[0], s.objects._packed(oid)[1].offset)
    Store.open(tmp_path).objects.put_bytes(contents[oid])   # the repair: a loose copy
    gc.prune(Store.open(tmp_path))
    rep = verify(Store.open(tmp_path), read_data=True)
    assert rep.ok, rep.errors
    assert Store.open(tmp_path).objects.get_bytes(oid) == contents[oid]


def test_a_misplaced_entry_does_not_hide_damaged_ones_from_read_data(tmp_path):
    s, ids, _ = _packed_store(tmp_path)
    pack = _packs(s)[0]
    p = s.objects.packed.all()[0]
    damaged = [o for o in ids[1:8] if s.objects._packed(o)[1].form == packed.WHOLE][:3]
    for o in damaged:
        _flip(pack, s.objects._packed(o)[1].offset)
    with open(pack, "r+b") as f:   # the table's last entry: longer than a packed object can be
        f.seek(p.table + (p.count - 1) * packed.ENTRY.size + 40)
        f.write((packed.MAX_STORED + 1).to_bytes(4, "big"))
    rep = verify(Store.open(tmp_path), read_data=True)
    assert set(damaged) <= {e["id"] for e in rep.errors}
    assert any("1 entry" in e["message"] and "too large" in e["message"] for e in rep.errors), rep.errors


def test_overlapping_entries_are_named_and_not_decompressed_again_and_again(tmp_path):
    s = Store.init(tmp_path)
    frame = s.objects.put_bytes(canonical.dumps({"kind": "x", "pad": "z" * 5000}), compressed=True)[0]
    raw = s.objects.zpath(frame).read_bytes()
    rows = [packed.ENTRY.pack(bytes([i]) * 32, len(packed.MAGIC), len(raw), packed.COMPRESSED) for i in range(1, 200)]
    path = s.root / packed.DIR / ("0" * 32 + ".pack")
    path.parent.mkdir()
    path.write_bytes(packed.MAGIC + raw + b"".join(rows) + packed.FOOT.pack(len(rows), packed.FOOT_MAGIC))
    rep = verify(Store.open(tmp_path), read_data=True)
    assert any("overlap" in e["message"] for e in rep.errors)
    assert not any(e["what"] == "corrupt" and e["id"] for e in rep.errors)   # no entry judged: none decompressed


def test_export_and_stream_find_an_object_packed_after_they_looked(tmp_path, monkeypatch):
    s, ids, contents = _packed_store(tmp_path)
    monkeypatch.setattr(type(s.objects), "packed_only", lambda self, o: False)   # what they saw before the gc
    out = tmp_path / "out"
    s.objects.export_file(ids[1], out)
    assert out.read_bytes() == contents[ids[1]]
    assert b"".join(bytes(b) for b in s.objects.stream(ids[2])) == contents[ids[2]]


def test_a_repeated_digest_does_not_hide_an_ambiguous_prefix_and_odd_names_are_foreign(tmp_path):
    from ledger.errors import AmbiguousRef
    s, ids, _ = _packed_store(tmp_path)
    a = ids[1]
    twin = bytes.fromhex(a[3:19] + "f" * 48)   # shares a's first 16 hex digits
    _craft(s.root / packed.DIR / ("0" * 32 + ".pack"), [(bytes.fromhex(a[3:]), b"x", 0)] * 2 + [(twin, b"y", 0)])
    with pytest.raises(AmbiguousRef):
        Store.open(tmp_path).objects.resolve_prefix(a[:19])
    (s.root / packed.DIR / ("1" * 32 + ".pack\n")).write_bytes(b"")
    rep = verify(Store.open(tmp_path), full=True)
    assert any(e["what"] == "foreign-file" and ".pack\n" in e["message"] for e in rep.errors)
