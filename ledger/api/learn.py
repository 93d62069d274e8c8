"""The learn cycle: run_cycle (pausing a serving image), and genesis.

Part of ledger.api (see its docstring): import the verbs from there, `from ledger import api`."""

from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass
from typing import Callable

from ledger import cycle
from ledger.api._base import StoreLike, Wrapped, take_warnings
from ledger.api._open import open_store
from ledger.errors import CycleRefused, Refused
from ledger.image import client
from ledger.options import LearnOptions


@dataclass(frozen=True)
class Cycle(Wrapped):
    """ledger.cycle's CycleResult in `result` (cycle, outcome, verdict, reasons, generation,
    stages, score, ...). failure(): CycleRefused when the gate said no, Refused when no cycle was due."""

    def failure(self):
        r = self.result
        if r.outcome == "refusal":
            why = f" ({', '.join(r.reasons)})" if r.reasons else ""
            return CycleRefused(f"cycle {r.cycle} refused: {r.verdict}{why}; HEAD stays {r.generation}")
        if r.outcome != "not-due":
            return None
        return Refused("no cycle is due: " + "; ".join(r.missing), "record more experience, wait, or pass --force")


def run_cycle(options: LearnOptions = LearnOptions(), *, progress: Callable[[str, str], None] | None = None,
              train_progress=None, store: StoreLike = None) -> Cycle:
    """One learn cycle: export → compile → train → judge → commit (only on Accept), or the rest of
    an interrupted one. A running image is paused for a cycle that will run (it finishes the
    request in flight, its turns are committed) and serves HEAD again afterwards.
    `progress(stage, message)` is told each stage."""
    s = open_store(store)
    with client.paused(s) if cycle.will_run(s, options) else contextlib.nullcontext():
        res = cycle.run_cycle(s, options, progress=progress, train_progress=train_progress)
    return Cycle(result=res, warnings=take_warnings(s))


def genesis(*, spec: str | os.PathLike | None = None, store: StoreLike = None):
    """gen-0, the base model with no adapter (the first incumbent), made if there is no generation
    yet; returns HEAD's Generation."""
    s = open_store(store)
    return cycle.ensure_genesis(s, cycle.load_spec(spec))
