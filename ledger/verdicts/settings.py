"""The gate's configuration: every threshold docs/gate.md names, with its default.

Defaults are configuration, not constants buried in code: every verdict records the exact
settings it was decided under (`to_json`), so a verdict can be re-read and re-checked later even
if the defaults change. Changing a *rule* (not a parameter) bumps `RULE_VERSION`.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from fractions import Fraction

from ledger.errors import BadInput

# Bump when the decision procedure itself changes (order of rules, a new condition), so that a
# recorded verdict says which procedure produced it. gate/2: contamination on folded character
# windows and whole documents (every document checked), and a divergence bar that no longer
# rises with the scored gain (docs/gate.md, "Why gate/2").
RULE_VERSION = "gate/2"

# Settings of earlier rule versions that no longer exist. A suite sealed under an older rule
# records them; reading its settings drops them (the current rule decides, and says so).
RETIRED_SETTINGS = {"gate/1": frozenset({"ngram_n", "divergence_lambda"})}


def min_count(fraction: float, total: int) -> int:
    """Smallest integer count c with c / total >= fraction (i.e. ceil(fraction * total)).

    Done in rational arithmetic: in floats ceil(0.7 * 10) is 8, not 7, because 0.7 * 10
    rounds to 7.000000000000001. limit_denominator recovers the decimal the user wrote.
    """
    return math.ceil(Fraction(fraction).limit_denominator(10**6) * total)


@dataclass(frozen=True)
class GateSettings:
    """The gate's thresholds (alpha, eta, budget, contamination, divergence), recorded in each verdict."""
    # Accept: one-sided significance level of the paired sign-flip test.
    alpha: float = 0.05
    # Accept: the improvement must be at least eta = max(eta_min, sd(d)/sqrt(n)) nats/token, so
    # that a gain smaller than the noise of the suite's own mean never counts. eta_min is set
    # from the measured seed-twin spread (benchmarks/RESULTS.md, gate calibration): seed noise
    # moves a whole model, every document at once, which no test over documents can see, so
    # the floor must exceed what a retrained twin gains by luck (sd 0.03 nats/token there).
    eta_min: float = 0.08
    # Accept: at least this fraction of scored documents improved (d_i < 0).
    win_fraction: float = 0.70
    # Accept: no scored document may get worse by more than this fraction of its incumbent loss.
    max_relative_worsening: float = 0.10
    # Divergence (rule 3): the canaries' mean delta must reach
    # max(divergence_abs, divergence_rel * incumbent mean canary loss) nats/token. A fixed bar,
    # set from the measured seed-twin spread (benchmarks/bench_gate_calibration.py): it does not
    # move with the scored gain (gate/1's lambda * |mean d^S| rose with the very gain it was
    # meant to catch).
    divergence_abs: float = 0.15
    divergence_rel: float = 0.0
    # canaries_worse (rule 5): tau_K = max(tau_k_abs, tau_k_rel * incumbent mean canary loss).
    tau_k_abs: float = 0.01
    tau_k_rel: float = 0.01
    # Divergence: at least ceil(canary_worse_fraction * K) canaries individually worse (3K/4).
    canary_worse_fraction: float = 0.75
    # Sign-flip test: enumerate all 2^n patterns up to this n, Monte Carlo above it.
    exact_max_n: int = 20
    mc_draws: int = 10_000
    # A fixed seed keeps a verdict reproducible: the same scores always give the same p-value.
    mc_seed: int = 20_240_917
    # SuiteChanged: incumbent fresh vs recorded per-document loss, nats/token.
    drift_tolerance: float = 1e-4
    # Contamination: a shared window of this many folded characters (about ten words) is a copy;
    # documents shorter than a window are checked whole (all their segments in one row), and
    # documents with fewer than min_doc_chars folded characters cannot be checked at all.
    ngram_chars: int = 50
    min_doc_chars: int = 16
    # The canary string is found from any window of this many of its folded characters.
    canary_window: int = 24
    # Holdout hygiene: a suite hash may be queried budget_multiplier * |S| times.
    budget_multiplier: int = 2
    # Display only: percentile bootstrap interval for mean d^S.
    bootstrap_draws: int = 2_000
    bootstrap_level: float = 0.95
    bootstrap_seed: int = 20_240_918
    # |mean d^S| below this (nats/token) is reported as `action_score_unchanged`: an adapter that
    # learned only the register barely moves the action-span score. A tenth of eta_min.
    # |mean d^S| below eta_min is below what the gate can ever accept: report it as "the action
    # score did not move" (a register-only adapter moves it by ~0.004 on the demo model).
    unchanged_tolerance: float = 0.01
    # Below these sizes the gate still decides, but says the suite is small (docs/gate.md: with 10
    # scored documents only effects of ~0.85 sd are detectable).
    small_suite_scored: int = 30
    small_suite_canaries: int = 8
    rule_version: str = RULE_VERSION

    def __post_init__(self) -> None:
        _validate(self)

    # --- derived thresholds (one place, so the gate and the docs agree) ------------------
    def wins_needed(self, n: int) -> int:
        return min_count(self.win_fraction, n)

    def canaries_worse_needed(self, k: int) -> int:
        return min_count(self.canary_worse_fraction, k)

    def budget_for(self, n_scored: int) -> int:
        return self.budget_multiplier * n_scored

    def divergence_bar(self, incumbent_canary_mean: float) -> float:
        """The canary mean delta that counts as divergence: it depends on the incumbent's canary
        loss only, never on the scored gain (so a larger memorisation gain cannot raise it)."""
        return max(self.divergence_abs, self.divergence_rel * incumbent_canary_mean)

    # --- serialisation -------------------------------------------------------------------
    def to_json(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_json(cls, obj: object) -> "GateSettings":
        """Build settings from a JSON object. Missing keys take their defaults; unknown keys and
        bad values raise BadInput (a typo in a threshold must never be silently ignored)."""
        if not isinstance(obj, dict):
            raise BadInput(f"gate settings must be a JSON object, got {type(obj).__name__}")
        obj = dict(obj)
        # The rule version is the code's, not a setting: a verdict must name the procedure that
        # decided it. Settings recorded under an older rule lose what that rule had and this
        # one does not (RETIRED_SETTINGS); anything else unknown is still an error.
        recorded = obj.pop("rule_version", RULE_VERSION)
        if recorded != RULE_VERSION and recorded not in RETIRED_SETTINGS:
            raise BadInput(f"gate setting rule_version = {recorded!r} names a rule this gate does not know",
                           hint=f"this gate decides by {RULE_VERSION}; drop rule_version from the settings")
        for key in RETIRED_SETTINGS.get(recorded, ()):
            obj.pop(key, None)
        known = {f.name for f in dataclasses.fields(cls)} - {"rule_version"}
        unknown = sorted(set(obj) - known)
        if unknown:
            raise BadInput(f"unknown gate setting(s): {', '.join(map(str, unknown))}",
                           hint=f"known settings: {', '.join(sorted(known))}")
        return cls(**obj)


# name -> (kind, low, low_inclusive, high, high_inclusive); None means unbounded.
_BOUNDS: dict[str, tuple[str, float | None, bool, float | None, bool]] = {
    "alpha": ("float", 0.0, False, 1.0, False),
    "eta_min": ("float", 0.0, True, None, False),
    "win_fraction": ("float", 0.0, False, 1.0, True),
    "max_relative_worsening": ("float", 0.0, True, None, False),
    "divergence_abs": ("float", 0.0, True, None, False),
    "divergence_rel": ("float", 0.0, True, None, False),
    "tau_k_abs": ("float", 0.0, True, None, False),
    "tau_k_rel": ("float", 0.0, True, None, False),
    "canary_worse_fraction": ("float", 0.0, False, 1.0, True),
    # 2^24 patterns is 128 MiB of float64; beyond that exact enumeration is not "fast".
    "exact_max_n": ("int", 0, True, 24, True),
    "mc_draws": ("int", 1, True, 10_000_000, True),
    "mc_seed": ("int", 0, True, None, False),
    "drift_tolerance": ("float", 0.0, True, None, False),
    "ngram_chars": ("int", 8, True, 10_000, True),
    "min_doc_chars": ("int", 1, True, 10_000, True),
    "canary_window": ("int", 8, True, 10_000, True),
    "budget_multiplier": ("int", 1, True, None, False),
    "bootstrap_draws": ("int", 1, True, 1_000_000, True),
    "bootstrap_level": ("float", 0.0, False, 1.0, False),
    "bootstrap_seed": ("int", 0, True, None, False),
    "unchanged_tolerance": ("float", 0.0, True, None, False),
    "small_suite_scored": ("int", 0, True, None, False),
    "small_suite_canaries": ("int", 0, True, None, False),
}


def _validate(s: GateSettings) -> None:
    for name, (kind, lo, lo_inc, hi, hi_inc) in _BOUNDS.items():
        v = getattr(s, name)
        # bool is an int subclass; `alpha = true` in a config file is a mistake, not 1.
        if isinstance(v, bool):
            raise BadInput(f"gate setting {name} must be a number, got {v!r}")
        if kind == "int":
            if not isinstance(v, int):
                raise BadInput(f"gate setting {name} must be an integer, got {v!r}")
        else:
            if not isinstance(v, (int, float)):
                raise BadInput(f"gate setting {name} must be a number, got {v!r}")
            if not math.isfinite(v):
                raise BadInput(f"gate setting {name} must be finite, got {v!r}")
            # Store 0 as 0.0: canonical JSON of the recorded settings must not depend on
            # whether a config file wrote `0` or `0.0`.
            v = float(v)
            object.__setattr__(s, name, v)
        ok = True
        if lo is not None:
            ok &= v >= lo if lo_inc else v > lo
        if hi is not None:
            ok &= v <= hi if hi_inc else v < hi
        if not ok:
            lo_s = "-inf" if lo is None else f"{lo:g}"
            hi_s = "inf" if hi is None else f"{hi:g}"
            interval = f"{'[' if lo_inc else '('}{lo_s}, {hi_s}{']' if hi_inc else ')'}"
            raise BadInput(f"gate setting {name} = {v!r} is outside {interval}")
    if s.rule_version != RULE_VERSION:
        raise BadInput(f"gate setting rule_version = {s.rule_version!r} is not this gate's ({RULE_VERSION})",
                       hint="the rule version names the procedure that decides; it is not configurable")
