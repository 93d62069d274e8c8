"""Experience: record, export.

Part of ledger.api (see its docstring): import the verbs from there, `from ledger import api`."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping, Sequence

from ledger import experience
from ledger.api._base import Result, StoreLike, Wrapped, take_warnings
from ledger.api._open import open_store
from ledger.errors import BadInput


@dataclass(frozen=True)
class Recorded(Result):
    """The turn batch one `record` appended: its object, turn numbers and seq."""
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


