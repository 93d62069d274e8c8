"""Where shared objects come from: one Source protocol for remotes and bundles.

A source offers signed tables of contents (`Offer`: a manifest, its signatures and the refs
it names) and reads single objects by id. Everything inbound — pull, fetch, bundle import,
repair — is written against this protocol, so the verification in admit.py is the same
whatever the bytes came from.

Reads are bounded (MUST, docs/sharing.md): an object whose size a manifest or the journal
announces is refused if the source holds a different size, and never more than that many
bytes are read; an object of unknown size (a loose walk) is refused if it would not fit in
the receiving store's free space. Files in a directory remote are opened without following
links and must be regular files (files.py), so a FIFO or a link in a remote is a typed error,
never a hang or a read elsewhere.
"""

from __future__ import annotations

import shutil
from dataclasses import dataclass
from typing import Callable, Protocol

from ledger.errors import BadInput, CorruptObject, StoreCorrupt, UnknownRef
from ledger.sharing import chunked
from ledger.sharing import manifest as mf
from ledger.sharing import remote as rm
from ledger.store import canonical
from ledger.store.ids import hash_bytes, is_id

REF_LIMIT = 1 << 20
MANIFEST_LIMIT = 512 << 20
FREE_RESERVE = 64 << 20   # a loose object must leave this much free space in the store


@dataclass(frozen=True)
class Offer:
    """One signed table of contents a source offers: import it with admit.admit."""

    manifest: mf.Manifest
    signatures: tuple         # signature dicts over the manifest (signing.py)
    refs: tuple               # the manifest's ref names this offer is for
    namespace: str | None     # the namespace the source suggests (a bundle's origin), if any
    what: str                 # how messages name it ("bundle x.bundle", "manifest b3:… on URL")


class NotHeld(Exception):
    """Control flow only: the source does not hold the object asked for."""


class Source(Protocol):
    """A remote or a bundle, read-only."""

    label: str          # how records and messages name it
    resumable: bool     # admit keeps each verified batch (a remote) or nothing until all passed (a bundle)
    loose: bool         # objects can be read by id alone, so a closure can be walked (a remote)

    def offers(self, names=None) -> list[Offer]: ...      # names: refs as the source names them
    def offers_for(self, ids) -> list[Offer]: ...         # offers that carry any of `ids`

    def read(self, oid: str, size: int | None, dest, on_bytes: Callable[[int], None], *, limit: int = 0,
             local=None) -> str:
        """Stream object `oid` into `dest` and return the hash of exactly what was written.
        `local` (chunked.LocalChunks) are chunks the receiver holds: a chunked object on a
        remote downloads only the others (a bundle carries whole objects and ignores it).
        `size` is the announced size: a different size at the source is refused before any
        byte moves. With `size` None (unknown) at most `limit` bytes may arrive (loose_limit).
        Raises NotHeld if the source does not hold `oid`."""
        ...


def loose_limit(store) -> int:
    """The most bytes an object of unknown size may have: what the store's disk has free."""
    return max(0, shutil.disk_usage(store.tmp).free - FREE_RESERVE)


# --- remotes --------------------------------------------------------------------------------
def remote_refs(backend) -> list[str]:
    """Every ref name the remote holds."""
    return [k[len("refs/"):] for k in backend.list("refs/")]


def read_ref(backend, name: str) -> dict:
    """A remote ref file, checked for shape (not yet for what its manifest says)."""
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


def read_manifest(backend, mid: str) -> mf.Manifest:
    """A manifest object from the remote, hash-checked and parsed defensively."""
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


def _ref_name(name: str) -> str:
    """A raw id or 8+ hex prefix asks for the ref that a push of that id wrote."""
    if is_id(name):
        return "id/" + name[3:]
    return name


def remote_ref_name(backend, name: str) -> str:
    """As locally: an exact ref, else `name/<name>` (what `add --name` made), else an id."""
    name = _ref_name(name)
    mf.check_ref_name(name)
    if not backend.exists(f"refs/{name}") and backend.exists(f"refs/name/{name}"):
        return f"name/{name}"
    return name


class RemoteSource:
    """A directory or S3 remote (remote.Backend) as a Source."""

    resumable = True
    loose = True

    def __init__(self, backend: rm.Backend, label: str | None = None):
        self.backend = backend
        self.label = label or backend.url

    def offers(self, names=None) -> list[Offer]:
        be = self.backend
        rm.check_marker(be, create=False)
        names = [remote_ref_name(be, n) for n in names] if names else remote_refs(be)
        if not names:
            raise UnknownRef(f"remote {be.url} has no refs", "push something to it first")
        by_manifest: dict[str, list] = {}
        bodies = {}
        for n in names:
            mf.check_ref_name(n)
            bodies[n] = read_ref(be, n)
            by_manifest.setdefault(bodies[n]["manifest"], []).append(n)
        out = []
        for mid, refnames in sorted(by_manifest.items()):
            man = read_manifest(be, mid)
            for n in refnames:
                if man.refs.get(n) != bodies[n]["target"]:
                    raise StoreCorrupt(f"remote ref {n!r} names {bodies[n]['target']} but its manifest says "
                                       f"{man.refs.get(n)}", "the remote was altered; ask its owner to push again")
            out.append(Offer(manifest=man, signatures=tuple(bodies[refnames[0]]["signatures"]), refs=tuple(refnames),
                             namespace=None, what=f"manifest {mid[:15]} on {be.url}"))
        return out

    def offers_for(self, ids) -> list[Offer]:
        """The signed manifests a push of exactly these ids (`refs/id/<hex>`) or a ref to them left."""
        rm.check_marker(self.backend, create=False)
        wanted = set(ids)
        refs = remote_refs(self.backend)
        hits = [r for r in refs if r.startswith("id/") and ("b3:" + r[3:]) in wanted]
        if len(hits) < len(wanted):
            for r in refs:
                if r not in hits and read_ref(self.backend, r)["target"] in wanted:
                    hits.append(r)
        return self.offers(hits) if hits else []

    def read(self, oid, size, dest, on_bytes, *, limit=0, local=None):
        try:
            return self.backend.get_object(oid, dest, on_bytes, expect=size, limit=limit)
        except FileNotFoundError:
            pass
        # not held whole: perhaps as a chunk list (chunked.py), bounded by the announced size
        cap = chunked.list_limit(size) if size is not None else min(chunked.list_limit(limit), chunked.LIST_MAX)
        data = self.backend.read_small(chunked.list_key(oid), cap)
        if data is None:
            raise NotHeld(oid)
        return chunked.read_listed(self.backend, oid, data, size, limit, dest, on_bytes, local)
