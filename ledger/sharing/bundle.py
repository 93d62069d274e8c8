"""Bundles: a closure of objects plus the journal segment that made them, in one file.

Layout (all integers big-endian):

  MAGIC            b"ledger-bundle\\n" (14 bytes)
  header length    8 bytes, at most MAX_HEADER
  header           canonical JSON:
                   {"format": "ledger-bundle", "version": 1, "algorithm": "blake3",
                    "origin": sender's suggested namespace, "created", "actor",
                    "manifest": {... refs, roots, objects: [[id, offset, size]…], segment},
                    "signatures": [{"key": "ed25519:<hex>", "name", "sig"}…]}
  data             the objects back to back, in manifest order; offsets are relative to
                   the first data byte, and the file ends exactly after the last object.

The signatures sign the manifest (see signing.py), which names every object by hash with
its offset and size, so they bind every data byte. Reading is defensive: the header size is
bounded before it is read, it must be canonical JSON, offsets must be contiguous and the
file length must equal header + data exactly (a truncated or extended file is refused).
Nothing is ever unpickled or evaluated. The bundle file is the path the user named (a link
there is the user's own and is followed) but it must be a regular file: a FIFO or a device
is refused before anything is read, so nothing can hang.

`BundleSource` offers a bundle to admit.py like any remote (sources.Source): its one
manifest, and each object's byte range, read with exactly the size the manifest announces.
"""

from __future__ import annotations

import os
import stat
import struct
from dataclasses import dataclass
from pathlib import Path

import blake3

from ledger.errors import BadInput, CorruptObject, StoreCorrupt, UnknownRef, UnsupportedFormat
from ledger.sharing import keys, signing
from ledger.sharing import manifest as mf
from ledger.sharing.admit import ImportResult, admit, check_namespace
from ledger.sharing.pool import JOBS, NullProgress, Progress
from ledger.sharing.sources import NotHeld, Offer
from ledger.store import canonical, fsio
from ledger.store.ids import PREFIX, hash_bytes
from ledger.store.journal import default_actor, now

MAGIC = b"ledger-bundle\n"
FORMAT = "ledger-bundle"
VERSION = 1
MAX_HEADER = 64 << 20
CHUNK = 8 << 20


@dataclass(frozen=True)
class Header:
    """A bundle's checked table of contents and where its data starts."""

    origin: str
    created: str
    actor: str
    manifest: mf.Manifest
    signatures: list
    data_start: int
    file_size: int

    def to_json(self) -> dict:
        """The header as JSON (`bundle ls --json`)."""
        return {"origin": self.origin, "created": self.created, "actor": self.actor, "manifest": self.manifest.id,
                "refs": self.manifest.refs, "roots": list(self.manifest.roots), "objects": len(self.manifest.objects),
                "bytes": self.manifest.total_bytes, "segment": self.manifest.segment,
                "absent": list(self.manifest.absent),
                "file_size": self.file_size}


@dataclass(frozen=True)
class CreateResult:
    """What `bundle create` wrote."""

    path: str
    manifest: str
    refs: dict
    objects: int
    bytes: int
    file_size: int
    segment_records: int
    signed_by: str | None
    absent: tuple = ()      # ids the closure names that this store does not hold

    def to_json(self) -> dict:
        """The result as JSON (`--json`)."""
        return dict(self.__dict__)


def default_origin() -> str:
    """The sender's user name, cleaned into a namespace (the receiver's default)."""
    user = default_actor().split("@")[0]
    clean = "".join(c if (c.isalnum() or c in "._-") else "-" for c in user).strip("-._")[:64]
    return clean or "bundle"


def create(store, names, out: Path, key_name: str | None = None, origin: str | None = None,
           progress: Progress | None = None) -> CreateResult:
    """Write the closure of `names` and its journal segment to the bundle file `out` (atomically)."""
    progress = progress or NullProgress()
    origin = check_namespace(origin or default_origin())
    sel, man, seg, sigs, pub = mf.prepare(store, names, key_name)
    header = {"format": FORMAT, "version": VERSION, "algorithm": mf.ALGORITHM, "origin": origin, "created": now(),
              "actor": default_actor(), "manifest": man.to_json(), "signatures": sigs}
    hbytes = canonical.dumps(header)
    if len(hbytes) > MAX_HEADER:
        raise BadInput(f"the bundle's table of contents would be {len(hbytes)} bytes (limit {MAX_HEADER})",
                       "bundle fewer refs at a time")
    out = Path(out)
    tmp = out.with_name(f".{out.name}.ledger-tmp-{os.getpid()}")
    progress.start(f"bundle → {out.name}", len(man.objects), man.total_bytes)
    try:
        with open(tmp, "wb") as f:
            f.write(MAGIC + struct.pack(">Q", len(hbytes)) + hbytes)
            for oid, _, size in man.objects:
                if oid == man.segment:
                    f.write(seg)
                    progress.advance(1, len(seg))
                    continue
                _copy_verified(store, oid, size, f, progress)
                progress.advance(objects=1)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, out)
    except OSError as e:
        raise BadInput(f"cannot write {out}: {e.strerror or e}") from None
    finally:
        progress.finish()
        tmp.unlink(missing_ok=True)
    return CreateResult(path=str(out), manifest=man.id, refs=dict(sel.refs), objects=len(man.objects),
                        bytes=man.total_bytes, file_size=out.stat().st_size, segment_records=len(sel.records),
                        signed_by=pub.name if pub else None, absent=man.absent)


def _copy_verified(store, oid: str, size: int, f, progress) -> None:
    """Copy an object into the bundle, hashing as we go: nothing corrupt is ever shared."""
    h = blake3.blake3(max_threads=blake3.blake3.AUTO)
    n = 0
    # whole or chunked alike (ledger/store/chunks.py); every chunk is verified as it is read,
    # and the stream itself raises CorruptObject at its end if the whole does not hash to oid
    for view in store.objects.stream(oid, CHUNK):
        h.update(view)
        f.write(view)
        n += len(view)
        progress.advance(nbytes=len(view))
    if PREFIX + h.hexdigest() != oid or n != size:
        raise CorruptObject(oid)


def open_bundle(path: Path):
    """The bundle file for reading: it must be a regular file (O_NONBLOCK: a FIFO cannot hang)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as e:
        raise BadInput(f"cannot read bundle {path}: {e.strerror or e}") from None
    mode = os.fstat(fd).st_mode
    if not stat.S_ISREG(mode):
        os.close(fd)
        raise BadInput(f"{path} is a {fsio.file_kind(mode)}, not a bundle file",
                       "bundles are regular files written by `ledger bundle create`")
    return open(fd, "rb", buffering=0)


def read_header(path: Path) -> Header:
    """Read and check a bundle's header: bounded, canonical, exact fields, exact file length."""
    path = Path(path)
    with open_bundle(path) as f:
        size = os.fstat(f.fileno()).st_size
        lead = f.read(len(MAGIC) + 8)
        if len(lead) < len(MAGIC) + 8 or not lead.startswith(MAGIC):
            if lead.startswith(MAGIC[: len(lead)]) and len(lead) < len(MAGIC) + 8:
                raise StoreCorrupt(f"bundle {path} is truncated (only {size} bytes)", "copy the bundle again")
            raise BadInput(f"{path} is not a ledger bundle", "bundles are written by `ledger bundle create`")
        (hlen,) = struct.unpack(">Q", lead[len(MAGIC):])
        start = len(MAGIC) + 8
        if hlen > MAX_HEADER:
            raise StoreCorrupt(f"bundle {path} claims a {hlen}-byte table of contents (limit {MAX_HEADER})",
                               "the bundle is damaged or hostile; nothing was read from it")
        if start + hlen > size:
            raise StoreCorrupt(f"bundle {path} is truncated: its table of contents needs {start + hlen} bytes, "
                               f"the file has {size}", "copy the bundle again")
        hdata = f.read(hlen)
    try:
        h = canonical.loads(hdata, strict=True)
    except BadInput as e:
        raise StoreCorrupt(f"bundle {path} has a damaged table of contents: {e.message}",
                           "copy the bundle again") from None
    if not isinstance(h, dict) or h.get("format") != FORMAT:
        raise StoreCorrupt(f"bundle {path} has a damaged table of contents")
    if h.get("algorithm") != mf.ALGORITHM:
        raise UnsupportedFormat(f"bundle {path} uses hash algorithm {h.get('algorithm')!r}; this ledger knows only "
                                f"{mf.ALGORITHM!r}", "ask the sender for a blake3 bundle")
    if h.get("version") != VERSION:
        raise UnsupportedFormat(f"bundle {path} is format version {h.get('version')!r}; this ledger reads {VERSION}",
                                "upgrade ledger to read it")
    if set(h) != {"format", "version", "algorithm", "origin", "created", "actor", "manifest", "signatures"} \
            or not all(isinstance(h[k], str) for k in ("origin", "created", "actor")) \
            or not isinstance(h["signatures"], list):
        raise StoreCorrupt(f"bundle {path} has a malformed table of contents")
    man = mf.Manifest.from_json(h["manifest"])
    data_start = start + hlen
    end = data_start + man.total_bytes
    if end > size:
        raise StoreCorrupt(f"bundle {path} is truncated: its objects need {end} bytes, the file has {size}",
                           "copy the bundle again; nothing was imported")
    if end < size:
        raise StoreCorrupt(f"bundle {path} has {size - end} unexpected bytes after its last object",
                           "the bundle was altered; nothing was imported")
    return Header(origin=h["origin"], created=h["created"], actor=h["actor"], manifest=man,
                  signatures=h["signatures"], data_start=data_start, file_size=size)


class BundleSource:
    """A bundle file as a sources.Source: one signed manifest; objects read by byte range."""

    resumable = False   # all-or-nothing: nothing is installed until every check passed
    loose = False       # it holds exactly its manifest's objects; there is nothing to walk

    def __init__(self, path: Path):
        self.path = Path(path)
        self.header = read_header(self.path)
        self.label = f"bundle:{self.path.name}"
        self._ranges = {oid: (off, size) for oid, off, size in self.header.manifest.objects}

    def offers(self, names=None) -> list[Offer]:
        """The bundle's manifest, for all its refs or the named ones."""
        man = self.header.manifest
        for n in names or ():
            if n not in man.refs:
                raise UnknownRef(f"bundle {self.path.name} has no ref {n!r}", "see `ledger bundle ls BUNDLE`")
        return [Offer(manifest=man, signatures=tuple(self.header.signatures), refs=tuple(sorted(names or man.refs)),
                      namespace=self.header.origin, what=f"bundle {self.path.name}")]

    def offers_for(self, ids) -> list[Offer]:
        """A bundle is imported whole: its one manifest."""
        return self.offers()

    def read(self, oid, size, dest, on_bytes, *, limit=0, local=None) -> str:
        """Stream one object's byte range (exactly its manifest size), hashing it."""
        if oid not in self._ranges:
            raise NotHeld(oid)
        off, have = self._ranges[oid]
        if size is not None and size != have:
            raise CorruptObject(oid, f"bundle {self.path.name} holds {oid} with {have} bytes; {size} were expected",
                                "the bundle is not a copy of what this store recorded")
        h = blake3.blake3(max_threads=blake3.blake3.AUTO)
        with open_bundle(self.path) as f:
            f.seek(self.header.data_start + off)
            left = have
            while left:
                chunk = f.read(min(CHUNK, left))
                if not chunk:
                    raise StoreCorrupt(f"bundle {self.path} ended inside object {oid}")
                h.update(chunk)
                dest.write(chunk)
                left -= len(chunk)
                on_bytes(len(chunk))
        return PREFIX + h.hexdigest()


def import_bundle(store, path: Path, namespace: str | None = None, progress: Progress | None = None,
                  jobs: int = JOBS) -> ImportResult:
    """Verify everything, then import into `namespace/…` (default: the bundle's origin) in one
    transaction. A bad bundle raises and changes nothing."""
    src = BundleSource(path)
    offer = src.offers()[0]
    return admit(store, src, offer, namespace=offer.namespace if namespace is None else namespace,
                 progress=progress, all_or_nothing=True, jobs=jobs)


@dataclass(frozen=True)
class Listing:
    """What `bundle ls` shows: the header, its signers and the journal segment."""

    header: Header
    signers: tuple          # signing.Check
    records: tuple          # the segment's records (checked), or () if it has none

    def to_json(self) -> dict:
        """The listing as JSON (`bundle ls --json`)."""
        return {**self.header.to_json(), "signers": [c.to_json() for c in self.signers],
                "segment_records": [{"seq": r["seq"], "id": r["id"], "kind": r["kind"], "time": r["time"],
                                     "actor": r["actor"]} for r in self.records]}


def ls(store, path: Path) -> Listing:
    """The table of contents, its signatures (checked against this store's trust list) and the
    journal segment — without importing anything. Object data other than the segment is not read."""
    path = Path(path)
    hdr = read_header(path)
    trusted = keys.trusted_keys(store) if store is not None else {}
    checks = signing.verify(trusted, "manifest", hdr.manifest.to_json(), hdr.signatures)
    records: tuple = ()
    if hdr.manifest.segment:
        off, size = next((o, s) for i, o, s in hdr.manifest.objects if i == hdr.manifest.segment)
        if size > mf.MAX_SEGMENT:
            raise StoreCorrupt(f"bundle {path} claims a {size}-byte journal segment")
        with open_bundle(path) as f:
            f.seek(hdr.data_start + off)
            data = f.read(size)
        if hash_bytes(data) != hdr.manifest.segment:
            raise CorruptObject(hdr.manifest.segment, f"bundle {path}: the journal segment does not hash to its id")
        records = mf.verify_segment(trusted, data).records
    return Listing(header=hdr, signers=tuple(checks), records=records)
