"""What every verb of ledger.api shares: the Result types, and opening the store a verb names."""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from ledger.errors import LedgerError
from ledger.store.paths import find_root

MAX_INLINE_BYTES = 64 << 20   # `cat --json` and `show` read objects up to this size into memory

StoreLike = Any  # a Store, a folder (str or PathLike), or None: the store found from the current folder


def store_root(store: StoreLike) -> Path:
    """The store's .ledger folder without opening it (the cheap path of `log`, `act`, `image status`)."""
    root = getattr(store, "root", None)
    if isinstance(root, Path):
        return root
    return find_root(None if store is None else str(store))


def human_bytes(n: float) -> str:
    """1536 -> '1.5 KiB' (messages and the CLI's tables)."""
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n} B"


def take_warnings(store) -> tuple[str, ...]:
    """The store's warnings so far (cleared: each is reported once)."""
    out = tuple(getattr(store, "warnings", ()))
    if store is not None:
        store.warnings.clear()
    return out


@dataclass(frozen=True)
class Result:
    """What every verb returns. `to_json()` is the `--json` output; `warnings` are the store's
    warnings raised on the way (printed by the CLI on stderr); `failure()` is the error the
    CLI exits with after printing the result, or None."""

    warnings: tuple[str, ...] = field(default=(), kw_only=True, compare=False)

    def to_json(self):
        return {f.name: getattr(self, f.name) for f in fields(self) if f.name != "warnings"}

    def failure(self) -> LedgerError | None:
        return None


@dataclass(frozen=True)
class Wrapped(Result):
    """A domain module's own result object (it has its own `to_json()`), plus the warnings."""

    result: Any = None

    def to_json(self):
        return self.result.to_json()
