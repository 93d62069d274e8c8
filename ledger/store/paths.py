"""Finding the store directory — kept free of heavy imports: `ledger log` needs only this
and the journal reader."""

from __future__ import annotations

import os
from pathlib import Path

from ledger.errors import NotAStore

DIRNAME = ".ledger"


def find_root(dir: str | Path | None = None) -> Path:
    if dir is None:
        dir = os.environ.get("LEDGER_DIR") or Path.cwd()
    p = Path(dir)
    if p.name != DIRNAME and (p / DIRNAME).is_dir():
        p = p / DIRNAME
    if not (p / "config").is_file():
        raise NotAStore(f"no ledger store at {p}")
    return p.absolute()
