"""The recorded chunk list (docs/store-format.md C12): a record that writes a chunked object names
its chunk list's digest, so `verify --read-data` hashes each byte once (the whole against the id)
and proves the chunks' names by the list; where nothing is recorded, or the records or the index
disagree, it hashes the whole and every chunk by name, and says so. Planted chunks, pages and
indexes fail either way."""

import os
import random

import pytest

from ledger.store import Store, chunks, objects, repack, schema
from ledger.store.verify import verify
from tests.store.test_chunks import _add, _forge_page, flip_a_chunk_byte
from tests.store.test_repack import _setup

MIB = 1 << 20


@pytest.fixture
def small(store):
    store.objects.chunked_min = 1 * MIB  # small files exercise the chunked path quickly
    return store


@pytest.fixture
def named(monkeypatch):
    """How many chunks verify rehashed against their names."""
    seen = []
    real = objects._names_match

    def counting(view, start, part):
        seen.append(len(part))
        return real(view, start, part)
    monkeypatch.setattr(objects, "_names_match", counting)
    return seen


def _file(tmp_path, name="f", size=4 * MIB, seed=1):
    p = tmp_path / name
    p.write_bytes(random.Random(seed).randbytes(size))
    return p


def _recorded(store, oid):
    """The digests the journal's records give `oid` in payload.chunk_lists."""
    out = []
    for rec in store.journal.backwards(strict=False):
        for o, d in rec["payload"].get("chunk_lists", []):
            if o == oid:
                out.append(d)
    return out


def _read_data(root):
    """verify --read-data from a fresh process's view (nothing remembered by the writer)."""
    return verify(Store.open(root), read_data=True)


def test_an_add_records_its_chunk_list_and_read_data_hashes_each_byte_once(small, tmp_path, named):
    oid = _add(small, _file(tmp_path))
    fresh = Store.open(small.root)
    assert _recorded(small, oid) == [chunks.list_digest(fresh.objects.chunk_entries(oid))]
    rep = verify(fresh, read_data=True)
    assert rep.ok, rep.errors
    assert rep.stats["chunked_hashed"] == {"list": 1, "names": 0, "other-list": 0}
    assert named == []                                       # no chunk was hashed a second time
    assert not any(i["what"] == "chunk-list" for i in rep.info)
    # the object store's own answer for the recorded digest: one hash, intact
    assert fresh.objects.check_data(oid, _recorded(small, oid)[0]) == (True, "list")


def test_a_planted_chunk_fails(small, tmp_path):
    """Bytes of one chunk flipped in its pack: the one hash of the whole fails."""
    oid = _add(small, _file(tmp_path))
    flip_a_chunk_byte(small, oid)
    rep = _read_data(small.root)
    assert [e for e in rep.errors if e["id"] == oid and e["what"] == "corrupt"], rep.errors
    assert rep.stats["chunked_hashed"]["list"] == 1          # the fast path ran, and caught it


def test_a_planted_page_fails(small, tmp_path, named):
    """A page naming a chunk by a wrong digest over the right bytes (the whole still hashes to
    the id): the list no longer hashes to the recorded digest, so every chunk is hashed by name."""
    oid = _add(small, _file(tmp_path))

    def rename_third(entries):
        d, loc = entries[3]
        return entries[:3] + [(bytes(32), loc)] + entries[4:]
    _forge_page(small, oid, rename_third)
    rep = _read_data(small.root)
    assert [e for e in rep.errors if e["id"] == oid and e["what"] == "corrupt"], rep.errors
    assert rep.stats["chunked_hashed"]["other-list"] == 1 and named


def test_a_planted_index_fails(small, tmp_path):
    """The index replaced by another object's (same size, pages and chunks that all verify):
    its list is not the recorded one, and its whole does not hash to this id."""
    a = _add(small, _file(tmp_path, "a", seed=1))
    b = _add(small, _file(tmp_path, "b", seed=2))
    pa, pb = small.objects.index_path(a), small.objects.index_path(b)
    os.chmod(pa, 0o644)
    pa.write_bytes(pb.read_bytes())
    rep = _read_data(small.root)
    assert [e for e in rep.errors if e["id"] == a and e["what"] == "corrupt"], rep.errors
    assert not [e for e in rep.errors if e["id"] == b]
    assert rep.stats["chunked_hashed"] == {"list": 1, "names": 0, "other-list": 1}


def test_an_index_repaged_over_the_same_chunks_is_a_warning_not_damage(small, tmp_path):
    """An index whose pages were rewritten (the first page split in two, in packs of its own) over
    the same chunks, in the same order: the list is the recorded one, nothing is damaged. And one
    whose list differs but whose chunks and whole are right (a chunk's bytes named by its own
    digest, but split in two chunks) is intact, with a warning naming the record."""
    oid = _add(small, _file(tmp_path))
    _forge_page(small, oid, lambda entries: entries)        # same entries, a new page elsewhere
    rep = _read_data(small.root)
    assert rep.ok and rep.stats["chunked_hashed"]["list"] == 1, rep.errors
    assert not rep.warnings

    fresh = Store.open(small.root)

    def split_first(entries):
        d, (p, off, n) = entries[0]
        view = fresh.objects.packs.read((p, off, n), d, oid)
        h = n // 2
        return [(chunks.blake3.blake3(view[:h]).digest(), (p, off, h)),
                (chunks.blake3.blake3(view[h:]).digest(), (p, off + h, n - h))] + entries[1:]
    _forge_page(fresh, oid, split_first)
    rep = _read_data(small.root)
    assert rep.ok, rep.errors
    assert rep.stats["chunked_hashed"]["other-list"] == 1
    seq = [r for r in Store.open(small.root).journal.backwards(strict=False) if r["kind"] == "add"][0]["seq"]
    assert [w for w in rep.warnings if w["what"] == "chunk-list" and w["id"] == oid and w["seq"] == seq]


def test_an_object_without_a_recorded_list_is_hashed_twice_and_said_so(small, tmp_path, named):
    """An object whose record carries no chunk list (written before C12: stored by one process,
    recorded by another that never saw its index written nor checked it): the whole and every
    chunk by name, and verify's info says how many; a planted page still fails."""
    src = _file(tmp_path)
    with small.locked():
        oid, _, _ = small.objects.put_file(src)
    other = Store.open(small.root)
    with other.transaction("add") as tx:
        tx.record_object(oid, "blob")
        tx.outputs.append(oid)
    assert _recorded(other, oid) == []
    rep = _read_data(small.root)
    assert rep.ok and rep.stats["chunked_hashed"] == {"list": 0, "names": 1, "other-list": 0}
    assert [i for i in rep.info if i["what"] == "chunk-list" and i["count"] == 1]
    assert sum(named) == len(other.objects.chunk_entries(oid))

    def rename_third(entries):
        d, loc = entries[3]
        return entries[:3] + [(bytes(32), loc)] + entries[4:]
    _forge_page(other, oid, rename_third)
    assert [e for e in _read_data(small.root).errors if e["id"] == oid]


def test_a_record_disagreeing_about_the_list_cannot_skip_the_names(small, tmp_path, named):
    """A later record naming the object with another digest (what a forger appending to the
    journal could write, with a planted page to match): the records disagree, so the names are
    hashed — the planted page is found."""
    oid = _add(small, _file(tmp_path))

    def rename_third(entries):
        d, loc = entries[3]
        return entries[:3] + [(bytes(32), loc)] + entries[4:]
    _forge_page(small, oid, rename_third)
    forged = chunks.list_digest(Store.open(small.root).objects.chunk_entries(oid))
    other = Store.open(small.root)
    with other.transaction("add") as tx:
        tx.record_object(oid, "blob")
        tx.chunk_lists[oid] = forged
        tx.outputs.append(oid)
    assert sorted(_recorded(other, oid)) != [forged]         # two digests recorded
    rep = _read_data(small.root)
    assert [e for e in rep.errors if e["id"] == oid], rep.errors
    assert rep.stats["chunked_hashed"]["names"] == 1 and named


def test_a_repack_keeps_the_recorded_list(tmp_path):
    """A repack moves chunks and rewrites pages (no record): the list, which names no pack or
    offset, is unchanged, so read-data still hashes once."""
    s, xid, _ = _setup(tmp_path / "s")
    assert _recorded(s, xid)
    before = chunks.list_digest(s.objects.chunk_entries(xid))
    p = repack.repack(s)
    assert p.packs                                            # something moved
    s2 = Store.open(s.root)
    assert chunks.list_digest(s2.objects.chunk_entries(xid)) == before == _recorded(s, xid)[0]
    rep = verify(s2, read_data=True)
    assert rep.ok and rep.stats["chunked_hashed"]["list"] == 1, rep.errors


@pytest.mark.parametrize("lists", [
    [["b3:" + "1" * 64, "0" * 64]],                           # not one of payload.objects
    [["b3:" + "a" * 64, "0" * 63]],                           # not 64 hex
    [["b3:" + "a" * 64, "0" * 64], ["b3:" + "a" * 64, "1" * 64]],   # twice
    [[["b3:" + "a" * 64], "0" * 64]],                         # an id that is not a string
    {"b3:" + "a" * 64: "0" * 64},                             # not a list
])
def test_the_envelope_refuses_ill_formed_chunk_lists(lists):
    payload = {"objects": [["b3:" + "a" * 64, 20 << 20, "blob"]], "chunk_lists": lists}
    assert "chunk_lists" in schema.envelope_problem(payload)
    assert schema.envelope_problem({**payload, "chunk_lists": [["b3:" + "a" * 64, "0" * 64]]}) is None


def test_pulled_and_imported_chunked_objects_record_their_lists(tmp_path):
    """Arrivals (C9: the whole checked against the id before install) are written as chunks by the
    receiver, whose import record carries the list: read-data hashes them once too."""
    from ledger.sharing import bundle, fetch, push
    from ledger.sharing import remote as rm
    from tests.sharing.test_chunked import BIG, _add_big

    alice, bob, carol = (Store.init(tmp_path / n) for n in ("alice", "bob", "carol"))
    v1 = _add_big(alice, random.Random(3).randbytes(BIG), "w1")
    be = rm.DirBackend(tmp_path / "remote")
    push.push(alice, be, ["w1"])
    fetch.pull(bob, be, ["w1"], namespace="alice")
    bundle.create(alice, ["w1"], tmp_path / "v1.bundle", origin="alice")
    bundle.import_bundle(carol, tmp_path / "v1.bundle")
    for s in (bob, carol):
        s = Store.open(s.root)
        assert s.objects.chunked(v1)
        assert _recorded(s, v1) == [chunks.list_digest(s.objects.chunk_entries(v1))]
        rep = verify(s, read_data=True)
        assert rep.ok and rep.stats["chunked_hashed"]["list"] == 1, rep.errors
