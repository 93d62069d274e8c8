"""The image's context: what it is, persisted in the store as objects and journal records.

A context is a structured object {"kind": "image-context", ...}:

    generation   manifest id of the generation the image last served (and `gen`, its number)
    grants       that generation's capability grants ({capability: [handle, ...]})
    counters     turns, refusals, calls, call_errors, given (actions a client supplied),
                 switches (times the generation served changed), starts (times the keeper
                 started), sessions (image processes started: one per start, resume, restart)
    cursor       the buffer cursor: {"session", "n"} of the last buffer entry in the journal,
                 and "turn", the number (tN) the journal gave it
    previous     the context this one succeeds (a chain, like generations)

Every `record` transaction the keeper commits carries a new context in the same transaction
(ref `image/context`), and so does each lifecycle record (kind `image`: start, pause,
resume, restart, stop). A restarted
image reads that ref -- one refs lookup, no replay of any transcript -- and continues from it.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from ledger import records
from ledger.errors import BadInput

CONTEXT_REF = "image/context"
KIND = "image-context"
COUNTERS = ("turns", "refusals", "calls", "call_errors", "given", "switches", "starts", "sessions")


@dataclass(frozen=True)
class Context:
    generation: str | None = None
    gen: int | None = None
    grants: dict = field(default_factory=dict)
    counters: dict = field(default_factory=lambda: {k: 0 for k in COUNTERS})
    cursor: dict = field(default_factory=lambda: {"session": None, "n": 0, "turn": 0})
    previous: str | None = None
    id: str | None = None            # the object id, once written (not part of the object)

    def to_json(self) -> dict:
        return {"kind": KIND, "version": 1, "generation": self.generation, "gen": self.gen,
                "grants": self.grants, "counters": dict(self.counters), "cursor": dict(self.cursor),
                "previous": self.previous}

    @classmethod
    def from_json(cls, d: dict, oid: str | None = None) -> "Context":
        if not isinstance(d, dict) or d.get("kind") != KIND or d.get("version") != 1:
            raise BadInput(f"{oid or 'object'} is not an image context this ledger understands")
        counters = {k: 0 for k in COUNTERS}
        counters.update({k: int(v) for k, v in (d.get("counters") or {}).items() if k in COUNTERS})
        cursor = {"session": None, "n": 0, "turn": 0, **(d.get("cursor") or {})}
        return cls(d.get("generation"), d.get("gen"), dict(d.get("grants") or {}), counters, cursor,
                   d.get("previous"), oid)

    def bump(self, **deltas) -> "Context":
        c = dict(self.counters)
        for k, v in deltas.items():
            c[k] = c.get(k, 0) + v
        return replace(self, counters=c)

    def serving(self, generation) -> "Context":
        """The same context, serving `generation` (ledger.generations.Generation); a change of
        generation counts as a switch."""
        if generation is None:
            return replace(self, generation=None, gen=None, grants={})
        grants = {name: list(entry.get("grants") or []) for name, entry in sorted(generation.capabilities.items())}
        ctx = self.bump(switches=1) if self.generation not in (None, generation.id) else self
        return replace(ctx, generation=generation.id, gen=generation.n, grants=grants)

    def after(self, entries, first_turn: int, generation_of) -> "Context":
        """The context once buffer `entries` (ledger.image.spool.Entry, in order) are recorded
        as turns first_turn.. ; `generation_of(id)` loads a generation named by a turn."""
        ctx = self
        for e in entries:
            t, meta = e.turn, e.meta
            deltas = {"turns": 1, "refusals": int(bool(t.get("refusal"))),
                      "calls": int(meta.get("kind") == "call"), "call_errors": int(bool(meta.get("error"))),
                      "given": int(t.get("source") == "given")}
            gid = t.get("generation")
            if gid and gid != ctx.generation:
                ctx = ctx.serving(generation_of(gid))
            ctx = ctx.bump(**deltas)
        if entries:
            last = entries[-1]
            ctx = replace(ctx, cursor={"session": last.session, "n": last.n, "turn": first_turn + len(entries) - 1})
        return ctx


def load(store) -> Context:
    """The context the journal names (ref image/context), or a fresh one."""
    oid = store.state.refs.get(CONTEXT_REF)
    if oid is None:
        return Context()
    return Context.from_json(store.get_json(oid), oid)


def write(tx, ctx: Context) -> Context:
    """Put `ctx` (succeeding ctx.id) in transaction `tx` and point ref image/context at it."""
    new = replace(ctx, previous=ctx.id, id=None)
    oid = tx.put_json(new.to_json())
    tx.outputs.append(oid)
    tx.refs[CONTEXT_REF] = oid
    records.write_field(tx, "context", oid)  # the record (an `image` or a turns batch) names it too
    return replace(new, id=oid)


# --- request ids: exactly-once bookkeeping, from the journal (the source of truth) -------------------
def recent_requests(store, limit: int = 4096, scan_records: int = 20000) -> dict[str, dict]:
    """{request id: the recorded turn (with its "id" tN)} for the image's most recent recorded
    turns, newest last, at most `limit`, looking at most `scan_records` journal records back.
    A retry of a request older than this window would be recorded again: the window is the
    idempotency horizon (docs/image.md)."""
    out: dict[str, dict] = {}
    for rec in reversed(store.journal.tail(scan_records)):
        if rec["kind"] != records.Record.KIND:
            continue
        p = records.read(rec)  # typed: an ill-formed record is JournalCorrupt naming it
        if not p.requests:
            continue
        batch = store.get_json(p.turns)["turns"]
        for t in reversed(batch):
            rid = t.get("request")
            if rid and rid not in out:
                out[rid] = t
        if len(out) >= limit:
            break
    return dict(reversed(list(out.items())[:limit]))


def find_request(store, rid: str, scan_records: int = 100000) -> str | None:
    """The turn id (tN) the journal gave request `rid`, or None if it is not (yet) recorded."""
    for rec in reversed(store.journal.tail(scan_records)):
        if rec["kind"] != records.Record.KIND:
            continue
        p = records.read(rec)
        if p.requests and rid in p.requests:
            return f"t{p.first + p.requests.index(rid)}"
    return None
