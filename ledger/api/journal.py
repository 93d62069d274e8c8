"""The journal read from its end: `log`, and the last committed record (what an interrupted
command kept).

Part of ledger.api (see its docstring): import the verbs from there, `from ledger import api`."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping

from ledger.api._base import Result, StoreLike, store_root, take_warnings
from ledger.store import Store, lookup
from ledger.store.journal import Journal

RECEIPT_RECORDS = ("train", "reproduce")  # records whose payload names a receipt (its losses)


@dataclass(frozen=True)
class Log(Result):
    """The last journal records (`ledger log`), with the loss traces they name."""
    records: tuple[Mapping, ...]
    losses: Mapping[int, Any] = field(default_factory=dict)   # seq -> loss trace of the receipt it names

    def to_json(self):
        return list(self.records)


def log(n: int = 20, *, kind: str | None = None, losses: bool = False, store: StoreLike = None) -> Log:
    """The last `n` journal records (of `kind`), newest last. Reads only the journal's end (fast on
    millions of records); of one kind, the index's newest n of it and the records after the
    index (store/lookup.py: checked against the chain, a walk with a warning where the index
    cannot be used), never every record. `losses`: also read the loss traces of the receipts
    the shown records name (only those)."""
    root = store_root(store)
    warnings: tuple[str, ...] = ()
    if kind:
        s = Store.open(root)
        recs = list(lookup.records(s, kind, limit=n))[::-1] if n > 0 else []
        warnings = take_warnings(s)
    else:
        stopped: list[str] = []
        recs = Journal(root).tail(n, stopped)
        # lenient, so that a damaged journal's last records can still be seen; but never as if
        # they were all of it (the records before the damage are not shown)
        warnings = tuple(f"{m}: only the {len(recs)} record(s) after it are shown; run `ledger verify`"
                         for m in stopped)
    traces = {}
    wanted = [r for r in recs if r["kind"] in RECEIPT_RECORDS and isinstance(r["payload"].get("receipt"), str)]
    if losses and wanted:
        # imported here: ~3 ms (mmap, struct) that `ledger log` pays only when it draws a loss curve
        from ledger.store.objects import ObjectStore

        objects = ObjectStore(root)
        for r in wanted:   # a missing or corrupt receipt raises, as any read does
            body = objects.get_json(r["payload"]["receipt"])
            traces[r["seq"]] = body.get("losses") if isinstance(body, dict) else None
    return Log(tuple(recs), traces, warnings=warnings)


def last_record(*, store: StoreLike = None) -> Mapping | None:
    """The store's last committed journal record (what an interrupted command kept), read from the
    journal's end; None for an empty journal."""
    tail = Journal(store_root(store)).tail(1)
    return tail[-1] if tail else None


