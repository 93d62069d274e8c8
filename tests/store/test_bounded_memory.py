"""gc, report and index rebuild stream the journal: their peak memory does not grow with the
number of records (issue 18: 2.1-2.5 GiB at a million records when each held every parsed
record). Measured with tracemalloc on synthetic stores of two lengths: what the larger store
adds per record must be a small fraction of what holding its records would cost."""

from __future__ import annotations

import os
import tracemalloc

import pytest

from ledger.report import model as reportmodel
from ledger.store import Store, canonical, gc, gcstate, index, journal, reach
from ledger.store.ids import hash_bytes
from ledger.store.journal import record_id
from ledger.store.state import Fold

SMALL, LARGE = 1000, 4000


def _append_turn_batches(s: Store, n: int) -> None:
    """n `record` records with their `turns` objects, written straight to the journal (real
    format and hash chain, as benchmarks/bench_scale.py builds its stores)."""
    st = s.state
    seq, prev, turns = st.seq, st.head, st.counters.get("turns", 0)
    with open(s.journal.path, "ab") as f:
        for _ in range(n):
            first = turns + 1
            obj = canonical.dumps({"kind": "turns", "first": first, "turns": [
                {"id": f"t{first}", "situation": f"user: question {first} " + "x" * 200, "action": f"a{first}",
                 "refusal": False}]})
            oid = hash_bytes(obj)
            path = s.objects.path(oid)
            path.parent.mkdir(exist_ok=True)
            path.write_bytes(obj)
            os.chmod(path, 0o444)
            turns += 1
            seq += 1
            body = {"seq": seq, "prev": prev, "time": "2026-12-01T00:00:00.000000Z", "kind": "record",
                    "inputs": [], "outputs": [oid], "actor": "t@h",
                    "payload": {"count": 1, "counters": {"turns": 1}, "first": first,
                                "objects": [[oid, len(obj), "turns"]], "turns": oid}}
            body["id"] = record_id(body)
            f.write(canonical.dumps(body) + b"\n")
            prev = body["id"]


@pytest.fixture(scope="module")
def stores(tmp_path_factory):
    out = {}
    for n in (SMALL, LARGE):
        s = Store.init(tmp_path_factory.mktemp(f"n{n}"))
        _append_turn_batches(s, n)
        out[n] = Store.open(s.root)
    return out


@pytest.fixture(autouse=True)
def small_blocks(monkeypatch):
    """Read blocks and batches smaller than these stores (at scale they are constants: 8 MiB of
    journal, 2^18 pending keys), so what is left to grow is what grows
    with history."""
    monkeypatch.setattr(journal, "SCAN_BLOCK", 64 << 10)
    monkeypatch.setattr(reach, "_FLUSH", 512)


def _peak(fn) -> int:
    # Run once untraced first: what the first run grows once (the interpreter's table of interned
    # strings, which pathlib fills with object file names, is resized in one block of megabytes
    # when many modules -- torch -- are loaded) is not what a second, equal run holds.
    # The smaller of two traced runs: a one-off resize of such a table can still land in the first
    # traced run (seen after a `query` ran before the measurement); what grows with history is in both.
    fn()
    peaks = []
    for _ in range(2):
        tracemalloc.start()
        try:
            tracemalloc.reset_peak()
            fn()
            peaks.append(tracemalloc.get_traced_memory()[1])
        finally:
            tracemalloc.stop()
    return min(peaks)


def _per_record(stores, make) -> float:
    small = _peak(lambda: make(Store.open(stores[SMALL].root)))
    large = _peak(lambda: make(Store.open(stores[LARGE].root)))
    return (large - small) / (LARGE - SMALL)


# A parsed record (dicts, strings, a list) costs ~1.5 KB in Python: holding them all was the bug.
PER_RECORD_MAX = 150


def _forget(s: Store) -> None:
    for name in gcstate.STATE, gcstate.SEAL:
        s.root.joinpath(*name).unlink(missing_ok=True)


def _cold_gc(s: Store) -> gc.GcPlan:
    """gc with no saved reach state: every record streamed, every object it reaches opened."""
    _forget(s)
    return gc.plan(s)


def test_gc_reachability_memory_does_not_grow_with_history(stores):
    assert _cold_gc(Store.open(stores[LARGE].root)).unreachable == ()   # every turns object is reachable
    grow = _per_record(stores, _cold_gc)
    assert grow < PER_RECORD_MAX, f"gc's reachability holds {grow:.0f} bytes per record"


def test_gc_from_its_saved_state_holds_keys_not_records(stores):
    """Rule 22: from the saved state gc holds the key arrays (8 bytes an id, three arrays at
    most in flight) and one listed batch, whatever the history."""
    for n in (SMALL, LARGE):
        _cold_gc(Store.open(stores[n].root))
    s = Store.open(stores[LARGE].root)
    p = gc.plan(s)
    assert p.unreachable == () and not s.warnings
    grow = _per_record(stores, gc.plan)
    assert grow < 40, f"gc from its saved state holds {grow:.0f} bytes per record"


def _cold_report(s: Store) -> reportmodel.Report:
    """The report with no saved state: every record folded."""
    s.root.joinpath(*reportmodel.STATE).unlink(missing_ok=True)
    return reportmodel.gather(s)


def test_report_memory_does_not_grow_with_turns(stores):
    m = _cold_report(Store.open(stores[LARGE].root))
    assert m.turns_total == LARGE and len(m.recent_turns) == reportmodel.RECENT_TURNS
    assert m.recent_turns[-1].n == LARGE
    grow = _per_record(stores, _cold_report)
    assert grow < PER_RECORD_MAX, f"report holds {grow:.0f} bytes per record"


def test_report_from_its_saved_state_holds_what_it_shows(stores):
    """Rule 23: from its saved state the report reads no record before it, and holds the fold
    of what it shows (a few batches' turns), not of the history."""
    for n in (SMALL, LARGE):
        _cold_report(Store.open(stores[n].root))
    s = Store.open(stores[LARGE].root)
    assert reportmodel.gather(s) == _cold_report(Store.open(stores[LARGE].root)) and not s.warnings
    grow = _per_record(stores, reportmodel.gather)
    assert grow < 8, f"the report from its saved state holds {grow:.0f} bytes per record"


def _stream_rebuild(s: Store) -> None:
    f = Fold()

    def each():
        for rec in s.journal.stream():
            f.add(rec)
            yield rec

    index.rebuild(s.root, each(), f.state, s.get_json, s.tmp, s.store_id)


def test_index_rebuild_from_a_stream_memory_is_one_batch(stores, monkeypatch):
    monkeypatch.setattr(index, "BATCH_RECORDS", 250)
    s = Store.open(stores[LARGE].root)
    _stream_rebuild(s)
    assert s.index_current()
    assert s.query("select count(*) from turns")[1] == [(LARGE,)]
    grow = _per_record(stores, _stream_rebuild)
    assert grow < PER_RECORD_MAX, f"index rebuild holds {grow:.0f} bytes per record"


def test_index_rebuilt_from_a_stream_equals_the_one_rebuilt_from_a_list(stores):
    s = Store.open(stores[SMALL].root)
    s.rebuild_index()
    want = index.dump(s.root)
    _stream_rebuild(s)
    assert index.dump(s.root) == want
