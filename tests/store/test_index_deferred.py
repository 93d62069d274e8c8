"""Deferred index tables (store/index.py, docs/store-format.md rule 8): a rebuild projects the
turns table only for its first REBUILD_EAGER records, and the first query that names it fills the
rest from the index's own, hash-checked journal rows; the result equals the incremental index."""

from __future__ import annotations

import json

import duckdb
import pytest

from ledger import experience
from ledger.store import Store, index


def _turns(k: int, i: int) -> list[dict]:
    return experience.parse_turns("\n".join(json.dumps({"situation": f"q{i}.{j}", "action": f"a{i}.{j}",
                                                        "outcome": f"o{i}.{j}"}) for j in range(k)))


@pytest.fixture
def store(tmp_path, monkeypatch):
    monkeypatch.setattr(index, "REBUILD_EAGER", 3)
    monkeypatch.setattr(index, "DEFERRED_BATCH", 2)
    s = Store.init(tmp_path)
    for i in range(7):
        experience.record(s, _turns(2, i))
    return Store.open(tmp_path)


def _turn_ids(s: Store) -> list[str]:
    return [r[0] for r in index.query(s.root, "select id from turns order by n")[1]]


def test_a_rebuild_defers_the_turns_table_and_the_first_query_of_it_fills_it(store):
    s = store
    before = index.dump(s.root)
    assert len(before["turns"]) == 14 and not index.deferred_behind(s.root)   # incremental: complete
    s.rebuild_index()
    assert index.indexed_meta(s.root)["seq"] == s.state.seq
    assert index.deferred_behind(s.root)
    # init is record 1: records 2 and 3 are the first two batches, projected eagerly
    assert _turn_ids(s) == ["t1", "t2", "t3", "t4"]
    assert s.query("select count(*) from turns")[1] == [(14,)]
    assert not index.deferred_behind(s.root) and not s.warnings
    assert index.dump(s.root) == before


def test_a_query_that_names_no_deferred_table_does_not_fill_it(store):
    s = store
    s.rebuild_index()
    s.query("select kind, count(*) from journal group by all")
    s.query("select count(*) from outcomes")   # a table whose name contains no `turns` word
    assert index.deferred_behind(s.root) and len(_turn_ids(s)) == 4


def test_writes_while_deferred_leave_their_turns_to_the_fill_and_the_result_equals_a_full_index(store, monkeypatch):
    s = store
    s.rebuild_index()
    experience.record(s, _turns(3, 99))           # the writer's sync: turns stay deferred, not partial
    assert index.deferred_behind(s.root) and len(_turn_ids(s)) == 4
    s.complete_index()
    filled = index.dump(s.root)
    assert len(filled["turns"]) == 17
    monkeypatch.setattr(index, "REBUILD_EAGER", 10_000)
    s.rebuild_index()
    assert not index.deferred_behind(s.root)
    assert index.dump(s.root) == filled
    experience.record(s, _turns(1, 100))          # complete: the sync projects the new turns at once
    assert len(_turn_ids(s)) == 18 and not index.deferred_behind(s.root)


def test_a_row_that_does_not_hash_stops_the_fill_and_says_the_index_is_not_trusted(store):
    s = store
    s.rebuild_index()
    con = duckdb.connect(str(s.root / "index.duckdb"))
    # the record batch at seq 6 now names another turns object: its row no longer hashes
    con.execute("UPDATE journal SET payload = replace(payload::VARCHAR, '\"count\":2', '\"count\":3')::JSON "
                "WHERE seq = 6")
    con.close()
    s.query("select count(*) from turns")
    assert any("record 6 does not hash" in w and "index rebuild" in w for w in s.warnings), s.warnings
    assert _turn_ids(s) == ["t1", "t2", "t3", "t4", "t5", "t6", "t7", "t8"]   # records 2-5, not 6 onward
    assert index.deferred_behind(s.root)
