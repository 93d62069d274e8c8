"""Moving HEAD and writing generations out: rollback, checkout.

Part of ledger.api (see its docstring): import the verbs from there, `from ledger import api`."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from ledger import checkout as checkoutlib
from ledger import generations
from ledger.api._base import Result, StoreLike, Wrapped, take_warnings
from ledger.api._open import open_store


@dataclass(frozen=True)
class RolledBack(Result):
    """Where one `rollback` record moved HEAD from and to."""
    from_: str
    to: str
    head: str
    seq: int

    def to_json(self):
        return {"from": self.from_, "to": self.to, "head": self.head, "seq": self.seq}



def rollback(target: str | None = None, *, undo: bool = False, reason: str = "", wait: float = 0.0,
             store: StoreLike = None) -> RolledBack:
    """Move HEAD to `target` (default: HEAD's parent), or `undo` the last rollback: one journal
    record; nothing is deleted."""
    s = open_store(store)
    r = generations.rollback(s, target, undo=undo, reason=reason, wait=wait)
    return RolledBack(r["from"], r["to"], r["head"], r["seq"], warnings=take_warnings(s))



@dataclass(frozen=True)
class CheckedOut(Wrapped):
    """ledger.checkout's CheckedOut in `result` (kind, id, path, files, generation, adapter, base)."""



def checkout(ref: str, directory: str | os.PathLike, *, with_base: bool = True, store: StoreLike = None) -> CheckedOut:
    """Write what `ref` names back to the filesystem: a generation as a folder that
    peft.PeftModel.from_pretrained loads as is (the base under base/), a tree as its folder, any
    other object as a file. Nothing existing is overwritten."""
    s = open_store(store)
    res = checkoutlib.checkout(s, ref, Path(directory), with_base=with_base)
    return CheckedOut(result=res, warnings=take_warnings(s))
