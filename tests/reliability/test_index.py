"""Lost, stale and corrupt index: a rebuild gives identical query results."""

from ledger.store import Store, index
from tests.conftest import ledger_cmd


def _populate(tmp_path):
    s = Store.init(tmp_path)
    from ledger import generations as G

    for i in range(4):
        with s.transaction("t") as tx:
            tx.refs[f"name/n{i}"] = tx.put_bytes(f"{i}".encode())
        with s.transaction("commit") as tx:
            G.new_generation(tx, s, note=f"g{i}")
    return s


def test_lost_index(tmp_path):
    s = _populate(tmp_path)
    before = index.dump(s.root)
    (s.root / "index.duckdb").unlink()
    q = ledger_cmd("query", "select count(*) as n from generations", "--json", cwd=tmp_path, check=True)
    assert '"n": 4' in q.stdout
    assert index.dump(s.root) == before


def test_corrupt_index(tmp_path):
    s = _populate(tmp_path)
    before = index.dump(s.root)
    (s.root / "index.duckdb").write_bytes(b"this is not a database" * 100)
    with s.transaction("t"):
        pass  # the writer notices and rebuilds
    after = index.dump(s.root)
    assert after["generations"] == before["generations"]
    assert len(after["journal"]) == len(before["journal"]) + 1


def test_rebuild_command_equals(tmp_path):
    s = _populate(tmp_path)
    before = index.dump(s.root)
    p = ledger_cmd("index", "rebuild", cwd=tmp_path, check=True)
    assert index.dump(s.root) == before
    assert "rebuilt" in p.stdout


def test_stale_index_caught_up_by_query(tmp_path):
    """A crash between journal append and index update leaves the index whole but behind:
    simulate it with a copy of the index taken earlier."""
    import shutil

    s = _populate(tmp_path)
    shutil.copy(s.root / "index.duckdb", tmp_path / "old.duckdb")
    old_seq = s.state.seq
    from ledger import generations as G

    with s.transaction("commit") as tx:
        G.new_generation(tx, s, note="late")
    fresh = index.dump(s.root)
    shutil.copy(tmp_path / "old.duckdb", s.root / "index.duckdb")
    (s.root / "index.duckdb.wal").unlink(missing_ok=True)
    assert index.indexed_seq(s.root) == old_seq
    ledger_cmd("query", "select 1", cwd=tmp_path, check=True)
    assert index.indexed_seq(s.root) == old_seq + 1
    assert index.dump(s.root) == fresh


def test_deferred_index_is_synced_once_at_the_end(tmp_path, monkeypatch):
    """Inside index_deferred() commits leave the index behind (a learn cycle's stages); it is
    whole at every moment, and equal to a rebuild afterwards — also when the block fails."""
    s = _populate(tmp_path)
    seq0 = index.indexed_seq(s.root)
    calls = []
    real = index.sync
    monkeypatch.setattr(index, "sync", lambda *a, **k: (calls.append(1), real(*a, **k)))
    try:
        with s.index_deferred():
            for i in range(3):
                with s.transaction("t") as tx:
                    tx.refs[f"name/d{i}"] = tx.put_bytes(f"d{i}".encode())
                assert index.indexed_seq(s.root) == seq0, "a deferred commit touched the index"
            raise RuntimeError("a stage failed")
    except RuntimeError:
        pass
    assert calls == [1] and index.indexed_seq(s.root) == s.state.seq == seq0 + 3
    incremental = index.dump(s.root)
    s.rebuild_index()
    assert index.dump(s.root) == incremental


def test_catch_up_reads_the_journal_end_or_scans(tmp_path, monkeypatch):
    """A writer's sync reads only the missing records from the end of the journal; a gap
    larger than TAIL_SYNC_MAX scans the journal. Both give the rebuilt index."""
    import ledger.store.repo as repo

    s = _populate(tmp_path)
    tails = []
    real_tail = s.journal.tail
    monkeypatch.setattr(s.journal, "tail", lambda n: (tails.append(n), real_tail(n))[1])
    for limit, expect in ((10_000, [3]), (1, [])):
        tails.clear()
        monkeypatch.setattr(repo, "TAIL_SYNC_MAX", limit)
        with s.index_deferred():
            for i in range(3):
                with s.transaction("t") as tx:
                    tx.refs[f"name/{limit}-{i}"] = tx.put_bytes(f"{limit}-{i}".encode())
        assert index.indexed_seq(s.root) == s.state.seq and tails == expect
        incremental = index.dump(s.root)
        s.rebuild_index()
        assert index.dump(s.root) == incremental
