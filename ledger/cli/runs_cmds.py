"""`ledger runs`: every training run — ledger's own, DPO and tracked — in one table."""

from __future__ import annotations

import csv
import io
import sys
from typing import Annotated

import typer

from ledger import api
from ledger.cli import common
from ledger.cli.common import JsonOpt, finish
from ledger.cli.tables import Column, number, print_table, short_id, terminal_width

COLUMNS = [
    Column("run"), Column("trainer", 3), Column("name", 2, wrap=True), Column("status"), Column("verdict", 1),
    Column("rung", 4), Column("lr", 1, "right"), Column("r", 2, "right"), Column("alpha", 5, "right"),
    Column("steps", 3, "right"), Column("batch", 5, "right"), Column("seed", 5, "right"), Column("base", 6),
    Column("loss", 0, "right"),
]


def register(app: typer.Typer) -> None:
    app.command("runs")(runs)


def _cells(r) -> list[str]:
    return [short_id(r.run), r.trainer, r.name or "-", r.status, r.verdict or "-", r.rung or "-", number(r.lr),
            number(r.r), number(r.alpha), number(r.steps), number(r.batch), number(r.seed), short_id(r.base),
            number(r.final_loss)]


def runs(
    where: Annotated[str | None, typer.Option("--where", help="A SQL condition over the columns, e.g. \"lr >= 1e-3 and status = 'finished'\" (an unfinished tracked run is 'started' here).")] = None,
    sort: Annotated[str, typer.Option("--sort", help="Column to sort by: seq, time, name, lr, r, steps, final_loss, ...")] = "seq",
    desc: Annotated[bool, typer.Option("--desc", help="Sort descending.")] = False,
    limit: Annotated[int | None, typer.Option("--limit", "-n", help="At most this many runs.")] = None,
    csv_: Annotated[bool, typer.Option("--csv", help="CSV on stdout (every column, params and metrics as JSON).")] = False,
    json_: JsonOpt = False,
):
    """Every training run with status, verdict, key params (lr, r, alpha, steps, batch, seed,
    base) and final loss: SFT, DPO, reproduce and tracked runs (`ledger.track`). Also the `runs`
    view of `ledger query`."""
    res = api.runs(where=where, sort=sort, descending=desc, limit=limit, store=common.store_dir())
    if csv_:
        buf = io.StringIO()
        w = csv.writer(buf, lineterminator="\n")
        fields = list(res.rows[0].to_json()) if res.rows else list(api.RUN_FIELDS)
        w.writerow(fields)
        for r in res.rows:
            d = r.to_json()
            w.writerow([api.csv_cell(d[f]) for f in fields])
        sys.stdout.write(buf.getvalue())
        return
    finish(json_, res, lambda: print_table(common.console(), COLUMNS, [_cells(r) for r in res.rows],
                                           terminal_width()) if res.rows else
           sys.stdout.write("no runs yet: `ledger train PLAN`, `ledger run`, or `ledger.track(...)` in your own loop\n"))
