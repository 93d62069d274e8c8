"""`ledger repair --from SOURCE`: replace missing or damaged objects with verified copies.

`verify --read-data` names what is damaged; repair asks a source (a remote or a bundle) for
each such object by id, admits a copy only if its bytes hash to that id (and, where the
journal recorded the object's size, have exactly that size), and replaces the damaged file
atomically (ObjectStore.replace_damaged: readers see the damaged file or the good one,
never a half-written one). No signature is needed: the id, which this store's own journal
already names, is the whole check — nothing new enters the store's history. Each round of
replacements is one `repair` record naming the source and the ids replaced. Only objects the
journal reaches are repaired (a damaged object nothing reaches is `gc`'s). A repaired
structured object may name objects that were invisible while it was damaged, so verify runs
again until nothing more can be repaired; what remains is reported, not hidden.
"""

from __future__ import annotations

from dataclasses import dataclass

from ledger import records
from ledger.errors import CorruptObject, StoreCorrupt
from ledger.sharing.admit import Arrivals, held_state
from ledger.sharing.pool import JOBS, NullProgress, Progress, run_all
from ledger.sharing.sources import NotHeld, Source, loose_limit
from ledger.store import faults, schema
from ledger.store.ids import is_id
from ledger.store.verify import verify

DAMAGE = ("missing", "corrupt")   # verify's object findings that a verified copy cures


@dataclass(frozen=True)
class RepairResult:
    """What a repair replaced, what it could not, and verify's findings afterwards."""

    source: str
    repaired: tuple           # ids whose missing or damaged file a verified copy replaced
    not_held: tuple           # damaged ids the source does not hold either
    refused: tuple            # (id, why) copies the source offered that failed verification
    remaining: tuple          # verify's errors after the repair (empty: the store is clean)
    records: tuple            # ids of the `repair` records written (one per round)

    @property
    def ok(self) -> bool:
        """The store verifies clean now."""
        return not self.remaining

    def to_json(self) -> dict:
        """The result as JSON (`--json`)."""
        return {"source": self.source, "ok": self.ok, "repaired": list(self.repaired),
                "not_held": list(self.not_held), "refused": [{"id": i, "message": m} for i, m in self.refused],
                "remaining": list(self.remaining), "records": list(self.records)}


def recorded_sizes(store) -> dict[str, int]:
    """Each object's size as the journal recorded it when it was written (or imported)."""
    sizes: dict[str, int] = {}

    def each(r):
        for o in schema.objects_of(r):
            if isinstance(o, list) and len(o) == 3 and is_id(o[0]) and type(o[1]) is int and o[1] >= 0:
                sizes[o[0]] = o[1]
    store.journal.scan(keep=False, each=each)  # streamed: no list of every record
    return sizes


def damaged_ids(report) -> dict[str, str]:
    """{id: message} for verify's findings that a verified copy would cure."""
    return {e["id"]: e["message"] for e in report.errors if e.get("what") in DAMAGE and is_id(e.get("id"))}


class _NothingReplaced(Exception):
    """Control flow only: no copy arrived, so the round writes no record."""


def _round(store, source: Source, targets: list[str], sizes: dict, progress: Progress, jobs: int):
    """One locked round: fetch each target, verified, and install it. Returns (replaced ids,
    ids the source lacks, refused (id, why), record id or None)."""
    replaced: list[str] = []
    lacking: list[str] = []
    refused: list[tuple[str, str]] = []
    record = None
    try:
        with store.transaction("repair") as tx:
            state = {o: held_state(store, o) for o in targets}
            todo = [o for o in targets if state[o] != "intact"]   # another writer may have fixed it
            arrivals = Arrivals(store, damaged=[o for o in todo if state[o] == "damaged"])
            limit = loose_limit(store)
            progress.start(f"repair ← {source.label}", len(todo), sum(sizes.get(o, 0) for o in todo))

            def get(oid):
                size = sizes.get(oid)
                try:
                    arrivals.fetch(oid, size, lambda dest, cb: source.read(oid, size, dest, cb, limit=limit),
                                   lambda n: progress.advance(nbytes=n))
                except NotHeld:
                    return oid, "lacking", None
                except CorruptObject as e:   # this copy is bad; others may still be good
                    return oid, "refused", e.message
                faults.point("repair.object")
                progress.advance(objects=1)
                return oid, "fetched", None

            try:
                results = run_all(get, todo, jobs)
                arrivals.flush("repair.installed")
            finally:
                progress.finish()
                arrivals.discard()
            for oid, outcome, why in sorted(results):
                if outcome == "fetched":
                    replaced.append(oid)
                elif outcome == "lacking":
                    lacking.append(oid)
                else:
                    refused.append((oid, why))
            if not replaced:
                raise _NothingReplaced
            for oid in replaced:
                tx.record_object(oid, "repair")
            records.write(tx, records.Repair(source=source.label, repaired=replaced))
        record = tx.record["id"]
    except _NothingReplaced:
        pass
    return replaced, lacking, refused, record


def repair(store, source: Source, progress: Progress | None = None, jobs: int = JOBS) -> RepairResult:
    """Replace every missing or damaged object that `source` holds a verified copy of; report the rest."""
    progress = progress or NullProgress()
    sizes = recorded_sizes(store)
    tried: set[str] = set()
    repaired: list[str] = []
    lacking: list[str] = []
    refused: list[tuple[str, str]] = []
    records: list[str] = []
    while True:
        report = verify(store, read_data=True)
        targets = set(damaged_ids(report)) - tried
        if targets:
            # Only what the journal reaches: a record naming an object makes it reachable for
            # good, and a damaged object nothing reaches is gc's to remove, not ours to keep.
            targets &= store.closure(store.roots())
        if not targets:
            break
        targets = sorted(targets)
        tried.update(targets)
        got, lack, bad, record = _round(store, source, targets, sizes, progress, jobs)
        repaired += got
        lacking += lack
        refused += bad
        if record:
            records.append(record)
        if not got:
            break   # nothing new arrived, so nothing new can have become visible
    return RepairResult(source=source.label, repaired=tuple(sorted(repaired)), not_held=tuple(sorted(lacking)),
                        refused=tuple(sorted(refused)), remaining=tuple(report.errors), records=tuple(records))


def failure(res: RepairResult) -> StoreCorrupt | None:
    """The error `ledger repair` exits with when damage remains (exit 4), naming the first."""
    if res.ok:
        return None
    first = res.remaining[0]
    lack = f"; {len(res.not_held)} damaged object(s) are not on {res.source} either" if res.not_held else ""
    return StoreCorrupt(f"repair replaced {len(res.repaired)} object(s), but {len(res.remaining)} fault(s) remain"
                        f"{lack}; first: {first.get('message')}",
                        "repair again from another remote or bundle that holds them (`ledger repair --from SOURCE`)")
