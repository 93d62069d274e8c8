"""Pure functions: scores in, verdict and statistics out (docs/gate.md). No I/O, no torch.

    from ledger.verdicts import GateInputs, Scores, decide
    verdict = decide(GateInputs(incumbent_id=..., candidate_id=..., pinned_hash=h,
                                recomputed_hash=h, scores=Scores(...), runs_used=3))
    verdict.to_json()        # the full record; per-document numbers under "sealed"
    verdict.learner_view()   # {"verdict": ..., "best_score": ...}: all the learner may see
"""

from ledger.verdicts.budget import BudgetCheck, budget_key, check_budget
from ledger.verdicts.contamination import (
                                           ContaminationReport,
                                           NgramOverlap,
                                           check_contamination,
                                           fold_stream,
                                           fold_text,
                                           fold_tokens,
                                           ngrams,
)
from ledger.verdicts.gate import GateInputs, check_export, contamination_options, decide
from ledger.verdicts.reasons import (
                                           ACCEPT,
                                           GAMED_THE_EVALUATOR,
                                           NO_IMPROVEMENT,
                                           REASON_CODES,
                                           REGRESSED,
                                           SUITE_CHANGED,
                                           VERDICTS,
                                           Reason,
)
from ledger.verdicts.scores import Scores
from ledger.verdicts.settings import RULE_VERSION, GateSettings
from ledger.verdicts.stats import (
                                           BootstrapInterval,
                                           PairedStats,
                                           SignFlipResult,
                                           bootstrap_mean_interval,
                                           paired_stats,
                                           sign_flip_test,
)
from ledger.verdicts.suite_hash import content_hash, suite_hash, suite_hash_payload
from ledger.verdicts.verdict import CanaryStats, DriftCheck, ScoredChecks, Verdict

__all__ = [
    "ACCEPT", "GAMED_THE_EVALUATOR", "NO_IMPROVEMENT", "REASON_CODES", "REGRESSED", "RULE_VERSION",
    "SUITE_CHANGED", "VERDICTS", "BootstrapInterval", "BudgetCheck", "CanaryStats",
    "ContaminationReport", "DriftCheck", "GateInputs", "GateSettings", "NgramOverlap",
    "PairedStats", "Reason", "ScoredChecks", "Scores", "SignFlipResult", "Verdict",
    "bootstrap_mean_interval", "budget_key", "check_budget", "check_contamination", "check_export",
    "contamination_options", "content_hash", "decide", "fold_stream", "fold_text", "fold_tokens", "ngrams",
    "paired_stats", "sign_flip_test", "suite_hash", "suite_hash_payload",
]
