"""Wasm capabilities: add, grant, call, list.

Part of ledger.api (see its docstring): import the verbs from there, `from ledger import api`."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping, Sequence

from ledger.api._base import Result, StoreLike, Wrapped, take_warnings
from ledger.api._open import open_store
from ledger.capabilities import admission, registry
from ledger.capabilities.manifest import Handle
from ledger.errors import BadInput


def _handles(texts: Sequence[str]):
    return [Handle.parse(t) for t in texts]


@dataclass(frozen=True)
class CapabilityAdmitted(Wrapped):
    """ledger.capabilities.admission's Admission in `result` (name, generation, module, grants,
    outcomes)."""


def capability_add(source: str | os.PathLike, manifest: str | os.PathLike, *, grants: Sequence[str] | None = None,
                   no_grants: bool = False, replace: bool = False, note: str = "", wait: float = 0.0,
                   store: StoreLike = None, regrant_reason: str | None = None) -> CapabilityAdmitted:
    """Compile (WAT, wasm or C), test with zero authority, and admit a capability as a new
    generation. `grants`: handles (dir:PATH:ro|rw, stdout, stderr; default what the manifest
    declares); `no_grants`: none at all. `regrant_reason`: why a module may hold more than it
    did when a generation last named it (grants belong to its content id)."""
    if no_grants and grants:
        raise BadInput("--no-grants and --grant contradict each other", "give one of them")
    hs = [] if no_grants else (_handles(grants) if grants else None)
    s = open_store(store)
    res = admission.admit(s, Path(source), Path(manifest), grants=hs, replace=replace, note=note, wait=wait,
                          regrant_reason=regrant_reason)
    return CapabilityAdmitted(result=res, warnings=take_warnings(s))


@dataclass(frozen=True)
class Granted(Result):
    """The new generation a grant change made, and the capability's handles now."""
    name: str
    generation: Any          # the new Generation
    grants: tuple[Any, ...]
    previous: tuple[Any, ...]

    def to_json(self):
        return {"name": self.name, "generation": self.generation.n, "generation_id": self.generation.id,
                "grants": [h.to_json() for h in self.grants], "previous": [h.to_json() for h in self.previous]}


def capability_grant(name: str, handles: Sequence[str] = (), *, none: bool = False, note: str = "",
                     wait: float = 0.0, store: StoreLike = None) -> Granted:
    """Set a live capability's handles in a new generation; grants only narrow (anything wider is
    Refused, exit 3). `none`: drop every handle."""
    if not handles and not none:
        raise BadInput("give the new set of handles, or --none to drop them all",
                       "e.g. `ledger capability grant notes dir:data/sub:ro stdout`")
    if handles and none:
        raise BadInput("--none and handles contradict each other", "give one of them")
    s = open_store(store)
    gen, old, new = registry.grant(s, name, [] if none else _handles(handles), note=note, wait=wait)
    return Granted(name, gen, grants=tuple(new), previous=tuple(old), warnings=take_warnings(s))


@dataclass(frozen=True)
class Called(Wrapped):
    """ledger.capabilities.runtime's call result in `result` (stdout, stderr, results)."""


def capability_call(name: str, export: str, args: Sequence[str] = (), *, fuel: int | None = None,
                    timeout_ms: int | None = None, store: StoreLike = None) -> Called:
    """Run an export of a capability live in HEAD with exactly its granted handles, under fuel
    and time limits."""
    s = open_store(store)
    res = registry.call(s, name, export, list(args), fuel=fuel, time_ms=timeout_ms)
    return Called(result=res, warnings=take_warnings(s))


@dataclass(frozen=True)
class Capabilities(Result):
    """The capabilities live in a generation, with their grants (`ledger capability list`)."""
    generation: int | None
    entries: tuple[Any, ...]          # registry Entry, one per capability
    details: tuple[Mapping, ...]      # each entry's JSON with exports, description, declared, limits

    def to_json(self):
        return {"generation": self.generation, "capabilities": list(self.details)}


def capability_list(gen: str = "HEAD", *, store: StoreLike = None) -> Capabilities:
    """The capabilities live in a generation, with their grants and the generation that admitted each."""
    s = open_store(store)
    items = registry.entries(s, gen)
    data = []
    for e in items:
        m = registry.load_manifest(s, e)
        data.append({**e.to_json(), "exports": [x.to_json() for x in m.exports], "description": m.description,
                     "declared": [h.to_json() for h in m.handles], "limits": m.limits.to_json()})
    return Capabilities(items[0].generation if items else None, tuple(items), tuple(data), warnings=take_warnings(s))
