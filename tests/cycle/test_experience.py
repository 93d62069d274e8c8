import json

from ledger import experience
from ledger.store import Store
from tests.conftest import ledger_cmd


def _jsonl(rows):
    return "\n".join(json.dumps(r) for r in rows) + "\n"


def test_record_and_query(tmp_path):
    Store.init(tmp_path)
    rows = [{"situation": f"user: what is {i} plus 1?", "action": f"call adder.add({i}, 1)", "outcome": str(i + 1)}
            for i in range(5)] + [{"situation": "user: rm /etc/passwd", "action": "refuse: not permitted", "refusal": True}]
    (tmp_path / "t.jsonl").write_text(_jsonl(rows))
    p = ledger_cmd("record", "t.jsonl", "--json", cwd=tmp_path, check=True)
    assert json.loads(p.stdout)["count"] == 6
    q = ledger_cmd("query", "select count(*) as n, sum(refusal::int) as r from turns", "--json", cwd=tmp_path, check=True)
    assert json.loads(q.stdout) == [{"n": 6, "r": 1}]
    # verbatim: the action is stored byte for byte
    q = ledger_cmd("query", "select action from turns where n = 6", "--json", cwd=tmp_path, check=True)
    assert json.loads(q.stdout)[0]["action"] == "refuse: not permitted"
    p = ledger_cmd("record", "-", cwd=tmp_path, input=_jsonl(rows[:2]), check=True)
    assert "t7–t8" in p.stdout


def test_bad_row_records_nothing(tmp_path):
    s = Store.init(tmp_path)
    rows = _jsonl([{"situation": "a", "action": "b"}, {"situation": "c"}, {"situation": "d", "action": "e"}])
    (tmp_path / "bad.jsonl").write_text(rows)
    p = ledger_cmd("record", "bad.jsonl", cwd=tmp_path)
    assert p.returncode == 2 and "line 2" in p.stderr and "action" in p.stderr
    (tmp_path / "bad2.jsonl").write_text('{"situation": "a", "action": "b"}\nnot json\n')
    p = ledger_cmd("record", "bad2.jsonl", cwd=tmp_path)
    assert p.returncode == 2 and "line 2" in p.stderr
    (tmp_path / "bad3.jsonl").write_text('{"situation": "a", "action": "b", "extra": 1}\n')
    p = ledger_cmd("record", "bad3.jsonl", cwd=tmp_path)
    assert p.returncode == 2 and "extra" in p.stderr
    assert Store.open(tmp_path).state.seq == s.state.seq  # nothing recorded


def test_export_cursor_each_turn_once(tmp_path):
    s = Store.init(tmp_path)
    experience.record(s, experience.parse_turns(_jsonl([{"situation": f"s{i}", "action": f"a{i}"} for i in range(4)])))
    ex1 = experience.export(s)
    assert (ex1.first, ex1.last) == (1, 4)
    experience.record(s, experience.parse_turns(_jsonl([{"situation": "s5", "action": "a5"}])))
    ex2 = experience.export(s)
    assert (ex2.first, ex2.last) == (5, 5)
    import io

    import pyarrow.parquet as pq

    t = pq.read_table(io.BytesIO(s.get_bytes(ex2.id)))
    assert t.column("situation").to_pylist() == ["s5"] and t.column("turn").to_pylist() == ["t5"]
    p = ledger_cmd("export", cwd=tmp_path)
    assert p.returncode == 3 and "no new turns" in p.stderr


def test_run_not_due_changes_nothing(tmp_path):
    s = Store.init(tmp_path)
    experience.record(s, experience.parse_turns(_jsonl([{"situation": "s", "action": "a"}] * 3)))
    from ledger.cycle import Policy, due

    assert due(s, Policy()) == ["3 new turns recorded, 150 needed"]
    assert due(s, Policy(min_turns=3)) == []


def test_seconds_since_journal_time_is_utc(monkeypatch):
    import time

    from ledger.cycle import _seconds_since
    from ledger.store.journal import now

    # Sydney keeps daylight saving in November, New York in summer: one of them is always in DST
    for tz in ("UTC", "Australia/Sydney", "America/New_York"):
        monkeypatch.setenv("TZ", tz)
        time.tzset()
        assert abs(_seconds_since(now())) < 5
    monkeypatch.delenv("TZ")
    time.tzset()
