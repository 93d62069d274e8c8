"""What an action does: a capability call, a refusal, or plain text.

The image's actions are the ones the built-in task teaches (ledger/artefacts/builtin_task.py):

    call NAME.EXPORT(ARG, ...)    run capability NAME's export in the wasm sandbox
    refuse: REASON                decline; recorded as a refusal (refusal = true)
    anything else                 text; nothing runs, and the outcome stays empty until a
                                  ground truth is attached (`ledger outcome`)

A call runs through the capability registry's parts with the capability entry of the
generation being served -- not whatever HEAD is at that instant -- so a turn's action, its
outcome and its `generation` field always agree. Exactly that entry's grants are passed to the
sandbox, under its manifest's limits. A call that cannot run (no such capability, a bad argument,
a trap) is still a turn: its outcome is `error: <why>`, which is precisely the experience a
learner needs. Arguments are parsed by the export's signature (ledger.capabilities.runtime).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field

from ledger.capabilities import cache, registry, runtime
from ledger.capabilities import grants as grants_mod
from ledger.errors import BadInput, LedgerError, UnknownRef

CALL_RE = re.compile(r"^call\s+([A-Za-z_][A-Za-z0-9_-]*)\.([A-Za-z_][A-Za-z0-9_]*)\((.*)\)\s*$", re.DOTALL)
REFUSAL_PREFIX = "refuse:"
REFUSED = "refused"
MAX_OUTCOME = 4096     # characters of an outcome kept in the turn (a capability may print 1 MiB)


@dataclass(frozen=True)
class Call:
    capability: str
    export: str
    args: tuple[str, ...]


@dataclass(frozen=True)
class Outcome:
    kind: str                  # "call" | "refusal" | "text"
    outcome: str | None
    refusal: bool
    call: dict | None = None   # capability, export, args, and results / error, fuel, elapsed
    error: bool = False        # a call that could not run or trapped
    timings: dict = field(default_factory=dict)

    def to_json(self) -> dict:
        return {"kind": self.kind, "outcome": self.outcome, "refusal": self.refusal, "call": self.call,
                "error": self.error}


def split_args(text: str) -> tuple[str, ...]:
    """Comma-separated arguments; double-quoted strings may hold commas (JSON string syntax)."""
    text = text.strip()
    if not text:
        return ()
    out, cur, i, n = [], [], 0, len(text)
    while i < n:
        c = text[i]
        if c == '"':
            j = i + 1
            while j < n and text[j] != '"':
                j += 2 if text[j] == "\\" else 1
            if j >= n:
                raise BadInput("unterminated string in the call's arguments")
            try:
                cur.append(json.loads(text[i:j + 1]))
            except ValueError:
                raise BadInput("bad string in the call's arguments") from None
            i = j + 1
        elif c == ",":
            out.append("".join(cur).strip())
            cur = []
            i += 1
        else:
            cur.append(c)
            i += 1
    out.append("".join(cur).strip())
    if any(a == "" for a in out):
        raise BadInput("an empty argument in the call")
    return tuple(out)


def parse(action: str) -> Call | None:
    """The call an action makes, or None when it is not a call. A malformed call is BadInput."""
    m = CALL_RE.match(action.strip())
    if m is None:
        return None
    return Call(m.group(1), m.group(2), split_args(m.group(3)))


def is_refusal(action: str) -> bool:
    return action.startswith(REFUSAL_PREFIX)


def run_call(store, generation, call: Call):
    """Run `call` with the capability entry of `generation` (ledger.generations.Generation)."""

    caps = generation.capabilities
    if call.capability not in caps:
        raise UnknownRef(f"no capability named {call.capability!r} in {generation.name}")
    e = registry.entry_from(call.capability, caps[call.capability], generation.n)
    m = registry.load_manifest(store, e)
    ex = m.export(call.export)
    args = runtime.parse_args(ex, list(call.args))
    granted = grants_mod.resolve(store, e.grants)
    module = cache.load(store, e.module)
    return runtime.run(module, ex, args, m.limits, granted, label=f"{call.capability}.{call.export}")


def format_results(res) -> str:

    shown = [runtime.format_value(v, t) for v, t in zip(res.values, res.types)]
    text = ", ".join(shown) if shown else "ok"
    out = res.stdout.decode("utf-8", "replace").strip()
    return _cap(f"{text}\n{out}" if out else text)


def _cap(text: str) -> str:
    return text if len(text) <= MAX_OUTCOME else text[:MAX_OUTCOME - 14] + " …(truncated)"


def perform(store, generation, action: str) -> Outcome:
    """Carry out `action` as generation `generation`; only LedgerErrors of the call become outcomes."""
    if is_refusal(action):
        return Outcome("refusal", REFUSED, True)
    try:
        call = parse(action)
    except BadInput as e:
        return Outcome("call", _cap(f"error: {e.message}"), False, {"error": e.message}, error=True)
    if call is None:
        return Outcome("text", None, False)
    where = {"capability": call.capability, "export": call.export, "args": list(call.args)}
    try:
        res = run_call(store, generation, call)
    except LedgerError as e:
        trap = e.details.get("trap") if isinstance(e.details, dict) else None
        return Outcome("call", _cap(f"error: {e.message}"), False, {**where, "error": e.message, "trap": trap}, error=True)
    return Outcome("call", format_results(res), False,
                   {**where, "results": res.to_json()["results"], "fuel_used": res.fuel_used,
                    "elapsed_ms": round(res.elapsed_s * 1e3, 3)})
