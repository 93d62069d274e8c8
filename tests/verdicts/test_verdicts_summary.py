"""One p-value everywhere (issue 19): what `ledger run`, `diff`, `gens` and the report show is the
p-value the verdict's reason cites, with the side it tests."""

from ledger.verdicts.summary import verdict_summary


def _v(verdict, p_better, p_worse):
    return {"verdict": verdict, "statistics": {"scored": {"p_better": p_better, "p_worse": p_worse, "mean": 0.1}}}


def test_a_regressed_verdict_shows_the_test_for_worse():
    s = verdict_summary(_v("Regressed", 1.0, 0.000977))
    assert (s["p"], s["p_side"]) == (0.000977, "worse")


def test_every_other_verdict_shows_the_test_for_better():
    for verdict in ("Accept", "NoImprovement", "GamedTheEvaluator"):
        s = verdict_summary(_v(verdict, 0.02, 0.98))
        assert (s["p"], s["p_side"]) == (0.02, "better")


def test_an_unscored_verdict_has_no_p():
    s = verdict_summary({"verdict": "SuiteChanged", "statistics": {}})
    assert s["p"] is None and verdict_summary(None) is None
