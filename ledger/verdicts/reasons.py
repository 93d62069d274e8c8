"""The gate's vocabulary: verdict names and machine-readable reason codes.

Codes are stable strings (scripts and the journal index match on them); the message beside each
code is for people and may change. A code names the rule, not the threshold it was run with
(`doc_regressed_over_10pct` keeps its name when max_relative_worsening is configured to 0.2;
the message and the recorded parameters say the actual value).
"""

from __future__ import annotations

from dataclasses import dataclass

from ledger.verdicts.contamination import CANARY_STRING_IN_EXPORT, NGRAM_OVERLAP

# --- verdicts, in the order their rules are checked ----------------------------------------
SUITE_CHANGED = "SuiteChanged"
GAMED_THE_EVALUATOR = "GamedTheEvaluator"
ACCEPT = "Accept"
REGRESSED = "Regressed"
NO_IMPROVEMENT = "NoImprovement"
VERDICTS = (SUITE_CHANGED, GAMED_THE_EVALUATOR, ACCEPT, REGRESSED, NO_IMPROVEMENT)

# --- reason codes -------------------------------------------------------------------------
# SuiteChanged
SUITE_HASH_MISMATCH = "suite_hash_mismatch"
INCUMBENT_DRIFT = "incumbent_drift"
# GamedTheEvaluator (CANARY_STRING_IN_EXPORT and NGRAM_OVERLAP come from contamination.py)
CANARY_DIVERGENCE = "canary_divergence"
# Accept
SIGNIFICANT_IMPROVEMENT = "significant_improvement"
# NoImprovement: the Accept conditions that failed
NOT_SIGNIFICANT = "not_significant"
BELOW_ETA = "below_eta"
TOO_FEW_WINS = "too_few_wins"
DOC_REGRESSED_OVER_10PCT = "doc_regressed_over_10pct"
# Regressed
SIGNIFICANTLY_WORSE = "significantly_worse"
CANARIES_WORSE = "canaries_worse"
# Either of the last two: the candidate barely moved the action-span score (register-only)
ACTION_SCORE_UNCHANGED = "action_score_unchanged"
# Refusal before judging (raised as ledger.errors.Refused, not a verdict)
BUDGET_SPENT = "budget_spent"

REASON_CODES = (SUITE_HASH_MISMATCH, INCUMBENT_DRIFT, CANARY_STRING_IN_EXPORT, NGRAM_OVERLAP,
                CANARY_DIVERGENCE, SIGNIFICANT_IMPROVEMENT, NOT_SIGNIFICANT, BELOW_ETA,
                TOO_FEW_WINS, DOC_REGRESSED_OVER_10PCT, SIGNIFICANTLY_WORSE, CANARIES_WORSE,
                ACTION_SCORE_UNCHANGED, BUDGET_SPENT)

# --- notes: things a verdict says without them changing the verdict -----------------------
SMALL_SUITE = "small_suite"
CANNOT_REACH_SIGNIFICANCE = "cannot_reach_significance"
NO_CANARIES = "no_canaries"
DRIFT_NOT_CHECKED = "drift_not_checked"
CONTAMINATION_NOT_CHECKED = "contamination_not_checked"
CANARY_STRING_NOT_CHECKED = "canary_string_not_checked"
DOCS_TOO_SHORT_FOR_NGRAM_CHECK = "docs_too_short_for_ngram_check"
DECIDED_BEFORE_SCORING = "decided_before_scoring"
BUDGET_NOT_TRACKED = "budget_not_tracked"


@dataclass(frozen=True)
class Reason:
    """One reason code with its human message."""
    code: str
    message: str  # one short human clause, no trailing period

    def to_json(self) -> dict:
        return {"code": self.code, "message": self.message}
