"""`ledger report`: the store's history as one self-contained HTML file (ledger.report)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated

import typer

from ledger.cli import common
from ledger.cli.common import JsonOpt, emit, flush_warnings, human_bytes, open_store


def register(app: typer.Typer) -> None:
    app.command("report")(report)


def report(
    output: Annotated[str, typer.Option("--output", "-o", help="HTML file to write, or - for stdout.")] = "report.html",
    json_: JsonOpt = False,
):
    """Write an HTML report: score history with the η band, verdicts, loss curves, canary vs
    scored deltas, lineage and HEAD moves, and a receipt browser. Offline: no script, no network."""
    from ledger import report as reportlib
    from ledger.errors import BadInput

    store = open_store()
    if output == "-":
        if json_:
            raise BadInput("--json and -o - both want stdout", "write the page to a file with -o FILE")
        sys.stdout.write(reportlib.render(reportlib.gather(store)))
        flush_warnings(store)
        return
    info = reportlib.write(store, Path(output))
    flush_warnings(store)
    emit(json_, info, lambda: common.console().print(
        f"wrote [bold]{info['path']}[/] ({human_bytes(info['bytes'])}): {info['generations']} generation(s), "
        f"{info['cycles']} cycle(s), {info['gate_runs']} gate run(s), {info['receipts']} receipt(s), "
        f"{info['rollbacks']} rollback(s) — open it in a browser (works offline)"))
