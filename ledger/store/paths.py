"""Finding the store directory — kept free of heavy imports: `ledger log` needs only this
and the journal reader."""

from __future__ import annotations

import os
from pathlib import Path

from ledger.errors import NotAStore

DIRNAME = ".ledger"
FORMAT_VERSION = 2  # 2: objects may be stored compressed (`.z`, store/compress.py); 1 is read and upgraded
FORMATS = (1, 2)    # config "format"s this ledger opens (Store.open; the stat cache's quick answer too)


def find_root(dir: str | Path | None = None) -> Path:
    """The store's .ledger folder. `dir` (else LEDGER_DIR) names it exactly: DIR/.ledger, or the
    .ledger folder itself. With neither, the current folder and then each parent is tried, like
    git: the nearest one holding .ledger/config wins."""
    if dir is None and not os.environ.get("LEDGER_DIR"):
        here = Path.cwd()
        for d in (here, *here.parents):
            if (d / DIRNAME / "config").is_file():
                return (d / DIRNAME).absolute()
        raise NotAStore(f"no ledger store in {here} or any folder above it",
                        "create one with `ledger init`, or name it with --store DIR")
    p = Path(dir if dir is not None else os.environ["LEDGER_DIR"])
    if p.name != DIRNAME and (p / DIRNAME).is_dir():
        p = p / DIRNAME
    if not (p / "config").is_file():
        raise NotAStore(f"no ledger store at {p}")
    return p.absolute()
