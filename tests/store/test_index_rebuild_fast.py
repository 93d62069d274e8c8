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
