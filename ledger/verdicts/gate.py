"""The gate's decision procedure (docs/gate.md): inputs in, one Verdict out. Pure: no I/O.

Rules are checked in order and the first that matches decides:

1. SuiteChanged      pinned hash != recomputed hash (looked at before any score), or the
                     incumbent's fresh losses drifted from its recorded ones
2. GamedTheEvaluator the training export holds the canary string or shares an n-gram with S u K
3. GamedTheEvaluator the scored set improves while the canaries get worse (divergence)
4. Accept            significant, at least eta better, enough wins, no document much worse
5. Regressed         significantly worse, or canaries worse without a scored gain
   NoImprovement     anything else, with the Accept conditions that failed as reasons

Statistics are computed whenever scores are present, even when an earlier rule decided, so the
record of a refused candidate still shows how it scored.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ledger.errors import BadInput
from ledger.verdicts import reasons as R
from ledger.verdicts.budget import BudgetCheck, check_budget
from ledger.verdicts.contamination import ContaminationReport, check_contamination
from ledger.verdicts.reasons import Reason
from ledger.verdicts.scores import Scores
from ledger.verdicts.settings import GateSettings
from ledger.verdicts.stats import PairedStats, paired_stats
from ledger.verdicts.suite_hash import canonical_json
from ledger.verdicts.verdict import CanaryStats, DriftCheck, ScoredChecks, Verdict, relative_change


@dataclass(frozen=True)
class GateInputs:
    """Everything the pure decision function needs: ids, hashes, scores, contamination, budget."""
    incumbent_id: str
    candidate_id: str
    pinned_hash: str
    recomputed_hash: str
    # None is allowed when the hash differs (SuiteChanged is decided before scoring), or when
    # contamination was found before scoring; otherwise decide() needs the scores.
    scores: Scores | None = None
    # None: not checked (recorded as a note). The report comes from check_contamination().
    contamination: ContaminationReport | None = None
    # Gate runs already made against this suite hash; None when the caller does not track them.
    runs_used: int | None = None
    settings: GateSettings = field(default_factory=GateSettings)
    # Preference tuning summary (reward margin, accuracy, chosen-reward summary), passed through.
    dpo: Mapping[str, Any] | None = None


def contamination_options(settings: GateSettings) -> dict:
    """check_contamination's keyword options that these settings record."""
    return {"window": settings.ngram_chars, "min_doc_chars": settings.min_doc_chars,
            "canary_window": settings.canary_window}


def check_export(training_texts, suite_texts, canary_string, settings: GateSettings, *,
                 shared_text=()) -> ContaminationReport:
    """check_contamination with the options `settings` name (what a verdict will record)."""
    return check_contamination(training_texts, suite_texts, canary_string, shared_text=shared_text,
                               **contamination_options(settings))


# "The scored set improves" means mean d^S < 0 beyond float noise: documents moved by +0.01 and
# -0.01 (2.01 - 2.0, 1.99 - 2.0) average to about -1e-16, which is no gain, and must not turn a
# canaries_worse Regressed into a divergence verdict by rounding alone.
_MEAN_NOISE = 1e-12


def _short(h: str) -> str:
    return h if len(h) <= 19 else h[:19] + "…"


def _validate(inputs: GateInputs) -> dict | None:
    for name in ("incumbent_id", "candidate_id", "pinned_hash", "recomputed_hash"):
        v = getattr(inputs, name)
        if not isinstance(v, str) or not v:
            raise BadInput(f"gate input {name} must be a non-empty string, got {v!r}")
    if not isinstance(inputs.settings, GateSettings):
        raise BadInput("gate input settings must be GateSettings")
    if inputs.scores is not None and not isinstance(inputs.scores, Scores):
        raise BadInput("gate input scores must be Scores")
    c = inputs.contamination
    if c is not None and not isinstance(c, ContaminationReport):
        raise BadInput("gate input contamination must be a ContaminationReport")
    st = inputs.settings
    if c is not None and (c.window, c.min_doc_chars, c.canary_window) != (
            st.ngram_chars, st.min_doc_chars, st.canary_window):
        # The verdict records the contamination settings; a report made with others would make
        # that record false.
        raise BadInput(f"contamination was checked with windows of {c.window} characters "
                       f"(min_doc_chars {c.min_doc_chars}, canary_window {c.canary_window}) but the "
                       f"gate settings say {st.ngram_chars} ({st.min_doc_chars}, {st.canary_window})",
                       hint="call check_contamination(..., **contamination_options(settings))")
    if inputs.dpo is None:
        return None
    if not isinstance(inputs.dpo, Mapping):
        raise BadInput("gate input dpo must be a mapping of summary statistics")
    # Round-trip through canonical JSON: rejects NaN and non-JSON values now, rather than when
    # the store writes the verdict, and detaches the record from the caller's mutable mapping.
    return json.loads(canonical_json(dict(inputs.dpo)))


# --- statistics ---------------------------------------------------------------------------
def _scored_checks(scores: Scores, st: PairedStats, s: GateSettings) -> ScoredChecks:
    eta = max(s.eta_min, st.standard_error)
    rel = [relative_change(scores.incumbent_scored[i], scores.candidate_scored[i])
           for i in scores.scored_ids]
    return ScoredChecks(
        eta=eta,
        significant=st.p_better <= s.alpha,
        beats_eta=st.mean <= -eta,
        wins_needed=s.wins_needed(st.n),
        enough_wins=st.wins >= s.wins_needed(st.n),
        worst_relative=max(rel),
        docs_over_limit=sum(r > s.max_relative_worsening for r in rel),
        significantly_worse=st.p_worse <= s.alpha,
        unchanged=abs(st.mean) < s.unchanged_tolerance,
    )


def _canary_stats(scores: Scores, s: GateSettings) -> CanaryStats | None:
    ids = scores.canary_ids
    if not ids:
        return None
    dk = scores.canary_deltas()
    inc_mean = float(np.mean([scores.incumbent_canary[i] for i in ids]))
    tau = max(s.tau_k_abs, s.tau_k_rel * inc_mean)
    return CanaryStats(
        k=len(ids), mean_delta=float(np.mean(dk)), incumbent_mean_loss=inc_mean, tau_k=tau,
        divergence_threshold=s.divergence_bar(inc_mean),
        worse=int(np.count_nonzero(dk > 0)), worse_needed=s.canaries_worse_needed(len(ids)),
        paired=paired_stats(dk, s))


def _drift(scores: Scores, s: GateSettings) -> DriftCheck | None:
    rec = scores.incumbent_recorded
    if rec is None:
        return None
    fresh = scores.incumbent_fresh()
    missing = tuple(sorted(fresh.keys() - rec.keys()))
    extra = tuple(sorted(rec.keys() - fresh.keys()))
    if missing or extra:
        return DriftCheck(s.drift_tolerance, None, None, missing, extra)
    worst = max(sorted(fresh), key=lambda i: abs(fresh[i] - rec[i]))
    return DriftCheck(s.drift_tolerance, abs(fresh[worst] - rec[worst]), worst)


def _notes(scores: Scores | None, inputs: GateInputs, drift: DriftCheck | None) -> list[Reason]:
    s = inputs.settings
    notes: list[Reason] = []
    if scores is not None:
        n, k = len(scores.incumbent_scored), len(scores.incumbent_canary)
        if n < s.small_suite_scored or k < s.small_suite_canaries:
            notes.append(Reason(R.SMALL_SUITE,
                                f"small suite: {n} scored and {k} canary documents "
                                f"({s.small_suite_scored}+ and {s.small_suite_canaries}+ make the "
                                "gate far sharper); only large effects can pass"))
        if n <= s.exact_max_n and 0.5 ** n > s.alpha:
            notes.append(Reason(R.CANNOT_REACH_SIGNIFICANCE,
                                f"with {n} scored documents the smallest possible p-value is "
                                f"1/{2 ** n} > {s.alpha:g}: no candidate can be accepted"))
        if k == 0:
            notes.append(Reason(R.NO_CANARIES, "the suite has no canary documents: "
                                               "divergence cannot be detected"))
        if drift is None:
            notes.append(Reason(R.DRIFT_NOT_CHECKED,
                                "no recorded incumbent scores: environment drift not checked"))
        if inputs.runs_used is None:
            notes.append(Reason(R.BUDGET_NOT_TRACKED, "runs on this suite are not being counted"))
    c = inputs.contamination
    if c is None:
        notes.append(Reason(R.CONTAMINATION_NOT_CHECKED, "the training export was not checked "
                                                         "for contamination"))
    else:
        if not c.canary_string_checked:
            notes.append(Reason(R.CANARY_STRING_NOT_CHECKED, "no canary string was given"))
        if c.unchecked_docs:
            notes.append(Reason(R.DOCS_TOO_SHORT_FOR_NGRAM_CHECK,
                                f"{len(c.unchecked_docs)} suite documents have fewer than "
                                f"{c.min_doc_chars} folded characters: too short to check"))
    return notes


# --- reasons ------------------------------------------------------------------------------
def _contamination_reasons(c: ContaminationReport) -> list[Reason]:
    out = []
    if c.canary_string_found:
        out.append(Reason(R.CANARY_STRING_IN_EXPORT,
                          f"the training export contains the suite's canary string "
                          f"({c.canary_row_count} row{'s' if c.canary_row_count != 1 else ''})"))
    if c.overlaps:
        out.append(Reason(R.NGRAM_OVERLAP,
                          f"{len(c.overlaps)} suite document{'s' if len(c.overlaps) != 1 else ''} "
                          f"found in the training export (folded text)"))
    return out


def _unchanged_reason(st: PairedStats, s: GateSettings) -> Reason:
    return Reason(R.ACTION_SCORE_UNCHANGED,
                  f"action score unchanged (|mean Δ| {abs(st.mean):.2g} < "
                  f"{s.unchanged_tolerance:g} nats/token): the candidate did not change what it "
                  "does, only how it says it")


def _failed_accept_reasons(st: PairedStats, ch: ScoredChecks, s: GateSettings) -> list[Reason]:
    out = []
    if not ch.significant:
        out.append(Reason(R.NOT_SIGNIFICANT,
                          f"not significant (p = {st.p_better:.3g} > {s.alpha:g})"))
    if not ch.beats_eta:
        out.append(Reason(R.BELOW_ETA,
                          f"mean Δ {st.mean:+.4f} nats/token does not reach −η = {-ch.eta:.4f}"))
    if not ch.enough_wins:
        out.append(Reason(R.TOO_FEW_WINS, f"{st.wins}/{st.n} documents improved "
                                          f"({ch.wins_needed} needed)"))
    if ch.docs_over_limit:
        worst = "a zero loss" if math.isinf(ch.worst_relative) else f"{ch.worst_relative:+.1%}"
        out.append(Reason(R.DOC_REGRESSED_OVER_10PCT,
                          f"{ch.docs_over_limit} document{'s' if ch.docs_over_limit != 1 else ''} "
                          f"worse by more than {s.max_relative_worsening:.0%} (worst {worst})"))
    return out


# --- the procedure ------------------------------------------------------------------------
def decide(inputs: GateInputs) -> Verdict:
    """Apply docs/gate.md's rules in order; the first that matches decides.

    Raises BadInput for malformed inputs, and Refused (reason `budget_spent`) when the suite's
    run budget is spent: that is a refusal to judge, not a verdict about the candidate.
    """
    dpo = _validate(inputs)
    s = inputs.settings
    base = dict(settings=s, incumbent_id=inputs.incumbent_id, candidate_id=inputs.candidate_id,
                pinned_hash=inputs.pinned_hash, recomputed_hash=inputs.recomputed_hash, dpo=dpo,
                contamination=inputs.contamination)

    # Rule 1a, before scores are even looked at: scores of a different suite are not recorded.
    if inputs.pinned_hash != inputs.recomputed_hash:
        return Verdict(R.SUITE_CHANGED, (Reason(
            R.SUITE_HASH_MISMATCH,
            f"suite hash {_short(inputs.recomputed_hash)} differs from the pinned "
            f"{_short(inputs.pinned_hash)}; re-pin the suite explicitly if the change is intended"),),
            notes=(Reason(R.DECIDED_BEFORE_SCORING, "decided before scoring"),), **base)

    scores = inputs.scores
    if scores is None:
        # Contamination needs only the export and the suite texts, so a caller may check it
        # before spending time scoring; a contaminated candidate needs no scores to be refused.
        c = inputs.contamination
        if c is not None and c.contaminated:
            return Verdict(R.GAMED_THE_EVALUATOR, tuple(_contamination_reasons(c)),
                           notes=(Reason(R.DECIDED_BEFORE_SCORING, "decided before scoring"),
                                  *_notes(None, inputs, None)), **base)
        raise BadInput("the gate needs both models' scores when the suite hash matches",
                       hint="score incumbent and candidate on the pinned suite in the same run")

    budget: BudgetCheck | None = None
    if inputs.runs_used is not None:
        budget = check_budget(inputs.runs_used, len(scores.incumbent_scored), s)
        budget.require()

    st = paired_stats(scores.scored_deltas(), s)
    ch = _scored_checks(scores, st, s)
    canary = _canary_stats(scores, s)
    drift = _drift(scores, s)
    full = dict(base, budget=budget, budget_counted=budget is not None, drift=drift,
                scores=scores, scored=st, checks=ch, canary=canary,
                notes=tuple(_notes(scores, inputs, drift)))

    # Rule 1b: the environment drifted, so fresh and recorded scores are not comparable.
    if drift is not None and drift.drifted:
        if drift.max_abs_diff is None:
            msg = (f"the incumbent's recorded scores cover other documents "
                   f"({len(drift.missing)} missing, {len(drift.extra)} extra)")
        else:
            msg = (f"the incumbent's fresh scores differ from its recorded ones by "
                   f"{drift.max_abs_diff:.2g} nats/token (> {s.drift_tolerance:g}): "
                   "the scoring environment drifted")
        return Verdict(R.SUITE_CHANGED, (Reason(R.INCUMBENT_DRIFT, msg),), **full)

    # Rule 2: contamination.
    c = inputs.contamination
    if c is not None and c.contaminated:
        return Verdict(R.GAMED_THE_EVALUATOR, tuple(_contamination_reasons(c)), **full)

    # Rule 3: divergence. An effect-size rule by design (4 canaries cannot reach p <= 0.05), with
    # a bar fixed by the settings and the incumbent: it does not rise with the scored gain.
    scored_gain = st.mean < -_MEAN_NOISE
    if (canary is not None and scored_gain and canary.mean_delta >= canary.divergence_threshold
            and canary.worse >= canary.worse_needed):
        return Verdict(R.GAMED_THE_EVALUATOR, (Reason(
            R.CANARY_DIVERGENCE,
            f"scored documents improved (mean Δ {st.mean:+.4f}) while {canary.worse}/{canary.k} "
            f"canaries got worse (mean Δ {canary.mean_delta:+.4f} ≥ "
            f"{canary.divergence_threshold:.4f})"),), **full)

    # Rule 4: Accept.
    if ch.accepted:
        return Verdict(R.ACCEPT, (Reason(
            R.SIGNIFICANT_IMPROVEMENT,
            f"mean Δ {st.mean:+.4f} nats/token (η {ch.eta:.4f}), p = {st.p_better:.3g}, "
            f"{st.wins}/{st.n} documents improved"),), **full)

    # Rule 5: Regressed, else NoImprovement.
    lead = [_unchanged_reason(st, s)] if ch.unchanged else []
    regressed = []
    if ch.significantly_worse:
        regressed.append(Reason(R.SIGNIFICANTLY_WORSE,
                                f"candidate significantly worse (mean Δ {st.mean:+.4f}, "
                                f"p = {st.p_worse:.3g} ≤ {s.alpha:g})"))
    if (canary is not None and not scored_gain and canary.mean_delta >= canary.tau_k
            and canary.worse >= canary.worse_needed):
        regressed.append(Reason(R.CANARIES_WORSE,
                                f"{canary.worse}/{canary.k} canaries worse (mean Δ "
                                f"{canary.mean_delta:+.4f} ≥ τ_K {canary.tau_k:.4f}) without a "
                                "scored gain"))
    if regressed:
        return Verdict(R.REGRESSED, tuple(lead + regressed), **full)
    return Verdict(R.NO_IMPROVEMENT, tuple(lead + _failed_accept_reasons(st, ch, s)), **full)
