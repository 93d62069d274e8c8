"""The DuckDB index: a query-friendly projection of the journal, never a source of truth.

Every table is derived from journal records (and the objects they name) by `rows_for`.
The writer brings the index up to the journal head after each commit; `ledger index rebuild`
replays the whole journal into a fresh file and swaps it in atomically, so a lost, stale or
corrupt index is always recoverable. Only the lock holder opens the file read-write; readers
open it read-only and retry briefly while a writer is mid-update (a few milliseconds).

To index a new record kind: give its payload class in ledger/records.py a `project` (and a
table in SCHEMA if needed); `rows_for` applies it.

Deferred tables. A kind whose projection must read an object per record (a turn batch's turns:
~980k object reads at a million records, most of a rebuild's time) names those tables in its hooks
(`KindHooks.deferred`). A rebuild fills them for the first REBUILD_EAGER records only (a small
store's index is complete at once) and meta's `deferred` says the seq up to which they hold every
record's rows. `complete` fills them from the index's own journal rows (each
rebuilt into its record and hash-checked, like a lookup's) on their first use (`Store.query` of
SQL naming one); a writer's sync projects them for its new records only while they are complete,
so they are never partial in the middle. An index without the key (made before deferral) is
complete.
"""

from __future__ import annotations

import importlib
import json
import os
import queue
import re
import stat
import sys
import threading
import time
from pathlib import Path

from ledger.errors import BadInput, InternalError, ResourceExhausted, StoreCorrupt
from ledger.store import blockcheck, canonical, faults, scan, schema
from ledger.store.journal import record_id

# 2: the outcomes table; 3: run_rows and the runs view; 4: journal_sparse; 5: the journal rows'
# payload is its canonical JSON (the line's own bytes; was json.dumps's spaced, ASCII-escaped text)
INDEX_VERSION = 5

_JOURNAL_COLS = ("seq BIGINT, id VARCHAR, prev VARCHAR, time TIMESTAMP, kind VARCHAR, actor VARCHAR, "
                 "inputs VARCHAR[], outputs VARCHAR[], payload JSON")

SCHEMA = {
    "meta": "key VARCHAR PRIMARY KEY, value VARCHAR",
    "journal": _JOURNAL_COLS,
    # The journal rows of every kind but the dense ones (schema.dense_kinds(): turn batches and
    # outcomes, ~98% of a long journal), row for row: what lookups by kind and payload field read.
    # Testing a payload field makes DuckDB decode the payload of every 2,048-row vector that holds
    # a row of the kind; in `journal` a rare kind is in most vectors (an export every 2,700 records:
    # 3 in 4), here in a table of ~2% of the rows (diff's export lookup: 33 -> 1.2 ms CPU at 1M).
    "journal_sparse": _JOURNAL_COLS,
    "objects": "id VARCHAR, size BIGINT, kind VARCHAR, name VARCHAR, seq BIGINT",
    "refs": "name VARCHAR, target VARCHAR",
    "generations": ("gen BIGINT, id VARCHAR, parent VARCHAR, base VARCHAR, adapter VARCHAR, receipt VARCHAR, "
                    "verdict VARCHAR, seq BIGINT, time TIMESTAMP"),
    "receipts": ("id VARCHAR, seq BIGINT, plan VARCHAR, spec VARCHAR, rung VARCHAR, adapter VARCHAR, steps BIGINT, "
                 "final_loss DOUBLE, tokens_per_s DOUBLE"),
    "metrics": "receipt VARCHAR, step BIGINT, name VARCHAR, value DOUBLE",
    "verdicts": ("id VARCHAR, seq BIGINT, verdict VARCHAR, reasons VARCHAR[], candidate VARCHAR, incumbent VARCHAR, "
                 "suite VARCHAR, mean_delta DOUBLE, p_value DOUBLE"),
    "turns": ("id VARCHAR, seq BIGINT, n BIGINT, situation VARCHAR, action VARCHAR, outcome VARCHAR, refusal BOOLEAN, "
              "time VARCHAR, generation VARCHAR"),
    # ground truth attached after a turn was recorded (`ledger outcome`); the latest seq wins
    "outcomes": "turn VARCHAR, seq BIGINT, outcome VARCHAR, time VARCHAR",
    # one row per record that starts, ends or re-runs a training run (ledger/runs.py fills it)
    "run_rows": ("run VARCHAR, seq BIGINT, time TIMESTAMP, trainer VARCHAR, name VARCHAR, status VARCHAR, "
                 "rung VARCHAR, receipt VARCHAR, adapter VARCHAR, base VARCHAR, lr DOUBLE, r BIGINT, alpha DOUBLE, "
                 "steps BIGINT, batch BIGINT, seed BIGINT, final_loss DOUBLE, metrics JSON, params JSON"),
}
# Views over the tables: `runs` is each run's latest row with the newest verdict on its adapter.
VIEWS = {
    "runs": """
SELECT r.run, r.trainer, r.name, r.status, v.verdict, r.rung, r.lr, r.r, r.alpha, r.steps, r.batch, r.seed,
       r.base, r.final_loss, r.metrics, r.params, r.receipt, r.adapter, r.seq, r.time
FROM (SELECT *, row_number() OVER (PARTITION BY run ORDER BY seq DESC) AS _n FROM run_rows) r
LEFT JOIN (SELECT candidate, verdict, row_number() OVER (PARTITION BY candidate ORDER BY seq DESC) AS _m
           FROM verdicts) v ON v.candidate = r.adapter AND v._m = 1
WHERE r._n = 1""",
}
COLUMNS = {t: [c.strip().split(" ")[0] for c in cols.split(",") if c.strip() and "PRIMARY" not in c.split(" ")[0]]
           for t, cols in SCHEMA.items()}


_UNKNOWN = object()


def rows_for(rec: dict, get_json, defer: bool = False, payload_text: str | None = None,
             envelope=_UNKNOWN) -> dict[str, list[tuple]]:
    """Rows each table gains from one journal record. `get_json(id)` reads structured objects;
    with `defer`, a kind whose tables are deferred is not projected (see the module doc).
    The journal row's payload is the payload's canonical JSON: `payload_text` when the caller
    has it (a rebuild slices it off the checked line, scan.payload_bytes), else encoded here, so
    a rebuild and a sync write the same text. `envelope`: envelope_problem(payload), when the
    caller has just computed it.

    The journal and objects rows are the store's own; every other table is a record kind's
    projection (registered by ledger/records.py into store/schema.py), so this module knows no
    receipt, verdict or turn internals. A record whose envelope breaks the store's rules gets its
    journal row only, and one whose payload breaks its kind's schema gets no kind rows: `verify`
    names both, and the index never makes rows up for them."""
    p = rec["payload"]
    if payload_text is None:
        payload_text = canonical.dumps(p).decode()
    row = (rec["seq"], rec["id"], rec["prev"], schema.index_time(rec["time"]), rec["kind"], rec["actor"],
           rec["inputs"], rec["outputs"], payload_text)
    out: dict[str, list[tuple]] = {"journal": [row]}
    if rec["kind"] not in schema.dense_kinds():
        out["journal_sparse"] = [row]  # whatever the payload: the same row as journal's (rule 21)
    if (schema.envelope_problem(p) if envelope is _UNKNOWN else envelope) is not None:
        return out
    objs = p.get("objects") or []
    if objs:
        name = p.get("name")
        out["objects"] = [(o[0], o[1], o[2], name if isinstance(name, str) else None, rec["seq"]) for o in objs]
    batches = [project(rec, get_json) for project in schema.common_projections()]
    h = schema.hooks(rec["kind"])
    if h is not None and not (defer and h.deferred):
        try:
            batches.append(h.project(rec, get_json))  # checks the payload against the kind's schema first
        except BadInput:
            pass  # ill-formed: verify reports it by seq; the index keeps the journal row only
    for rows_by_table in batches:
        for table, rows in rows_by_table.items():
            if table not in COLUMNS or table in ("journal", "journal_sparse", "objects", "refs", "meta"):
                raise InternalError(f"a projection of {rec['kind']!r} records wrote to table {table!r}",
                                    "a record kind may fill only its own tables (store/index.py SCHEMA)")
            out.setdefault(table, []).extend(rows)
    return out


def deferred_rows(rec: dict, get_json) -> dict[str, list[tuple]]:
    """The rows of the deferred tables one record's kind fills (none for an ill-formed payload,
    as in rows_for)."""
    h = schema.hooks(rec["kind"])
    if h is None or not h.deferred:
        return {}
    try:
        rows = h.project(rec, get_json)
    except BadInput:
        return {}
    stray = set(rows) - set(h.deferred)
    if stray:
        raise InternalError(f"the projection of {rec['kind']!r} records fills {sorted(stray)} beside its deferred "
                            f"tables {list(h.deferred)}", "a kind's deferred tables must be all the tables it fills")
    return rows


def record_from_row(row) -> dict | None:
    """The journal record an index row (seq, id, prev, time as written, kind, actor, inputs,
    outputs, payload) holds, or None when the rebuilt record does not hash to the row's id (a
    row edited in any way, into another shape too)."""
    rec = dict(zip(_FIELDS, row))
    try:
        rec["payload"] = json.loads(rec["payload"])
        rec["inputs"], rec["outputs"] = list(rec["inputs"]), list(rec["outputs"])
        return rec if record_id(rec) == rec["id"] else None
    except (TypeError, ValueError, BadInput):
        return None


_FIELDS = ("seq", "id", "prev", "time", "kind", "actor", "inputs", "outputs", "payload")


def preload() -> None:
    """Import DuckDB on a thread, for a writer about to wait on the disk (a large copy): the
    ~0.1 s import then overlaps the copy instead of following the commit. Not a daemon
    thread: the interpreter never exits in the middle of loading the extension module."""
    if "duckdb" in sys.modules:
        return
    threading.Thread(target=importlib.import_module, args=("duckdb",), name="preload-duckdb").start()


class _Connection:
    """A DuckDB connection that gives a Ctrl-C back (store-format.md, rule 24). DuckDB checks
    for signals while a query runs and turns the KeyboardInterrupt of a SIGINT into
    RuntimeError('Query interrupted') (`interrupt()` into InterruptException): the `except
    Exception` that treats an unreadable index as a cache to rebuild or walk would then swallow
    the user's Ctrl-C. Every call, on the connection and on the connection a call returns,
    raises KeyboardInterrupt instead."""

    __slots__ = ("_con",)

    def __init__(self, con):
        self._con = con

    def __getattr__(self, name: str):
        attr = getattr(self._con, name)
        if not callable(attr):
            return attr

        def call(*args, **kwargs):
            try:
                out = attr(*args, **kwargs)
            except Exception as e:
                if _is_interrupt(e):
                    raise KeyboardInterrupt from e
                raise
            return self if out is self._con else out   # execute() returns the connection itself

        return call


def _is_interrupt(e: BaseException) -> bool:
    import duckdb

    return isinstance(e, duckdb.InterruptException) or (type(e) is RuntimeError and str(e) == "Query interrupted")


def _connect(path: Path, read_only: bool, wait: float = 5.0) -> _Connection:
    import duckdb

    try:
        st = os.lstat(path)
    except FileNotFoundError:
        st = None
    if st is not None and not stat.S_ISREG(st.st_mode):
        # DuckDB would follow a link or block on a FIFO: nothing but a regular file is opened
        raise StoreCorrupt(f"{path} is not a regular file (a link, FIFO or directory in the index's place)",
                           "remove it and run `ledger index rebuild`")
    deadline = time.monotonic() + wait
    delay = 0.005
    while True:
        try:
            return _Connection(duckdb.connect(str(path), read_only=read_only))
        except duckdb.IOException as e:
            # Another process holds the file for writing (only ever for milliseconds).
            if "lock" not in str(e).lower() or time.monotonic() >= deadline:
                raise
            time.sleep(delay)
            delay = min(delay * 2, 0.05)
        except Exception as e:   # opening replays the WAL: a Ctrl-C may land there too
            if _is_interrupt(e):
                raise KeyboardInterrupt from e
            raise


def _create(con) -> None:
    for t, cols in SCHEMA.items():
        con.execute(f"CREATE TABLE IF NOT EXISTS {t} ({cols})")
    for name, sql in VIEWS.items():
        con.execute(f"CREATE OR REPLACE VIEW {name} AS {sql}")


ARROW_ROWS = 1000  # from this many rows on, insert through an Arrow table


def _use_arrow(rows: int) -> bool:
    # A transaction adds a handful of rows: importing pyarrow (and numpy) for them cost ~0.2 s
    # of every write command, four times what inserting them row by row costs. Where pyarrow
    # is loaded already, or for a rebuild, Arrow is the faster path.
    return rows >= ARROW_ROWS or "pyarrow" in sys.modules


def _journal_types() -> dict:
    return {"seq": lambda pa: pa.int64(), "id": lambda pa: pa.string(), "prev": lambda pa: pa.string(),
            "time": lambda pa: pa.string(), "kind": lambda pa: pa.string(), "actor": lambda pa: pa.string(),
            "inputs": lambda pa: pa.list_(pa.string()), "outputs": lambda pa: pa.list_(pa.string()),
            "payload": lambda pa: pa.string()}


# Arrow types of the store's own tables (journal, journal_sparse, objects); the time is the text
# DuckDB casts to TIMESTAMP on insert, as for an inferred column.
_ARROW_TYPES = {"journal": _journal_types(), "journal_sparse": _journal_types(),
                "objects": {"id": lambda pa: pa.string(), "size": lambda pa: pa.int64(), "kind": lambda pa: pa.string(),
                            "name": lambda pa: pa.string(), "seq": lambda pa: pa.int64()}}


def _count(table: str, segments: list) -> int:
    """How many rows `segments` hold: lists of row tuples, runs' Arrow tables, runs."""
    n = 0
    for x in segments:
        if type(x) is list:
            n += len(x)
        elif type(x) is blockcheck.Run:
            n += len(x) * _rows_a_record(x.kind, table)
        else:
            n += x.num_rows
    return n


def _rows_a_record(kind: str, table: str) -> int:
    """Rows a record of a run of `kind` gives `table` (_run_table_names): one, or an objects row
    for each of its objects entries."""
    return len(schema.hooks(kind).line_fields.objects) if table == "objects" else 1


def _holds_runs(segments: list) -> bool:
    return any(type(x) is blockcheck.Run for x in segments)


def _insert(con, batch: dict[str, list[tuple]]) -> None:
    """Append each table's rows (tuples)."""
    _append(con, _prepared({t: [rows] for t, rows in batch.items()}))


def _prepared(batch: dict[str, list]) -> list[tuple]:
    """What appending each table's rows takes — its segments, in order: lists of row tuples and
    Arrow tables of runs (_run_tables) — as (table, rows) to insert row by row or (table, an Arrow
    table) to append at once: one append a table. Built apart from the append (_append) so that a
    rebuild prepares the next batch while DuckDB appends this one (_Background)."""
    out = []
    for table, segments in batch.items():
        rows = [r for x in segments if type(x) is list for r in x]
        total = _count(table, segments)
        if not total:
            continue
        if len(rows) == total and not _use_arrow(total):
            out.append((table, rows))
            continue
        import pyarrow as pa

        cols = COLUMNS[table]
        typed = _ARROW_TYPES.get(table)
        if not rows:
            tbl = None
        elif typed is not None:
            # one transpose in C (zip), then one Arrow column per table column: a batch of
            # records becomes a columnar append, not a row-by-row insert. The store's own tables,
            # whose every value check_line and the envelope check typed: given the types, Arrow
            # converts without inferring them (2.6 -> 1.1 us a journal row)
            tbl = pa.Table.from_pydict(dict(zip(cols, map(list, zip(*rows)))), schema=_arrow_schema(pa, table))
        else:
            # a kind's projection may hold values of any type (read from objects): inferred,
            # and cast by DuckDB on insert
            tbl = pa.table(dict(zip(cols, map(list, zip(*rows)))))
        if len(rows) != total:
            # runs' tables between the rows: the rows' table sliced back into its segments
            parts, at = [], 0
            for x in segments:
                if type(x) is list:
                    parts.append(tbl.slice(at, len(x)))
                    at += len(x)
                else:
                    parts.append(x)
            # one chunk: DuckDB appends a table of ~100 small chunks ~1.6x slower
            tbl = pa.concat_tables(parts).combine_chunks()
        out.append((table, tbl))
    return out


def _append(con, prepared: list[tuple]) -> None:
    """Append what _prepared made, table by table."""
    for table, rows in prepared:
        cols = COLUMNS[table]
        if type(rows) is list:
            con.executemany(f"INSERT INTO {table} ({', '.join(cols)}) VALUES ({', '.join('?' * len(cols))})", rows)
            continue
        con.register("_rows", rows)
        con.execute(f"INSERT INTO {table} SELECT {', '.join(cols)} FROM _rows")
        con.unregister("_rows")


class _Background:
    """A rebuild's appends, on a second thread, while the caller parses and projects the next batch.
    At a million records a rebuild spent ~9 of its ~22 s in DuckDB's append, which holds no GIL,
    and ~12 s in Python before it: one after the other on a machine with a second core idle.

    One thread, batches in order, at most one waiting (memory stays about two batches). The
    connection is the thread's until `close` or `abort` returns: the caller touches it only
    after. An error on the thread is raised in the caller, at its next `put` or at `close`;
    later batches are then dropped, never appended past a gap.

    The thread is waited for on an Event it sets as its last act, never with Thread.join: in
    CPython 3.11 a join interrupted by a Ctrl-C marks the thread stopped while it still runs, so
    every later join returns at once (helper-45) and the caller closed a connection the thread
    was appending through (ResourceInUseException: exit 1, the new file left in tmp/)."""

    def __init__(self, con):
        self._con = con
        self._queue = queue.Queue(maxsize=1)
        self._error: BaseException | None = None
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._run, name="index-append", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        try:
            while (prepared := self._queue.get()) is not None:
                if self._error is None:
                    try:
                        _append(self._con, prepared)
                    except BaseException as e:  # noqa: BLE001 - handed to the caller, who raises it
                        self._error = e
        finally:
            self._done.set()

    def _raise(self) -> None:
        if self._error is not None:
            raise self._error

    def put(self, prepared: list[tuple]) -> None:
        self._raise()
        self._queue.put(prepared)

    def close(self) -> None:
        """Wait for every batch put; raise the thread's error, if one."""
        self._queue.put(None)
        self._done.wait()
        self._raise()

    def abort(self) -> None:
        """The caller failed (or was interrupted): stop the append in flight and wait for the
        thread, so that nothing writes to the connection once the caller closes it. DuckDB
        forgets an interrupt that comes between two queries, so it is repeated until the thread
        ends; a Ctrl-C pressed meanwhile is raised once the thread has ended, never swallowed."""
        while True:
            try:
                self._queue.get_nowait()
            except queue.Empty:
                break
        try:
            self._queue.put_nowait(None)
        except queue.Full:   # a close() of the caller's had put it already
            pass
        interrupted = False
        while not self._done.is_set():
            try:
                self._con.interrupt()
                self._done.wait(0.05)
            except KeyboardInterrupt:
                interrupted = True
        if interrupted:
            raise KeyboardInterrupt


def _arrow_schema(pa, table: str):
    return pa.schema([(c, _ARROW_TYPES[table][c](pa)) for c in COLUMNS[table]])


# --- a run of lines proved in bulk, as Arrow tables -----------------------------------------------
def _run_rows_only(kind: str) -> bool:
    """Whether a deferring `add` gives a record of a run of `kind` (each line its kind's usual,
    KindHooks.line_fields saying what the payload holds: objects entries, counters, no refs) its
    journal and objects rows only: its kind's own tables are deferred, and the common projections
    (generations) read refs, which such a payload has none of. tests/store/test_blockcheck.py
    holds a rebuild's tables with runs to its tables line by line (a common projection that read
    more would fail it)."""
    h = schema.hooks(kind)
    return h is not None and h.line_fields is not None and bool(h.deferred)


def _run_table_names(kind: str) -> tuple[str, ...]:
    """The tables a run of `kind` (_run_rows_only) gives rows to."""
    sparse = () if kind in schema.dense_kinds() else ("journal_sparse",)
    return ("journal", *sparse) + (("objects",) if schema.hooks(kind).line_fields.objects else ())


def _rows_of_runs(batch: dict[str, list]) -> None:
    """Replace each run in `batch`'s segments with its rows for that table, in place. The runs of
    one block and kind that follow one another are made into tables at once (blockcheck.joined:
    a run's cost is mostly per call, and outcomes cut turn batches into runs of ~50 lines), then
    sliced back into each run's rows."""
    order: dict[int, object] = {}   # every table holds its runs in journal order
    for segments in batch.values():
        for x in segments:
            if type(x) is blockcheck.Run:
                order.setdefault(id(x), x)
    runs = list(order.values())
    made: dict[int, dict] = {}   # id(run) -> {table: its rows}
    i = 0
    while i < len(runs):
        j = i + 1
        while j < len(runs) and runs[j].block is runs[i].block and runs[j].kind == runs[i].kind:
            j += 1
        group = runs[i:j]
        tables = _run_tables(blockcheck.joined(group))
        per = {t: _rows_a_record(group[0].kind, t) for t in tables}
        at = {t: 0 for t in tables}
        for r in group:
            made[id(r)] = {t: tbl.slice(at[t], len(r) * per[t]) for t, tbl in tables.items()}
            for t in tables:
                at[t] += len(r) * per[t]
        i = j
    for t, segments in batch.items():
        segments[:] = [made[id(x)][t] if type(x) is blockcheck.Run else x for x in segments]


def _run_tables(run) -> dict:
    """The journal (and journal_sparse) and objects rows of a run of proved lines (its kind
    passed _run_rows_only), as rows_for gives them, built as Arrow arrays from the block's
    bytes and the run's columns: no Python object a row."""
    import numpy as np
    import pyarrow as pa

    data = np.frombuffer(run.block.data, np.uint8)
    n = len(run)
    seq = pa.array(run.seq, pa.int64())
    time_starts, time_lengths = run.texts("time")
    while True:   # schema.index_time: trailing Z's off, each T a space
        z = (time_lengths > 0) & (data[time_starts + np.maximum(time_lengths - 1, 0)] == ord("Z"))
        if not z.any():
            break
        time_lengths = time_lengths - z
    time = _texts(pa, np, data, time_starts, time_lengths, replace=(ord("T"), ord(" ")))
    lists = [pa.ListArray.from_arrays(pa.array(offsets - offsets[0], pa.int32()),
                                      _ids(pa, np, hexes[int(offsets[0]):int(offsets[-1])]))
             for offsets, hexes in run.envelope_lists()]
    journal = pa.Table.from_arrays(
        [seq, _ids(pa, np, run.ids), _ids(pa, np, run.prevs), time, pa.array([run.kind] * n, pa.string()),
         _texts(pa, np, data, *run.texts("actor")), *lists, _texts(pa, np, data, *run.texts("payload"))],
        schema=_arrow_schema(pa, "journal"))
    out = {"journal": journal}
    if run.kind not in schema.dense_kinds():
        out["journal_sparse"] = journal
    fields = schema.hooks(run.kind).line_fields
    if fields.objects:
        # a record's entries in order, record after record
        ids = np.stack([run.parts[i] for i, _, _ in fields.objects], axis=1).reshape(-1, 64)
        sizes = np.stack([run.parts[z] for _, z, _ in fields.objects], axis=1).reshape(-1)
        kinds = [k for _, _, k in fields.objects] * n
        out["objects"] = pa.Table.from_arrays(
            [_ids(pa, np, ids), pa.array(sizes, pa.int64()), pa.array(kinds, pa.string()),
             pa.nulls(len(kinds), pa.string()), pa.array(np.repeat(run.seq, len(fields.objects)), pa.int64())],
            schema=_arrow_schema(pa, "objects"))
    return out


def _ids(pa, np, hexes):
    """A string array of "b3:" and each row of 64 hex bytes."""
    m = len(hexes)
    text = np.empty((m, 67), np.uint8)
    text[:, :3] = np.frombuffer(b"b3:", np.uint8)
    text[:, 3:] = hexes
    offsets = np.arange(0, 67 * (m + 1), 67, dtype=np.int32)
    return pa.Array.from_buffers(pa.string(), m, [None, pa.py_buffer(offsets), pa.py_buffer(text)])


_TEXT_ROWS = 1024


def _texts(pa, np, data, starts, lengths, replace=None):
    """A string array of data[starts[k]:starts[k] + lengths[k]] (ASCII: proved lines' texts)."""
    offsets = np.zeros(len(starts) + 1, np.int64)
    np.cumsum(lengths, out=offsets[1:])
    text = np.empty(int(offsets[-1]), np.uint8)
    for a in range(0, len(starts), _TEXT_ROWS):   # index arrays of 8 bytes a byte: a slice at a time
        b = min(a + _TEXT_ROWS, len(starts))
        lo, hi = int(offsets[a]), int(offsets[b])
        text[lo:hi] = data[np.repeat(starts[a:b] - offsets[a:b], lengths[a:b]) + np.arange(lo, hi)]
    if replace is not None:
        text[text == replace[0]] = replace[1]
    return pa.Array.from_buffers(pa.string(), len(starts), [None, pa.py_buffer(offsets.astype(np.int32)),
                                                            pa.py_buffer(text)])


def _dense_meta() -> str:
    """What meta's `dense` says of an index this code writes: the kinds journal_sparse leaves out."""
    return ",".join(sorted(schema.dense_kinds()))


def _layout_problem(con) -> str | None:
    """Why the index's tables are not the ones this code reads and writes, or None when they are:
    meta missing or unreadable, or `_version_problem`. Such an index is never used: a writer
    rebuilds it, a lookup walks the journal, a query is refused (rule 8)."""
    try:
        rows = dict(con.execute("SELECT key, value FROM meta WHERE key IN ('seq', 'version', 'dense')").fetchall())
    except Exception as e:  # noqa: BLE001 - DuckDB raises many kinds for a damaged file; the caller rebuilds or walks
        return f"unreadable ({type(e).__name__})"
    if not rows.get("seq", "").isdigit() or not rows.get("version", "").isdigit():
        return "damaged (no meta)"
    return _version_problem(rows)


def _version_problem(meta_rows: dict) -> str | None:
    """Another INDEX_VERSION (an index of version 3 has no journal_sparse: a lookup reading it
    would find nothing), or a journal_sparse made with other dense kinds (it would lack rows a
    lookup asks for); None when meta's version and dense kinds are this code's."""
    ver = meta_rows.get("version")
    if ver is None:
        return None
    if ver != str(INDEX_VERSION):
        return f"of index version {ver} (this ledger's is {INDEX_VERSION})"
    if meta_rows.get("dense") != _dense_meta():
        return f"made with other dense kinds ({meta_rows.get('dense')!r}; this ledger's are {_dense_meta()!r})"
    return None


def _meta_seq(con) -> int | None:
    if _layout_problem(con) is not None:
        return None
    try:
        return int(con.execute("SELECT value FROM meta WHERE key = 'seq'").fetchone()[0])
    except Exception:  # noqa: BLE001 - as in _layout_problem
        return None


def _meta(con) -> dict | None:
    """What the index says it projects: the journal position (seq, head: the id of the last
    record it holds), the store it belongs to, and the seq its deferred tables are complete to
    (`deferred`). None if unreadable or of another version."""
    seq = _meta_seq(con)
    if seq is None:
        return None
    try:
        rows = dict(con.execute("SELECT key, value FROM meta WHERE key IN ('head', 'store', 'deferred')").fetchall())
        deferred = min(seq, int(rows["deferred"])) if "deferred" in rows else seq
    except Exception:
        return None
    return {"seq": seq, "head": rows.get("head") or None, "store": rows.get("store") or None, "deferred": deferred}


def _foreign(meta: dict, state, store_id: str | None) -> bool:
    """The index is not a projection of this store's journal: another store's id, or another
    record at the position it claims (an index copied from another store at the same seq)."""
    if store_id is not None and meta["store"] not in (None, store_id):
        return True
    return meta["seq"] == state.seq and meta["head"] != state.head


BATCH_RECORDS = 5_000  # records projected per Arrow append: bounds a rebuild's memory at any length
# A rebuild projects the deferred tables of this many records at once (a store's first index, a
# small journal's: complete, ~0.3 s at most); beyond them they are filled on first use (module doc)
REBUILD_EAGER = 10_000
# DuckDB's buffer pool during a rebuild (it spills or evicts beyond it). What DuckDB holds outside
# it grows ~3 MiB a million records (294 MiB peak at 1M, 300 at 3M with 128 MB). With no checkpoint
# until the end (rebuild) and runs' rows made in bulk, 96 MB peaked at 316-332 MiB at 1M, 64 MB at
# 285, 48 MB at 275 and 32 MB at 257, at the same CPU time (session 13): 32 leaves room under 300
# at 10M.
REBUILD_MEMORY = "32MB"
# DuckDB checkpoints whenever its WAL passes 16 MB, and each checkpoint rewrote the table's last row
# group, so a rebuild's appends cost more the longer the table (19 us a journal row at 400k rows,
# 7.6 with no checkpoint until the end; benchmarks/RESULTS.md, session 13). With none, though, the
# WAL grew to 1.2 GB at a million records (~12 GB on disk at ten million): 256 MB keeps that to one
# WAL's worth beside the new file (0.6 GB peak at 1M) at the same CPU time (session 14).
REBUILD_CHECKPOINT = "256MB"
PEEK_MEMORY = "64MB"      # DuckDB's buffer pool for a lookup's read-only look


def _write(con, records, state, get_json, store_id: str | None = None, eager: int | None = None,
           background: bool = False) -> None:
    """Project `records` (an iterable, or a feeder function that calls its argument with each
    record: a rebuild streams the journal through here) in batches
    of BATCH_RECORDS, then the refs and meta of `state` — a State, or a callable giving the
    state once `records` is exhausted (a stream's fold is known only at its end).
    `eager`: None — the deferred tables are projected for every record (they were complete and
    stay so); k — only for the first k records, and meta's `deferred` becomes the seq of the last
    of them (all of them: the state's seq) when k > 0, or stays as it is when k is 0.

    A feeder may take a second argument, `add_run`: the journal rows of a run of lines proved in
    bulk (store/blockcheck.py) are then made from its columns (_run_tables), with no record
    built, where `add` would give them exactly those rows (_run_rows_only).

    `background`: the batches are appended on a second thread (_Background: a rebuild's)."""
    batch: dict[str, list] = {}     # table -> its rows in order: lists of row tuples, and runs (made at the flush)
    n = pending = 0
    whole: int | None = None   # the last record projected with its deferred tables, while unbroken
    deferring = False

    def flush(force: bool) -> None:
        # Only the tables that hold a batch's worth of rows are appended: an append costs
        # DuckDB about a millisecond whatever its size, and the tables of rare kinds gain a few
        # rows a batch (7 of them: ~4 us a record at a million records). Each table holds at
        # most ~2 batches of rows before its append, so memory stays bounded.
        nonlocal pending
        full = {t: segments for t, segments in batch.items() if force or _count(t, segments) >= BATCH_RECORDS}
        if any(_holds_runs(x) for x in full.values()):
            # the runs' rows are made for every table at once (_rows_of_runs): each table that holds
            # a run goes too
            full.update({t: x for t, x in batch.items() if _holds_runs(x)})
            _rows_of_runs(full)
        prepared = _prepared(full)
        if appender is None:
            _append(con, prepared)
        else:
            appender.put(prepared)
        for t in full:
            del batch[t]
        pending = 0
        scan.collect_young()

    def add(rec: dict, line: bytes | None = None, envelope=_UNKNOWN) -> None:
        # `line`: the record's checked line (a scan's `lines`), whose payload bytes are the
        # journal row's payload text; `envelope`: its envelope_problem, when the feeder knows it
        nonlocal n, pending, whole, deferring
        defer = eager is not None and n >= eager
        if defer:
            deferring = True
        elif not deferring:
            whole = rec["seq"]
        text = None if line is None else scan.payload_bytes(line).decode()
        for t, rows in rows_for(rec, get_json, defer, text, envelope).items():
            segments = batch.get(t)
            if segments is None:
                batch[t] = [rows]
            elif type(segments[-1]) is list:
                segments[-1].extend(rows)
            else:
                segments.append(rows)   # after a run's table
        n += 1
        pending += 1
        if pending >= BATCH_RECORDS:
            flush(False)

    def add_run(run) -> bool:
        """The run's rows, if `add` would give each of its records only its journal and objects
        rows (its kind's tables deferred from here on); False (nothing done) otherwise."""
        nonlocal n, pending, deferring
        if not (eager is not None and n >= eager and _run_rows_only(run.kind)):
            return False
        deferring = True
        for t in _run_table_names(run.kind):
            batch.setdefault(t, []).append(run)   # its rows made at the flush (_rows_of_runs)
        n += len(run)
        pending += len(run)
        if pending >= BATCH_RECORDS:
            flush(False)
        return True

    appender = _Background(con) if background else None
    try:
        if callable(records):
            records(add, add_run)   # a feeder: calls `add` once per record (a journal scan's `each`)
        else:
            for rec in records:
                add(rec)
        flush(True)
        if appender is not None:
            appender.close()   # inside: a Ctrl-C while it waits must stop the thread too
    except BaseException:
        if appender is not None:
            appender.abort()
        raise
    if callable(state):
        state = state()
    # Only the refs that changed are rewritten: a year's store has thousands of gen-N refs and a
    # write moves one or two, so rewriting them all made every write cost O(generations) (2,471
    # rows through an Arrow table at 10M records: ~0.1 s of each rollback; RESULTS, H18X). A
    # table holding a name twice (never written so) is rewritten whole.
    want = dict(state.refs)
    rows = con.execute("SELECT name, target FROM refs").fetchall()
    have = dict(rows)
    if len(have) != len(rows):
        con.execute("DELETE FROM refs")
        have = {}
    gone = [(n,) for n, t in have.items() if want.get(n) != t]
    if gone:
        con.executemany("DELETE FROM refs WHERE name = ?", gone)
    _insert(con, {"refs": sorted((n, t) for n, t in want.items() if have.get(n) != t)})
    con.execute("INSERT OR REPLACE INTO meta VALUES ('seq', ?), ('head', ?), ('version', ?), ('dense', ?)",
                [str(state.seq), state.head or "", str(INDEX_VERSION), _dense_meta()])
    if eager is None or eager > 0:
        upto = state.seq if not deferring else (whole or 0)
        con.execute("INSERT OR REPLACE INTO meta VALUES ('deferred', ?)", [str(upto)])
    if store_id is not None:
        con.execute("INSERT OR REPLACE INTO meta VALUES ('store', ?)", [store_id])


def rebuild(root: Path, records, state, get_json, tmp_dir: Path, store_id: str | None = None) -> None:
    """Replay the journal into a fresh database and swap it in (caller holds the lock).
    `records` may be a stream or a feeder and `state` a callable read after it (see _write):
    memory is then one batch, whatever the journal's length. A failure leaves no file behind."""
    path = root / "index.duckdb"
    new = tmp_dir / f"index-{os.getpid()}.duckdb"
    for p in (new, Path(str(new) + ".wal")):
        p.unlink(missing_ok=True)
    con = _connect(new, read_only=False)
    try:
        # No one transaction around the replay: DuckDB keeps a transaction's rows in memory until
        # it commits (1.6 GiB at a million records). The new file is invisible until the rename
        # below, so committing batch by batch (autocommit) changes nothing anyone can see; and
        # the buffer pool is capped, so memory is one batch whatever the journal's length.
        con.execute(f"SET memory_limit = '{REBUILD_MEMORY}'")
        con.execute(f"SET checkpoint_threshold = '{REBUILD_CHECKPOINT}'")
        # One DuckDB thread: its appends run beside the Python that prepares the next batch
        # (_Background), which takes the other core of two. A second DuckDB thread then only
        # competed: at 1M records the same wall (13.4 / 13.8 s), 2 s more CPU (20.1 / 18.0 s)
        con.execute("SET threads = 1")
        _create(con)
        with scan.without_collector():
            _write(con, records, state, get_json, store_id, eager=REBUILD_EAGER, background=True)
        con.execute("CHECKPOINT")
    except BaseException as e:
        try:
            con.close()
        except Exception as c:  # noqa: BLE001 - `e` is the failure raised; this one is said with it
            e.add_note(f"closing the new index failed too: {c}")
        for p in (new, Path(str(new) + ".wal")):
            p.unlink(missing_ok=True)
        if isinstance(e, sys.modules["duckdb"].OutOfMemoryException):   # imported by _connect
            raise _out_of_memory(e) from e
        raise
    con.close()
    Path(str(path) + ".wal").unlink(missing_ok=True)
    os.replace(new, path)


def _out_of_memory(e: Exception) -> ResourceExhausted:
    """DuckDB's OutOfMemoryException in the index's own work, typed (it was exit 1): the buffer
    pool is capped (REBUILD_MEMORY) so a pass's memory does not grow with history, and only rows
    far larger than any ledger writes fill it — a journal some other program wrote."""
    return ResourceExhausted(
        f"the index ran out of its {REBUILD_MEMORY} of memory ({str(e).splitlines()[0]})",
        "the journal holds records far larger than ledger writes (a long actor or payload): "
        "`ledger verify --full` checks it; the index was left as it was")


def sync(root: Path, journal_records_after, state, get_json, tmp_dir: Path, all_records,
         store_id: str | None = None) -> str | None:
    """Bring the index up to `state` (caller holds the lock). Rebuild if missing, damaged, or
    not this store's projection (another store's id, or another record at its position).
    Returns why an index that was there was rebuilt (the caller warns: a damaged or foreign
    index replaced without a word would be a silent fallback), None otherwise."""
    path = root / "index.duckdb"
    faults.point("index.before-sync")
    try:
        if not path.exists():
            raise FileNotFoundError
        con = _connect(path, read_only=False)
    except FileNotFoundError:
        rebuild(root, all_records(), state, get_json, tmp_dir, store_id)
        return None
    except Exception as e:  # noqa: BLE001 - DuckDB raises many kinds for a damaged file; it is a cache
        rebuild(root, all_records(), state, get_json, tmp_dir, store_id)
        return f"unreadable ({type(e).__name__})"
    try:
        meta = _meta(con)
        recs = None
        if meta is not None and not _foreign(meta, state, store_id) and meta["seq"] < state.seq:
            recs = journal_records_after(meta["seq"])
        # the records to add must continue the one the index ends at
        why = ((_layout_problem(con) or "damaged (no meta)") if meta is None
               else f"ahead of the journal (record {meta['seq']} > {state.seq})" if meta["seq"] > state.seq
               else "another store's or another history's" if _foreign(meta, state, store_id)
               else f"of another history (its record {meta['seq']} is not this journal's)"
               if recs is not None and recs and recs[0]["prev"] != meta["head"] else None)
        if why is not None:
            con.close()
            con = None
            rebuild(root, all_records(), state, get_json, tmp_dir, store_id)
            return why
        if recs is None and store_id is not None and meta["store"] is None:
            # an index from before store ids: it is this store's (same head), now it says so
            con.execute("INSERT OR REPLACE INTO meta VALUES ('store', ?)", [store_id])
        if recs is not None:
            con.execute("BEGIN")
            # deferred tables stay complete if they were; if not, `complete` fills them later
            _write(con, recs, state, get_json, store_id, eager=0 if meta["deferred"] < meta["seq"] else None)
            con.execute("COMMIT")
            # Fold the WAL into the file now: the index file alone is then always a whole,
            # consistent snapshot (copies, backups and a crash never pair it with a stale WAL).
            con.execute("CHECKPOINT")
    finally:
        if con is not None:
            con.close()
    faults.point("index.after-sync")
    return None


DEFERRED_BATCH = 5_000  # records whose deferred rows `complete` projects per committed step


def deferred_tables() -> tuple[str, ...]:
    """Every table some kind's hooks defer."""
    return tuple(sorted({t for k in schema.kinds() for t in schema.hooks(k).deferred}))


def mentions_deferred(sql: str) -> bool:
    """Whether `sql` names a deferred table (as a word: `turns`, not `turns_x`)."""
    return any(re.search(rf"(?<![A-Za-z0-9_]){t}(?![A-Za-z0-9_])", sql, re.IGNORECASE) for t in deferred_tables())


def deferred_behind(root: Path) -> bool:
    """Whether the index's deferred tables lack rows of records it holds."""
    meta = _peek(root, _meta)
    return meta is not None and meta["deferred"] < meta["seq"]


def complete(root: Path, get_json) -> str | None:
    """Fill the deferred tables up to the index's seq (caller holds the lock), from the index's
    journal rows of the kinds that defer, each rebuilt into its record and hash-checked. Commits
    every DEFERRED_BATCH records with meta's `deferred` (a crash keeps what was filled, and
    memory stays one batch). Returns why it stopped early (a row that does not hash: the
    index is not to be trusted), None when complete or when there is no usable index."""
    import duckdb

    kinds = sorted(k for k in schema.kinds() if schema.hooks(k).deferred)
    path = root / "index.duckdb"
    if not kinds or not path.exists():
        return None
    con = _connect(path, read_only=False)
    try:
        con.execute(f"SET memory_limit = '{REBUILD_MEMORY}'")
        con.execute(f"SET checkpoint_threshold = '{REBUILD_CHECKPOINT}'")
        meta = _meta(con)
        if meta is None:
            return None
        done, seq = meta["deferred"], meta["seq"]
        sql = (f"SELECT {_ROW} FROM journal WHERE seq > ? AND seq <= ? AND kind IN ({', '.join('?' * len(kinds))}) "
               "ORDER BY seq LIMIT ?")
        step = DEFERRED_BATCH
        while done < seq:
            try:
                rows = con.execute(sql, [done, seq, *kinds, step]).fetchall()
            except duckdb.OutOfMemoryException as e:
                # rows as large as a journal line may be (256 MiB): fewer at a time, the same rows
                # filled in the same order; one that alone does not fit is the typed error below
                if step == 1:
                    raise _out_of_memory(e) from e
                step = max(1, step // 8)
                continue
            batch: dict[str, list[tuple]] = {}
            for row in rows:
                rec = record_from_row(row)
                if rec is None:
                    return f"the index's row for record {row[0]} does not hash to its id"
                for t, r in deferred_rows(rec, get_json).items():
                    batch.setdefault(t, []).extend(r)
            upto = rows[-1][0] if len(rows) == step else seq
            con.execute("BEGIN")
            _insert(con, batch)
            con.execute("INSERT OR REPLACE INTO meta VALUES ('deferred', ?)", [str(upto)])
            con.execute("COMMIT")
            done = upto
        con.execute("CHECKPOINT")
    except duckdb.OutOfMemoryException as e:   # committed batches stay: meta's `deferred` says how far
        raise _out_of_memory(e) from e
    finally:
        con.close()
    return None


def _peek(root: Path, read):
    """`read(con)` on the index opened read-only; None when the index is missing or unreadable
    (a cache: every caller has the journal to fall back on, and says so)."""
    path = root / "index.duckdb"
    if not path.exists():
        return None
    try:
        con = _connect(path, read_only=True)
    except Exception:
        return None
    try:
        # a lookup reads a few rows: one thread and a small buffer pool keep a million-record
        # index from costing a few hundred MiB of cached row groups (291 -> 136 MiB at 1M)
        con.execute(f"SET memory_limit = '{PEEK_MEMORY}'")
        con.execute("SET threads = 1")
        return read(con)
    except Exception:
        return None
    finally:
        con.close()


def indexed_meta(root: Path) -> dict | None:
    """The index's meta (seq, head, store), read-only; None if missing or unreadable."""
    return _peek(root, _meta)


def journal_row_counts(root: Path) -> tuple[int, int, int, int] | None:
    """(rows, distinct seqs, min seq, max seq) of the index's journal table, read-only (verify
    --full: rows are checked one by one as lookups read them, a deleted one only by counting)."""
    return _peek(root, lambda con: tuple(con.execute(
        "SELECT count(*), count(DISTINCT seq), coalesce(min(seq), 0), coalesce(max(seq), 0) FROM journal").fetchone()))


def sparse_rows_problem(root: Path) -> str | None:
    """What is wrong with journal_sparse as a copy of journal's rows of the kinds that are not
    dense (verify --full: lookups read it, each row checked as they read it; a row deleted or
    added shows only here), or None; None too when the index cannot be read (verify says so)."""
    dense = sorted(schema.dense_kinds())
    rare = f"kind NOT IN ({', '.join('?' * len(dense))})" if dense else "true"
    sql = (f"SELECT (SELECT count(*) FROM journal_sparse), (SELECT count(*) FROM journal WHERE {rare}), "
           f"(SELECT count(*) FROM journal j WHERE {rare} AND NOT EXISTS "
           "(SELECT 1 FROM journal_sparse s WHERE s.seq = j.seq AND s.id = j.id))")

    def read(con):
        if _meta(con) is None:
            return None
        held, want, missing = con.execute(sql, [*dense, *dense]).fetchone()
        if held == want and not missing:
            return None
        return (f"the index's journal_sparse table holds {held} rows for the journal's {want} records of kinds "
                f"other than {', '.join(dense)} ({missing} of those missing): rows were deleted or added "
                "(`ledger index rebuild`)")
    return _peek(root, read)


def indexed_id_at(root: Path, seq: int) -> str | None:
    """The id the index holds for journal record `seq` (None if it holds none)."""
    def read(con):
        row = con.execute("SELECT id FROM journal WHERE seq = ?", [seq]).fetchone()
        return row[0] if row else None
    return _peek(root, read)


def indexed_seq(root: Path) -> int | None:
    """The journal seq the index reflects (None if missing, unreadable or of another version)."""
    return _peek(root, _meta_seq)


def _query_hint(e) -> str:
    """A hint that fits the mistake: a typo in the SQL, a table or column that does not exist, or
    a statement that tries to change the index (a read-only cache of the journal)."""
    name, text = type(e).__name__, str(e)
    if "Parser" in name:
        return "the SQL does not parse near the place named above; e.g. `select kind, count(*) from journal group by all`"
    if "Catalog" in name or "Binder" in name:
        tables = ", ".join([t for t in SCHEMA if t != "meta"] + list(VIEWS))
        return f"tables: {tables}; `ledger query \"describe TABLE\"` lists a table's columns"
    if "file system operations are disabled" in text:
        return "a query reads the index's tables only, never files: redirect `ledger query --json` instead"
    if "read-only" in text or "read only" in text or "Permission" in name:
        return "the index is read-only (a cache of the journal): change the store with ledger's commands"
    return "see docs/store-format.md for the tables and their columns"


def query(root: Path, sql: str):
    """Run read-only SQL on the index; returns (columns, rows)."""
    import duckdb

    path = root / "index.duckdb"
    if not path.exists():
        # a lost cache, not a bug: typed like the other store faults (exit 4), with its fix
        raise StoreCorrupt("the index is missing", "run `ledger index rebuild`")
    if not sql.strip():
        raise BadInput("query failed: the SQL is empty",
                       'give one statement, e.g. `ledger query "select kind, count(*) from journal group by kind"`')
    con = _connect(path, read_only=True)
    try:
        # Read-only is the index file's; DuckDB's SQL could still read and write any file
        # (COPY ... TO, EXPORT DATABASE, read_csv, ATTACH). A query sees the index's tables and
        # nothing else, and cannot switch that back on.
        con.execute("SET enable_external_access = false")
        con.execute("SET lock_configuration = true")
        try:
            stale = _version_problem(dict(con.execute("SELECT key, value FROM meta WHERE key IN ('version', 'dense')")
                                          .fetchall()))
        except duckdb.Error:
            stale = None  # no meta table: the query's own error (or rows) says more than a guess
        if stale is not None:
            # its tables are another layout's (a journal_sparse missing or partial): never answered from
            raise StoreCorrupt(f"the index is {stale}", "run `ledger index rebuild` (a write rebuilds it too)")
        try:
            cur = con.execute(sql)
        except duckdb.Error as e:
            raise BadInput(f"query failed: {str(e).splitlines()[0]}", _query_hint(e)) from e
        if cur is None or not cur.description:   # a statement without rows (DuckDB gives None for a comment)
            return [], []
        return [d[0] for d in cur.description], cur.fetchall()
    finally:
        con.close()


def dump(root: Path) -> dict:
    """Every table's rows in a stable order — used to prove a rebuild equals the original."""
    cols_rows = {}
    for t in SCHEMA:
        if t == "meta":
            continue
        cols, rows = query(root, f"SELECT * FROM {t} ORDER BY ALL")
        cols_rows[t] = [tuple(str(v) for v in r) for r in rows]
    return cols_rows


_PAYLOAD_KEY_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


def lookup_rows(root: Path, kinds: tuple[str, ...], where: dict[str, str], limit: int | None = None):
    """(meta, rows) in one read-only look at the index: its meta (what it projects) and the
    journal rows of `kinds` whose payload's string field `key` equals `where[key]`, newest
    first, each row (seq, id, prev, time as written, kind, actor, inputs, outputs, payload).
    None when the index is missing or unreadable, a string saying why when its layout is not
    this code's (`_layout_problem`). Meta and rows come from one connection, so the rows are
    exactly those of the records up to meta's seq. Kinds that are none of them dense are read
    from journal_sparse (the same rows, ~2% of the table: SCHEMA's comment). `limit`: only the
    newest that many (`ledger log --kind`: a kind may have a million rows)."""
    for key in where:
        if not _PAYLOAD_KEY_RE.match(key):
            raise InternalError(f"lookup by payload key {key!r}", "payload keys in lookups are identifiers")
    if not kinds:
        raise InternalError("a lookup of no record kind")
    marks = ", ".join("?" * len(kinds))
    test = "".join(f" AND json_extract_string(payload, '$.{k}') = ?" for k in where)
    sparse = not set(kinds) & schema.dense_kinds()
    # In journal, two steps: the matching seqs (the kind filter in a subquery of its own: in one
    # WHERE with the JSON test DuckDB extracted the field from far more rows), then the whole rows
    # of those seqs only: fetching every column of the kind's rows costs ~0.2 s at a million
    # records even when the JSON test keeps none of them, the seqs ~10 ms. journal_sparse is
    # small enough to read in one.
    last = "" if limit is None else f" LIMIT {int(limit)}"
    one = f"SELECT {_ROW} FROM journal_sparse WHERE kind IN ({marks}){test} ORDER BY seq DESC{last}"
    find = (f"SELECT seq FROM (SELECT seq, payload FROM journal WHERE kind IN ({marks})) WHERE true{test}"
            + ("" if limit is None else f" ORDER BY seq DESC{last}"))

    def read(con):
        meta = _meta(con)
        if meta is None:
            return _layout_problem(con)
        if sparse:
            return meta, con.execute(one, [*kinds, *where.values()]).fetchall()
        seqs = {r[0] for r in con.execute(find, [*kinds, *where.values()]).fetchall()}
        if not seqs:
            return meta, []
        # a seq range (zone maps skip the row groups outside it) and the kind, rather than an IN
        # list of seqs, which DuckDB tests against every row (~0.6 s for 370 seqs at 1M records)
        rows = con.execute(f"SELECT {_ROW} FROM journal WHERE seq BETWEEN ? AND ? AND kind IN ({marks}) "
                           "ORDER BY seq DESC", [min(seqs), max(seqs), *kinds]).fetchall()
        return meta, [r for r in rows if r[0] in seqs]
    return _peek(root, read)


_ROW = "seq, id, prev, strftime(time, '%Y-%m-%dT%H:%M:%S.%fZ'), kind, actor, inputs, outputs, payload"


def rows_by_id_prefix(root: Path, hexpart: str, limit: int = 2):
    """(meta, rows) like lookup_rows (or why not), for the journal rows whose id starts with `b3:` + `hexpart`
    (lowercase hex, checked by the caller), newest first, at most `limit`."""
    if not hexpart or any(c not in "0123456789abcdef" for c in hexpart):
        raise InternalError(f"id prefix {hexpart!r} is not lowercase hex")
    sql = f"SELECT {_ROW} FROM journal WHERE starts_with(id, ?) ORDER BY seq DESC LIMIT ?"

    def read(con):
        meta = _meta(con)
        if meta is None:
            return _layout_problem(con)
        return meta, con.execute(sql, ["b3:" + hexpart, limit]).fetchall()
    return _peek(root, read)


def rows_writing(root: Path, oid: str):
    """(meta, rows) like lookup_rows (or why not), for the journal rows of the records whose `objects` name
    `oid` (the transactions that wrote it, with its size), newest first."""
    sql = (f"SELECT {_ROW} FROM journal WHERE seq IN (SELECT seq FROM objects WHERE id = ?) "
           "ORDER BY seq DESC")

    def read(con):
        meta = _meta(con)
        if meta is None:
            return _layout_problem(con)
        return meta, con.execute(sql, [oid]).fetchall()
    return _peek(root, read)
