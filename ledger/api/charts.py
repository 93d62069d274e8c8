"""Text charts for the CLI's tables: sparkline (its own room: drawing one loads ledger.report, which
`ledger log` pays only when a record it shows has a loss curve).

Part of ledger.api (see its docstring): import the verbs from there, `from ledger import api`."""

from __future__ import annotations

from typing import Sequence

from ledger.report.sparkline import sparkline as spark


def sparkline(values: Sequence[float], width: int = 16) -> str:
    """`▇▅▃▂▁`: a series in `width` block glyphs (the loss curves of `log`, `gens` and `show`)."""
    return spark(values, width)
