"""State is a fold over the journal: the journal is the only source of truth.

What is live is a set of named refs (HEAD, gen-N, name/<x>, suite, ...), each naming an
object id, plus integer counters (turns recorded, turns exported, cycles run). A record changes
refs through `payload["refs"]` ({name: id, or None to delete}) and counters through
`payload["counters"]` ({name: delta}), so every feature built on the store shares one fold.
`refs.json` is a cache of this fold plus
the journal position it reflects; it can be deleted at any time.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from ledger.errors import BadInput, JournalCorrupt
from ledger.store import schema
from ledger.store.ids import is_id
from ledger.store.schema import envelope_problem


@dataclass(frozen=True)
class State:
    """The fold of the journal: seq and head of the last record, refs and counters."""
    seq: int = 0
    head: str | None = None          # id of the last journal record
    refs: dict = field(default_factory=dict)
    counters: dict = field(default_factory=dict)

    def apply(self, rec: dict) -> "State":
        # A well-chained record whose refs or counters are not what the fold needs cannot be
        # folded: say which record, as corruption, rather than fail inside the fold.
        bad = envelope_problem(rec["payload"])
        if bad is not None:
            raise JournalCorrupt(f"journal record {rec['seq']} ({str(rec['kind'])[:64]}) is ill-formed: {bad}",
                                 "see `ledger verify`; restore .ledger/journal from a backup or bundle", seq=rec["seq"])
        refs = self.refs
        changes = rec["payload"].get("refs")
        if changes:
            refs = dict(refs)
            for name, target in changes.items():
                if target is None:
                    refs.pop(name, None)
                else:
                    refs[name] = target
        counters = self.counters
        deltas = rec["payload"].get("counters")
        if deltas:
            counters = dict(counters)
            for name, d in deltas.items():
                if isinstance(d, int) and not isinstance(d, bool):
                    counters[name] = counters.get(name, 0) + d
        return replace(self, seq=rec["seq"], head=rec["id"], refs=refs, counters=counters)

    @classmethod
    def from_json(cls, c: dict) -> "State":
        return cls(int(c["seq"]), c["head"], dict(c["refs"]), dict(c.get("counters") or {}))

    @classmethod
    def from_cache(cls, c) -> "State":
        """from_json for a cache file (refs.json, the verify watermark): anyone in the store can
        write one, so every field must have its type (ValueError otherwise: the cache is unusable,
        never an internal error later)."""
        def integer(v) -> bool:
            return isinstance(v, int) and not isinstance(v, bool)
        if not isinstance(c, dict) or not integer(c.get("seq")) or c["seq"] < 0:
            raise ValueError("seq")
        head, refs, counters = c.get("head"), c.get("refs"), c.get("counters") or {}
        if not (head is None or is_id(head)) or (head is None) != (c["seq"] == 0):
            raise ValueError("head")
        if not isinstance(refs, dict) or not all(isinstance(k, str) and is_id(v) for k, v in refs.items()):
            raise ValueError("refs")
        if not isinstance(counters, dict) or not all(isinstance(k, str) and integer(v) for k, v in counters.items()):
            raise ValueError("counters")
        return cls(c["seq"], head, dict(refs), dict(counters))

    def to_json(self) -> dict:
        return {"seq": self.seq, "head": self.head, "refs": dict(sorted(self.refs.items())),
                "counters": dict(sorted(self.counters.items()))}


class Fold:
    """A fold in progress, for a scan that streams records (`journal.scan(each=f.add)`): the
    same result as State.apply record by record, without copying the refs at every record that
    changes one (a journal of millions of records folds in time linear in its length)."""

    def __init__(self, start: State | None = None):
        s = start or State()
        self.seq, self.head = s.seq, s.head
        self.refs, self.counters = dict(s.refs), dict(s.counters)

    def add(self, rec: dict, checked: bool = False) -> None:
        """Apply one record (JournalCorrupt naming it if its envelope cannot be folded, as apply;
        `checked`: the caller has just found its envelope well-formed)."""
        payload = rec["payload"]
        if "refs" in payload or "counters" in payload or "objects" in payload:
            bad = None if checked else envelope_problem(payload)
            if bad is not None:
                raise JournalCorrupt(f"journal record {rec['seq']} ({str(rec['kind'])[:64]}) is ill-formed: {bad}",
                                     "see `ledger verify`; restore .ledger/journal from a backup or bundle",
                                     seq=rec["seq"])
            for name, target in (payload.get("refs") or {}).items():
                if target is None:
                    self.refs.pop(name, None)
                else:
                    self.refs[name] = target
            for name, d in (payload.get("counters") or {}).items():
                self.counters[name] = self.counters.get(name, 0) + d
        self.seq, self.head = rec["seq"], rec["id"]

    def add_rows(self, run, a: int, b: int) -> None:
        """Apply rows a .. b-1 (a < b) of a run of proved lines (store/blockcheck.py) of a kind
        with KindHooks.line_fields, which names every counter such a payload changes and says it
        has no refs: the counters' deltas summed exactly (Python ints), as `add` one by one."""
        for name, p in schema.hooks(run.kind).line_fields.counters:
            self.counters[name] = self.counters.get(name, 0) + sum(run.parts[p][a:b].tolist())
        self.seq, self.head = int(run.seq[b - 1]), run.id(b - 1)

    def state(self) -> State:
        """The state folded so far (a snapshot: later adds do not change it)."""
        return State(self.seq, self.head, dict(self.refs), dict(self.counters))


def fold(records, start: State | None = None) -> State:
    """Apply records, in order, to `start` (the empty state by default)."""
    f = Fold(start)
    for r in records:
        f.add(r)
    return f.state()


def check_ref_changes(changes: dict) -> None:
    """Refuse (BadInput) ref changes with bad names or targets that are not ids."""
    for name, target in changes.items():
        if not isinstance(name, str) or not name or any(c.isspace() for c in name) or name.startswith("b3:"):
            raise BadInput(f"bad ref name {name!r}", "ref names are non-empty, without spaces, not ids")
        if target is not None and not is_id(target):
            raise BadInput(f"ref {name!r} must name an object id, got {target!r}")
