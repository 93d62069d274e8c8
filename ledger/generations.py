"""Generations: `gen-N` is a manifest object; `HEAD` names the live one.

A manifest lists everything the live image is made of: parent generation, base weights,
adapter (or none), capabilities with their grants, kernels, and the receipt and verdict that
admitted it. A new generation is always made from HEAD plus explicit changes, so what is not
changed is inherited, and the record that makes it moves HEAD in the same transaction.
Rollback is one record that moves HEAD; nothing is deleted.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from ledger import records
from ledger.errors import BadInput, JournalCorrupt, UnknownRef
from ledger.store import lookup

GEN_RE = re.compile(r"^gen-(\d+)$")
FIELDS = ("parent", "base", "adapter", "capabilities", "kernels", "receipt", "verdict", "note")


@dataclass(frozen=True)
class Generation:
    n: int
    id: str
    parent: str | None = None
    base: str | None = None
    adapter: str | None = None
    capabilities: dict = field(default_factory=dict)
    kernels: dict = field(default_factory=dict)
    receipt: str | None = None
    verdict: str | None = None
    note: str = ""

    @property
    def name(self) -> str:
        return f"gen-{self.n}"

    def manifest(self) -> dict:
        return {"kind": "generation", "n": self.n, **{k: getattr(self, k) for k in FIELDS}}


def _fields(m: dict) -> dict:
    return {"parent": m.get("parent"), "base": m.get("base"), "adapter": m.get("adapter"),
            "capabilities": dict(m.get("capabilities") or {}), "kernels": dict(m.get("kernels") or {}),
            "receipt": m.get("receipt"), "verdict": m.get("verdict"), "note": m.get("note") or ""}


def from_manifest(oid: str, m: dict) -> Generation:
    n = m.get("n") if isinstance(m, dict) else None
    if not isinstance(m, dict) or m.get("kind") != "generation" or not isinstance(n, int) or isinstance(n, bool) \
            or n < 0:
        raise BadInput(f"{oid} is not a generation manifest")
    return Generation(n=n, id=oid, **_fields(m))


def numbers(store) -> list[int]:
    return sorted(int(m.group(1)) for name in store.state.refs if (m := GEN_RE.match(name)))


def load(store, ref: str) -> Generation:
    """A generation by `gen-N`, `HEAD`, or manifest id."""
    oid = store.resolve(ref)
    return from_manifest(oid, store.get_json(oid))


def head(store) -> Generation | None:
    """The live generation, or None before the first. HEAD naming anything but a generation
    manifest is a damaged journal (a record moved it there), never bad input from the user."""
    oid = store.state.refs.get("HEAD")
    if not oid:
        return None
    try:
        return from_manifest(oid, store.get_json(oid))
    except BadInput:
        raise JournalCorrupt(f"HEAD names {oid}, which is not a generation manifest",
                             "run `ledger verify` to see the record that moved it; restore .ledger/journal "
                             "from a backup or bundle") from None


def new_generation(tx, store, note: str = "", **changes) -> Generation:
    """Make gen-(max+1) from HEAD with `changes`, write its manifest in `tx`, and move HEAD.

    `tx` must be an open transaction of `store`: the generation exists only if it commits."""
    bad = set(changes) - set(FIELDS)
    if bad:
        raise BadInput(f"unknown generation fields: {sorted(bad)}")
    cur = head(store)
    nums = numbers(store)
    n = (max(nums) + 1) if nums else 0
    fields = _fields(cur.manifest()) if cur else _fields({})
    fields.update({"parent": cur.id if cur else None, "receipt": None, "verdict": None, "note": note})
    fields.update(changes)
    g = Generation(n=n, id="", **fields)
    oid = tx.put_json(g.manifest())
    tx.outputs.append(oid)
    tx.refs[g.name] = oid
    tx.refs["HEAD"] = oid
    records.write_field(tx, "generation", n)  # every kind that makes a generation carries its number
    return Generation(**{**g.__dict__, "id": oid})


def move_head(tx, store, target: Generation) -> None:
    if f"gen-{target.n}" not in store.state.refs:
        raise UnknownRef(f"gen-{target.n} does not exist")
    tx.inputs.append(target.id)
    tx.refs["HEAD"] = target.id
    records.write(tx, records.Rollback(head=target.n))


def rollback(store, target: str | None = None, *, undo: bool = False, reason: str = "", wait: float | None = None) -> dict:
    """One `rollback` record that moves HEAD: to `target`, to HEAD's parent by default, or with
    `undo` back to where the last rollback moved it from. Nothing is deleted."""
    with store.transaction("rollback", wait=wait) as tx:
        cur = head(store)
        if cur is None:
            raise UnknownRef("there is no generation yet", "commit one first (`ledger run` or `ledger demo`)")
        if undo:
            last = lookup.latest(store, "rollback")  # the index answers; a walk would read all history
            if last is None:
                raise BadInput("there is no rollback to undo")
            moved_from = records.read(last).from_  # typed; an ill-formed record is JournalCorrupt
            if moved_from is records.ABSENT:
                raise BadInput(f"the last rollback (record {last['seq']}) does not say where it moved HEAD from",
                               "name the generation: `ledger rollback gen-N`")
            dest = load(store, f"gen-{moved_from}")
        elif target is not None:
            dest = load(store, target)
        else:
            if cur.parent is None:
                raise BadInput(f"{cur.name} has no parent to roll back to", "name a generation: `ledger rollback gen-N`")
            dest = from_manifest(cur.parent, store.get_json(cur.parent))
        if dest.id == cur.id:
            raise BadInput(f"HEAD is already {dest.name}")
        move_head(tx, store, dest)
        records.write(tx, records.Rollback(head=dest.n, from_=cur.n, to=dest.n, reason=reason))
    return {"from": cur.name, "to": dest.name, "head": dest.id, "seq": tx.record["seq"]}
