"""`ledger report`: the store's history as one self-contained HTML file (api.report)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated

import typer

from ledger import api
from ledger.cli import common
from ledger.cli.common import JsonOpt, finish, human_bytes
from ledger.errors import BadInput


def register(app: typer.Typer) -> None:
    app.command("report")(report)


def report(
    output: Annotated[str, typer.Option("--output", "-o", help="HTML file to write, or - for stdout.")] = "report.html",
    json_: JsonOpt = False,
):
    """Write an HTML report: score history with the η band, verdicts, loss curves, canary vs
    scored deltas, lineage and HEAD moves, and a receipt browser. Offline: no script, no network."""
    if output == "-":
        if json_:
            raise BadInput("--json and -o - both want stdout", "write the page to a file with -o FILE")
        html, warnings = api.report_html(store=common.store_dir())
        sys.stdout.write(html)
        common.print_warnings(warnings)
        return
    res = api.report(Path(output), store=common.store_dir())
    info = res.info
    finish(json_, res, lambda: common.console().print(
        f"wrote [bold]{info['path']}[/] ({human_bytes(info['bytes'])}): {info['generations']} generation(s), "
        f"{info['cycles']} cycle(s), {info['gate_runs']} gate run(s), {info['receipts']} receipt(s), "
        f"{info['rollbacks']} rollback(s) — open it in a browser (works offline)"))
