"""Inbound from a source: pull named refs, or fetch the closure of some ids (`reproduce --from`).

Pull reads each ref and its manifest (hash-checked) and admits each manifest (admit.py) into
`NAMESPACE/…`, one import record per manifest. Fetch uses the signed manifests that a push of
exactly those ids (`refs/id/<hex>`) or a ref to them left; otherwise it walks a remote object
by object (breadth-first, verified, one `import` record at the end) — refused when the store
requires signatures, since nothing signs a loose object. Either way an object held here but
damaged is fetched again and replaced (admit.py); ids held on neither side are returned as
`missing`, not raised, so reproduce can answer MissingInputs naming them.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from ledger import records
from ledger.errors import BadInput, CorruptObject, MissingObject, Refused, UnknownRef
from ledger.sharing import chunked, keys
from ledger.sharing import remote as rm
from ledger.sharing.admit import JSON_SCAN_LIMIT, Arrivals, ImportResult, admit, check_namespace, held_state
from ledger.sharing.bundle import BundleSource
from ledger.sharing.pool import JOBS, NullProgress, Progress, run_all
from ledger.sharing.sources import NotHeld, RemoteSource, Source, loose_limit
from ledger.store import canonical
from ledger.store.ids import find_ids, is_id


@dataclass(frozen=True)
class FetchResult:
    """What fetch_closure brought, and what is still missing on both sides."""

    source: str
    requested: tuple
    fetched_objects: int
    fetched_bytes: int
    missing: tuple            # ids reachable from `requested` that neither side has
    imports: tuple            # ImportResult for manifests that were pulled whole
    record: str | None        # id of the record that keeps walked objects reachable
    repaired: tuple = ()      # ids held here damaged that a verified copy replaced

    @property
    def complete(self) -> bool:
        """Nothing reachable from the requested ids is missing any more."""
        return not self.missing

    def to_json(self) -> dict:
        """The result as JSON (`--json`)."""
        d = dict(self.__dict__)
        d["imports"] = [i.to_json() for i in self.imports]
        d["complete"] = self.complete
        return d


def open_source(store, spec: str) -> Source:
    """REMOTE name, bundle file, remote directory or s3:// URL -> a Source. An ambiguous or
    unknown spec is an error, never a guess."""
    cfgs = rm.configured(store)
    if spec in cfgs:
        c = cfgs[spec]
        return RemoteSource(rm.open_backend(c.url, c.options), spec)
    if spec.startswith("s3://"):
        return RemoteSource(rm.open_backend(spec), spec)
    p = Path(spec[len("file://"):] if spec.startswith("file://") else spec)
    if p.is_file():
        return BundleSource(p)
    if p.is_dir():
        return RemoteSource(rm.DirBackend(p), str(p))
    raise UnknownRef(f"{spec!r} is neither a configured remote, a bundle file nor a remote directory",
                     "see `ledger remote list`, or give a path or s3:// URL")


def pull(store, backend: rm.Backend, names=None, *, namespace: str, source: str | None = None,
         progress: Progress | None = None, jobs: int = JOBS) -> list[ImportResult]:
    """Fetch refs (default: all) from a remote into `namespace/…`; one import per manifest."""
    check_namespace(namespace)
    src = RemoteSource(backend, source)
    return [admit(store, src, offer, namespace=namespace, progress=progress, all_or_nothing=False, jobs=jobs)
            for offer in src.offers(names)]


def needs(store, ids) -> tuple[set[str], set[str]]:
    """(missing, damaged): ids reachable from `ids` that are not here, or here but damaged."""
    missing: set[str] = set()
    reach = store.closure(ids, missing)
    missing |= {i for i in ids if held_state(store, i) == "missing"}
    damaged = {o for o in reach - missing if held_state(store, o) == "damaged"}
    return missing, damaged


class _NoRecord(Exception):
    """Control flow only: the walk found everything already here, so there is nothing to record."""


def fetch_closure(store, source, ids, namespace: str | None = None, progress: Progress | None = None,
                  jobs: int = JOBS) -> FetchResult:
    """Bring every object reachable from `ids` into `store` from `source` (a spec string for
    `open_source`, or a Source). Uses signed manifests where the source has them; otherwise
    walks a remote object by object (refused when this store requires signatures).
    Returns what is still missing rather than raising, so `reproduce` can answer
    MissingInputs naming them."""
    src = open_source(store, source) if isinstance(source, str) else source
    ids = [i if is_id(i) else store.resolve(i) for i in ids]
    missing, damaged = needs(store, ids)
    if not missing and not damaged:
        return FetchResult(source=src.label, requested=tuple(ids), fetched_objects=0, fetched_bytes=0, missing=(),
                           imports=(), record=None)
    default_ns = src.label if rm.NAME_RE.match(src.label) else "remote"
    imports = [admit(store, src, offer, namespace=check_namespace(namespace or offer.namespace or default_ns),
                     progress=progress, all_or_nothing=not src.resumable, jobs=jobs)
               for offer in src.offers_for(ids)]
    fetched = sum(i.objects_new for i in imports)
    fetched_bytes = sum(i.bytes_new for i in imports)
    repaired = {r for i in imports for r in i.repaired}
    missing, damaged = needs(store, ids)
    if not src.loose or (not missing and not damaged):
        return FetchResult(source=src.label, requested=tuple(ids), fetched_objects=fetched, fetched_bytes=fetched_bytes,
                           missing=tuple(sorted(missing)), imports=tuple(imports), record=None,
                           repaired=tuple(sorted(repaired)))
    # Walk the remote object by object. Nothing signs a loose object, so a store that requires
    # signatures refuses this path for new objects instead of quietly taking it. Replacing a
    # damaged object needs no signature: its id, which this store already recorded, is the check.
    if missing and keys.signatures_required(store):
        raise Refused(f"{src.label} has no signed manifest for {sorted(missing)[0]}, "
                      "and this store requires signatures",
                      "ask the sender to `ledger push REMOTE ID --sign KEY` for exactly this id")
    ns = check_namespace(namespace or default_ns)
    got: dict = {}
    try:
        with store.transaction("import") as tx:
            walked, nbytes, still, fixed = got["walk"] = walk(store, src, ids, progress or NullProgress(), jobs)
            lacking = [i for i in ids if not store.has(i)]
            if lacking:
                raise UnknownRef(f"{src.label} does not hold {lacking[0]}",
                                 "check the id, and that the sender pushed it (`ledger push REMOTE ID`)")
            if not walked:
                raise _NoRecord
            for oid in walked:
                tx.record_object(oid, "import")
            # Keep what arrived reachable; ids neither side holds are listed (as a bundle's
            # "absent": each is named by a walked object) so `verify` on this store reports
            # exactly what the sender's would.
            tx.outputs.extend(sorted(set(ids)))
            records.write(tx, records.Import(source=src.label, namespace=ns, walked=len(walked), bytes_new=nbytes,
                                             signers=[], absent=sorted(still),
                                             **({"repaired": sorted(fixed)} if fixed else {})))
        record = tx.record["id"]
    except _NoRecord:
        record = None
    walked, nbytes, still, fixed = got["walk"]
    return FetchResult(source=src.label, requested=tuple(ids), fetched_objects=fetched + len(walked) - len(fixed),
                       fetched_bytes=fetched_bytes + nbytes, missing=tuple(sorted(still)), imports=tuple(imports),
                       record=record, repaired=tuple(sorted(repaired | set(fixed))))


def children(store, oid: str) -> set[str]:
    """The ids a held structured object names (empty for blobs, for large objects, and for one
    missing or damaged here). Read through the store, whatever form it has here: whole,
    compressed (store/compress.py: decompressed, rehashed) or packed (store/packed.py: no file
    of its own; read from its pack, rehashed)."""
    if store.objects.chunked(oid):
        return set()   # stored as chunks: a large blob, never structure (as Store.closure)
    try:
        data = store.objects.structure(oid, JSON_SCAN_LIMIT)
    except (MissingObject, CorruptObject):
        return set()
    if data is None:
        return set()
    try:
        return find_ids(canonical.loads(data))
    except BadInput:
        return set()


def walk(store, src: Source, ids, progress: Progress, jobs: int):
    """Breadth-first over the object graph; each fetched object is verified and installed,
    a damaged one replacing its file (the caller holds the lock). Returns (fetched
    {id: size}, bytes, ids missing on both sides, ids repaired)."""
    fetched: dict[str, int] = {}
    missing: set[str] = set()
    arrivals = Arrivals(store)
    local = chunked.LocalChunks(store)   # chunks held here are not downloaded again
    seen: set[str] = set()
    frontier = list(dict.fromkeys(ids))
    progress.start(f"fetch ← {src.label}", 0, 0)
    try:
        while frontier:
            seen.update(frontier)
            state = {o: held_state(store, o) for o in frontier}
            need = [o for o in frontier if state[o] != "intact"]
            arrivals.damaged |= {o for o in need if state[o] == "damaged"}
            limit = loose_limit(store)

            def get(oid):
                count = [0]

                def on_bytes(n):
                    count[0] += n
                    progress.advance(nbytes=n)

                try:
                    # The size is unknown before arrival: at most the free space may arrive,
                    # and the hash is the check.
                    arrivals.fetch(oid, None, lambda dest, cb: src.read(
                        oid, None, dest, cb, limit=limit, local=None if oid in arrivals.damaged else local), on_bytes)
                except NotHeld:
                    return oid, None
                progress.advance(objects=1)
                return oid, count[0]

            for oid, size in run_all(get, need, jobs):
                if size is None:
                    missing.add(oid)
                else:
                    fetched[oid] = size
            arrivals.flush("fetch.level")
            nxt = []
            for oid in frontier:
                if oid not in missing:
                    nxt.extend(i for i in children(store, oid) if i not in seen)
            frontier = list(dict.fromkeys(nxt))
    finally:
        progress.finish()
        arrivals.discard()
    return fetched, sum(fetched.values()), missing, tuple(arrivals.repaired)
