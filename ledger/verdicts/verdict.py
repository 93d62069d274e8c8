"""The verdict object: what the gate decided, why, and everything needed to re-check it.

Two audiences, two projections:
- `to_json()` is the full record for the journal (docs/gate.md, "What is sealed and what the learner sees"). Per-document
  numbers (losses, deltas, signs, relative changes, n-gram examples) live under its `sealed` key.
- `learner_view()` is all the training side may ever see: the verdict and the best score rounded
  to eta. Rounding means a learner retrying many candidates learns the suite's score only in
  steps of eta, never the per-document detail it could fit to.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from ledger.verdicts.budget import BudgetCheck
from ledger.verdicts.contamination import ContaminationReport
from ledger.verdicts.reasons import ACCEPT, Reason
from ledger.verdicts.scores import Scores
from ledger.verdicts.settings import GateSettings
from ledger.verdicts.stats import PairedStats

VERDICT_FORMAT = "ledger.verdict/1"


def round_to_step(x: float, step: float) -> float:
    """x rounded to the nearest multiple of step (step <= 0 leaves x as is)."""
    if step <= 0:
        return x
    # The second round only strips float noise (0.30000000000000004) from the multiple.
    return round(round(x / step) * step, 12)


def relative_change(incumbent: float, candidate: float) -> float:
    """(candidate - incumbent) / incumbent; +inf for any worsening from a zero loss."""
    d = candidate - incumbent
    if incumbent > 0:
        return d / incumbent
    return math.inf if d > 0 else 0.0


def _finite_or_none(x: float | None) -> float | None:
    return x if x is not None and math.isfinite(x) else None


@dataclass(frozen=True)
class DriftCheck:
    """Incumbent fresh vs recorded losses (rule 1, second half)."""
    tolerance: float
    max_abs_diff: float | None  # None when the documents differ (then it has drifted)
    worst_doc: str | None
    missing: tuple[str, ...] = ()  # scored now, but not in the record
    extra: tuple[str, ...] = ()  # in the record, not scored now

    @property
    def drifted(self) -> bool:
        return bool(self.missing or self.extra) or (
            self.max_abs_diff is not None and self.max_abs_diff > self.tolerance)

    def to_json(self) -> dict:
        return {"tolerance": self.tolerance, "max_abs_diff": self.max_abs_diff,
                "worst_doc": self.worst_doc, "missing_from_record": list(self.missing),
                "extra_in_record": list(self.extra), "drifted": self.drifted}


@dataclass(frozen=True)
class ScoredChecks:
    """The Accept conditions (rule 4) and the Regressed test (rule 5), evaluated."""
    eta: float  # max(eta_min, sd / sqrt(n))
    significant: bool  # p_better <= alpha
    beats_eta: bool  # mean d <= -eta
    wins_needed: int
    enough_wins: bool
    worst_relative: float  # max_i d_i / L_incumbent(i); +inf when a zero loss got worse
    docs_over_limit: int  # documents worse by more than max_relative_worsening
    significantly_worse: bool  # p_worse <= alpha
    unchanged: bool  # |mean d| < unchanged_tolerance

    @property
    def accepted(self) -> bool:
        return self.significant and self.beats_eta and self.enough_wins and self.docs_over_limit == 0

    def to_json(self) -> dict:
        return {"eta": self.eta, "mean_threshold": -self.eta, "significant": self.significant,
                "beats_eta": self.beats_eta, "wins_needed": self.wins_needed,
                "enough_wins": self.enough_wins,
                "worst_relative_change": _finite_or_none(self.worst_relative),
                "worst_relative_change_infinite": math.isinf(self.worst_relative),
                "docs_over_relative_limit": self.docs_over_limit,
                "significantly_worse": self.significantly_worse, "unchanged": self.unchanged}


@dataclass(frozen=True)
class CanaryStats:
    """Canary deltas, summarised for the divergence rule (rule 3) and canaries_worse (rule 5)."""
    k: int
    mean_delta: float
    incumbent_mean_loss: float
    tau_k: float  # max(tau_k_abs, tau_k_rel * incumbent_mean_loss)
    divergence_threshold: float  # settings.divergence_bar(incumbent_mean_loss): not the scored gain
    worse: int  # canaries with d > 0
    worse_needed: int  # ceil(canary_worse_fraction * K)
    paired: PairedStats  # display only: with K = 4 no test can reach p <= 0.05

    def to_json(self) -> dict:
        return {"k": self.k, "mean_delta": self.mean_delta,
                "incumbent_mean_loss": self.incumbent_mean_loss, "tau_k": self.tau_k,
                "divergence_threshold": self.divergence_threshold, "worse": self.worse,
                "worse_needed": self.worse_needed, "sd": self.paired.sd,
                "p_worse": self.paired.p_worse, "p_better": self.paired.p_better,
                "test": self.paired.test.to_json()}


@dataclass(frozen=True)
class Verdict:
    """The gate's decision with its reasons, statistics, checks and settings (to_json is stored)."""
    verdict: str
    reasons: tuple[Reason, ...]
    settings: GateSettings
    incumbent_id: str
    candidate_id: str
    pinned_hash: str
    recomputed_hash: str
    notes: tuple[Reason, ...] = ()
    budget: BudgetCheck | None = None
    budget_counted: bool = False  # whether this run counts against the budget
    drift: DriftCheck | None = None
    scores: Scores | None = None  # None when decided before scoring
    scored: PairedStats | None = None
    checks: ScoredChecks | None = None
    canary: CanaryStats | None = None
    contamination: ContaminationReport | None = None
    dpo: Mapping[str, Any] | None = None

    @property
    def reason_codes(self) -> tuple[str, ...]:
        return tuple(r.code for r in self.reasons)

    @property
    def accepted(self) -> bool:
        return self.verdict == ACCEPT

    @property
    def summary(self) -> str:
        """The human one-line reason."""
        return f"{self.verdict}: " + "; ".join(r.message for r in self.reasons)

    @property
    def incumbent_mean_loss(self) -> float | None:
        if self.scores is None:
            return None
        return float(np.mean([self.scores.incumbent_scored[i] for i in self.scores.scored_ids]))

    @property
    def candidate_mean_loss(self) -> float | None:
        if self.scores is None:
            return None
        return float(np.mean([self.scores.candidate_scored[i] for i in self.scores.scored_ids]))

    def best_score(self) -> float | None:
        """Mean scored loss of whichever model is live after this verdict, rounded to eta."""
        if self.scores is None or self.checks is None:
            return None
        best = self.candidate_mean_loss if self.accepted else self.incumbent_mean_loss
        return round_to_step(best, self.checks.eta)

    def learner_view(self) -> dict:
        """All the training side may see. Nothing per-document, no reasons, no p-values."""
        return {"verdict": self.verdict, "best_score": self.best_score()}

    def to_json(self) -> dict:
        s = self.settings
        stats = None
        if self.scored is not None and self.checks is not None:
            stats = {"scored": {**self.scored.to_json(), **self.checks.to_json(),
                                "incumbent_mean_loss": self.incumbent_mean_loss,
                                "candidate_mean_loss": self.candidate_mean_loss},
                     "canary": self.canary.to_json() if self.canary is not None else None}
        budget = None
        if self.budget is not None:
            budget = {"used": self.budget.used + (1 if self.budget_counted else 0),
                      "of": self.budget.total, "counted": self.budget_counted}
        return {
            "format": VERDICT_FORMAT,
            "verdict": self.verdict,
            "reason_codes": list(self.reason_codes),
            "reasons": [r.to_json() for r in self.reasons],
            "summary": self.summary,
            "notes": [n.to_json() for n in self.notes],
            "rule": {"version": s.rule_version, "parameters": s.to_json()},
            "incumbent": self.incumbent_id,
            "candidate": self.candidate_id,
            "suite": {"pinned_hash": self.pinned_hash, "recomputed_hash": self.recomputed_hash,
                      "matches": self.pinned_hash == self.recomputed_hash},
            "budget": budget,
            "drift": self.drift.to_json() if self.drift is not None else None,
            "statistics": stats,
            "contamination": (self.contamination.to_json(include_examples=False)
                              if self.contamination is not None else None),
            "dpo": dict(self.dpo) if self.dpo is not None else None,
            "learner_view": self.learner_view(),
            "sealed": self._sealed(),
        }

    def _sealed(self) -> dict:
        out: dict[str, Any] = {"scored": None, "canary": None, "incumbent_recorded": None,
                               "contamination_examples": []}
        sc = self.scores
        if sc is not None:
            out["scored"] = {i: _doc_row(sc.incumbent_scored[i], sc.candidate_scored[i])
                             for i in sc.scored_ids}
            out["canary"] = {i: _doc_row(sc.incumbent_canary[i], sc.candidate_canary[i])
                             for i in sc.canary_ids}
            if sc.incumbent_recorded is not None:
                out["incumbent_recorded"] = dict(sorted(sc.incumbent_recorded.items()))
        if self.contamination is not None:
            out["contamination_examples"] = [o.to_json() for o in self.contamination.overlaps]
        return out


def _doc_row(incumbent: float, candidate: float) -> dict:
    d = candidate - incumbent
    rel = relative_change(incumbent, candidate)
    return {"incumbent": incumbent, "candidate": candidate, "delta": d,
            "sign": (d > 0) - (d < 0),  # +1: candidate worse on this document
            "relative": _finite_or_none(rel)}
