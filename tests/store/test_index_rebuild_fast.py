"""index rebuild's fast path (docs/store-format.md rule 8): the journal row's payload is the line's
own payload bytes (the payload's canonical JSON, as a writer's sync encodes it), the tables of rare
kinds are appended only when they hold a batch's worth of rows, and the result still equals the
incrementally maintained index, row for row."""

from __future__ import annotations

from ledger import generations as G
from ledger.store import Store, canonical, index, scan


def _populate(tmp_path, n: int = 40) -> Store:
    s = Store.init(tmp_path)
    for i in range(n):
        with s.transaction("add") as tx:
            oid = tx.put_bytes(f"{i} é ☃ \U0001f600".encode())
            tx.payload.update({"path": f"dir/é{i}.txt", "note": "tab\there \"quoted\" \\ back"})
            tx.refs[f"name/n{i}"] = oid
        if i % 7 == 0:
            with s.transaction("commit") as tx:
                G.new_generation(tx, s, note=f"g{i} ü")
    return s


def test_payload_text_is_the_lines_canonical_payload_in_a_sync_and_a_rebuild(tmp_path):
    s = _populate(tmp_path, 12)
    lines = (s.root / "journal").read_bytes().splitlines()

    def payloads():
        return {r[0]: r[1] for r in index.query(s.root, "select seq, payload::varchar from journal")[1]}

    synced = payloads()
    for line in lines:
        rec = scan.check_line(line)
        assert synced[rec["seq"]] == scan.payload_bytes(line).decode() == canonical.dumps(rec["payload"]).decode()
    s.rebuild_index()
    assert payloads() == synced
    # DuckDB reads the canonical text as JSON, non-ASCII included
    _, rows = index.query(s.root, "select json_extract_string(payload, '$.path') from journal where kind = 'add' "
                                  "order by seq limit 1")
    assert rows == [("dir/é0.txt",)]


def test_rebuild_with_batches_smaller_than_the_rare_tables_equals_the_incremental_index(tmp_path, monkeypatch):
    # With batches of 3 records, the journal and objects tables are appended every batch or two
    # while generations, refs and journal_sparse wait for 3 rows or for the end: nothing may be
    # lost, doubled or reordered across those appends.
    s = _populate(tmp_path, 40)
    before = index.dump(s.root)
    monkeypatch.setattr(index, "BATCH_RECORDS", 3)
    s.rebuild_index()
    after = index.dump(s.root)
    assert after == before
    assert len(after["journal"]) == s.state.seq and len(after["generations"]) == 6


def test_an_index_of_version_4_is_rebuilt_by_the_next_writer(tmp_path):
    # version 4 wrote json.dumps's spaced, ASCII-escaped payload text: mixed with this version's
    # rows a rebuild would not equal the incremental index, so it is another layout (rule 8)
    s = _populate(tmp_path, 3)
    import duckdb

    con = duckdb.connect(str(s.root / "index.duckdb"))
    con.execute("UPDATE meta SET value = '4' WHERE key = 'version'")
    con.close()
    with s.transaction("add") as tx:
        tx.payload["path"] = "x"
    assert any("index version 4" in w for w in s.warnings)
    assert index.query(s.root, "select value from meta where key = 'version'")[1] == [(str(index.INDEX_VERSION),)]


# --- the rebuild's appends on a second thread (index._Background) ------------------------------
def _index_files(s: Store) -> dict:
    """The index file's bytes and every file the rebuild could leave in tmp/."""
    return {"index": (s.root / "index.duckdb").read_bytes(), "tmp": sorted(p.name for p in s.tmp.iterdir())}


def _append_threads() -> list:
    import threading

    return [t for t in threading.enumerate() if t.name == "index-append"]


def test_a_failed_append_on_the_thread_is_the_rebuilds_typed_error_and_changes_nothing(tmp_path, monkeypatch):
    # DuckDB's OutOfMemoryException on the thread, at its third batch: the rebuild raises the
    # same exit-6 error as an append in the caller's thread did, no later batch is appended past
    # the gap, the old index stays, the new file is removed and the thread is gone.
    import time

    import duckdb
    import pytest

    from ledger.errors import ResourceExhausted

    s = _populate(tmp_path, 40)
    before = _index_files(s)
    monkeypatch.setattr(index, "BATCH_RECORDS", 3)
    real, calls = index._append, []

    def failing(con, prepared):
        calls.append(len(prepared))
        if len(calls) == 3:
            time.sleep(0.3)   # the caller, batches ahead, has queued the next one meanwhile
            raise duckdb.OutOfMemoryException("Out of Memory Error: could not allocate block")
        real(con, prepared)

    monkeypatch.setattr(index, "_append", failing)
    with pytest.raises(ResourceExhausted, match="ran out of its 32MB"):
        s.rebuild_index()
    assert len(calls) == 3     # the batches after the failed one were dropped, not appended
    assert _index_files(s) == before
    assert not _append_threads()


def test_a_ctrl_c_while_the_rebuild_prepares_stops_the_thread_and_changes_nothing(tmp_path, monkeypatch):
    # The KeyboardInterrupt lands in the caller's thread (Python delivers signals to it alone):
    # the append in flight is interrupted and the thread joined before the connection is closed.
    import pytest

    s = _populate(tmp_path, 40)
    before = _index_files(s)
    monkeypatch.setattr(index, "BATCH_RECORDS", 3)
    real, seen = index.rows_for, []

    def interrupted(rec, *a, **k):
        seen.append(rec["seq"])
        if len(seen) == 20:
            raise KeyboardInterrupt
        return real(rec, *a, **k)

    monkeypatch.setattr(index, "rows_for", interrupted)
    with pytest.raises(KeyboardInterrupt):
        s.rebuild_index()
    assert _index_files(s) == before
    assert not _append_threads()


def test_the_rebuild_appends_on_a_second_thread_and_a_sync_in_its_own(tmp_path, monkeypatch):
    # what the two tests above rely on: a rebuild's record batches are the thread's (its refs,
    # written once the thread is joined, are not), a writer's sync's (a handful of rows) are not
    import threading

    s = _populate(tmp_path, 12)
    real, where = index._append, []

    def spy(con, prepared):
        where.append((threading.current_thread().name, {t for t, _ in prepared}))
        real(con, prepared)

    monkeypatch.setattr(index, "_append", spy)
    s.rebuild_index()
    batches = [name for name, tables in where if "journal" in tables]
    assert batches and set(batches) == {"index-append"}
    assert [tables for name, tables in where if name != "index-append"] == [{"refs"}]
    where.clear()
    with s.transaction("add") as tx:
        tx.payload["path"] = "x"
    assert where and {name for name, _ in where} == {threading.current_thread().name}


def test_a_ctrl_c_while_the_rebuild_waits_for_its_last_append_waits_for_the_thread(tmp_path, monkeypatch):
    # A real SIGINT while the caller waits for the thread's last append (a long one: a big batch,
    # a checkpoint). With Thread.join, CPython 3.11 marked the running thread stopped, every
    # later join returned at once, and the rebuild closed the connection under the thread
    # (helper-45): DuckDB's "connection is busy" (exit 1) and the new file left in tmp/. The
    # caller now waits for the thread's own end, then raises the Ctrl-C.
    import os
    import signal
    import threading
    import time

    import pytest

    s = _populate(tmp_path, 40)
    before = _index_files(s)
    monkeypatch.setattr(index, "BATCH_RECORDS", 3)
    real, closing, log = index._append, [False], []

    def slow(con, prepared):
        if threading.current_thread().name == "index-append" and closing[0]:
            time.sleep(1.0)
            real(con, prepared)
            log.append("appended")
        else:
            real(con, prepared)

    real_close = index._Background.close

    def close(self):
        closing[0] = True
        threading.Timer(0.2, lambda: os.kill(os.getpid(), signal.SIGINT)).start()
        real_close(self)

    monkeypatch.setattr(index, "_append", slow)
    monkeypatch.setattr(index._Background, "close", close)
    began = time.monotonic()
    with pytest.raises(KeyboardInterrupt):
        s.rebuild_index()
    assert time.monotonic() - began >= 1.0 and log   # the append in flight ended before the caller went on
    assert not _append_threads()
    assert _index_files(s) == before
