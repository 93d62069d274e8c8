"""The report's model against the store it came from: the journal, the objects, and the DuckDB
index (an independent projection of the same records)."""

from __future__ import annotations

import json

import pytest

from ledger import experience
from ledger.report import gather
from ledger.report.model import RECENT_TURNS
from ledger.store import Store


def _q(s, sql):
    cols, rows = s.query(sql)
    return [dict(zip(cols, r)) for r in rows]


@pytest.mark.slow
def test_model_agrees_with_journal_objects_and_index(demo_store):
    s = Store.open(demo_store)
    m = gather(s)
    recs = list(s.journal.records())
    assert m.seq == recs[-1]["seq"] and m.journal_head == recs[-1]["id"]
    assert m.counts == {k: [r["kind"] for r in recs].count(k) for k in {r["kind"] for r in recs}}

    gens = _q(s, "select gen, id, parent, adapter, receipt, verdict from generations order by gen")
    assert [(g.n, g.id, g.adapter, g.receipt, g.verdict) for g in m.generations] == \
        [(g["gen"], g["id"], g["adapter"], g["receipt"], g["verdict"]) for g in gens]
    parent_n = {g["id"]: g["gen"] for g in gens}
    assert [g.parent for g in m.generations] == [parent_n.get(g["parent"]) for g in gens]
    assert m.head == parent_n[s.state.refs["HEAD"]]

    receipts = _q(s, "select id, rung, steps, final_loss from receipts order by seq")
    assert [(r.id, r.rung, r.steps) for r in m.receipts] == [(r["id"], r["rung"], r["steps"]) for r in receipts]
    assert [r.losses[-1] for r in m.receipts] == pytest.approx([r["final_loss"] for r in receipts])
    for r in m.receipts:
        body = s.get_json(r.id)
        assert list(r.losses) == body["losses"]
        assert r.memory_predicted == body["memory"]["predicted_bytes"]
        assert r.memory_observed == body["memory"]["observed"]["peak_growth_bytes"]
        assert r.versions["torch"] == body["versions"]["torch"] and r.source == body["source"]["hash"]

    verdicts = _q(s, "select id, verdict, reasons, mean_delta, p_value from verdicts order by seq")
    assert [(j.verdict_id, j.verdict, j.mean_delta, j.p_better) for j in m.judges] == \
        [(v["id"], v["verdict"], v["mean_delta"], v["p_value"]) for v in verdicts]
    assert [[c for c, _ in j.reasons] for j in m.judges] == [v["reasons"] for v in verdicts]
    for j in m.judges:
        st = s.get_json(j.verdict_id)["statistics"]
        assert j.eta == st["scored"]["eta"] and j.canary_delta == st["canary"]["mean_delta"]
        assert j.incumbent_loss == st["scored"]["incumbent_mean_loss"]


@pytest.mark.slow
def test_cycles_head_moves_and_turns(demo_store):
    s = Store.open(demo_store)
    m = gather(s)
    recs = list(s.journal.records())
    ends = [r for r in recs if r["kind"] in ("commit", "refusal")]
    assert [(c.cycle, c.outcome, c.verdict) for c in m.cycles] == \
        [(r["payload"]["cycle"], r["kind"], r["payload"]["verdict_name"]) for r in ends]
    refusal = next(c for c in m.cycles if c.outcome == "refusal")
    rec = next(r for r in ends if r["kind"] == "refusal")
    # a gate refusal's reasons are sealed in its verdict object, not in the journal the image reads
    assert "reasons" not in rec["payload"] and refusal.verdict_id == rec["payload"]["verdict"]
    assert list(refusal.reasons) == s.get_json(rec["payload"]["verdict"])["reason_codes"]
    commit = next(c for c in m.cycles if c.outcome == "commit")
    assert commit.generation == next(g.n for g in m.generations if g.receipt == commit.receipt)
    # each cycle's receipt and gate run are attributed to it
    for c in m.cycles:
        assert next(r for r in m.receipts if r.id == c.receipt).cycle == c.cycle
        assert next(j for j in m.judges if j.verdict_id == c.verdict_id).cycle == c.cycle

    moves = [r for r in recs if "HEAD" in (r["payload"].get("refs") or {})]
    assert [(h.seq, h.kind) for h in m.head_moves] == [(r["seq"], r["kind"]) for r in moves]
    rollbacks = [r for r in recs if r["kind"] == "rollback"]
    assert [(h.frm, h.to, h.reason) for h in m.head_moves if h.kind == "rollback"] == \
        [(r["payload"]["from"], r["payload"]["to"], r["payload"]["reason"]) for r in rollbacks]

    total = sum(r["payload"]["count"] for r in recs if r["kind"] == "record")
    assert m.turns_total == total
    assert [t.n for t in m.recent_turns] == list(range(total - RECENT_TURNS + 1, total + 1))
    last = s.get_json([r for r in recs if r["kind"] == "record"][-1]["payload"]["turns"])["turns"]
    assert [t.action for t in m.recent_turns] == [t["action"] for t in last[-RECENT_TURNS:]]


@pytest.mark.slow
def test_reproductions_are_attached_to_their_receipt(reproduced):
    """A reproduce whose inputs are gone answers MissingInputs; the report shows it on the receipt."""
    root, rid, out = reproduced
    m = gather(Store.open(root))
    r = next(r for r in m.receipts if r.id == rid)
    assert out["outcome"] == "MissingInputs"
    assert r.comparisons == ((out["comparison"], "MissingInputs"),)


def test_recent_turns_show_outcomes_attached_later(tmp_path):
    s = Store.init(tmp_path)
    rows = [{"situation": f"s{i}", "action": f"a{i}", "outcome": "first"} for i in range(RECENT_TURNS + 3)]
    for part in (rows[:5], rows[5:]):
        experience.record(s, experience.parse_turns("\n".join(json.dumps(r) for r in part)))
    experience.attach_outcome(s, f"t{len(rows)}", "later")
    experience.attach_outcome(s, f"t{len(rows)}", "latest")
    experience.attach_outcome(s, "t1", "too old to be shown")
    m = gather(s)
    assert m.turns_total == len(rows) and len(m.recent_turns) == RECENT_TURNS
    assert [t.n for t in m.recent_turns] == list(range(len(rows) - RECENT_TURNS + 1, len(rows) + 1))
    assert [t.situation for t in m.recent_turns] == [r["situation"] for r in rows[-RECENT_TURNS:]]
    assert [t.outcome for t in m.recent_turns] == ["first"] * (RECENT_TURNS - 1) + ["latest"]
