"""Adopting an imported generation: adopt (judged by the local gate unless forced).

Part of ledger.api (see its docstring): import the verbs from there, `from ledger import api`."""

from __future__ import annotations

from dataclasses import dataclass

from ledger import adopt as adoptlib
from ledger.api._base import StoreLike, Wrapped, take_warnings
from ledger.api._open import open_store


@dataclass(frozen=True)
class Adopted(Wrapped):
    """ledger.adopt's Adopted in `result` (generation, id, source_ref, source, verdict, forced, seq)."""



def adopt(ref: str, *, force: bool = False, reason: str = "", progress=None, wait: float = 0.0,
          store: StoreLike = None) -> Adopted:
    """Make an imported generation (`team/gen-7`) live: judged by the local gate (Refused, exit 3,
    unless it accepts), or `force`d with a `reason`; one `adopt` record makes gen-(N+1) and moves
    HEAD. Its model and receipt are taken; capabilities and grants stay the local HEAD's."""
    s = open_store(store)
    res = adoptlib.adopt(s, ref, force=force, reason=reason, progress=progress, wait=wait)
    return Adopted(result=res, warnings=take_warnings(s))
