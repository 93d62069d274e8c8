"""GateSettings: docs/gate.md's defaults, JSON round-trip, validation (ledger/verdicts/settings.py)."""

import json

import pytest

from ledger.errors import BadInput
from ledger.verdicts.settings import RULE_VERSION, GateSettings, min_count


def test_defaults_are_gate_md():
    s = GateSettings()
    assert s.alpha == 0.05
    assert s.eta_min == 0.08  # calibrated: benchmarks/RESULTS.md, gate calibration
    assert s.win_fraction == 0.70
    assert s.max_relative_worsening == 0.10
    assert s.divergence_abs == 0.15 and s.divergence_rel == 0.0  # calibrated, as eta_min
    assert s.tau_k_abs == 0.01 and s.tau_k_rel == 0.01
    assert s.canary_worse_fraction == 0.75
    assert s.exact_max_n == 20 and s.mc_draws == 10_000
    assert s.drift_tolerance == 1e-4
    assert s.ngram_chars == 50 and s.min_doc_chars == 16 and s.canary_window == 24
    assert s.budget_multiplier == 2
    assert s.rule_version == RULE_VERSION


def test_derived_counts():
    s = GateSettings()
    # 70% of 10 is 7 (not 8: 0.7 * 10 is 7.000000000000001 in floats), of 30 is 21, of 9 is 7
    assert [s.wins_needed(n) for n in (10, 30, 9, 1)] == [7, 21, 7, 1]
    # ceil(3K/4)
    assert [s.canaries_worse_needed(k) for k in (4, 8, 5, 1, 3)] == [3, 6, 4, 1, 3]
    assert s.budget_for(10) == 20 and s.budget_for(0) == 0
    assert min_count(0.7, 10) == 7 and min_count(0.35, 20) == 7 and min_count(1.0, 3) == 3


def test_round_trip_through_json_text():
    s = GateSettings(alpha=0.01, eta_min=0.02, win_fraction=0.8, exact_max_n=12, mc_draws=500,
                     mc_seed=7, ngram_chars=30, budget_multiplier=3)
    again = GateSettings.from_json(json.loads(json.dumps(s.to_json())))
    assert again == s
    assert GateSettings.from_json(GateSettings().to_json()) == GateSettings()


def test_every_field_is_serialised():
    import dataclasses
    assert set(GateSettings().to_json()) == {f.name for f in dataclasses.fields(GateSettings)}


def test_partial_json_takes_defaults():
    s = GateSettings.from_json({"alpha": 0.1})
    assert s.alpha == 0.1 and s.eta_min == 0.08


def test_settings_recorded_under_gate_1_are_read_by_the_current_rule():
    # A suite sealed under gate/1 recorded ngram_n and divergence_lambda: they are dropped, the
    # rest is kept, and the verdict names the rule that decides now.
    old = {**{k: v for k, v in GateSettings().to_json().items() if k not in ("ngram_chars", "min_doc_chars",
                                                                              "canary_window", "divergence_abs",
                                                                              "divergence_rel")},
           "ngram_n": 13, "divergence_lambda": 0.5, "rule_version": "gate/1", "alpha": 0.01}
    s = GateSettings.from_json(old)
    assert s.alpha == 0.01 and s.rule_version == RULE_VERSION == "gate/2"
    # ...but only for the rule that had them: a current record with them is a typo
    with pytest.raises(BadInput, match="unknown gate setting"):
        GateSettings.from_json({"ngram_n": 13})
    with pytest.raises(BadInput, match="rule_version"):
        GateSettings.from_json({"rule_version": "gate/9"})


def test_integers_for_float_fields_are_normalised():
    # canonical JSON of recorded settings must not depend on "0" vs "0.0" in a config file
    s = GateSettings.from_json({"eta_min": 0, "tau_k_abs": 1})
    assert isinstance(s.eta_min, float) and isinstance(s.tau_k_abs, float)
    assert json.dumps(s.to_json()["eta_min"]) == "0.0"


@pytest.mark.parametrize("field,value", [
    ("alpha", 0.0), ("alpha", 1.0), ("alpha", 1.5), ("alpha", -0.1), ("alpha", float("nan")),
    ("alpha", "0.05"), ("alpha", True), ("alpha", None),
    ("eta_min", -0.01), ("eta_min", float("inf")),
    ("win_fraction", 0.0), ("win_fraction", 1.01),
    ("max_relative_worsening", -0.1),
    ("divergence_abs", -1.0), ("divergence_rel", float("inf")),
    ("tau_k_abs", -0.01), ("tau_k_rel", float("nan")),
    ("canary_worse_fraction", 0.0), ("canary_worse_fraction", 2.0),
    ("exact_max_n", 25), ("exact_max_n", -1), ("exact_max_n", 20.0), ("exact_max_n", True),
    ("mc_draws", 0), ("mc_draws", 1.5), ("mc_seed", -1),
    ("drift_tolerance", -1e-4),
    ("ngram_chars", 7), ("min_doc_chars", 0), ("canary_window", 2), ("budget_multiplier", 0), ("bootstrap_draws", 0),
    ("bootstrap_level", 1.0), ("unchanged_tolerance", -0.001),
    ("rule_version", ""), ("rule_version", 3), ("rule_version", "gate/1-test"),
])
def test_bad_values_raise_bad_input(field, value):
    with pytest.raises(BadInput) as e:
        GateSettings.from_json({field: value})
    assert field in str(e.value)
    with pytest.raises(BadInput):
        GateSettings(**{field: value})


def test_unknown_key_and_non_object():
    with pytest.raises(BadInput, match="unknown gate setting"):
        GateSettings.from_json({"alpah": 0.05})
    with pytest.raises(BadInput):
        GateSettings.from_json([("alpha", 0.05)])
    assert BadInput.exit_code == 2


def test_frozen():
    with pytest.raises(Exception):
        GateSettings().alpha = 0.5  # type: ignore[misc]
