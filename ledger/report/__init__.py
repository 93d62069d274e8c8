"""`ledger report`: one self-contained HTML file that shows a store's history.

    from ledger.report import gather, render, write
    model = gather(store)          # a pure model of the report (ledger.report.model)
    html = render(model)           # the page: inline CSS + hand-written SVG, no script, no URL
    info = write(store, "report.html")

Modules: model (data from the journal and the objects it names), svg (scales and shapes),
plots (one function per chart), page (the HTML template), sparkline (text sparklines for the
terminal). Reading only: a report takes no lock and writes nothing into the store but its own
cache, cache/report.json (docs/store-format.md rule 23).
"""

from __future__ import annotations

import contextlib
import os
import time
from pathlib import Path

import ledger
from ledger.errors import BadInput
from ledger.store import fsio


def gather(store):
    """The report's model of `store` (ledger.report.model)."""
    # lazy: `ledger.report.sparkline` (every `ledger log`, `gens`) must not load the page and
    # its plotting modules (numpy, ~130 ms) through this package
    from ledger.report.model import gather as _gather

    return _gather(store)


def render(model) -> str:
    """The HTML page of a report model (ledger.report.page)."""
    from ledger.report.page import render as _render  # lazy: see gather

    return _render(model, getattr(ledger, "__version__", ""))


def write(store, out) -> dict:
    """Render the report for `store` into the file `out` (atomically: a reader never sees half a
    page). Returns what was written, for the CLI's --json."""

    t0 = time.perf_counter()
    model = gather(store)
    html = render(model).encode("utf-8")
    out = Path(out)
    if out.is_dir():
        raise BadInput(f"{out} is a directory", "pass a file name, e.g. -o report.html")
    fsio.refuse_special_output(out)
    tmp = out.with_name(f".{out.name}.{os.getpid()}.tmp")
    try:
        tmp.write_bytes(html)
        os.replace(tmp, out)
    except OSError as e:
        with contextlib.suppress(OSError):   # under a file: the unlink fails as the write did
            tmp.unlink(missing_ok=True)
        raise BadInput(f"cannot write {out}: {e.strerror or e}", "choose a writable path with -o") from None
    return {"path": str(out), "bytes": len(html), "seq": model.seq, "head": model.head,
            "generations": len(model.generations), "cycles": len(model.cycles), "gate_runs": len(model.judges),
            "receipts": len(model.receipts), "rollbacks": model.counts.get("rollback", 0),
            "seconds": round(time.perf_counter() - t0, 4)}
