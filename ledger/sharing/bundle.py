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

Version 2 (`bundle create --since BASE`, for a receiver that holds BASE) adds two header
fields, "base" (the ids the sender took the receiver to hold) and "pieces"
([[kind, id, offset, size]…], contiguous from 0; the data is the pieces back to back):
"object" is a whole object; "list" is a chunked object's chunk list (chunked.py's C8 format:
digest and length of every chunk); "chunk" is one chunk, named by the BLAKE3 of its bytes. An
object of the base's closure is not carried at all, and of a chunked object only the chunks
the base's chunked objects lack. The manifest is the same as without --since (same id, same
signatures), so the receiver checks each chunk against its name, the reassembled whole
against the object's id, and everything else exactly as for version 1, all-or-nothing.

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

import contextlib
import io
import os
import stat
import struct
from dataclasses import dataclass
from pathlib import Path

import blake3

from ledger.errors import BadInput, CorruptObject, StoreCorrupt, UnknownRef, UnsupportedFormat
from ledger.sharing import chunked, keys, signing
from ledger.sharing import manifest as mf
from ledger.sharing.admit import ImportResult, admit, check_namespace
from ledger.sharing.pool import JOBS, NullProgress, Progress
from ledger.sharing.sources import NotHeld, Offer
from ledger.store import canonical, chunks, fsio
from ledger.store.ids import PREFIX, hash_bytes, is_id
from ledger.store.journal import default_actor, now

MAGIC = b"ledger-bundle\n"
FORMAT = "ledger-bundle"
VERSION = 1             # what a bundle of whole objects is written as (every ledger reads it)
DELTA_VERSION = 2       # a bundle made --since a base: a pieces table (see above)
FIELDS = {"format", "version", "algorithm", "origin", "created", "actor", "manifest", "signatures"}
DELTA_FIELDS = FIELDS | {"base", "pieces"}
PIECE_KINDS = ("object", "list", "chunk")
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
    version: int = VERSION
    base: tuple = ()        # version 2: the ids the receiver is taken to hold
    pieces: tuple = ()      # version 2: ((kind, id, offset, size), ...) in data order

    def to_json(self) -> dict:
        """The header as JSON (`bundle ls --json`)."""
        return {"origin": self.origin, "created": self.created, "actor": self.actor, "manifest": self.manifest.id,
                "refs": self.manifest.refs, "roots": list(self.manifest.roots), "objects": len(self.manifest.objects),
                "bytes": self.manifest.total_bytes, "segment": self.manifest.segment,
                "absent": list(self.manifest.absent),
                "file_size": self.file_size, "version": self.version, "base": list(self.base),
                "data_bytes": self.file_size - self.data_start,
                "pieces": {k: sum(1 for p in self.pieces if p[0] == k) for k in PIECE_KINDS} if self.pieces else None}

    def ranges(self, kind: str = "object") -> dict:
        """{id: (offset, size)} of the whole objects (or chunk lists, or chunks) the data holds."""
        if self.version == VERSION:
            return {oid: (off, size) for oid, off, size in self.manifest.objects} if kind == "object" else {}
        return {pid: (off, size) for k, pid, off, size in self.pieces if k == kind}


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
    base: tuple = ()        # --since: the ids the receiver is taken to hold (their closure is not carried)
    data_bytes: int = 0     # bytes of object data the file carries (= bytes without --since)
    chunks_carried: int = 0  # --since: chunks of chunked objects carried (the rest the base holds)

    def to_json(self) -> dict:
        """The result as JSON (`--json`)."""
        return dict(self.__dict__)


def default_origin() -> str:
    """The sender's user name, cleaned into a namespace (the receiver's default)."""
    user = default_actor().split("@")[0]
    clean = "".join(c if (c.isalnum() or c in "._-") else "-" for c in user).strip("-._")[:64]
    return clean or "bundle"


def create(store, names, out: Path, key_name: str | None = None, origin: str | None = None,
           progress: Progress | None = None, since=()) -> CreateResult:
    """Write the closure of `names` and its journal segment to the bundle file `out` (atomically).
    With `since` (refs or ids the receiver holds): a version-2 bundle that leaves out the
    closure of `since` and, of each chunked object, the chunks that closure's chunked objects hold."""
    progress = progress or NullProgress()
    origin = check_namespace(origin or default_origin())
    sel, man, seg, sigs, pub = mf.prepare(store, names, key_name)
    header = {"format": FORMAT, "version": VERSION, "algorithm": mf.ALGORITHM, "origin": origin, "created": now(),
              "actor": default_actor(), "manifest": man.to_json(), "signatures": sigs}
    plan = None
    if since:
        plan = _plan_pieces(store, man, since)
        header.update(version=DELTA_VERSION, base=list(plan.base),
                      pieces=[[k, pid, off, size] for k, pid, off, size, _ in plan.pieces])
    hbytes = canonical.dumps(header)
    if len(hbytes) > MAX_HEADER:
        raise BadInput(f"the bundle's table of contents would be {len(hbytes)} bytes (limit {MAX_HEADER})",
                       "bundle fewer refs at a time")
    out = Path(out)
    if not out.name or out.is_dir():   # "" is ".": a folder, not a bundle file
        raise BadInput(f"{out} is a folder", "give the bundle's file name, e.g. -o share.bundle")
    fsio.refuse_special_output(out)
    tmp = out.with_name(f".{out.name}.ledger-tmp-{os.getpid()}")
    data_bytes = plan.data_bytes if plan else man.total_bytes
    progress.start(f"bundle → {out.name}", len(plan.pieces) if plan else len(man.objects), data_bytes)
    try:
        with open(tmp, "wb") as f:
            f.write(MAGIC + struct.pack(">Q", len(hbytes)) + hbytes)
            if plan is None:
                for oid, _, size in man.objects:
                    _write_object(store, man, seg, oid, size, f, progress)
            else:
                for kind, pid, _, size, what in plan.pieces:
                    if kind == "object":
                        _write_object(store, man, seg, pid, size, f, progress)
                        continue
                    # a list is built from pages verified as read; a chunk is re-read verified
                    body = what if kind == "list" else store.objects.packs.read(what[1], what[0], what[2])
                    f.write(body)
                    progress.advance(1, len(body))
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, out)
    except OSError as e:
        raise BadInput(f"cannot write {out}: {e.strerror or e}") from None
    finally:
        progress.finish()
        with contextlib.suppress(OSError):   # under a file: the unlink fails as the write did (reported above)
            tmp.unlink(missing_ok=True)
    return CreateResult(path=str(out), manifest=man.id, refs=dict(sel.refs), objects=len(man.objects),
                        bytes=man.total_bytes, file_size=out.stat().st_size, segment_records=len(sel.records),
                        signed_by=pub.name if pub else None, absent=man.absent,
                        base=plan.base if plan else (), data_bytes=data_bytes,
                        chunks_carried=sum(1 for p in plan.pieces if p[0] == "chunk") if plan else 0)


def _write_object(store, man, seg: bytes, oid: str, size: int, f, progress) -> None:
    if oid == man.segment:
        f.write(seg)
        progress.advance(1, len(seg))
        return
    _copy_verified(store, oid, size, f, progress)
    progress.advance(objects=1)


@dataclass(frozen=True)
class _Plan:
    """What a version-2 bundle carries: (kind, id, offset, size, what) pieces, `what` being a
    chunk list's bytes or a chunk's (digest, location, object id)."""

    base: tuple
    pieces: tuple
    data_bytes: int


def _plan_pieces(store, man: mf.Manifest, since) -> _Plan:
    """Leave out what a receiver holding the closure of `since` has: those objects, and the
    chunks of the chunked objects among them. A chunked object most of whose bytes would be
    new travels whole (its list would cost more than it saves; the receiver still writes
    only the chunks it lacks)."""
    roots = sorted({store.resolve(n) for n in since})
    base = store.closure(roots)
    held = {oid for oid in base if store.objects.has(oid)}
    base_chunks: set[bytes] = set()
    for oid in sorted(held):
        if store.objects.chunked(oid):
            base_chunks.update(d for d, _ in store.objects.chunk_entries(oid))
    pieces, carried, off = [], set(), 0

    def add(kind, pid, size, what=None):
        nonlocal off
        pieces.append((kind, pid, off, size, what))
        off += size

    for oid, _, size in man.objects:
        if oid in held and oid != man.segment:
            continue          # the receiver holds it: not carried
        if oid == man.segment or not store.objects.chunked(oid):
            add("object", oid, size)
            continue
        entries = store.objects.chunk_entries(oid)        # pages verified as read
        new = [(d, loc) for d, loc in dict(entries).items() if d not in base_chunks and d not in carried]
        if 2 * sum(loc[2] for _, loc in new) > size:
            add("object", oid, size)
            continue
        body = chunked.encode(size, ((d, loc[2]) for d, loc in entries))
        add("list", oid, len(body), body)
        for d, loc in new:
            carried.add(d)
            add("chunk", chunked.chunk_id(d), loc[2], (d, loc, oid))
    return _Plan(base=tuple(roots), pieces=tuple(pieces), data_bytes=off)


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
    version = h.get("version")
    if version not in (VERSION, DELTA_VERSION) or type(version) is not int:
        raise UnsupportedFormat(f"bundle {path} is format version {version!r}; this ledger reads "
                                f"{VERSION} and {DELTA_VERSION}", "upgrade ledger to read it")
    if set(h) != (FIELDS if version == VERSION else DELTA_FIELDS) \
            or not all(isinstance(h[k], str) for k in ("origin", "created", "actor")) \
            or not isinstance(h["signatures"], list):
        raise StoreCorrupt(f"bundle {path} has a malformed table of contents")
    man = mf.Manifest.from_json(h["manifest"])
    base, pieces = ((), ()) if version == VERSION else _check_pieces(path, man, h["base"], h["pieces"])
    data_start = start + hlen
    end = data_start + (man.total_bytes if version == VERSION else sum(p[3] for p in pieces))
    if end > size:
        raise StoreCorrupt(f"bundle {path} is truncated: its objects need {end} bytes, the file has {size}",
                           "copy the bundle again; nothing was imported")
    if end < size:
        raise StoreCorrupt(f"bundle {path} has {size - end} unexpected bytes after its last object",
                           "the bundle was altered; nothing was imported")
    return Header(origin=h["origin"], created=h["created"], actor=h["actor"], manifest=man,
                  signatures=h["signatures"], data_start=data_start, file_size=size, version=version,
                  base=base, pieces=pieces)


def _check_pieces(path: Path, man: mf.Manifest, base, pieces) -> tuple[tuple, tuple]:
    """A version-2 header's base and pieces, checked before any data is read: ids well formed,
    offsets contiguous from 0, every whole object and chunk list one the manifest lists (a
    whole object with its announced size; a list within the bound its object's size allows),
    every chunk of a length a chunk may have, nothing twice, and the segment carried whole."""
    def bad(why: str) -> StoreCorrupt:
        return StoreCorrupt(f"bundle {path} has a malformed table of contents: {why}",
                            "the bundle is damaged or hostile; nothing was read from it")

    if not isinstance(base, list) or len(base) > mf.MAX_OBJECTS or not all(is_id(b) for b in base):
        raise bad("its base is not a list of ids")
    if not isinstance(pieces, list) or len(pieces) > 2 * mf.MAX_OBJECTS:
        raise bad("its pieces are not a list")
    sizes = man.sizes()
    out, off, seen, whole = [], 0, set(), set()
    for p in pieces:
        if not (isinstance(p, list) and len(p) == 4 and p[0] in PIECE_KINDS and is_id(p[1])
                and type(p[2]) is int and type(p[3]) is int):
            raise bad("a piece is malformed")
        kind, pid, at, n = p
        if at != off or n < 0:
            raise bad(f"piece {pid} claims offset {at}, expected {off}")
        if (kind == "chunk") != (pid not in sizes) or pid in seen:
            raise bad(f"piece {pid} is not one the manifest lists, or is listed twice")
        if kind == "object" and n != sizes[pid]:
            raise bad(f"object {pid} is carried with {n} bytes; the manifest says {sizes[pid]}")
        if kind == "list" and n > chunked.list_limit(sizes[pid]):
            raise bad(f"the chunk list of {pid} has {n} bytes, more than its size allows")
        if kind == "chunk" and not 0 < n <= chunks.MAX_SIZE:
            raise bad(f"chunk {pid} claims {n} bytes")
        seen.add(pid)
        if kind == "object":
            whole.add(pid)
        out.append((kind, pid, at, n))
        off += n
    if man.segment and man.segment not in whole:
        raise bad("its journal segment is not carried")
    return tuple(base), tuple(out)


class BundleSource:
    """A bundle file as a sources.Source: one signed manifest; objects read by byte range (and,
    from a version-2 bundle, a chunked object reassembled from its list, the chunks the
    receiver holds and the chunks the bundle carries, each checked against its name)."""

    resumable = False   # all-or-nothing: nothing is installed until every check passed
    loose = False       # it holds exactly its manifest's objects; there is nothing to walk

    def __init__(self, path: Path):
        self.path = Path(path)
        self.header = read_header(self.path)
        self.label = f"bundle:{self.path.name}"
        self.url = f"bundle {self.path.name}"          # how chunked.read_listed names its source
        self._ranges = self.header.ranges("object")
        self._lists = self.header.ranges("list")
        self._chunks = self.header.ranges("chunk")

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

    def _needs_base(self, what: str) -> BadInput:
        base = ", ".join(b[:15] for b in self.header.base[:3]) + (" …" if len(self.header.base) > 3 else "")
        return BadInput(f"bundle {self.path.name} was made for a store holding {base} (--since): this store lacks "
                        f"{what}; nothing was imported",
                        "import the bundle that carries the base first, or ask for a bundle made without --since")

    def _copy_range(self, oid: str, off: int, n: int, dest, on_bytes) -> str:
        h = blake3.blake3(max_threads=blake3.blake3.AUTO)
        with open_bundle(self.path) as f:
            f.seek(self.header.data_start + off)
            left = n
            while left:
                chunk = f.read(min(CHUNK, left))
                if not chunk:
                    raise StoreCorrupt(f"bundle {self.path} ended inside object {oid}")
                h.update(chunk)
                dest.write(chunk)
                left -= len(chunk)
                on_bytes(len(chunk))
        return PREFIX + h.hexdigest()

    def read(self, oid, size, dest, on_bytes, *, limit=0, local=None) -> str:
        """Stream one object's byte range (exactly its manifest size), hashing it; or, for an
        object a version-2 bundle carries as a chunk list, the chunks reassembled in order."""
        if oid in self._lists:
            off, n = self._lists[oid]
            got = io.BytesIO()
            self._copy_range(oid, off, n, got, lambda _: None)      # bounded by _check_pieces
            return chunked.read_listed(self, oid, got.getvalue(), size, limit, dest, on_bytes, local)
        if oid not in self._ranges:
            if self.header.version == DELTA_VERSION and oid in self.header.manifest.sizes():
                raise self._needs_base(f"object {oid}")
            raise NotHeld(oid)
        off, have = self._ranges[oid]
        if size is not None and size != have:
            raise CorruptObject(oid, f"bundle {self.path.name} holds {oid} with {have} bytes; {size} were expected",
                                "the bundle is not a copy of what this store recorded")
        return self._copy_range(oid, off, have, dest, on_bytes)

    def get_object(self, cid, dest, on_bytes, *, expect=None, limit=0) -> str:
        """A chunk the bundle carries (chunked.read_listed's backend call): its bytes and their
        hash. A chunk neither carried nor held here means this store lacks the bundle's base."""
        if cid not in self._chunks:
            raise self._needs_base(f"chunk {cid}")
        off, n = self._chunks[cid]
        if expect is not None and n != expect:
            raise CorruptObject(cid, f"bundle {self.path.name} carries chunk {cid} with {n} bytes; its chunk list "
                                     f"says {expect}", "the bundle is damaged or hostile; nothing was imported")
        return self._copy_range(cid, off, n, dest, on_bytes)


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
        off, size = hdr.ranges("object")[hdr.manifest.segment]
        if size > mf.MAX_SEGMENT:
            raise StoreCorrupt(f"bundle {path} claims a {size}-byte journal segment")
        with open_bundle(path) as f:
            f.seek(hdr.data_start + off)
            data = f.read(size)
        if hash_bytes(data) != hdr.manifest.segment:
            raise CorruptObject(hdr.manifest.segment, f"bundle {path}: the journal segment does not hash to its id")
        records = mf.verify_segment(trusted, data).records
    return Listing(header=hdr, signers=tuple(checks), records=records)
