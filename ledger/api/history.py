"""History: gens (the generations and the verdicts that admitted them), diff.

Part of ledger.api (see its docstring): import the verbs from there, `from ledger import api`."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping

from ledger import generations
from ledger.api._base import Result, StoreLike, take_warnings
from ledger.api._open import open_store
from ledger.diff import diff as run_diff
from ledger.lineage import generation_rows


@dataclass(frozen=True)
class Gens(Result):
    """The generations asked for (the newest `limit`, and HEAD's) with the verdict and score that
    admitted each (`ledger gens`); HEAD marked; `total` counts every generation."""
    rows: tuple[Mapping, ...]                       # ledger.lineage.generation_rows
    losses: Mapping[str, Any] = field(default_factory=dict)   # receipt id -> its loss trace
    total: int = 0

    def to_json(self):
        return list(self.rows)



def gens(*, losses: bool = False, limit: int | None = None, store: StoreLike = None) -> Gens:
    """Generations, with the verdict and score that admitted each; HEAD marked. `losses`: also
    read each generation's receipt loss trace. `limit`: only the newest so many (and HEAD's)."""
    s = open_store(store)
    rows = generation_rows(s, limit)
    traces = {r["receipt"]: s.get_json(r["receipt"]).get("losses") for r in rows if losses and r["receipt"]}
    return Gens(tuple(rows), traces, total=len(generations.numbers(s)), warnings=take_warnings(s))



@dataclass(frozen=True)
class Diff(Result):
    """The field-level differences between two generations, receipts, plans or specs."""
    body: Mapping   # ledger.diff.diff: kind, a, b, fields, receipt, verdicts, data, adapter

    def to_json(self):
        return self.body



def diff(a: str, b: str, *, store: StoreLike = None) -> Diff:
    """What changed between two generations, receipts or plans, field by field."""
    s = open_store(store)
    return Diff(run_diff(s, a, b), warnings=take_warnings(s))
