"""The CLI's answer to an unchanged `ledger add FILE` without opening a Store (not a verb: the
same answer `api.add` gives a stat-cache hit, rule 11 of docs/store-format.md). An unchanged
re-add is all start-up, and the store's modules were half of it; ledger/store/statcache.py needs
only fsio and ids."""

from __future__ import annotations

from pathlib import Path

from ledger.store import statcache


def unchanged_file(path: Path, store: str | None) -> tuple[str, int] | None:
    """(id, size) if `add` of file `path` to `store` (None: found as api.add finds it) would
    answer "unchanged" without hashing or recording; None when the whole add must run (which
    answers or raises as always)."""
    return statcache.unchanged_file(Path(path), store)
