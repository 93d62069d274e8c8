"""The verdict record (to_json), the learner view, and the budget check."""

import json

import pytest
from verdicts_helpers import OTHER_HASH, canary_report, inputs, make_scores, shifted

from ledger.errors import BadInput, Refused
from ledger.verdicts import check_budget, decide
from ledger.verdicts.suite_hash import canonical_json
from ledger.verdicts.verdict import round_to_step

DPO = {"reward_margin": 0.42, "accuracy": 0.8, "chosen_reward": {"mean": 1.5, "sd": 0.3}}


def every_branch():
    rec = {f"s{i:02d}": 2.5 for i in range(10)} | {f"k{i:02d}": 2.0 for i in range(4)}
    return {
        "hash": decide(inputs(None, recomputed=OTHER_HASH)),
        "drift": decide(inputs(shifted(n=10, delta=-0.1, recorded=rec))),
        "contamination": decide(inputs(shifted(n=10, delta=-0.1), contamination=canary_report())),
        "divergence": decide(inputs(shifted(n=10, delta=-0.04, canary_delta=0.05))),
        "accept": decide(inputs(shifted(n=10, delta=-0.1), runs_used=0, dpo=DPO)),
        "regressed": decide(inputs(shifted(n=10, delta=0.1))),
        "none": decide(inputs(make_scores([2.0] * 9 + [0.0], [1.5] * 9 + [0.05]))),
        "mc": decide(inputs(shifted(n=25, delta=-0.1))),
    }


def test_every_branch_is_canonical_json():
    for name, v in every_branch().items():
        j = v.to_json()
        # canonical JSON refuses NaN/inf: every number in the record must be finite
        canonical_json(j)
        assert j["verdict"] == v.verdict and j["reason_codes"], name
        assert "\n" not in v.summary and v.summary.startswith(v.verdict + ": "), name


def test_record_has_everything_gate_md_lists():
    v = every_branch()["accept"]
    j = v.to_json()
    assert j["rule"]["version"] == "gate/2" and j["rule"]["parameters"]["alpha"] == 0.05
    assert j["incumbent"] == "gen-1" and j["candidate"].startswith("b3:")
    assert j["suite"]["matches"] is True
    assert j["budget"] == {"used": 1, "of": 20, "counted": True}
    sc = j["statistics"]["scored"]
    for key in ("mean", "sd", "d_z", "p_better", "p_worse", "wins", "n", "wins_over_n",
                "bootstrap", "eta"):
        assert key in sc
    assert sc["wins"] == 10 and sc["n"] == 10 and sc["p_better"] == 1 / 1024
    canary = j["statistics"]["canary"]
    assert canary["k"] == 4 and canary["tau_k"] == pytest.approx(0.02)
    assert j["contamination"]["contaminated"] is False
    assert j["dpo"] == DPO
    # sealed: per-document losses for S and K, with deltas and signs
    s00 = j["sealed"]["scored"]["s00"]
    assert s00["incumbent"] == 2.0 and s00["candidate"] == pytest.approx(1.9)
    assert s00["delta"] == pytest.approx(-0.1) and s00["sign"] == -1
    assert set(j["sealed"]["canary"]) == {"k00", "k01", "k02", "k03"}
    assert j["sealed"]["canary"]["k00"]["sign"] == 0
    assert j["learner_view"] == v.learner_view()


def test_divergence_record_has_canary_signs():
    j = every_branch()["divergence"].to_json()
    assert [d["sign"] for d in j["sealed"]["canary"].values()] == [1, 1, 1, 1]
    assert j["statistics"]["canary"]["worse"] == 4


def test_learner_view_is_only_verdict_and_rounded_score():
    for name, v in every_branch().items():
        lv = v.learner_view()
        assert set(lv) == {"verdict", "best_score"}, name
        text = json.dumps(lv)
        for doc in ("s00", "k00", "s09"):
            assert doc not in text, name


def test_best_score_is_the_live_model_rounded_to_eta():
    # Accept: candidate mean 1.8333.. rounded to eta = 0.01 -> 1.83
    v = decide(inputs(make_scores([2.0] * 10, [1.8333333] * 10)))
    assert v.verdict == "Accept" and v.learner_view()["best_score"] == 1.83
    # not accepted: the incumbent stays live: its mean 2.0 is reported, not the candidate's
    v = decide(inputs(make_scores([2.004] * 10, [2.104] * 10)))
    assert v.verdict == "Regressed" and v.learner_view()["best_score"] == 2.0
    # a larger eta gives a coarser grid: eta 0.25 -> 1.8333 becomes 1.75
    from ledger.verdicts.settings import GateSettings
    v = decide(inputs(make_scores([2.5] * 10, [1.8333333] * 10), settings=GateSettings(eta_min=0.25)))
    assert v.verdict == "Accept" and v.learner_view()["best_score"] == 1.75


def test_round_to_step():
    assert round_to_step(0.3000000001, 0.1) == 0.3
    assert round_to_step(1.234, 0.05) == 1.25
    assert round_to_step(1.234, 0.0) == 1.234


def test_hash_mismatch_record_holds_no_scores():
    j = every_branch()["hash"].to_json()
    assert j["statistics"] is None and j["sealed"]["scored"] is None
    assert j["learner_view"] == {"verdict": "SuiteChanged", "best_score": None}


def test_decide_is_deterministic():
    a = [canonical_json(v.to_json()) for v in every_branch().values()]
    b = [canonical_json(v.to_json()) for v in every_branch().values()]
    assert a == b


def test_mc_branch_records_method():
    j = every_branch()["mc"].to_json()
    assert j["statistics"]["scored"]["test"]["method"] == "monte_carlo"
    assert j["statistics"]["scored"]["test"]["patterns"] == 10_000


# --- budget ---------------------------------------------------------------------------------
def test_check_budget():
    b = check_budget(0, 10)
    assert (b.total, b.remaining, b.spent, b.reason_code) == (20, 20, False, None)
    b.require()  # does not raise
    b = check_budget(19, 10)
    assert (b.remaining, b.spent) == (1, False)
    b = check_budget(20, 10)
    assert (b.remaining, b.spent, b.reason_code) == (0, True, "budget_spent")
    with pytest.raises(Refused) as e:
        b.require()
    assert e.value.details == {"reason": "budget_spent", "used": 20, "budget": 20}
    assert "rotate" in str(e.value)
    assert check_budget(25, 10).remaining == 0


def test_budget_multiplier_setting():
    from ledger.verdicts.settings import GateSettings
    assert check_budget(0, 10, GateSettings(budget_multiplier=3)).total == 30


@pytest.mark.parametrize("used,n", [(-1, 10), (0, -1), (1.0, 10), (True, 10), ("3", 10)])
def test_check_budget_bad_input(used, n):
    with pytest.raises(BadInput):
        check_budget(used, n)
