"""Query budget of a sealed suite (docs/gate.md, "What is sealed and what the learner sees").

Every gate run leaks a little about the suite, even through a verdict alone: a learner that
retries often enough can fit the holdout by selection. So each set of scored documents gets a
fixed number of runs, B = budget_multiplier * |S| (default 2|S|), and when they are spent the
gate refuses until the suite is rotated (new documents, explicitly pinned). Runs decided before
any scoring (SuiteChanged on the hash, contamination found before scoring) reveal nothing and
do not count.

What leaks is the scored documents' content, so that is what the budget is keyed on
(`budget_key`: their content with the scorer, tokenizer and base), not the pin's suite hash:
the suite hash covers the canary documents, which carry a canary string drawn fresh at every
seal, so re-pinning the same documents would otherwise start a fresh budget.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from ledger.errors import BadInput, Refused
from ledger.verdicts.reasons import BUDGET_SPENT
from ledger.verdicts.settings import GateSettings
from ledger.verdicts.suite_hash import b3, canonical_json

# Part of the hashed object: changing what the key covers must change every key.
BUDGET_KEY_FORMAT = "ledger.gate-budget/1"
BUDGET_KEY_PREFIX = "budget:"


def budget_key(scored_contents: Iterable[str], *, scorer_version: str, tokenizer_id: str,
               base_weights_id: str) -> str:
    """The budget's key: `b3:` over the scored documents' content hashes (a multiset: sorted,
    duplicates kept; no doc ids, so renaming a document is not a rotation) with the scorer
    version, tokenizer and base. The canary documents are not part of it."""
    hashes = list(scored_contents)
    if not hashes or not all(isinstance(h, str) and h for h in hashes):
        raise BadInput("a budget key needs the content hash of every scored document")
    for name, v in (("scorer_version", scorer_version), ("tokenizer_id", tokenizer_id),
                    ("base_weights_id", base_weights_id)):
        if not isinstance(v, str) or not v:
            raise BadInput(f"{name} must be a non-empty string, got {v!r}")
    digest = b3(canonical_json({"format": BUDGET_KEY_FORMAT, "scored": sorted(hashes),
                                "scorer_version": scorer_version, "tokenizer_id": tokenizer_id,
                                "base_weights_id": base_weights_id}))
    # `budget:<hex>`, not `b3:<hex>`: a key names no stored object, and every b3: id in a record or
    # a structured object counts as a reference that verify and gc must find (store/ids.py)
    return BUDGET_KEY_PREFIX + digest.removeprefix("b3:")


@dataclass(frozen=True)
class BudgetCheck:
    """Gate runs used and allowed on a set of scored documents; `require()` refuses when spent."""
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
    """The budget check for a suite of `n_scored` documents after `runs_used` gate runs."""
    s = settings or GateSettings()
    for name, v in (("runs used", runs_used), ("number of scored documents", n_scored)):
        if isinstance(v, bool) or not isinstance(v, int) or v < 0:
            raise BadInput(f"{name} must be a non-negative integer, got {v!r}")
    return BudgetCheck(used=runs_used, total=s.budget_for(n_scored))
