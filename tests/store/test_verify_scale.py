"""`verify --full` at scale (issue 18): memory that does not grow with records or distinct objects
beyond a fixed-size key each, the ids read off a record's bytes exactly as find_ids reads them off
the parsed payload, and the object checks that moved from one pass over everything into the
journal's stream (docs/store-format.md, rule 20)."""

from __future__ import annotations

import os
import tracemalloc

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ledger.store import Store, canonical, journal
from ledger.store import verify as V
from ledger.store.ids import find_ids, hash_bytes
from ledger.store.journal import make_record, parse_line, record_id

SMALL, LARGE = 1000, 4000


def _put(s: Store, obj: dict) -> tuple[str, int]:
    data = canonical.dumps(obj)
    oid = hash_bytes(data)
    path = s.objects.path(oid)
    path.parent.mkdir(exist_ok=True)
    path.write_bytes(data)
    os.chmod(path, 0o444)
    return oid, len(data)


def _append(s: Store, payloads_outputs) -> None:
    """Records written straight to the journal (real format and hash chain, as
    benchmarks/bench_scale.py builds its stores)."""
    st_ = s.state
    seq, prev = st_.seq, st_.head
    with open(s.journal.path, "ab") as f:
        for kind, payload, outputs in payloads_outputs:
            seq += 1
            body = {"seq": seq, "prev": prev, "time": "2026-12-01T00:00:00.000000Z", "kind": kind,
                    "inputs": [], "outputs": outputs, "actor": "t@h", "payload": payload}
            body["id"] = record_id(body)
            f.write(canonical.dumps(body) + b"\n")
            prev = body["id"]


def _turn_batches(s: Store, n: int, first: int = 1):
    for i in range(first, first + n):
        oid, size = _put(s, {"kind": "turns", "first": i, "turns": [
            {"id": f"t{i}", "situation": f"user: question {i} " + "x" * 200, "action": f"a{i}", "refusal": False}]})
        yield "record", {"count": 1, "counters": {"turns": 1}, "first": i, "objects": [[oid, size, "turns"]],
                         "turns": oid}, [oid]


@pytest.fixture(scope="module")
def stores(tmp_path_factory):
    out = {}
    for n in (SMALL, LARGE):
        s = Store.init(tmp_path_factory.mktemp(f"n{n}"))
        _append(s, _turn_batches(s, n))
        out[n] = Store.open(s.root)
    return out


@pytest.fixture
def small_batches(monkeypatch):
    """Read blocks, object batches and caches smaller than these stores (at scale they are
    constants: 8 MiB of journal, 256 records, 4096 sizes and kinds, 4096 keys in a set), so what is left to grow is what
    grows with history."""
    monkeypatch.setattr(journal, "SCAN_BLOCK", 64 << 10)
    monkeypatch.setattr(V, "_BATCH", 64)
    monkeypatch.setattr(V, "_KINDS_CACHE", 64)
    monkeypatch.setattr(V, "_SET_MAX", 64)


def _peak(root) -> int:
    tracemalloc.start()
    try:
        tracemalloc.reset_peak()
        rep = V.verify(Store.open(root), full=True)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert rep.ok and rep.stats["objects"] >= SMALL
    return peak


def test_full_verify_memory_grows_by_a_key_per_distinct_object(stores, small_batches):
    """Every record names a fresh object: 3,000 more of them may add a fixed-size key each (8 bytes,
    and a run merge's temporaries), never what a set or dict of id strings costs (~150-250 bytes an
    id: the 1,266 MiB measured at a million records)."""
    for n in (LARGE, SMALL):  # untraced first: what a first run grows once (interned strings, caches)
        assert V.verify(Store.open(stores[n].root), full=True).ok
    # the smaller of two equal runs: a one-time resize of some interpreter table (seen once in ten
    # runs, ~2 MB in one block) is not what verify holds
    small = min(_peak(stores[SMALL].root), _peak(stores[SMALL].root))
    large = min(_peak(stores[LARGE].root), _peak(stores[LARGE].root))
    grow = (large - small) / (LARGE - SMALL)
    assert grow < 64, f"verify --full holds {grow:.0f} bytes per distinct object ({small} -> {large} bytes)"


def test_every_object_of_a_large_store_is_reached_across_batches(stores, small_batches):
    """Batched 64 records at a time, every turns object is still reached (none dangling) and counted."""
    rep = V.verify(Store.open(stores[LARGE].root), full=True)
    assert rep.ok and rep.stats["checked"] == LARGE + 1 and rep.stats["objects"] >= LARGE
    assert not [i for i in rep.info if i["what"] == "dangling"]


def test_missing_objects_are_found_across_batches(tmp_path, small_batches):
    s = Store.init(tmp_path)
    _append(s, _turn_batches(s, 600))
    s = Store.open(s.root)
    gone = []
    for rec in s.journal.records()[100:600:150]:
        oid = rec["outputs"][0]
        s.objects.path(oid).unlink()
        gone.append(oid)
    rep = V.verify(s, full=True)
    assert sorted(e["id"] for e in rep.errors if e["what"] == "missing") == sorted(gone)
    assert all(e["what"] == "missing" for e in rep.errors)


def test_a_size_recorded_twice_is_checked_both_times(tmp_path):
    """A later record naming an object again with another size: the object has one size, so one
    of the two records is wrong (the old pass compared only the last size recorded)."""
    s = Store.init(tmp_path)
    with s.transaction("add") as tx:
        oid = tx.put_bytes(b"hello world")
    _append(s, [("add", {"objects": [[oid, 12, "blob"]]}, [oid])])
    rep = V.verify(Store.open(s.root), full=True)
    bad = [e for e in rep.errors if e["what"] == "corrupt"]
    assert len(bad) == 1 and bad[0]["id"] == oid and "12 were written" in bad[0]["message"]


def test_an_id_inside_a_structured_object_must_be_present(tmp_path):
    """The closure through structured objects is still walked: an object named only inside another
    (two levels down, in a later batch than its parent's record) that is missing is reported."""
    s = Store.init(tmp_path)
    leaf, _ = _put(s, {"kind": "leaf", "n": 1})
    mid, _ = _put(s, {"kind": "mid", "child": leaf})
    top, size = _put(s, {"kind": "top", "child": mid})
    _append(s, [("add", {"objects": [[top, size, "top"]]}, [top])])
    assert V.verify(Store.open(s.root), full=True).ok
    s.objects.path(leaf).unlink()
    rep = V.verify(Store.open(s.root), full=True)
    assert [(e["what"], e["id"]) for e in rep.errors] == [("missing", leaf)]


def test_an_escaped_id_inside_an_object_is_followed(tmp_path):
    """An object whose id spells itself with a JSON escape (\\u0062 for "b") holds a reference the
    structured reader sees: the shortcut that skips objects without "b3:" in their bytes must not
    skip it."""
    s = Store.init(tmp_path)
    leaf, _ = _put(s, {"kind": "leaf"})
    data = b'{"child":"\\u0062' + leaf[1:].encode() + b'","kind":"odd"}'
    oid = hash_bytes(data)
    p = s.objects.path(oid)
    p.parent.mkdir(exist_ok=True)
    p.write_bytes(data)
    _append(s, [("add", {"objects": [[oid, len(data), "odd"]]}, [oid])])
    s.objects.path(leaf).unlink()
    rep = V.verify(Store.open(s.root), full=True)
    assert ("missing", leaf) in [(e["what"], e["id"]) for e in rep.errors]


def test_dangling_and_damaged_files_are_still_judged_by_the_listing(tmp_path):
    s = Store.init(tmp_path)
    with s.transaction("add") as tx:
        kept = tx.put_bytes(b"kept")
    dangling, _ = _put(s, {"kind": "nobody-names-me"})
    fifo_hex = "ab" * 32
    (s.root / "objects" / fifo_hex[:2]).mkdir(exist_ok=True)
    os.mkfifo(s.root / "objects" / fifo_hex[:2] / fifo_hex[2:])
    (s.root / "objects" / kept[3:5] / "not-an-object").write_bytes(b"x")
    rep = V.verify(Store.open(s.root), full=True)
    whats = sorted((e["what"], e.get("id")) for e in rep.errors)
    assert ("corrupt", "b3:" + fifo_hex) in whats and ("foreign-file", None) in whats
    info = [i for i in rep.info if i["what"] == "dangling"]
    assert info and dangling in info[0]["ids"] and kept not in info[0]["ids"]


# --- ids off the bytes ---------------------------------------------------------------------------
_ID = st.text("0123456789abcdef", min_size=64, max_size=64).map(lambda h: "b3:" + h)
_TEXT = st.one_of(_ID, st.text(max_size=8), _ID.map(lambda i: "\b" + i[1:]), _ID.map(lambda i: "x" + i + "\\"),
                  _ID.map(lambda i: i + '"'))
_KEY = st.one_of(st.sampled_from(["a", "suite_hash", "digest", "source_hash", "x\\y", "q\"", "b3"]), _ID, st.text(max_size=4))
_JSON = st.recursive(st.one_of(st.none(), st.booleans(), st.integers(-5, 5), _TEXT),
                     lambda kids: st.one_of(st.lists(kids, max_size=3), st.dictionaries(_KEY, kids, max_size=3)),
                     max_leaves=12)


@settings(max_examples=300, deadline=None)
@given(payload=st.dictionaries(_KEY, _JSON, max_size=4), outputs=st.lists(_ID, max_size=2),
       actor=_TEXT, kind=_TEXT)
def test_ids_read_off_the_line_are_find_ids_of_the_record(payload, outputs, actor, kind):
    rec = make_record(7, None, kind, [], outputs, actor, payload)
    line = canonical.dumps(rec)
    parsed = parse_line(line)
    assert V._ids_of(parsed, line) == set(outputs) | find_ids(payload)


def test_the_journal_line_hash_is_the_record_id(tmp_path):
    """parse_line hashes the line's bytes without the id member: the same id make_record gives."""
    rec = make_record(1, None, "add", [], [], "a\"ctor,\"id\":\"", {"x": 'v,"id":"b3:' + "0" * 64})
    assert parse_line(canonical.dumps(rec))["id"] == rec["id"]
    bad = canonical.dumps({**rec, "actor": "other"})
    with pytest.raises(Exception, match="does not hash"):
        parse_line(bad)
