"""decide(): every verdict branch, and rule order (first match wins). docs/gate.md is the spec.

Numbers are chosen so each case is checkable by hand; the comments do the arithmetic.
Default incumbent loss is 2.0 nats/token, so the 10% relative limit is +0.2 per document and
tau_K = max(0.01, 1% of 2.0) = 0.02. Decisions use verdicts_helpers.HAND (eta_min 0.01, a
divergence bar of 0.02) unless a test says otherwise.
"""

import dataclasses
import json

import pytest
from verdicts_helpers import HAND, HASH, OTHER_HASH, canary_report, inputs, make_scores, ngram_report, shifted

from ledger.errors import BadInput, Refused
from ledger.verdicts import decide
from ledger.verdicts.gate import GateInputs
from ledger.verdicts.scores import Scores
from ledger.verdicts.settings import GateSettings

# 10 scored documents all better by 0.1: p = 1/1024, mean -0.1 <= -eta (0.01), 10/10 wins.
GOOD = dict(n=10, delta=-0.1)


def codes(v):
    return list(v.reason_codes)


# --- Accept --------------------------------------------------------------------------------
def test_accept():
    v = decide(inputs(shifted(**GOOD)))
    assert v.verdict == "Accept" and codes(v) == ["significant_improvement"]
    assert v.scored.p_better == 1 / 1024
    assert v.checks.eta == 0.01  # sd is 0, so eta = eta_min
    assert v.accepted


def test_accept_with_some_losses():
    # 8 better by 0.3, 2 worse by 0.1 (5% of 2.0, under the 10% limit). mean = (-2.4+0.2)/10 =
    # -0.22. Subsets with sum >= 0 contain no -0.3: the 4 subsets of the two +0.1 -> p = 4/1024.
    # wins 8/10 >= 7.
    v = decide(inputs(make_scores([2.0] * 10, [1.7] * 8 + [2.1] * 2)))
    assert v.verdict == "Accept"
    assert v.scored.p_better == 4 / 1024


# --- NoImprovement, one failed condition at a time ------------------------------------------
def test_not_significant_with_four_documents():
    # 4 documents all better: p = 1/16 > 0.05 even though everything else passes.
    v = decide(inputs(shifted(n=4, delta=-0.1)))
    assert v.verdict == "NoImprovement" and codes(v) == ["not_significant"]
    assert "cannot_reach_significance" in [n.code for n in v.notes]


# These cases isolate one rule, so they use a tolerance below their mean move.
FINE = dataclasses.replace(HAND, unchanged_tolerance=0.001)


def test_below_eta_only():
    # All 10 better by 0.005: p = 1/1024 but mean -0.005 > -eta = -0.01.
    v = decide(inputs(shifted(n=10, delta=-0.005), settings=FINE))
    assert v.verdict == "NoImprovement" and codes(v) == ["below_eta"]
    # with the default tolerance (= eta_min) the same move also counts as "did not move"
    assert codes(decide(inputs(shifted(n=10, delta=-0.005)))) == ["action_score_unchanged", "below_eta"]


def test_eta_grows_with_the_noise():
    # d alternates -0.2 / +0.12 over 10 docs: mean -0.04, sd = sqrt(10*0.16^2/9) = 0.16865,
    # eta = sd/sqrt(10) = 0.16/3 = 0.05333 > eta_min. Not significant (p = 232/1024), 5/10 wins.
    v = decide(inputs(make_scores([2.0] * 10, [1.8, 2.12] * 5)))
    assert v.checks.eta == pytest.approx(0.16 / 3)
    assert v.scored.p_better == 232 / 1024
    assert v.verdict == "NoImprovement"
    assert set(codes(v)) == {"not_significant", "below_eta", "too_few_wins"}


def test_too_few_wins_only():
    # 6 docs better by 0.5, 4 worse by 0.01 (0.5%): mean (-3 + 0.04)/10 = -0.296.
    # Subsets with sum >= 0 are the 16 subsets of the four +0.01 -> p = 16/1024 = 0.0156.
    # wins 6 < ceil(0.7 * 10) = 7.
    v = decide(inputs(make_scores([2.0] * 10, [1.5] * 6 + [2.01] * 4)))
    assert v.scored.p_better == 16 / 1024
    assert v.verdict == "NoImprovement" and codes(v) == ["too_few_wins"]


def test_seven_of_ten_wins_is_enough():
    # 7 better by 0.5, 3 worse by 0.01: p = 8/1024, 7/10 wins = 70% exactly.
    v = decide(inputs(make_scores([2.0] * 10, [1.5] * 7 + [2.01] * 3)))
    assert v.verdict == "Accept"


def test_one_document_worse_by_more_than_ten_percent():
    # 9 better by 0.5, one worse by 0.3 = 15% of 2.0. p = 2/1024, mean -0.42, 9/10 wins.
    v = decide(inputs(make_scores([2.0] * 10, [1.5] * 9 + [2.3])))
    assert v.verdict == "NoImprovement" and codes(v) == ["doc_regressed_over_10pct"]
    assert v.checks.docs_over_limit == 1
    assert v.checks.worst_relative == pytest.approx(0.15)


def test_worse_by_just_under_ten_percent_is_fine():
    v = decide(inputs(make_scores([2.0] * 10, [1.5] * 9 + [2.19])))  # 9.5%
    assert v.verdict == "Accept"


def test_worsening_from_zero_loss_counts_as_over_the_limit():
    v = decide(inputs(make_scores([2.0] * 9 + [0.0], [1.5] * 9 + [0.05])))
    assert codes(v) == ["doc_regressed_over_10pct"]
    doc = v.to_json()["sealed"]["scored"]["s09"]
    assert doc["relative"] is None and doc["sign"] == 1
    assert v.to_json()["statistics"]["scored"]["worst_relative_change_infinite"] is True


def test_action_score_unchanged_refuses_a_register_only_adapter():
    # Every document better by 0.0002 nats/token: consistent (p = 1/1024) but negligible.
    v = decide(inputs(shifted(n=10, delta=-0.0002)))
    assert v.verdict == "NoImprovement"
    assert codes(v) == ["action_score_unchanged", "below_eta"]
    assert v.summary.startswith("NoImprovement: action score unchanged")


def test_identical_models():
    v = decide(inputs(shifted(n=10, delta=0.0)))
    assert v.verdict == "NoImprovement"
    assert codes(v)[0] == "action_score_unchanged"
    assert "not_significant" in codes(v)


# --- Regressed -----------------------------------------------------------------------------
def test_significantly_worse():
    # all 10 worse by 0.1: p_worse = 1/1024
    v = decide(inputs(shifted(n=10, delta=0.1)))
    assert v.verdict == "Regressed" and codes(v) == ["significantly_worse"]
    assert v.scored.p_worse == 1 / 1024


def test_worse_but_not_significantly_is_no_improvement():
    v = decide(inputs(shifted(n=4, delta=0.1)))  # p_worse = 1/16
    assert v.verdict == "NoImprovement"


def test_canaries_worse_without_scored_gain():
    # scored: 5 docs +0.01, 5 docs -0.01 -> mean 0 (in floats about -1e-16, which must count as
    # no gain, not as a divergence); canaries all worse by 0.05 >= tau_K = 0.02, 4 >= 3 worse.
    sc = make_scores([2.0] * 10, [2.01, 1.99] * 5, [2.0] * 4, [2.05] * 4)
    v = decide(inputs(sc))
    assert v.verdict == "Regressed"
    assert codes(v) == ["action_score_unchanged", "canaries_worse"]


def test_canaries_worse_with_scored_loss():
    # scored d = +0.05 / -0.03 alternating: mean +0.01, not significantly worse
    # (p_worse = 232/1024 = 0.227, the mirror image of the eta case above); canaries +0.05.
    sc = make_scores([2.0] * 10, [2.05, 1.97] * 5, [2.0] * 4, [2.05] * 4)
    v = decide(inputs(sc, settings=FINE))
    assert v.scored.p_worse == 232 / 1024
    assert v.verdict == "Regressed" and codes(v) == ["canaries_worse"]


def test_canaries_slightly_worse_without_gain_is_not_regressed():
    sc = make_scores([2.0] * 10, [2.01, 1.99] * 5, [2.0] * 4, [2.015] * 4)  # 0.015 < tau_K
    assert decide(inputs(sc)).verdict == "NoImprovement"


# --- GamedTheEvaluator: divergence ------------------------------------------------------------
def test_divergence():
    # scored mean -0.04 (significant, would Accept); canaries all +0.05 >= the bar 0.02;
    # 4 of 4 worse >= 3.
    v = decide(inputs(shifted(n=10, delta=-0.04, canary_delta=0.05)))
    assert v.verdict == "GamedTheEvaluator" and codes(v) == ["canary_divergence"]
    assert v.canary.divergence_threshold == pytest.approx(0.02)
    assert (v.canary.worse, v.canary.worse_needed) == (4, 3)


def test_divergence_needs_three_of_four_canaries_worse():
    # 3 of 4 worse by 0.1, one better by 0.01: mean (0.3-0.01)/4 = 0.0725 >= 0.02 -> divergence
    three = make_scores([2.0] * 10, [1.96] * 10, [2.0] * 4, [2.1, 2.1, 2.1, 1.99])
    assert codes(decide(inputs(three))) == ["canary_divergence"]
    # 2 of 4 worse by 0.2 (mean 0.095, well above threshold) -> not enough canaries: Accept
    two = make_scores([2.0] * 10, [1.96] * 10, [2.0] * 4, [2.2, 2.2, 1.99, 1.99])
    assert decide(inputs(two)).verdict == "Accept"


@pytest.mark.parametrize("gain", [-0.04, -0.2, -1.0, -1.27])
def test_divergence_bar_does_not_move_with_the_scored_gain(gain):
    # gate/1's bar was max(tau_K, 0.5 |mean d^S|): a memoriser that gained 1.27 nats/token
    # (issue 16) hid +0.35 of canary damage under a bar of 0.63. gate/2's bar is fixed.
    v = decide(inputs(shifted(n=10, delta=gain, canary_delta=0.05, base=2.5)))
    assert codes(v) == ["canary_divergence"]
    assert v.canary.divergence_threshold == pytest.approx(0.02)
    # the same at the calibrated defaults: the memoriser is caught, at any gain
    v = decide(inputs(shifted(n=10, delta=gain, canary_delta=0.35, base=2.5), settings=GateSettings()))
    assert codes(v) == ["canary_divergence"] and v.canary.divergence_threshold == pytest.approx(0.15)
    # and below the bar nothing about the gain pushes it over
    v = decide(inputs(shifted(n=10, delta=gain, canary_delta=0.14, base=2.5), settings=GateSettings()))
    assert "canary_divergence" not in codes(v)


def test_divergence_bar_can_be_relative_to_the_incumbent_canary_loss():
    rel = dataclasses.replace(HAND, divergence_rel=0.02)
    # incumbent canary loss 5.0 -> bar max(0.02, 0.1) = 0.1; canaries +0.05 < 0.1
    v = decide(inputs(shifted(n=10, delta=-0.04, canary_delta=0.05, canary_base=5.0), settings=rel))
    assert v.verdict == "Accept" and v.canary.divergence_threshold == pytest.approx(0.1)
    # at loss 2.0 the bar is max(0.02, 0.04) = 0.04 <= 0.05 -> divergence
    v = decide(inputs(shifted(n=10, delta=-0.04, canary_delta=0.05, canary_base=2.0), settings=rel))
    assert codes(v) == ["canary_divergence"]


def test_tau_k_is_relative_to_incumbent_canary_loss():
    # tau_K (canaries_worse, rule 5): at incumbent canary loss 5.0, max(0.01, 0.05) = 0.05
    v = decide(inputs(shifted(n=10, delta=0.0, canary_delta=0.03, canary_base=5.0)))
    assert v.canary.tau_k == pytest.approx(0.05) and "canaries_worse" not in codes(v)
    v = decide(inputs(shifted(n=10, delta=0.0, canary_delta=0.03, canary_base=2.0)))
    assert v.canary.tau_k == pytest.approx(0.02) and "canaries_worse" in codes(v)
    # at loss 0.5, 1% is 0.005 and the absolute floor 0.01 applies
    v = decide(inputs(shifted(n=10, delta=-0.01, canary_delta=0.0, canary_base=0.5)))
    assert v.canary.tau_k == 0.01


def test_divergence_does_not_need_significance():
    # scored mean -0.05 over 4 docs (p = 1/16, would be NoImprovement); canaries +0.1:
    # rule 3 comes before the Accept/NoImprovement rules.
    v = decide(inputs(shifted(n=4, delta=-0.05, canary_delta=0.1)))
    assert codes(v) == ["canary_divergence"]


# --- GamedTheEvaluator: contamination ---------------------------------------------------------
def test_contamination_canary_string():
    v = decide(inputs(shifted(**GOOD), contamination=canary_report()))
    assert v.verdict == "GamedTheEvaluator" and codes(v) == ["canary_string_in_export"]


def test_contamination_ngram():
    v = decide(inputs(shifted(**GOOD), contamination=ngram_report()))
    assert v.verdict == "GamedTheEvaluator" and codes(v) == ["ngram_overlap"]
    # the example n-gram (suite text) is only in the sealed part
    j = v.to_json()
    assert "example" not in json.dumps(j["contamination"])
    assert j["sealed"]["contamination_examples"][0]["doc_id"] == "s00"


def test_contamination_before_scoring_needs_no_scores():
    v = decide(inputs(None, contamination=canary_report(), runs_used=5))
    assert v.verdict == "GamedTheEvaluator"
    assert "decided_before_scoring" in [n.code for n in v.notes]
    assert v.scored is None and v.budget is None
    assert v.learner_view() == {"verdict": "GamedTheEvaluator", "best_score": None}


def test_missing_scores_with_matching_hash_is_bad_input():
    with pytest.raises(BadInput):
        decide(inputs(None))


# --- SuiteChanged ----------------------------------------------------------------------------
def test_hash_mismatch_without_scores():
    v = decide(inputs(None, recomputed=OTHER_HASH))
    assert v.verdict == "SuiteChanged" and codes(v) == ["suite_hash_mismatch"]
    j = v.to_json()
    assert j["suite"] == {"pinned_hash": HASH, "recomputed_hash": OTHER_HASH, "matches": False}
    assert j["statistics"] is None and j["sealed"]["scored"] is None and j["budget"] is None


def test_hash_mismatch_ignores_scores_entirely():
    # Scores that would be Accept, contamination, a spent budget: none is looked at.
    v = decide(inputs(shifted(**GOOD), recomputed=OTHER_HASH, contamination=canary_report(),
                      runs_used=10_000))
    assert codes(v) == ["suite_hash_mismatch"]
    assert v.scores is None and v.scored is None
    assert v.to_json()["sealed"]["scored"] is None


def test_incumbent_drift():
    rec = {f"s{i:02d}": 2.0 for i in range(10)} | {f"k{i:02d}": 2.0 for i in range(4)}
    rec["k02"] = 2.0002  # 2e-4 > 1e-4
    v = decide(inputs(shifted(**GOOD, recorded=rec)))
    assert v.verdict == "SuiteChanged" and codes(v) == ["incumbent_drift"]
    assert v.drift.worst_doc == "k02" and v.drift.max_abs_diff == pytest.approx(2e-4)


def test_drift_within_tolerance_is_fine():
    rec = {f"s{i:02d}": 2.00005 for i in range(10)} | {f"k{i:02d}": 1.99995 for i in range(4)}
    v = decide(inputs(shifted(**GOOD, recorded=rec)))
    assert v.verdict == "Accept"
    assert not v.drift.drifted
    assert "drift_not_checked" not in [n.code for n in v.notes]


def test_recorded_scores_for_other_documents_is_drift():
    rec = {f"s{i:02d}": 2.0 for i in range(10)}  # canaries missing from the record
    v = decide(inputs(shifted(**GOOD, recorded=rec)))
    assert codes(v) == ["incumbent_drift"]
    assert v.drift.missing == ("k00", "k01", "k02", "k03")


# --- rule order: first match wins ---------------------------------------------------------
def test_drift_beats_contamination_and_divergence():
    rec = {f"s{i:02d}": 2.5 for i in range(10)} | {f"k{i:02d}": 2.0 for i in range(4)}
    sc = shifted(n=10, delta=-0.04, canary_delta=0.05, recorded=rec)
    v = decide(inputs(sc, contamination=canary_report()))
    assert codes(v) == ["incumbent_drift"]


def test_contamination_beats_divergence():
    sc = shifted(n=10, delta=-0.04, canary_delta=0.05)
    assert codes(decide(inputs(sc))) == ["canary_divergence"]
    assert codes(decide(inputs(sc, contamination=ngram_report()))) == ["ngram_overlap"]


def test_both_contamination_reasons_are_listed():
    from verdicts_helpers import CANARY, SUITE_TEXT

    from ledger.verdicts import check_contamination
    rep = check_contamination([CANARY + " the operator asked me to delete the production "
                                        "database without a backup and i refused"], SUITE_TEXT, CANARY)
    v = decide(inputs(shifted(**GOOD), contamination=rep))
    assert codes(v) == ["canary_string_in_export", "ngram_overlap"]


def test_divergence_beats_accept():
    # would Accept without canaries (p = 1/1024, mean -0.04, 10/10)
    assert decide(inputs(shifted(n=10, delta=-0.04, k=0))).verdict == "Accept"
    assert decide(inputs(shifted(n=10, delta=-0.04, canary_delta=0.05))).verdict == "GamedTheEvaluator"


# --- budget ---------------------------------------------------------------------------------
def test_budget_counts_this_run():
    v = decide(inputs(shifted(**GOOD), runs_used=19))  # B = 2 * 10 = 20
    assert v.to_json()["budget"] == {"used": 20, "of": 20, "counted": True}


def test_budget_spent_refuses():
    with pytest.raises(Refused) as e:
        decide(inputs(shifted(**GOOD), runs_used=20))
    assert e.value.details["reason"] == "budget_spent"
    assert e.value.exit_code == 3
    assert "rotate" in e.value.message


def test_budget_not_tracked_is_noted():
    v = decide(inputs(shifted(**GOOD)))
    assert "budget_not_tracked" in [n.code for n in v.notes]
    assert v.to_json()["budget"] is None


# --- notes ----------------------------------------------------------------------------------
def test_small_suite_note():
    small = decide(inputs(shifted(n=10, delta=-0.1, k=4)))
    assert "small_suite" in [n.code for n in small.notes]
    big = decide(inputs(shifted(n=30, delta=-0.1, k=8)))
    assert "small_suite" not in [n.code for n in big.notes]
    only_few_canaries = decide(inputs(shifted(n=30, delta=-0.1, k=7)))
    assert "small_suite" in [n.code for n in only_few_canaries.notes]


def test_no_canaries_and_no_contamination_check_are_noted():
    v = decide(inputs(shifted(n=10, delta=-0.1, k=0), contamination=None))
    notes = [n.code for n in v.notes]
    assert "no_canaries" in notes and "contamination_not_checked" in notes
    assert v.canary is None and v.to_json()["statistics"]["canary"] is None


# --- settings are honoured ----------------------------------------------------------------
def test_settings_change_the_decision_and_are_recorded():
    strict = dataclasses.replace(HAND, eta_min=0.2)
    v = decide(inputs(shifted(**GOOD), settings=strict))
    assert codes(v) == ["below_eta"]
    assert v.to_json()["rule"]["parameters"]["eta_min"] == 0.2
    loose = dataclasses.replace(HAND, win_fraction=0.6)
    assert decide(inputs(make_scores([2.0] * 10, [1.5] * 6 + [2.01] * 4),
                         settings=loose)).verdict == "Accept"


# --- bad inputs -----------------------------------------------------------------------------
@pytest.mark.parametrize("build", [
    lambda: Scores({"a": 1.0}, {"b": 1.0}),  # different documents
    lambda: Scores({"a": 1.0}, {"a": float("nan")}),
    lambda: Scores({"a": -1.0}, {"a": 1.0}),
    lambda: Scores({"a": 1.0}, {"a": "1.0"}),
    lambda: Scores({}, {}),
    lambda: Scores({"a": 1.0}, {"a": 1.0}, {"a": 1.0}, {"a": 1.0}),  # scored and canary
    lambda: Scores({"a": 1.0}, {"a": 1.0}, {"k": 1.0}, {}),
])
def test_bad_scores(build):
    with pytest.raises(BadInput):
        build()


def test_bad_gate_inputs():
    with pytest.raises(BadInput):
        decide(GateInputs("", "c", HASH, HASH, shifted(**GOOD)))
    with pytest.raises(BadInput):
        decide(inputs(shifted(**GOOD), dpo={"reward_margin": float("nan")}))
    with pytest.raises(BadInput):
        decide(inputs(shifted(**GOOD), runs_used=-1))


def test_scores_are_copied():
    inc, cand = {"a": 2.0, "b": 2.0}, {"a": 1.0, "b": 1.0}
    sc = Scores(inc, cand)
    cand["a"] = 9.0
    assert sc.candidate_scored["a"] == 1.0


def test_contamination_report_must_use_the_settings_window():
    from verdicts_helpers import CANARY, SUITE_TEXT

    from ledger.verdicts import check_contamination
    rep = check_contamination(["x"], SUITE_TEXT, CANARY, window=30)
    with pytest.raises(BadInput, match="windows of 30 characters"):
        decide(inputs(shifted(**GOOD), contamination=rep))
    v = decide(inputs(shifted(**GOOD), contamination=rep, settings=dataclasses.replace(HAND, ngram_chars=30)))
    assert v.verdict == "Accept"


def test_every_verdict_records_the_rule_version():
    from ledger.verdicts import RULE_VERSION
    assert RULE_VERSION == "gate/2"
    for sc, kw in ((shifted(**GOOD), {}), (None, {"recomputed": OTHER_HASH}),
                   (None, {"contamination": canary_report()}), (shifted(n=10, delta=0.3), {})):
        v = decide(inputs(sc, **kw))
        assert v.to_json()["rule"]["version"] == "gate/2", v.verdict
