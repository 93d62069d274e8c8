"""Push: send the closure of some refs and its journal segment to a remote.

Read-only on the local store (no lock):
  0. if every remote ref already names the same target through a manifest the remote holds
     (signed by our key when signing), it is up to date — no closure walk at all;
  1. otherwise gather the closure of the named refs and the journal segment; build the manifest;
  2. if the remote already has that manifest object, every object it lists is there
     (invariant below) — nothing moves; otherwise ask which objects are missing;
  3. upload the missing objects in batches (each hashed as sent, staged, and the batch made
     durable and visible together: durable.py); a chunked object as the chunks the remote
     lacks and then its chunk list (chunked.py); a compressed or packed object, or one small
     enough that `gc --prune` may pack it meanwhile (store/packed.py: it then has no file of
     its own), read verified through the store into a work folder first;
  4. upload the manifest object, then 5. the ref files that name it.
Remote invariant (MUST): a manifest object is written only after every object it lists,
and a ref only after its manifest. A crash anywhere leaves complete objects and possibly
unreferenced ones; a rerun lists again and sends only what is still missing.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass

from ledger.errors import BadInput, CorruptObject, LedgerError
from ledger.sharing import chunked, keys, signing
from ledger.sharing import manifest as mf
from ledger.sharing import remote as rm
from ledger.sharing.pool import JOBS, NullProgress, Progress, batches, run_all
from ledger.sharing.sources import REF_LIMIT, read_manifest
from ledger.store import canonical, faults, fsio, packed
from ledger.store.ids import PREFIX, hash_bytes, is_id
from ledger.store.journal import default_actor, now


@dataclass(frozen=True)
class PushResult:
    """What a push sent (or that the remote was up to date)."""

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
        """The result as JSON (`--json`)."""
        return dict(self.__dict__)


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
                manifests[mid] = read_manifest(backend, mid)
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
    """Send the closure of `names` (refs, names or ids) and its segment; only missing objects move."""
    progress = progress or NullProgress()
    rm.check_marker(backend, create=True)
    if not full:
        quick = _already_there(store, backend, names, key_name)
        if quick is not None:
            return quick
    sel, man, seg, sigs, pub = mf.prepare(store, names, key_name)
    sizes = man.sizes()
    sent_objects = sent_bytes = 0
    up_to_date = backend.exists(rm.object_key(man.id)) and not full
    if not up_to_date:
        present = backend.has_objects(sizes)
        # a chunked object travels as its chunk list and the chunks the remote lacks (chunked.py);
        # one the remote holds as a list is there (the list is written after its chunks)
        big = {o for o in sizes if o not in present and o != man.segment and store.objects.chunked(o)}
        present |= chunked.held_as_list(backend, big)
        big -= present
        # The segment is written directly (write_small, durable on its own), the rest staged
        # in batches; sending it first keeps the order of a push independent of where its
        # (time-dependent) id happens to sort, so a rerun passes the same points in the same order.
        todo = sorted((oid for oid in sizes if oid not in present and oid not in big),
                      key=lambda o: (o != man.segment, o))
        progress.start(f"push → {backend.url}", len(todo) + len(big), sum(sizes[o] for o in todo))
        lock = threading.Lock()
        counted = [0]

        def on_bytes(n):
            with lock:
                counted[0] += n
            progress.advance(nbytes=n)

        staging = _Staging(store)
        reading = threading.Lock()

        def send(oid):
            if oid == man.segment:
                _put_blob(backend, oid, seg)
                on_bytes(len(seg))
            else:
                with reading:
                    # The form is judged and a copy read under one lock (the store's readers of
                    # packs, store/packed.py, are not shared between threads); uploads run in parallel.
                    whole = _large_whole(store, oid, sizes[oid])
                    data = None if whole else _held_bytes(store, oid, sizes[oid])
                if data is None:
                    # Stream from the store's file (the backend hashes what it sends and refuses
                    # a mismatch, so a corrupt local object can never be published under its id).
                    backend.put_object(oid, store.object_path(oid), on_bytes)
                else:
                    # Compressed (store/compress.py: a remote holds the object's own bytes),
                    # packed (store/packed.py: no file of its own), or small enough that `gc
                    # --prune` may pack it while this push runs: read verified through the
                    # store, whatever form it has, and uploaded from a file of our own.
                    path = staging.write(oid, data)
                    try:
                        backend.put_object(oid, path, on_bytes)
                    finally:
                        staging.done(oid)
            faults.point("push.object")
            progress.advance(objects=1)
            return oid

        try:
            for batch in batches(todo, sizes):
                run_all(send, batch, jobs)
                backend.flush()  # the batch is durable and visible before anything names it
                faults.point("push.batch")
            if big:
                chunked.push_objects(store, backend, big, on_bytes, jobs)
                progress.advance(objects=len(big))
        finally:
            staging.close()
            progress.finish()
        sent_objects, sent_bytes = len(todo) + len(big), counted[0]
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
        backend.write_small(f"refs/{name}", canonical.dumps(dict(body, actor=default_actor(), time=now())))
        faults.point("push.ref")
    return PushResult(remote=backend.url, refs=dict(sel.refs), manifest=man.id, objects_total=len(sizes),
                      bytes_total=man.total_bytes, objects_sent=sent_objects, bytes_sent=sent_bytes,
                      up_to_date=up_to_date, signed_by=pub.name if pub else None, absent=man.absent)


def _large_whole(store, oid: str, size: int) -> bool:
    """The object is a whole file of its own too large ever to be packed (packed.MAX_STORED: a
    whole object's stored size is its size), so its file stays while a push reads it. A
    compressed or packed one of that size is not (its stored bytes may be small)."""
    return size > packed.MAX_STORED and not store.objects.compressed(oid) and not store.objects.packed_only(oid)


def _held_bytes(store, oid: str, size: int) -> bytes:
    """The verified bytes of an object this store holds (whole, compressed or packed), read no
    further than the `size` its manifest lists."""
    try:
        data = store.objects.get_bytes(oid, max_size=size)
    except BadInput:   # larger than it was a moment ago: only damage can make it so
        raise CorruptObject(oid, f"object {oid} in this store is no longer the {size} bytes its manifest lists",
                            "`ledger verify --read-data`; `ledger repair --from REMOTE|BUNDLE` replaces it") from None
    if len(data) != size:
        raise CorruptObject(oid, f"object {oid} in this store is no longer the {size} bytes its manifest lists")
    return data


class _Staging:
    """Verified copies of objects, each in a file of its own in a work folder (flocked: a gc
    meanwhile leaves it alone) for the backend to upload from (it hashes what it sends), each
    removed once staged. The folder is made at the first object and removed by close()."""

    def __init__(self, store):
        self.store = store
        self.folder = None
        self.lock = threading.Lock()

    def write(self, oid: str, data: bytes):
        with self.lock:
            if self.folder is None:
                self.folder = self.store.work_folder("push")
        p = self.folder / oid[len(PREFIX):]
        try:
            with open(p, "xb") as f:
                f.write(data)
        except OSError as e:
            raise fsio.io_error(e, f"staging object {oid} for upload") from e
        return p

    def done(self, oid: str) -> None:
        (self.folder / oid[len(PREFIX):]).unlink(missing_ok=True)

    def close(self) -> None:
        if self.folder is not None:
            self.store.discard_work_folder(self.folder)
            self.folder = None


def _put_blob(backend, oid: str, data: bytes) -> None:
    if hash_bytes(data) != oid:
        raise CorruptObject(oid)
    if not backend.exists(rm.object_key(oid)):
        backend.write_small(rm.object_key(oid), data)
