"""Plans: targets, compile.

Part of ledger.api (see its docstring): import the verbs from there, `from ledger import api`."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Mapping

from ledger.api._base import Result, StoreLike, take_warnings
from ledger.api._open import open_store
from ledger.plan import compile as comp
from ledger.plan import spec as speclib
from ledger.plan import targets as t


@dataclass(frozen=True)
class Targets(Result):
    """The target profiles a plan can be compiled for (built-in and from a file)."""
    targets: tuple[Any, ...]   # ledger.plan.targets.Target, in listing order

    def to_json(self):
        return [{**t.body(), "id": t.id} for t in self.targets]


def targets(file: str | os.PathLike | None = None) -> Targets:
    """The target profiles: built-in, plus those in the TOML `file`."""
    return Targets(tuple(t.available(file).values()))


@dataclass(frozen=True)
class Compiled(Result):
    """`plan`: ledger.plan.compile's Plan (its body and id); `explain`: what changed from another
    plan, when asked."""

    plan: Any
    new: bool
    target: str
    explain: Mapping | None = None

    def to_json(self):
        b = self.plan.body
        out = {"plan": self.plan.id, "new": self.new, "target": self.target, "fits": True,
               "memory_bytes": b["memory"]["total_bytes"], "usable_bytes": b["fit"]["usable_bytes"],
               "parameters": b["parameters"]}
        if self.explain is not None:
            out["explain"] = self.explain
        return out


def compile(spec: str | os.PathLike, *, target: str | None = None, targets_file: str | os.PathLike | None = None,
            explain: str | None = None, store: StoreLike = None) -> Compiled:
    """Compile a spec (TOML) for a target (default: the spec's compile.target) into a plan, or
    raise CompileRejected (exit 3) naming what does not fit. `explain`: another plan to compare."""
    sp = speclib.load(Path(spec))
    tgt = t.get(target or sp.get("compile.target"), targets_file)
    s = open_store(store)
    other = comp.load(s, explain) if explain else None   # a bad --explain is refused before the plan is committed
    res = comp.compile_spec(s, sp, tgt)
    diff = comp.explain(other, res.plan) if other is not None else None
    return Compiled(res.plan, res.new, tgt.name, diff, warnings=take_warnings(s))


def plan_ref(ref: str, *, store: StoreLike = None, say: Callable[[str], None] | None = None) -> str:
    """A plan ref as is, or a spec .toml compiled first for its own target (its plan id)."""
    p = Path(ref)
    if p.suffix == ".toml" and p.is_file():
        sp = speclib.load(p)
        res = comp.compile_spec(open_store(store), sp, t.get(sp.get("compile.target")))
        if say:
            say(f"compiled {p} → plan {res.plan.id}")
        return res.plan.id
    return ref


