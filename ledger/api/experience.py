"""Experience and generations: record, export, gens, diff, rollback, adopt, checkout.

Part of ledger.api (see its docstring): import the verbs from there, `from ledger import api`."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping, Sequence

from ledger import adopt as adoptlib
from ledger import checkout as checkoutlib
from ledger import experience, generations
from ledger.api._base import Result, StoreLike, Wrapped, take_warnings
from ledger.api._open import open_store
from ledger.diff import diff as run_diff
from ledger.errors import BadInput
from ledger.lineage import generation_rows


@dataclass(frozen=True)
class Recorded(Result):
    turns: str        # the batch object
    first: int
    last: int
    count: int
    seq: int
    pending: int = 0  # turns waiting for a cycle, this batch included (not in to_json)

    def to_json(self):
        return {"turns": self.turns, "first": self.first, "last": self.last, "count": self.count, "seq": self.seq}


def read_text(path: str | os.PathLike) -> str:
    """A UTF-8 text file, or BadInput naming why it cannot be read."""
    try:
        return Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise BadInput(f"cannot read {path}: {e}", "give a readable UTF-8 file") from None


def record(turns: str | Sequence[Mapping], *, source: str = "input", wait: float = 0.0,
           store: StoreLike = None) -> Recorded:
    """Append turns to the experience buffer (one `record` record): JSONL text, or a list of
    dicts (situation, action, outcome, refusal, time, ...); any bad row fails the whole batch."""
    text = turns if isinstance(turns, str) else "\n".join(json.dumps(dict(t)) for t in turns)
    rows = experience.parse_turns(text, source)
    s = open_store(store)
    r = experience.record(s, rows, wait=wait)
    return Recorded(r["turns"], r["first"], r["last"], r["count"], r["seq"], experience.pending(s),
                    warnings=take_warnings(s))


@dataclass(frozen=True)
class Exported(Wrapped):
    """ledger.experience's Export in `result` (id, first, last)."""


def export(*, store: StoreLike = None) -> Exported:
    """Export the turns recorded since the last export as a Parquet dataset object."""
    s = open_store(store)
    return Exported(result=experience.export(s), warnings=take_warnings(s))


@dataclass(frozen=True)
class Gens(Result):
    rows: tuple[Mapping, ...]                       # ledger.lineage.generation_rows
    losses: Mapping[str, Any] = field(default_factory=dict)   # receipt id -> its loss trace

    def to_json(self):
        return list(self.rows)


def gens(*, losses: bool = False, store: StoreLike = None) -> Gens:
    """Generations, with the verdict and score that admitted each; HEAD marked. `losses`: also
    read each generation's receipt loss trace."""
    s = open_store(store)
    rows = generation_rows(s)
    traces = {r["receipt"]: s.get_json(r["receipt"]).get("losses") for r in rows if losses and r["receipt"]}
    return Gens(tuple(rows), traces, warnings=take_warnings(s))


@dataclass(frozen=True)
class Diff(Result):
    body: Mapping   # ledger.diff.diff: kind, a, b, fields, receipt, verdicts, data, adapter

    def to_json(self):
        return self.body


def diff(a: str, b: str, *, store: StoreLike = None) -> Diff:
    """What changed between two generations, receipts or plans, field by field."""
    s = open_store(store)
    return Diff(run_diff(s, a, b), warnings=take_warnings(s))


@dataclass(frozen=True)
class RolledBack(Result):
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
