"""The options of the learn cycle and of the image, each default written once.

`ledger run`, `ledger serve --learn`, the detached keeper and the Python API all take these:
the CLI's option defaults read them (`LearnOptions.min_turns`), the cycle's trigger policy reads
them (ledger.cycle.Policy), and `ledger serve --detach` hands a `ServeOptions` to the keeper
process as JSON (`to_json` / `from_json`), so there is no second parser to keep in step.

Stdlib only: the CLI imports this module at start-up.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Mapping

from ledger.errors import BadInput

# fsync: a turn is fdatasynced in the image's buffer before its reply (one fdatasync per round
# of requests). os: written to the OS before its reply -- survives the image or the keeper being
# killed, not a power loss before the keeper's next commit (usually well under a second).
DURABILITY = ("fsync", "os")


@dataclass(frozen=True)
class LearnOptions:
    """When a learn cycle may run, and what it trains.

    min_turns / min_hours: the trigger policy (new turns recorded; hours since the last cycle).
    spec: a training spec TOML (None: the built-in tiny one, ledger/demo/cycle.toml).
    target: the target profile the plan is compiled for.
    unsandboxed: train without Landlock (recorded in the receipt).
    force: run even if the trigger policy says not yet (recorded in the export)."""

    min_turns: int = 150
    min_hours: float = 4.0
    spec: str | None = None
    target: str = "cpu"
    unsandboxed: bool = False
    force: bool = False

    def __post_init__(self):
        if isinstance(self.min_turns, bool) or not isinstance(self.min_turns, int) or self.min_turns < 0:
            raise BadInput(f"min_turns must be a whole number >= 0, got {self.min_turns!r}", "e.g. --min-turns 150")
        if isinstance(self.min_hours, bool) or not isinstance(self.min_hours, (int, float)) or not self.min_hours >= 0:
            raise BadInput(f"min_hours must be a number >= 0, got {self.min_hours!r}", "e.g. --min-hours 4")
        if self.spec is not None:
            object.__setattr__(self, "spec", str(self.spec))

    def to_json(self) -> dict:
        return {f.name: getattr(self, f.name) for f in fields(self)}

    @classmethod
    def from_json(cls, data: Mapping) -> LearnOptions:
        return cls(**_known(cls, data, "learn options"))


@dataclass(frozen=True)
class ServeOptions:
    """How `ledger serve` runs the image.

    learn: run the learn cycle when its policy says so (None: never).
    durability: see DURABILITY. threads: CPU threads for the model. decoder: force a decoder
    (None: the image picks). unsandboxed: run the image without Landlock (recorded)."""

    learn: LearnOptions | None = None
    durability: str = "fsync"
    threads: int = 1
    decoder: str | None = None
    unsandboxed: bool = False

    def __post_init__(self):
        if self.durability not in DURABILITY:
            raise BadInput(f"durability must be one of {', '.join(DURABILITY)}, got {self.durability!r}",
                           "--durability fsync (default) or --durability os")
        if isinstance(self.threads, bool) or not isinstance(self.threads, int) or self.threads < 1:
            raise BadInput(f"threads must be a whole number >= 1, got {self.threads!r}", "e.g. --threads 2")

    def to_json(self) -> dict:
        out = {f.name: getattr(self, f.name) for f in fields(self)}
        out["learn"] = self.learn.to_json() if self.learn else None
        return out

    @classmethod
    def from_json(cls, data: Mapping) -> ServeOptions:
        kw = _known(cls, data, "serve options")
        if kw.get("learn") is not None:
            if not isinstance(kw["learn"], Mapping):
                raise BadInput("serve options: learn must be an object or null")
            kw["learn"] = LearnOptions.from_json(kw["learn"])
        return cls(**kw)


def _known(cls, data, what: str) -> dict:
    if not isinstance(data, Mapping):
        raise BadInput(f"{what} must be a JSON object, got {type(data).__name__}")
    names = {f.name for f in fields(cls)}
    unknown = sorted(set(data) - names)
    if unknown:
        raise BadInput(f"{what}: unknown field(s) {', '.join(map(str, unknown))}",
                       f"fields: {', '.join(sorted(names))}")
    return dict(data)
