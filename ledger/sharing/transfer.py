"""Moving objects: push, pull, fetch a closure, and admitting what arrives.

Push (read-only on the local store; no lock):
  0. if every remote ref already names the same target through a manifest the remote holds
     (signed by our key when signing), it is up to date — no closure walk at all;
  1. otherwise gather the closure of the named refs and the journal segment; build the manifest;
  2. if the remote already has that manifest object, every object it lists is there
     (invariant below) — nothing moves; otherwise ask which objects are missing;
  3. upload the missing objects in batches (each hashed as sent, staged, and the batch made
     durable and visible together: durable.py);
  4. upload the manifest object, then 5. the ref files that name it.
  Remote invariant (MUST): a manifest object is written only after every object it lists,
  and a ref only after its manifest. A crash anywhere leaves complete objects and possibly
  unreferenced ones; a rerun lists again and sends only what is still missing.

Pull / bundle import (one `import` transaction, under the store lock):
  1. read the manifest and check its signatures against the trust policy — before any
     object moves;
  2. fetch each missing object into tmp/, verifying its hash on arrival;
  3. check the journal segment (ids recompute, prev links) and that the closure is complete;
  4. install objects, then append ONE record that sets `NAMESPACE/<ref>` refs. Local HEAD
     and local refs are never touched.
  A bundle is all-or-nothing: objects stay in tmp/ until every check passed, so a bad bundle
  leaves the object set and the journal exactly as they were. A pull installs each verified
  object as it arrives so an interrupted pull resumes; until its record commits they are
  unreferenced objects (valid, and gc-able).
"""

from __future__ import annotations

import os
import re
import threading
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from ledger.errors import (BadInput, CorruptObject, LedgerError, Refused, StoreCorrupt,
                           UnknownRef)
from ledger.sharing import durable, keys, manifest as mf, remote as rm, signing
from ledger.store import canonical, faults, fsio
from ledger.store.ids import find_ids, hash_bytes, is_id
from ledger.store.journal import default_actor, now

JOBS = 4                 # concurrent transfers: I/O bound (disk, network), not CPU bound
BATCH_BYTES = 256 << 20  # objects made durable together (durable.py); also the resume granularity


def batch_objects() -> int:
    """Objects per durable batch. LEDGER_SHARE_BATCH overrides it (the crash tests use tiny
    batches so that a kill lands between batches as well as inside one)."""
    v = os.environ.get("LEDGER_SHARE_BATCH")
    return max(1, int(v)) if v and v.isdigit() else 1000


def batches(ids, sizes):
    """Split ids into batches of at most batch_objects() objects and ~BATCH_BYTES bytes."""
    cap, out, cur, nbytes = batch_objects(), [], [], 0
    for oid in ids:
        if cur and (len(cur) >= cap or nbytes + sizes[oid] > BATCH_BYTES):
            out.append(cur)
            cur, nbytes = [], 0
        cur.append(oid)
        nbytes += sizes[oid]
    if cur:
        out.append(cur)
    return out
REF_LIMIT = 1 << 20
MANIFEST_LIMIT = 512 << 20
JSON_SCAN_LIMIT = 256 << 20   # as store.closure: larger objects are data, not structure
RESERVED_NS = {"name", "id", "HEAD"}
NS_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")


# --- progress -----------------------------------------------------------------------------
class Progress(Protocol):
    def start(self, label: str, objects: int, nbytes: int) -> None: ...
    def advance(self, objects: int = 0, nbytes: int = 0) -> None: ...
    def finish(self) -> None: ...


class NullProgress:
    def start(self, label, objects, nbytes): pass
    def advance(self, objects=0, nbytes=0): pass
    def finish(self): pass


# --- results --------------------------------------------------------------------------------
@dataclass(frozen=True)
class PushResult:
    remote: str
    refs: dict
    manifest: str
    objects_total: int
    bytes_total: int
    objects_sent: int
    bytes_sent: int
    up_to_date: bool
    signed_by: str | None
    absent: tuple = ()        # ids the closure names that the sender does not hold

    def to_json(self) -> dict:
        return dict(self.__dict__)


@dataclass(frozen=True)
class ImportResult:
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

    def to_json(self) -> dict:
        d = dict(self.__dict__)
        d["signers"] = [c.to_json() for c in self.signers]
        return d


@dataclass(frozen=True)
class FetchResult:
    source: str
    requested: tuple
    fetched_objects: int
    fetched_bytes: int
    missing: tuple            # ids reachable from `requested` that neither side has
    imports: tuple            # ImportResult for manifests that were pulled whole
    record: str | None        # id of the record that keeps walked objects reachable

    @property
    def complete(self) -> bool:
        return not self.missing

    def to_json(self) -> dict:
        d = dict(self.__dict__)
        d["imports"] = [i.to_json() for i in self.imports]
        d["complete"] = self.complete
        return d


def check_namespace(ns: str) -> str:
    if not isinstance(ns, str) or not NS_RE.match(ns) or ns in RESERVED_NS or re.match(r"^gen-\d+$", ns):
        raise BadInput(f"bad namespace {ns!r}", "namespaces use letters, digits, . _ - and are not name, id, HEAD or gen-N")
    return ns


# --- signing what we share ------------------------------------------------------------------
def _signer(store, key_name: str | None):
    if key_name is None:
        return None
    sk = keys.private_key(store, key_name)
    return sk, keys.own_keys(store)[key_name]


def make_segment(sel: mf.Selection, signer) -> bytes | None:
    if not sel.records:
        return None
    sigs = {}
    if signer:
        sk, pub = signer
        sigs = {r["id"]: [signing.sign(sk, pub, "record", r)] for r in sel.records}
    return mf.encode_segment(list(sel.records), sigs)


def prepare(store, names, key_name: str | None):
    """(selection, manifest, segment blob, manifest signatures, signer public key)."""
    sel = mf.gather(store, names)
    signer = _signer(store, key_name)
    seg = make_segment(sel, signer)
    man = mf.assemble(store, sel.refs, sel.roots, sel.objects, seg, sel.absent)
    sigs = [signing.sign(signer[0], signer[1], "manifest", man.to_json())] if signer else []
    return sel, man, seg, sigs, (signer[1] if signer else None)


# --- push -----------------------------------------------------------------------------------
def _already_there(store, backend, names, key_name: str | None) -> PushResult | None:
    """The up-to-date check, without walking the closure: every ref on the remote already
    names the same target through a manifest the remote holds (and, when signing, carries a
    valid signature by our key). By the remote invariant a present manifest means all its
    objects are present. `push --full` skips this and re-checks every object."""
    refs, _ = mf.select(store, names)
    pub = keys.own_keys(store)[key_name] if key_name else None
    if pub is None and key_name:
        return None
    manifests: dict[str, mf.Manifest] = {}
    for name, target in refs.items():
        data = backend.read_small(f"refs/{name}", REF_LIMIT)
        if data is None:
            return None
        try:
            body = canonical.loads(data)
        except BadInput:
            return None
        if not isinstance(body, dict) or body.get("target") != target or not is_id(body.get("manifest")):
            return None
        mid = body["manifest"]
        if mid not in manifests:
            try:
                manifests[mid] = _read_manifest(backend, mid)
            except LedgerError:
                return None
        if manifests[mid].refs.get(name) != target:
            return None
        if pub is not None:
            checks = signing.verify({pub.fingerprint: pub}, "manifest", manifests[mid].to_json(),
                                    body.get("signatures") if isinstance(body.get("signatures"), list) else [])
            if not any(c.trusted for c in checks):
                return None
    sizes: dict[str, int] = {}
    for m in manifests.values():
        sizes.update(m.sizes())
    first = manifests[next(iter(manifests))] if manifests else None
    return PushResult(remote=backend.url, refs=dict(refs), manifest=first.id if first else "", objects_total=len(sizes),
                      bytes_total=sum(sizes.values()), objects_sent=0, bytes_sent=0, up_to_date=True,
                      signed_by=key_name, absent=tuple(sorted({a for m in manifests.values() for a in m.absent})))


def push(store, backend: rm.Backend, names, key_name: str | None = None, progress: Progress | None = None,
         jobs: int = JOBS, full: bool = False) -> PushResult:
    progress = progress or NullProgress()
    rm.check_marker(backend, create=True)
    if not full:
        quick = _already_there(store, backend, names, key_name)
        if quick is not None:
            return quick
    sel, man, seg, sigs, pub = prepare(store, names, key_name)
    sizes = man.sizes()
    sent_objects = sent_bytes = 0
    up_to_date = backend.exists(rm.object_key(man.id)) and not full
    if not up_to_date:
        present = backend.has_objects(sizes)
        # The segment is written directly (write_small, durable on its own), the rest staged
        # in batches; sending it first keeps the order of a push independent of where its
        # (time-dependent) id happens to sort, so a rerun passes the same points in the same order.
        todo = sorted((oid for oid in sizes if oid not in present), key=lambda o: (o != man.segment, o))
        progress.start(f"push → {backend.url}", len(todo), sum(sizes[o] for o in todo))
        lock = threading.Lock()
        counted = [0]

        def on_bytes(n):
            with lock:
                counted[0] += n
            progress.advance(nbytes=n)

        def send(oid):
            if oid == man.segment:
                _put_blob(backend, oid, seg)
                on_bytes(len(seg))
            else:
                # Read through the store's verified path for small objects; stream large ones
                # (the backend hashes what it sends and refuses a mismatch, so a corrupt local
                # object can never be published under its id).
                backend.put_object(oid, store.object_path(oid), on_bytes)
            faults.point("push.object")
            progress.advance(objects=1)
            return oid

        try:
            for batch in batches(todo, sizes):
                _run_all(send, batch, jobs)
                backend.flush()  # the batch is durable and visible before anything names it
                faults.point("push.batch")
        finally:
            progress.finish()
        sent_objects, sent_bytes = len(todo), counted[0]
        _put_blob(backend, man.id, man.canonical())
        faults.point("push.manifest")
    for name, target in sorted(sel.refs.items()):
        body = {"kind": "remote-ref", "target": target, "manifest": man.id, "signatures": sigs}
        cur = backend.read_small(f"refs/{name}", REF_LIMIT)
        if cur is not None:
            try:
                old = canonical.loads(cur)
                if isinstance(old, dict) and {k: old.get(k) for k in body} == body:
                    continue
            except BadInput:
                pass  # an unreadable ref is simply replaced by a good one
        full = dict(body, actor=default_actor(), time=now())
        backend.write_small(f"refs/{name}", canonical.dumps(full))
        faults.point("push.ref")
    return PushResult(remote=backend.url, refs=dict(sel.refs), manifest=man.id, objects_total=len(sizes),
                      bytes_total=man.total_bytes, objects_sent=sent_objects, bytes_sent=sent_bytes,
                      up_to_date=up_to_date, signed_by=pub.name if pub else None, absent=man.absent)


def _put_blob(backend, oid: str, data: bytes) -> None:
    if hash_bytes(data) != oid:
        raise CorruptObject(oid)
    if not backend.exists(rm.object_key(oid)):
        backend.write_small(rm.object_key(oid), data)


def _run_all(fn, items, jobs: int):
    """Run fn over items on a small pool; the first failure cancels the rest and is raised."""
    if jobs <= 1 or len(items) <= 1:
        return [fn(i) for i in items]
    out = []
    with ThreadPoolExecutor(jobs) as pool:
        futs = [pool.submit(fn, i) for i in items]
        try:
            for f in as_completed(futs):
                out.append(f.result())
        except BaseException:
            for f in futs:
                f.cancel()
            raise
    return out


# --- admitting what arrives -----------------------------------------------------------------
class _Arrivals:
    """Objects fetched into the store's tmp/ and verified; installed by flush() in batches
    (durable.py: sync, rename, sync) — always before the record that names them."""

    def __init__(self, store):
        self.store = store
        self.pending: dict[str, Path] = {}
        self.lock = threading.Lock()

    def fetch(self, oid: str, size: int, fetch_fn, on_bytes) -> None:
        tmp = fsio.tmp_path(self.store.tmp)
        try:
            with open(tmp, "xb") as f:
                got = fetch_fn(oid, f, on_bytes)
                faults.io_check("receiving an object")
            if got != oid:
                raise CorruptObject(oid, f"object {oid} arrived with the wrong content (it hashes to {got})",
                                    "the source is damaged or was tampered with; nothing was imported from it")
            if size >= 0 and os.path.getsize(tmp) != size:
                raise CorruptObject(oid, f"object {oid} arrived with {os.path.getsize(tmp)} bytes, {size} were announced")
            with self.lock:
                self.pending[oid] = tmp
            tmp = None
        except OSError as e:
            raise fsio.io_error(e, f"receiving {oid}") from e
        finally:
            if tmp is not None and tmp.exists():
                tmp.unlink()

    def path(self, oid: str) -> Path:
        return self.pending.get(oid) or self.store.object_path(oid)

    def flush(self, point: str) -> None:
        with self.lock:
            staged = [(tmp, self.store.object_path(oid)) for oid, tmp in sorted(self.pending.items())]
            self.pending.clear()
        try:
            durable.install(self.store.root, staged, point)
        except OSError as e:
            for tmp, _ in staged:
                tmp.unlink(missing_ok=True)
            raise fsio.io_error(e, "installing received objects") from e

    def discard(self) -> None:
        for p in self.pending.values():
            p.unlink(missing_ok=True)
        self.pending.clear()


def _check_closed(store, man: mf.Manifest, arrivals: _Arrivals) -> None:
    """Every id that a structured object in the manifest names must be in the manifest or
    already here — otherwise admitting it would make the store incomplete."""
    listed = man.sizes()
    absent = set(man.absent)
    for oid, size in listed.items():
        if size > JSON_SCAN_LIMIT or size == 0:
            continue
        with open(arrivals.path(oid), "rb") as f:
            if f.read(1) != b"{":
                continue
            f.seek(0)
            data = f.read()
        try:
            obj = canonical.loads(data)
        except BadInput:
            continue
        for ref in find_ids(obj):
            if ref not in listed and ref not in absent and not store.has(ref):
                raise StoreCorrupt(f"incomplete share: {oid} refers to {ref}, which it does not carry",
                                   "ask the sender for the whole closure (bundle or push the ref, not a part)")


def verify_segment(trusted: dict, data: bytes) -> mf.Segment:
    seg = mf.decode_segment(data)
    for rec in seg.records:
        for c in signing.verify(trusted, "record", rec, seg.signatures.get(rec["id"], [])):
            if not c.valid:
                raise StoreCorrupt(f"journal segment record {rec['seq']} carries a signature that does not verify",
                                   "the segment was altered after it was signed")
    return seg


def admit(store, man: mf.Manifest, sigs, fetch_fn, *, namespace: str, source: str, names=None,
          progress: Progress | None = None, all_or_nothing: bool, jobs: int = JOBS,
          what: str = "share") -> ImportResult:
    """Verify and import a manifest's objects, then record ONE `import` transaction that sets
    `namespace/<ref>` for the refs in `names` (default: all of the manifest's refs)."""
    progress = progress or NullProgress()
    check_namespace(namespace)
    names = sorted(man.refs) if names is None else sorted(names)
    checks = signing.verify(keys.trusted_keys(store), "manifest", man.to_json(), sigs)
    signing.enforce(store, checks, what)
    sizes = man.sizes()
    arrivals = _Arrivals(store)
    try:
        with store.transaction("import") as tx:
            todo = [oid for oid in sorted(sizes) if not store.has(oid)]
            nbytes = sum(sizes[o] for o in todo)
            progress.start(f"import ← {source}", len(todo), nbytes)

            def get(oid):
                arrivals.fetch(oid, sizes[oid], fetch_fn, lambda n: progress.advance(nbytes=n))
                faults.point("pull.object")
                progress.advance(objects=1)

            try:
                for batch in batches(todo, sizes):
                    _run_all(get, batch, jobs)
                    if not all_or_nothing:
                        # A pull keeps each verified batch, so a rerun resumes after it.
                        arrivals.flush("pull.batch")
            finally:
                progress.finish()
            nseg = 0
            if man.segment:
                with open(arrivals.path(man.segment), "rb") as f:
                    seg = verify_segment(keys.trusted_keys(store), f.read(mf.MAX_SEGMENT + 1))
                nseg = len(seg.records)
            _check_closed(store, man, arrivals)
            arrivals.flush("import.objects-installed")
            mid = tx.put_json(man.to_json())
            for oid in todo:
                tx.objects[oid] = (sizes[oid], "import")
            refs = {f"{namespace}/{n}": man.refs[n] for n in names}
            tx.refs.update(refs)
            tx.outputs.extend(sorted(set(man.roots) | set(refs.values()) | ({man.segment} if man.segment else set())))
            tx.outputs.append(mid)
            absent = tuple(a for a in man.absent if not store.has(a))
            tx.payload.update({"source": source, "namespace": namespace, "manifest": mid, "segment": man.segment,
                               "signers": [c.to_json() for c in checks], "objects_new": len(todo), "bytes_new": nbytes,
                               "absent": list(absent)})
    finally:
        arrivals.discard()
    return ImportResult(source=source, namespace=namespace, refs=refs, manifest=mid, objects_total=len(sizes),
                        bytes_total=man.total_bytes, objects_new=len(todo), bytes_new=nbytes, signers=tuple(checks),
                        segment_records=nseg, record=tx.record["id"], absent=absent)


# --- pull -----------------------------------------------------------------------------------
def _read_ref(backend, name: str) -> dict:
    data = backend.read_small(f"refs/{name}", REF_LIMIT)
    if data is None:
        raise UnknownRef(f"remote {backend.url} has no ref {name!r}", "see `ledger pull REMOTE` with no refs for all")
    try:
        body = canonical.loads(data)
    except BadInput:
        raise StoreCorrupt(f"remote ref {name!r} is unreadable") from None
    if not (isinstance(body, dict) and body.get("kind") == "remote-ref" and is_id(body.get("target"))
            and is_id(body.get("manifest")) and isinstance(body.get("signatures"), list)):
        raise StoreCorrupt(f"remote ref {name!r} is malformed")
    return body


def _read_manifest(backend, mid: str) -> mf.Manifest:
    data = backend.read_small(rm.object_key(mid), MANIFEST_LIMIT)
    if data is None:
        raise StoreCorrupt(f"remote {backend.url} names manifest {mid} but does not hold it",
                           "the push that wrote it was interrupted after the ref? push again from the source")
    if hash_bytes(data) != mid:
        raise CorruptObject(mid, f"manifest {mid} on {backend.url} does not hash to its id")
    try:
        return mf.Manifest.from_json(canonical.loads(data, strict=True))
    except BadInput as e:
        raise StoreCorrupt(f"manifest {mid} is malformed: {e.message}") from None


def remote_refs(backend) -> list[str]:
    return [k[len("refs/"):] for k in backend.list("refs/")]


def _ref_name(name: str) -> str:
    """A raw id or 8+ hex prefix asks for the ref that a push of that id wrote."""
    if is_id(name):
        return "id/" + name[3:]
    return name


def _remote_ref_name(backend, name: str) -> str:
    """As locally: an exact ref, else `name/<name>` (what `add --name` made), else an id."""
    name = _ref_name(name)
    mf.check_ref_name(name)
    if not backend.exists(f"refs/{name}") and backend.exists(f"refs/name/{name}"):
        return f"name/{name}"
    return name


def pull(store, backend: rm.Backend, names=None, *, namespace: str, source: str | None = None,
         progress: Progress | None = None, jobs: int = JOBS) -> list[ImportResult]:
    """Fetch refs (default: all) from a remote into `namespace/…`; one import per manifest."""
    check_namespace(namespace)
    rm.check_marker(backend, create=False)
    names = [_remote_ref_name(backend, n) for n in names] if names else remote_refs(backend)
    if not names:
        raise UnknownRef(f"remote {backend.url} has no refs", "push something to it first")
    by_manifest: dict[str, list] = {}
    bodies = {}
    for n in names:
        mf.check_ref_name(n)
        body = _read_ref(backend, n)
        bodies[n] = body
        by_manifest.setdefault(body["manifest"], []).append(n)
    out = []
    for mid, refnames in sorted(by_manifest.items()):
        man = _read_manifest(backend, mid)
        for n in refnames:
            if man.refs.get(n) != bodies[n]["target"]:
                raise StoreCorrupt(f"remote ref {n!r} names {bodies[n]['target']} but its manifest says {man.refs.get(n)}",
                                   "the remote was altered; ask its owner to push again")
        sigs = bodies[refnames[0]]["signatures"]

        def fetch_fn(oid, f, on_bytes):
            try:
                return backend.get_object(oid, f, on_bytes)
            except FileNotFoundError:
                raise StoreCorrupt(f"remote {backend.url} lacks {oid}, which its manifest lists",
                                   "the remote is incomplete; `ledger push --full` again from the source") from None

        out.append(admit(store, man, sigs, fetch_fn, namespace=namespace, source=source or backend.url, names=refnames,
                         progress=progress, all_or_nothing=False, jobs=jobs, what=f"manifest {mid[:15]} on {backend.url}"))
    return out


# --- fetching the closure of some ids (for `reproduce --from`) -----------------------------


class _NoRecord(Exception):
    """Control flow only: the walk found everything already here, so there is nothing to record."""


class _NotOnRemote(Exception):
    """Control flow only: the remote does not hold an object the walk asked for."""


def open_source(store, spec: str):
    """REMOTE name, bundle file, remote directory or s3:// URL → ("remote", backend, label) or
    ("bundle", path, label). An ambiguous or unknown spec is an error, never a guess."""
    cfgs = rm.configured(store)
    if spec in cfgs:
        c = cfgs[spec]
        return "remote", rm.open_backend(c.url, c.options), spec
    if spec.startswith("s3://"):
        return "remote", rm.open_backend(spec), spec
    p = Path(spec[len("file://"):] if spec.startswith("file://") else spec)
    if p.is_file():
        return "bundle", p, str(p)
    if p.is_dir():
        return "remote", rm.DirBackend(p), str(p)
    raise UnknownRef(f"{spec!r} is neither a configured remote, a bundle file nor a remote directory",
                     "see `ledger remote list`, or give a path or s3:// URL")


def _local_missing(store, ids) -> set[str]:
    missing: set[str] = set()
    store.closure(ids, missing)
    return missing


def fetch_closure(store, source, ids, namespace: str | None = None, progress: Progress | None = None,
                  jobs: int = JOBS) -> FetchResult:
    """Bring every object reachable from `ids` into `store` from `source` (a spec string for
    `open_source`, or its result). Uses signed manifests where the source has them; otherwise
    walks the remote object by object (refused when this store requires signatures).
    Returns what is still missing rather than raising, so `reproduce` can answer
    MissingInputs naming them."""
    kind, where, label = open_source(store, source) if isinstance(source, str) else source
    ids = [i if is_id(i) else store.resolve(i) for i in ids]
    if not _local_missing(store, ids):
        return FetchResult(source=label, requested=tuple(ids), fetched_objects=0, fetched_bytes=0, missing=(),
                           imports=(), record=None)
    imports = []
    if kind == "bundle":
        from ledger.sharing import bundle

        imports.append(bundle.import_bundle(store, where, namespace=namespace, progress=progress, jobs=jobs))
        missing = _local_missing(store, ids)
        return FetchResult(source=label, requested=tuple(ids), fetched_objects=imports[0].objects_new,
                           fetched_bytes=imports[0].bytes_new, missing=tuple(sorted(missing)), imports=tuple(imports),
                           record=None)
    backend = where
    rm.check_marker(backend, create=False)
    ns = check_namespace(namespace or (label if rm.NAME_RE.match(label) else "remote"))
    # 1. a signed manifest that a push of exactly these ids (or a ref to them) wrote
    wanted = set(ids)
    refs = remote_refs(backend)
    hits = [r for r in refs if r.startswith("id/") and ("b3:" + r[3:]) in wanted]
    if len(hits) < len(wanted):
        for r in refs:
            if r not in hits and _read_ref(backend, r)["target"] in wanted:
                hits.append(r)
    if hits:
        imports.extend(pull(store, backend, hits, namespace=ns, source=label, progress=progress, jobs=jobs))
    missing = _local_missing(store, ids) | {i for i in ids if not store.has(i)}
    if not missing:
        return FetchResult(source=label, requested=tuple(ids), fetched_objects=sum(i.objects_new for i in imports),
                           fetched_bytes=sum(i.bytes_new for i in imports), missing=(), imports=tuple(imports), record=None)
    # 2. walk the remote object by object: nothing signs a loose object, so a store that
    #    requires signatures refuses this path instead of quietly taking it.
    if keys.signatures_required(store):
        raise Refused(f"{label} has no signed manifest for {sorted(missing)[0]}, and this store requires signatures",
                      "ask the sender to `ledger push REMOTE ID --sign KEY` for exactly this id")
    got: dict = {}
    try:
        with store.transaction("import") as tx:
            walked, nbytes, still = got["walk"] = _walk(store, backend, ids, progress or NullProgress(), jobs)
            lacking = [i for i in ids if not store.has(i)]
            if lacking:
                raise UnknownRef(f"{label} does not hold {lacking[0]}",
                                 "check the id, and that the sender pushed it (`ledger push REMOTE ID`)")
            if not walked:
                raise _NoRecord
            for oid, size in walked.items():
                tx.objects[oid] = (size, "import")
            # Keep what arrived reachable; ids neither side holds are listed (as a bundle's
            # "absent") so `verify` on this store reports exactly what the sender's would.
            tx.outputs.extend(sorted(set(ids)))
            tx.payload.update({"source": label, "namespace": ns, "walked": len(walked), "bytes_new": nbytes,
                               "signers": [], "absent": sorted(still)})
        record = tx.record["id"]
    except _NoRecord:
        record = None
    walked, nbytes, still = got["walk"]
    return FetchResult(source=label, requested=tuple(ids), fetched_objects=sum(i.objects_new for i in imports) + len(walked),
                       fetched_bytes=sum(i.bytes_new for i in imports) + nbytes, missing=tuple(sorted(still)),
                       imports=tuple(imports), record=record)


def _walk(store, backend, ids, progress: Progress, jobs: int):
    """Breadth-first over the object graph; each fetched object is verified and installed
    (the caller holds the lock). Returns (fetched {id: size}, bytes, ids missing on both sides)."""
    fetched: dict[str, int] = {}
    missing: set[str] = set()
    arrivals = _Arrivals(store)
    seen: set[str] = set()
    frontier = list(dict.fromkeys(ids))
    progress.start(f"fetch ← {backend.url}", 0, 0)
    try:
        while frontier:
            seen.update(frontier)
            need = [o for o in frontier if not store.has(o)]

            def get(oid):
                count = [0]

                def on_bytes(n):
                    count[0] += n
                    progress.advance(nbytes=n)
                def fetch_fn(o, f, cb):
                    try:
                        return backend.get_object(o, f, cb)
                    except FileNotFoundError:
                        raise _NotOnRemote(o) from None
                try:
                    # The size is unknown before arrival (-1): the hash is the check.
                    arrivals.fetch(oid, -1, fetch_fn, on_bytes)
                except _NotOnRemote:
                    return oid, None
                progress.advance(objects=1)
                return oid, count[0]

            for oid, size in _run_all(get, need, jobs):
                if size is None:
                    missing.add(oid)
                else:
                    fetched[oid] = size
            arrivals.flush("fetch.level")
            nxt = []
            for oid in frontier:
                if oid in missing:
                    continue
                p = store.object_path(oid)
                if p.stat().st_size > JSON_SCAN_LIMIT:
                    continue
                with open(p, "rb") as f:
                    if f.read(1) != b"{":
                        continue
                try:
                    obj = store.get_json(oid)
                except BadInput:
                    continue
                nxt.extend(i for i in find_ids(obj) if i not in seen)
            frontier = list(dict.fromkeys(nxt))
    finally:
        progress.finish()
        arrivals.discard()
    return fetched, sum(fetched.values()), missing
