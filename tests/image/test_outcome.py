"""Ground truth attached after a turn was recorded: an `outcome` record, visible in the index,
used by the next export; the turn's own object is never rewritten."""

import io
import json

import pytest

from ledger import experience
from ledger.errors import BadInput, UnknownRef
from ledger.store import Store


def test_outcome_attached_later(tmp_path):
    s = Store.init(tmp_path)
    rows = "\n".join(json.dumps({"situation": f"s{i}", "action": f"a{i}", "outcome": None if i else "first"}) for i in range(3))
    rec = experience.record(s, experience.parse_turns(rows))
    batch = s.get_bytes(rec["turns"])
    experience.attach_outcome(s, "t2", "right")
    experience.attach_outcome(s, "t2", "really right")      # the latest wins
    experience.attach_outcome(s, "t1", "changed")
    with pytest.raises(BadInput):
        experience.attach_outcome(s, "2", "x")
    with pytest.raises(BadInput):
        experience.attach_outcome(s, "t1", " ")
    with pytest.raises(UnknownRef):
        experience.attach_outcome(s, "t4", "x")
    assert s.get_bytes(rec["turns"]) == batch
    q = s.query("select turn, outcome from outcomes order by seq")[1]
    assert q == [("t2", "right"), ("t2", "really right"), ("t1", "changed")]
    ex = experience.export(s)
    import pyarrow.parquet as pq

    t = pq.read_table(io.BytesIO(s.get_bytes(ex.id)))
    assert t.column("outcome").to_pylist() == ["changed", "really right", ""]
    s.rebuild_index()
    assert s.query("select count(*) from outcomes")[1] == [(3,)]


def test_request_and_source_fields_only_when_present():
    plain = experience.parse_turns('{"situation": "s", "action": "a"}')[0]
    assert "request" not in plain and "source" not in plain
    full = experience.parse_turns('{"situation": "s", "action": "a", "request": "r-1", "source": "given"}')[0]
    assert full["request"] == "r-1" and full["source"] == "given"
    with pytest.raises(BadInput):
        experience.parse_turns('{"situation": "s", "action": "a", "request": 7}')


def test_export_reads_back_only_to_the_batch_it_exports(tmp_path, monkeypatch):
    """Outcomes attached after an earlier export, to turns of either batch: the next export takes
    the latest for its own turns, and its walk back stops at the batch holding its first turn."""
    import pyarrow.parquet as pq

    s = Store.init(tmp_path)
    experience.record(s, experience.parse_turns("\n".join(json.dumps({"situation": f"s{i}", "action": f"a{i}"})
                                                           for i in range(3))))
    experience.attach_outcome(s, "t2", "old")
    experience.export(s)
    b = experience.record(s, experience.parse_turns("\n".join(json.dumps({"situation": f"s{i}", "action": f"a{i}"})
                                                               for i in range(3, 5))))
    for turn, outcome in (("t1", "late, already exported"), ("t5", "first"), ("t4", "four"), ("t5", "second")):
        experience.attach_outcome(s, turn, outcome)
    seen = []
    real = type(s.journal).backwards

    def counting(self, strict=True):
        for r in real(self, strict):
            seen.append(r["seq"])
            yield r

    monkeypatch.setattr(type(s.journal), "backwards", counting)
    ex = experience.export(s)
    t = pq.read_table(io.BytesIO(s.get_bytes(ex.id)))
    assert t.column("turn").to_pylist() == ["t4", "t5"]
    assert t.column("outcome").to_pylist() == ["four", "second"]
    assert min(seen) == b["seq"]            # nothing older than the batch holding t4 was read
