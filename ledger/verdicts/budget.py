"""Query budget of a sealed suite (GATE.md, holdout hygiene).

Every gate run leaks a little about the suite, even through a verdict alone: a learner that
retries often enough can fit the holdout by selection. So each suite hash gets a fixed number of
runs, B = budget_multiplier * |S| (default 2|S|), and when they are spent the gate refuses until
the suite is rotated (a new sealed suite, explicitly pinned). Runs decided before any scoring
(SuiteChanged on the hash, contamination found before scoring) reveal nothing and do not count.
"""

from __future__ import annotations

from dataclasses import dataclass

from ledger.errors import BadInput, Refused
from ledger.verdicts.reasons import BUDGET_SPENT
from ledger.verdicts.settings import GateSettings


@dataclass(frozen=True)
class BudgetCheck:
    used: int  # gate runs already made against this suite hash (before the one being asked for)
    total: int  # B

    @property
    def remaining(self) -> int:
        return max(0, self.total - self.used)

    @property
    def spent(self) -> bool:
        return self.used >= self.total

    @property
    def reason_code(self) -> str | None:
        return BUDGET_SPENT if self.spent else None

    @property
    def message(self) -> str:
        if self.spent:
            return (f"the suite's gate budget is spent ({self.used} of {self.total} runs used); "
                    "rotate the suite (seal a new one and pin it) before judging again")
        return f"{self.remaining} of {self.total} gate runs left on this suite"

    def to_json(self) -> dict:
        return {"used": self.used, "of": self.total, "remaining": self.remaining,
                "spent": self.spent}

    def require(self) -> None:
        """Raise Refused (exit code 3) when the budget is spent."""
        if self.spent:
            raise Refused(self.message,
                          hint="seal a new suite and pin it explicitly; the old one is spent",
                          reason=BUDGET_SPENT, used=self.used, budget=self.total)


def check_budget(runs_used: int, n_scored: int, settings: GateSettings | None = None) -> BudgetCheck:
    s = settings or GateSettings()
    for name, v in (("runs used", runs_used), ("number of scored documents", n_scored)):
        if isinstance(v, bool) or not isinstance(v, int) or v < 0:
            raise BadInput(f"{name} must be a non-negative integer, got {v!r}")
    return BudgetCheck(used=runs_used, total=s.budget_for(n_scored))
