"""Garbage collection: delete only what no journal record reaches.

Reachability is computed from the journal itself (inputs, outputs and every id mentioned
in any payload, then the closure through structured objects), never from caches. A dry run
is the default; pruning needs the lock, so no transaction can be writing objects meanwhile.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ledger.errors import JournalCorrupt


@dataclass(frozen=True)
class GcPlan:
    unreachable: tuple = ()       # (id, size)
    tmp_files: tuple = ()         # names in tmp/
    reachable: int = 0
    pruned: bool = False

    @property
    def bytes(self) -> int:
        return sum(s for _, s in self.unreachable)

    def to_json(self) -> dict:
        return {"pruned": self.pruned, "reachable": self.reachable, "unreachable": [list(x) for x in self.unreachable],
                "unreachable_bytes": self.bytes, "tmp_files": list(self.tmp_files)}


def plan(store) -> GcPlan:
    scan = store.journal.scan()
    if scan.broken_at is not None:
        raise JournalCorrupt(f"journal is damaged at {scan.problem}; gc refuses to judge reachability")
    reachable = store.closure(store.roots(scan.records))
    unreachable = tuple((oid, p.stat().st_size) for oid, p in store.objects.iter_ids() if oid not in reachable)
    tmp = tuple(sorted(p.name for p in store.tmp.iterdir())) if store.tmp.is_dir() else ()
    return GcPlan(unreachable, tmp, len(reachable))


def prune(store) -> GcPlan:
    with store.locked():
        p = plan(store)
        for oid, _ in p.unreachable:
            store.objects.remove(oid)
        for name in p.tmp_files:
            (store.tmp / name).unlink(missing_ok=True)
        return GcPlan(p.unreachable, p.tmp_files, p.reachable, pruned=True)
