"""Admitting what arrives: the one inbound verification for pull, fetch, bundle import and repair.

One `import` transaction, under the store lock:
  1. check the offer's signatures against the trust policy — before any object moves;
  2. fetch each object that is missing here, or held but damaged (not a regular file, or not
     hashing to its id; a packed copy whose bytes in its pack do not: store/packed.py), into
     tmp/, verifying its announced size and its hash on arrival (a chunked object on a remote:
     its chunk list, then only the chunks not held here, each verified, reassembled into tmp/
     and hashed whole — chunked.py);
  3. check the journal segment (ids recompute, prev links, record signatures), that the
     closure is complete, and that every id the offer calls *absent* is named by one of its
     objects (an invented absent id is refused: it would otherwise be a reference nobody can
     ever satisfy);
  4. install the objects (a verified copy replaces a damaged one atomically, and the result
     says so), then append ONE record that sets `NAMESPACE/<ref>` refs. Local HEAD and local
     refs are never touched.
A bundle is all-or-nothing: objects stay in tmp/ until every check passed, so a bad bundle
leaves the object set and the journal exactly as they were. A pull installs each verified
batch as it arrives so an interrupted pull resumes; until its record commits they are
unreferenced objects (valid, and gc-able).
"""

from __future__ import annotations

import os
import re
import threading
from dataclasses import dataclass
from pathlib import Path

from ledger import records
from ledger.errors import BadInput, CorruptObject, StoreCorrupt
from ledger.sharing import chunked, durable, keys, signing
from ledger.sharing import manifest as mf
from ledger.sharing.pool import JOBS, NullProgress, Progress, batches, run_all
from ledger.sharing.sources import NotHeld, Offer, Source
from ledger.store import canonical, faults, fsio
from ledger.store.ids import find_ids

JSON_SCAN_LIMIT = 256 << 20   # as store.closure: larger objects are data, not structure
RESERVED_NS = {"name", "id", "HEAD"}
NS_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")


@dataclass(frozen=True)
class ImportResult:
    """What one admitted offer brought: refs set, objects new and repaired, signers."""

    source: str
    namespace: str
    refs: dict                # local ref name -> id
    manifest: str
    objects_total: int
    bytes_total: int
    objects_new: int
    bytes_new: int
    signers: tuple            # signing.Check
    segment_records: int
    record: str | None        # id of the `import` journal record
    absent: tuple = ()        # ids the closure names that neither side holds
    repaired: tuple = ()      # ids held here damaged (or missing) that a verified copy replaced

    def to_json(self) -> dict:
        """The result as JSON (`--json`)."""
        d = dict(self.__dict__)
        d["signers"] = [c.to_json() for c in self.signers]
        return d


def check_namespace(ns: str) -> str:
    """A namespace for imported refs: `[A-Za-z0-9._-]`, not name, id, HEAD or gen-N."""
    if not isinstance(ns, str) or not NS_RE.match(ns) or ns in RESERVED_NS or re.match(r"^gen-\d+$", ns):
        raise BadInput(f"bad namespace {ns!r}",
                       "namespaces use letters, digits, . _ - and are not name, id, HEAD or gen-N")
    return ns


def held_state(store, oid: str) -> str:
    """"intact", "missing" or "damaged" (present but a special file, a link, or wrong bytes).
    A packed object (store/packed.py) has no file of its own: it is intact if its bytes in its
    pack hash to its id (ObjectStore.intact), damaged if a pack holds an entry for it that does
    not — then a verified copy replaces it with a file of its own, which reads prefer."""
    if store.objects.intact(oid):
        return "intact"
    for p in (store.object_path(oid), store.objects.index_path(oid), store.objects.zpath(oid)):
        try:
            os.lstat(p)
            return "damaged"
        except FileNotFoundError:
            pass
    return "damaged" if store.objects.packed_only(oid) else "missing"


class Arrivals:
    """Objects fetched into the store's tmp/ and verified; installed by flush() in batches
    (durable.py: sync, rename, sync) — always before the record that names them. Ids in
    `damaged` replace the damaged file in place (ObjectStore.replace_damaged, atomic)."""

    def __init__(self, store, damaged=()):
        self.store = store
        self.damaged = set(damaged)
        self.pending: dict[str, Path] = {}
        self.repaired: list[str] = []
        self.lock = threading.Lock()

    def fetch(self, oid: str, size: int | None, read, on_bytes) -> None:
        """read(dest, on_bytes) -> hash of what it wrote; the copy is kept only if it matches."""
        tmp = fsio.tmp_path(self.store.tmp)
        try:
            with open(tmp, "xb") as f:
                got = read(f, on_bytes)
                faults.io_check("receiving an object")
            if got != oid:
                raise CorruptObject(oid, f"object {oid} arrived with the wrong content (it hashes to {got})",
                                    "the source is damaged or was tampered with; nothing was imported from it")
            have = os.path.getsize(tmp)
            if size is not None and have != size:
                raise CorruptObject(oid, f"object {oid} arrived with {have} bytes, {size} were announced")
            with self.lock:
                self.pending[oid] = tmp
            tmp = None
        except OSError as e:
            raise fsio.io_error(e, f"receiving {oid}") from e
        finally:
            if tmp is not None and tmp.exists():
                tmp.unlink()

    def _peek(self, oid: str, cap: int, structure: bool) -> bytes | None:
        """At most `cap` bytes of an arrival in tmp/ (hashed as it arrived); None if it is not
        structure (`structure`: it does not start with `{`)."""
        tmp = self.pending[oid]
        try:
            fd, st = fsio.open_regular(tmp)
        except fsio.NotRegular as e:   # our own file in tmp/, replaced under us
            raise StoreCorrupt(f"{tmp}, where {oid} arrived, is now a {e.kind}",
                               "something else is writing to the store's tmp/; retry") from None
        except OSError as e:
            raise fsio.io_error(e, f"reading {oid} as it arrived") from e
        try:
            if structure and os.pread(fd, 1, 0) != b"{":
                return None
            return fsio.read_bounded(fd, min(cap, st.st_size))
        except OSError as e:
            raise fsio.io_error(e, f"reading {oid} as it arrived") from e
        finally:
            os.close(fd)

    def structure(self, oid: str, cap: int) -> bytes | None:
        """The bytes of `oid` if it is structure to look for ids in (starts with `{`), else None:
        an arrival's from tmp/ (at most `cap` bytes: its announced size), or, if it was held
        intact already, through the store's reader, whatever form it has there (whole,
        compressed, packed: a packed object has no file of its own; at most JSON_SCAN_LIMIT).
        A chunked object is data, never structure (as Store.closure)."""
        if oid in self.pending:
            return self._peek(oid, cap, structure=True)
        if self.store.objects.chunked(oid):
            return None
        return self.store.objects.structure(oid, JSON_SCAN_LIMIT)

    def read(self, oid: str, cap: int) -> bytes:
        """The verified bytes of `oid`, at most `cap`: an arrival's from tmp/, or a held object's
        through the store's reader, whatever form it has there (BadInput if it is larger)."""
        if oid in self.pending:
            return self._peek(oid, cap, structure=False)
        return self.store.objects.get_bytes(oid, max_size=cap)

    def flush(self, point: str) -> None:
        """Install everything pending: new objects in one durable batch, then the repairs."""
        with self.lock:
            pending = sorted(self.pending.items())
            self.pending.clear()
        objects = self.store.objects
        # a large arrival is stored as chunks (ledger/store/chunks.py): only the chunks this
        # store lacks are written, the rest are shared with what it holds
        big = [(oid, tmp) for oid, tmp in pending
               if oid not in self.damaged and tmp.stat().st_size >= objects.chunked_min]
        new = [(tmp, self.store.object_path(oid)) for oid, tmp in pending
               if oid not in self.damaged and (oid, tmp) not in big]
        fix = [(oid, tmp) for oid, tmp in pending if oid in self.damaged]
        try:
            for oid, tmp in big:
                if not objects.has(oid):
                    objects.put_file(tmp, expect=oid)   # re-verified while chunked
            durable.install(self.store.root, new, point)
            for oid, tmp in fix:
                if self.store.objects.replace_damaged(oid, tmp):   # copies tmp: ours is removed below
                    self.repaired.append(oid)
        except OSError as e:
            raise fsio.io_error(e, "installing received objects") from e
        finally:   # what was installed was renamed away; nothing else of ours may stay in tmp/
            for tmp in [t for t, _ in new] + [t for _, t in fix] + [t for _, t in big]:
                tmp.unlink(missing_ok=True)

    def discard(self) -> None:
        """Drop whatever was fetched but not installed (a refused import)."""
        for p in self.pending.values():
            p.unlink(missing_ok=True)
        self.pending.clear()


def check_closed(store, man: mf.Manifest, arrivals: Arrivals, what: str) -> None:
    """Every id that a structured object in the manifest names must be in the manifest,
    already here, or listed as absent — otherwise admitting it would make the store
    incomplete. And every absent id must be named by one of those objects: an id the sender
    merely claims is absent is an invented reference (refused, StoreCorrupt)."""
    listed = man.sizes()
    absent = set(man.absent)
    named: set[str] = set()
    for oid, size in listed.items():
        if size > JSON_SCAN_LIMIT or size == 0:
            continue
        data = arrivals.structure(oid, size)   # just arrived, or held here in whatever form
        if data is None:
            continue
        try:
            obj = canonical.loads(data)
        except BadInput:
            continue
        for ref in find_ids(obj):
            named.add(ref)
            if ref not in listed and ref not in absent and not store.has(ref):
                raise StoreCorrupt(f"incomplete share: {oid} refers to {ref}, which it does not carry",
                                   "ask the sender for the whole closure (bundle or push the ref, not a part)")
    invented = sorted(absent - named)
    if invented:
        raise StoreCorrupt(f"{what} lists {len(invented)} id(s) as absent that none of its objects names, "
                           f"e.g. {invented[0]}",
                           "its table of contents was altered or made up; nothing from it was recorded")


def admit(store, source: Source, offer: Offer, *, namespace: str, names=None, progress: Progress | None = None,
          all_or_nothing: bool, jobs: int = JOBS) -> ImportResult:
    """Verify and import an offer's objects, then record ONE `import` transaction that sets
    `namespace/<ref>` for the refs in `names` (default: the offer's refs). Objects held here
    damaged are replaced by their verified copies (`ImportResult.repaired`)."""
    progress = progress or NullProgress()
    man = offer.manifest
    check_namespace(namespace)
    names = sorted(offer.refs) if names is None else sorted(names)
    checks = signing.verify(keys.trusted_keys(store), "manifest", man.to_json(), list(offer.signatures))
    signing.enforce(store, checks, offer.what)
    sizes = man.sizes()
    with store.transaction("import") as tx:
        state = {oid: held_state(store, oid) for oid in sorted(sizes)}
        todo = [oid for oid, s in state.items() if s != "intact"]
        arrivals = Arrivals(store, damaged=[oid for oid, s in state.items() if s == "damaged"])
        nbytes = sum(sizes[o] for o in todo)
        progress.start(f"import ← {source.label}", len(todo), nbytes)

        local = chunked.LocalChunks(store)   # chunks held here are not downloaded again

        def get(oid):
            def read(dest, on_bytes):
                try:
                    # a damaged object downloads all its chunks: its own may be the damaged ones
                    return source.read(oid, sizes[oid], dest, on_bytes,
                                       local=None if oid in arrivals.damaged else local)
                except NotHeld:
                    raise StoreCorrupt(f"{source.label} lacks {oid}, which its manifest lists",
                                       "the remote is incomplete; `ledger push --full` again from the source"
                                       ) from None
            arrivals.fetch(oid, sizes[oid], read, lambda n: progress.advance(nbytes=n))
            faults.point("pull.object")
            progress.advance(objects=1)

        try:
            for batch in batches(todo, sizes):
                run_all(get, batch, jobs)
                if not all_or_nothing:
                    # A pull keeps each verified batch, so a rerun resumes after it.
                    arrivals.flush("pull.batch")
            nseg = 0
            if man.segment:
                # just arrived, or held here already (perhaps packed: no file of its own)
                try:
                    data = arrivals.read(man.segment, min(sizes[man.segment], mf.MAX_SEGMENT + 1))
                except BadInput:   # held, and larger than announced: not this manifest's segment
                    raise StoreCorrupt(f"{offer.what}: its journal segment is not the size its manifest "
                                       "lists") from None
                nseg = len(mf.verify_segment(keys.trusted_keys(store), data).records)
            check_closed(store, man, arrivals, offer.what)
            arrivals.flush("import.objects-installed")
        finally:
            progress.finish()
            arrivals.discard()
        mid = tx.put_json(man.to_json())
        for oid in todo:
            tx.record_object(oid, "import")
        refs = {f"{namespace}/{n}": man.refs[n] for n in names}
        tx.refs.update(refs)
        tx.outputs.extend(sorted(set(man.roots) | set(refs.values()) | ({man.segment} if man.segment else set())))
        tx.outputs.append(mid)
        absent = tuple(a for a in man.absent if not store.has(a))
        # Every absent id was proven above (check_closed) to be named by an object this import
        # carries, so listing it adds no reference the store did not already have: an import
        # never adds a reference that only the sender's word backs.
        records.write(tx, records.Import(
            source=source.label, namespace=namespace, manifest=mid, segment=man.segment,
            signers=[c.to_json() for c in checks], objects_new=len(todo) - len(arrivals.repaired), bytes_new=nbytes,
            absent=list(absent), **({"repaired": sorted(arrivals.repaired)} if arrivals.repaired else {})))
    repaired = tuple(sorted(arrivals.repaired))
    return ImportResult(source=source.label, namespace=namespace, refs=refs, manifest=mid, objects_total=len(sizes),
                        bytes_total=man.total_bytes, objects_new=len(todo) - len(repaired), bytes_new=nbytes,
                        signers=tuple(checks), segment_records=nseg, record=tx.record["id"], absent=absent,
                        repaired=repaired)
