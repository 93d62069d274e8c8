"""The budget belongs to the scored documents' content; the journal (what the learner side
reads) carries the verdict and the rounded score only; a contaminated export is refused before
anything trains on it (docs/gate.md, "What is sealed and what the learner sees", and rule 2; issue 16)."""

import json

import pytest

from ledger.errors import Refused
from ledger.gate import judge as judgelib
from ledger.gate import seal
from ledger.verdicts import REASON_CODES
from tests.gate import calibration as C


def _small_suite(tmp_path, name, scored, canaries, **settings):
    return seal.write_suite_dir(tmp_path / name, scored, canaries, settings={"budget_multiplier": 1, **settings})


def _budget(store, rec):
    return store.get_json(rec["payload"]["verdict"])["budget"]


def test_repinning_the_same_scored_documents_continues_their_budget(world, wstore, tmp_path):
    scored, canaries = seal.demo_docs(2, 2, 0)  # B = 1 x 2 scored = 2 runs
    seal.seal(wstore, _small_suite(tmp_path, "a", scored, canaries[:1]), base=world.base, repin=True,
              reason="a small suite")
    first = seal.pinned(wstore)
    _, _, rec = judgelib.judge(wstore, world.A, against=world.base)
    assert _budget(wstore, rec) == {"used": 1, "of": 2, "counted": True}
    # Re-pinned: the same scored documents, renamed, with other canaries (so a new canary string
    # and a new suite hash). The budget continues: the scored content is what leaks.
    renamed = [{**d, "id": "renamed-" + d["id"]} for d in scored]
    seal.seal(wstore, _small_suite(tmp_path, "b", renamed, canaries[1:]), base=world.base, repin=True,
              reason="new canaries")
    second = seal.pinned(wstore)
    assert second.canary_string != first.canary_string and second.suite_hash != first.suite_hash
    _, _, rec2 = judgelib.judge(wstore, world.A, against=world.base)
    assert rec2["payload"]["budget_key"] == rec["payload"]["budget_key"]
    assert _budget(wstore, rec2) == {"used": 2, "of": 2, "counted": True}
    with pytest.raises(Refused, match="budget is spent"):
        judgelib.judge(wstore, world.A, against=world.base)
    # A rotation is new documents: a fresh budget.
    other, _ = seal.demo_docs(4, 0, 0)
    seal.seal(wstore, _small_suite(tmp_path, "c", other[2:], canaries[1:]), base=world.base, repin=True,
              reason="rotate: budget spent")
    _, _, rec3 = judgelib.judge(wstore, world.A, against=world.base)
    assert rec3["payload"]["budget_key"] != rec["payload"]["budget_key"]
    assert _budget(wstore, rec3) == {"used": 1, "of": 2, "counted": True}


def test_budget_counts_records_written_before_the_key_existed(world, wstore, tmp_path):
    # A gate/1 record named only its suite: its key is derived from that suite's documents.
    scored, canaries = seal.demo_docs(2, 1, 0)
    seal.seal(wstore, _small_suite(tmp_path, "a", scored, canaries), base=world.base, repin=True, reason="small")
    suite = seal.pinned(wstore)
    key = suite.budget_key(wstore)
    _, _, real = judgelib.judge(wstore, world.A, against=world.base)  # 1 run, keyed
    old = {k: real["payload"][k] for k in ("verdict", "verdict_name", "learner_view", "suite_hash", "suite_ref",
                                         "recomputed_suite_hash", "candidate", "incumbent", "scored")}
    with wstore.transaction("judge") as tx:  # a second run as gate/1 recorded it: no budget_key
        tx.payload.update({**old, "reason_codes": [], "budget_counted": True, "budget": {"used": 2, "of": 2},
                           "wall_s": 0.0, "score_s": 0.0})
    assert judgelib.runs_used(wstore, key) == 2
    with pytest.raises(Refused, match="budget is spent"):
        judgelib.judge(wstore, world.A, against=world.base)


def test_the_journal_carries_only_the_learner_view(world, wstore):
    recs = []
    for cand, export in ((world.A, None), (world.G, None), (world.D, None)):
        recs.append(judgelib.judge(wstore, cand, against=world.base, export_dataset=export)[2])
    envelope = {"objects", "refs", "counters"}  # the store's own keys (ledger/store/schema.py)
    for rec in wstore.journal.records():
        if rec["kind"] == "judge":
            keys = set(rec["payload"]) - envelope
            assert keys <= judgelib.LEARNER_PAYLOAD_KEYS, keys - judgelib.LEARNER_PAYLOAD_KEYS
    text = wstore.journal.path.read_text()
    # no reason code, budget count or statistic anywhere in what the image reads
    for code in REASON_CODES:
        assert code not in text, code
    for word in ("p_better", "reason_codes", "budget_counted", '"used"', "mean_delta", "sealed"):
        assert word not in text, word
    # ...while the operator's view (the verdict object) has all of it
    v = wstore.get_json(recs[0]["payload"]["verdict"])
    assert v["reason_codes"] and v["budget"]["used"] >= 1 and v["statistics"]["scored"]["p_better"] > 0
    # and the learner view object is the verdict and the rounded score, nothing else
    lv = wstore.get_json(recs[0]["payload"]["learner_view"])
    assert set(lv) == {"kind", "verdict", "best_score"} and lv["best_score"] == recs[0]["payload"]["best_score"]


def test_contaminated_export_is_refused_before_training(world, wstore):
    cal = C.Calibration(wstore, world.base, world.A, world.G, world.root, [], "", *seal.demo_docs(10, 4, 0))
    clean = cal.dataset([("user: what is 1 plus 2?", "call adder.add(1, 2)")] * 3)
    seq = wstore.state.seq
    assert judgelib.check_before_training(wstore, clean, candidate=world.A) is None
    assert wstore.state.seq == seq  # nothing recorded for a clean export
    docs = [(s[:5] + C.INVISIBLE + s[5:], a) for s, a in C._doc_rows(cal.scored)]
    dirty = cal.dataset([("user: what is 1 plus 2?", "call adder.add(1, 2)")] + docs)
    out = judgelib.check_before_training(wstore, dirty, candidate=world.A)
    assert out.verdict.verdict == "GamedTheEvaluator" and out.verdict.reason_codes == ("ngram_overlap",)
    p = out.record["payload"]
    assert p["before_training"] and not p["scored"] and p["verdict_name"] == "GamedTheEvaluator"
    body = wstore.get_json(out.verdict_id)
    assert body["budget"] is None and body["contamination"]["ngram_overlaps"]
    assert json.dumps(body["contamination"]).count("example") == 0  # suite text stays sealed


@pytest.mark.slow
def test_a_contaminated_cycle_refuses_before_training(tmp_path):
    """The learn cycle checks its export before training: a turn that is a scored document with a
    soft hyphen in it ends the cycle with a GamedTheEvaluator refusal and no training run."""
    from ledger import experience
    from ledger.cycle import ensure_genesis, load_spec, run_cycle
    from ledger.options import LearnOptions
    from ledger.store import Store

    s = Store.init(tmp_path)
    ensure_genesis(s, load_spec(None))
    seal.seal(s, seal.write_demo_suite(tmp_path / "suite"))
    scored, _ = seal.demo_docs(10, 4, 0)
    turns = [{"situation": d["situation"].replace(" ", " \u00ad", 1), "action": d["action"], "outcome": d["outcome"]}
             for d in scored]
    experience.record(s, experience.parse_turns("\n".join(json.dumps(t) for t in turns)))
    res = run_cycle(s, LearnOptions(min_turns=1, min_hours=0))
    assert res.outcome == "refusal" and res.verdict == "GamedTheEvaluator"
    assert "ngram_overlap" in res.reasons  # the operator's result has them ...
    recs = list(s.journal.records())
    kinds = [r["kind"] for r in recs]
    assert "train" not in kinds and "checkpoint" not in kinds and kinds[-1] == "refusal"
    pre = [r for r in recs if r["kind"] == "judge"]
    assert len(pre) == 1 and pre[0]["payload"]["before_training"]
    assert "reasons" not in recs[-1]["payload"]  # ... the journal does not
