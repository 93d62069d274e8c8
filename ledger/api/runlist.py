"""Every training run in one table: `runs` (SFT, DPO, reproduce and tracked runs).

Part of ledger.api (see its docstring): import the verbs from there, `from ledger import api`."""

from __future__ import annotations

from dataclasses import dataclass

from ledger import runs as runslib
from ledger.api._base import Result, StoreLike, take_warnings
from ledger.api._open import open_store

RUN_FIELDS = runslib.FIELDS   # the columns of a run row, in order


@dataclass(frozen=True)
class RunsResult(Result):
    """Every training run of the `runs` view, as `ledger runs` shows them."""
    rows: tuple[runslib.RunRow, ...]

    def to_json(self):
        return runslib.Runs(self.rows).to_json()


def runs(*, where: str | None = None, sort: str = "seq", descending: bool = False, limit: int | None = None,
         store: StoreLike = None) -> RunsResult:
    """Every training run with status, verdict, key params and final loss; `where`: one SQL
    condition over the columns (e.g. "lr >= 1e-3"), `sort`/`descending`/`limit` as in `ledger runs`."""
    s = open_store(store)
    rows = runslib.list_runs(s, where=where, sort=sort, descending=descending, limit=limit)
    return RunsResult(tuple(rows), warnings=take_warnings(s))


def csv_cell(value) -> str:
    """A value as a CSV cell (params and metrics as JSON, None as empty)."""
    return runslib.csv_cell(value)
