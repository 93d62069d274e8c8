"""The body of `ledger add`, without typer: the typer command (store_cmds.add) runs it, and so
does ledger/cli/main.py for a plain `ledger add FILE`, before typer is imported (an unchanged
re-add is all start-up)."""

from __future__ import annotations

from pathlib import Path

from ledger import api
from ledger.api import _quick
from ledger.cli import common


def quick(path: Path) -> None:
    """A plain `ledger add FILE` (ledger/cli/main.py): an unchanged file is answered from the stat
    cache before the store's modules load (the same line `add` prints for it); anything else —
    changed, new, a folder, no entry, a racy one — is `add`."""
    hit = _quick.unchanged_file(path, common.store_dir())
    if hit is None:
        add(path)
        return
    oid, size = hit
    common.line(f"unchanged {oid}  {common.human_bytes(size)}  blob")


def add(path: Path, kind: str = "", name: str | None = None, wait: float = 0.0, json_: bool = False) -> None:
    """Store a file or directory and record it; one line (or the JSON document) on stdout."""
    where = common.store_dir()
    if json_:
        res = api.add(path, kind=kind or None, name=name, wait=wait, store=where)
    else:
        with common.byte_progress(f"adding {path.name}", api.tree_size(path)) as advance:
            res = api.add(path, kind=kind or None, name=name, wait=wait, bar=advance, store=where)

    def render():
        verb = "unchanged" if res.unchanged else "added"
        # one line whatever the width: scripts read the id from it
        common.line(f"{verb} {res.id}  {common.human_bytes(res.size)}  {res.kind}" + (f"  name={name}" if name else ""))
    common.finish(json_, res, render)
