"""The index's refs table after each write equals the fold's refs (docs/store-format.md rule 8),
now that a sync rewrites only the refs a write changed: a moved ref, a deleted one and an
unchanged one, and a table that holds a name twice (never written so) rewritten whole."""

from __future__ import annotations

from ledger.store import Store, index


def _refs(s: Store) -> list:
    return sorted(index.query(s.root, "select name, target from refs")[1])


def test_a_sync_rewrites_the_moved_and_deleted_refs_and_keeps_the_rest(tmp_path):
    s = Store.init(tmp_path)
    ids = []
    for i in range(4):
        with s.transaction("add") as tx:
            ids.append(tx.put_bytes(f"object {i}".encode()))
            tx.refs[f"name/n{i}"] = ids[-1]
    assert _refs(s) == sorted(s.state.refs.items())
    with s.transaction("add") as tx:
        tx.refs["name/n0"] = ids[3]     # moved
        tx.refs["name/n1"] = None       # deleted
    refs = s.state.refs
    assert "name/n1" not in refs and refs["name/n0"] == ids[3] and refs["name/n2"] == ids[2]
    assert _refs(s) == sorted(refs.items())
    synced = index.dump(s.root)
    s.rebuild_index()
    assert index.dump(s.root) == synced


def test_a_refs_table_holding_a_name_twice_is_rewritten_whole_by_the_next_sync(tmp_path):
    s = Store.init(tmp_path)
    with s.transaction("add") as tx:
        oid = tx.put_bytes(b"one")
        tx.refs["name/a"] = oid
    import duckdb

    con = duckdb.connect(str(s.root / "index.duckdb"))
    con.execute("INSERT INTO refs VALUES ('name/a', 'b3:' || repeat('0', 64))")
    con.execute("CHECKPOINT")
    con.close()
    with s.transaction("add") as tx:
        tx.refs["name/b"] = oid
    assert _refs(s) == sorted(s.state.refs.items())
