"""Chunked objects: a large object kept as content-defined chunks that its versions share.

An object of at least THRESHOLD bytes is cut with FastCDC (pyfastcdc: gear hash, normalised
chunking, ~56 KiB average; a cut point depends only on the bytes since the previous one, so an
edit moves at most the boundaries around it). Each chunk is named by the BLAKE3 of its bytes.
New chunks are appended to one *pack* per write (`packs/ab/<30 hex>`, a random name): one file,
one fsync — a file per chunk would cost ~0.2 ms to create and far more to make durable on
ext4 (measured: `sync` after 4,000 small files 2.5 s, after one 128 MiB file 0.07 s).

The object itself is an index, `objects/ab/cd….c`, named like every object by the BLAKE3 of
its *whole* content. The index lists pages, and each page (itself a chunk, in a pack) lists
the object's chunks with where they are:

    pack   = chunk bytes back to back + TRAILER entries + TAIL (count, magic)
    index  = HEAD (magic, size, npages, 0) + npages × PAGE_REF (digest, bytes covered, entries, pack, offset)
    page   = entries × ENTRY (chunk digest, length, pack, offset)

A page ends after a chunk whose digest says so (content-defined too, ~1024 entries), so
inserting or removing a chunk rewrites one page, not every page after it: a 4 KiB edit of a
2 GiB file stores one or two chunks, one or two pages (~60 KiB each) and a ~2 KiB index.

The pack trailer lists (digest, offset, length) of what the pack holds (44 bytes per 56 KiB
stored); a writer learns which chunks exist from the persistent chunk index cache/chunks.idx
(ChunkIndex below: sorted, mapped, each hit checked against its pack's trailer) plus the
trailers of the packs it does not cover yet, never from every trailer in memory. Crash rules are in
docs/store-format.md (C1–C6): the pack is fsynced and renamed into packs/ before the index is
fsynced and renamed into objects/ — the object's commit point. A crash before it leaves a
pack no index names (gc removes it), never half an object. Every chunk is re-hashed when it
is read; one that does not hash to its name is CorruptObject naming the object and the pack.
"""

from __future__ import annotations

import json
import mmap
import os
import stat
import struct
from pathlib import Path

import blake3

from ledger.errors import CorruptObject, StoreCorrupt
from ledger.store import faults, fsio

THRESHOLD = 16 << 20          # objects this large are chunked (below it one file is cheaper than an index)
MIN_SIZE = 32 << 10           # FastCDC bounds: chunks average ~56 KiB (measured on random bytes); a
AVG_SIZE = 40 << 10           # 32 KiB minimum skips more bytes than 16 KiB did (cut ~1.6 GB/s vs ~0.6 here)
MAX_SIZE = 256 << 10
PAGE_MASK = 0x3FF             # a page ends after a chunk whose digest ends in 10 zero bits: ~1024 entries
PAGE_MAX = 4096               # ... and after 4096 entries at most

MAGIC = b"ledger-chunked\x00\x01"
PACK_MAGIC = b"ledger-pack\x00\x00\x00\x00\x01"
HEAD = struct.Struct(">16sQII")          # magic, size, npages, reserved (0)
PAGE_REF = struct.Struct(">32sQI16sQ")   # page digest, data bytes the page covers, entries, pack, offset
ENTRY = struct.Struct(">32sI16sQ")       # chunk digest, length, pack, offset
TRAILER = struct.Struct(">32sQI")        # a pack's chunk: digest, offset, length
TAIL = struct.Struct(">Q16s")            # a pack's chunk count, PACK_MAGIC
SUFFIX = ".c"

# the persistent chunk index, cache/chunks.idx (a cache: rule 8; the format is in docs/store-format.md)
CACHE_NAME = "chunks.idx"
CACHE_MAGIC = b"ledger-chunkidx\x01"
CACHE_HEAD = struct.Struct(">16s48sIIQ")      # magic, store id (ASCII, NUL-padded), packs, reserved (0), entries
CACHE_ENTRY = struct.Struct(">32s16sQII")     # chunk digest, pack, offset, length, its index in the pack's trailer
FANOUT = struct.Struct(">65537I")             # start of each first-two-bytes bucket of entries (and the end)
# the chunk list (docs/store-format.md C8, C12): an object's chunks by digest and length only,
# no pack, offset or page. A remote holds it as `chunked/ab/<62 hex>` (ledger/sharing/chunked.py);
# its BLAKE3, recorded by the record that wrote the object's index (payload.chunk_lists), is what
# lets `verify --read-data` hash each byte once (C12)
LIST_MAGIC = b"ledger-chunks\x00\x00\x01"
LIST_HEAD = struct.Struct(">16sQII")   # magic, object size, chunk count, reserved (0)
LIST_ENTRY = struct.Struct(">32sI")    # chunk digest, length
SPILL = 1 << 18          # entries sorted in memory at once while the cache is built (~25 MiB)
OVERLAY_MIN = 1 << 14    # entries of packs the cache does not cover that are held in memory before it is rewritten


def cut(view) -> list[tuple[int, int]]:
    """(offset, length) of each chunk of `view` (a bytes-like object), in order."""
    from pyfastcdc.cy import FastCDC  # only large objects need it; the compiled one (never a slow fallback)

    if not len(view):
        return []
    return [(c.offset, c.length) for c in FastCDC(AVG_SIZE, min_size=MIN_SIZE, max_size=MAX_SIZE).cut_buf(view)]


def chunk_list(size: int, entries) -> bytes:
    """The chunk list of an object of `size` bytes: entries are (digest, length), in order."""
    body = b"".join([d + n.to_bytes(4, "big") for d, n in entries])   # LIST_ENTRY each, ~3x faster
    return LIST_HEAD.pack(LIST_MAGIC, size, len(body) // LIST_ENTRY.size, 0) + body


def list_digest(entries) -> str:
    """The hex BLAKE3 of the chunk list of an object whose chunks are `entries`, (digest,
    location) as ObjectStore.chunk_entries gives them: what payload.chunk_lists records (C12)."""
    body = b"".join([d + loc[2].to_bytes(4, "big") for d, loc in entries])
    size = sum([loc[2] for _, loc in entries])
    h = blake3.blake3(LIST_HEAD.pack(LIST_MAGIC, size, len(body) // LIST_ENTRY.size, 0))
    h.update(body)
    return h.hexdigest()


def page_ends_after(digest: bytes) -> bool:
    """Whether a page ends after this chunk (content-defined, so pages shift with the data)."""
    return (int.from_bytes(digest[-2:], "big") & PAGE_MASK) == 0


Location = tuple  # (pack name: 16 bytes, offset, length)


def _tail(fd: int, st, p) -> tuple[int, int]:
    """(byte where a pack's trailer starts, chunks it lists), from its fixed-size tail;
    CorruptObject if the tail is missing or names more entries than the pack can hold."""
    if st.st_size < TAIL.size:
        raise CorruptObject(None, f"pack {p} is truncated")
    count, magic = TAIL.unpack(os.pread(fd, TAIL.size, st.st_size - TAIL.size))
    start = st.st_size - TAIL.size - count * TRAILER.size
    if magic != PACK_MAGIC or start < 0:
        raise CorruptObject(None, f"pack {p} has a damaged trailer")
    return start, count


class PackStore:
    """The packs/ directory: write-once pack files of chunks, and where each known chunk is."""

    def __init__(self, root: Path):
        self.dir = root / "packs"
        self.tmp = root / "tmp"
        self.root = root
        self._index: ChunkIndex | None = None     # where each known chunk is (cache/chunks.idx + new packs)
        self.packs_written = 0                    # the tests and benchmarks count them
        self.chunks_written = 0
        self.index_builds = 0                     # times cache/chunks.idx was (re)written by this process

    def path(self, pack: bytes) -> Path:
        h = pack.hex()
        return self.dir / h[:2] / h[2:]

    def iter_packs(self):
        """(pack name, path) of every pack file present (gc and verify only)."""
        if not self.dir.is_dir():
            return
        for sub in sorted(self.dir.iterdir()):
            if len(sub.name) == 2 and sub.is_dir() and not sub.is_symlink():
                for f in sorted(sub.iterdir()):
                    try:
                        yield bytes.fromhex(sub.name + f.name), f
                    except ValueError:
                        continue  # not a pack's name: verify reports it

    def trailer(self, pack: bytes) -> list[tuple[bytes, int, int]]:
        """(digest, offset, length) of every chunk in a pack, from its trailer (bounded, checked)."""
        p = self.path(pack)
        fd, st = fsio.open_regular(p)
        try:
            start, count = _tail(fd, st, p)
            data = fsio.read_bounded_at(fd, count * TRAILER.size, start)
        finally:
            os.close(fd)
        out = [TRAILER.unpack_from(data, i * TRAILER.size) for i in range(count)]
        if any(off + n > start for _, off, n in out):
            raise CorruptObject(None, f"pack {p} has a damaged trailer")
        return out

    def trailer_start(self, pack: bytes) -> tuple[int, int]:
        """(byte where a pack's trailer starts, chunks it lists); CorruptObject if damaged."""
        p = self.path(pack)
        fd, st = fsio.open_regular(p)
        try:
            return _tail(fd, st, p)
        finally:
            os.close(fd)

    def iter_trailer(self, pack: bytes, block: int = 1 << 16):
        """(digest, offset, length, i) of every chunk a pack's trailer lists, read `block` entries
        at a time (a pack of a 100 GiB object lists ~1.8M chunks: never all in memory)."""
        start, count = self.trailer_start(pack)
        fd, _ = fsio.open_regular(self.path(pack))
        try:
            for first in range(0, count, block):
                k = min(block, count - first)
                data = fsio.read_bounded_at(fd, k * TRAILER.size, start + first * TRAILER.size)
                if len(data) != k * TRAILER.size:
                    raise CorruptObject(None, f"pack {self.path(pack)} has a damaged trailer")
                for j, (d, off, n) in enumerate(TRAILER.iter_unpack(data)):
                    if off + n > start:
                        raise CorruptObject(None, f"pack {self.path(pack)} has a damaged trailer")
                    yield d, off, n, first + j
        finally:
            os.close(fd)

    def known(self) -> "ChunkIndex":
        """Where each chunk the packs present hold is (`.get(digest)` -> location or None): the
        persistent index cache/chunks.idx for the packs it covers, the trailers of the packs it
        does not (read once per process), packs gone since dropped. The writer (the lock
        holder: only writers call this) rewrites the cache when it is missing, another store's,
        damaged, or when the packs it does not cover hold more than OVERLAY_MIN chunks and an
        eighth of those it does. A damaged trailer only means its chunks are written again."""
        present = {name for name, _ in self.iter_packs()}
        if self._index is None:
            self._index = ChunkIndex.open(self)
        self._index.refresh(present)
        if self._index.due():
            self.rebuild_index(present)
        return self._index

    def rebuild_index(self, present: set[bytes] | None = None) -> None:
        """Write cache/chunks.idx anew from the trailers of the packs present (bounded memory:
        entries are spilled to tmp/ in ranges of the digest and sorted a range at a time),
        then use it. Atomic (tmp/ + rename): a reader sees the old file or the new one."""
        present = {name for name, _ in self.iter_packs()} if present is None else present
        if self._index is not None:
            self._index.close()
        dest = self.root / "cache" / CACHE_NAME
        try:
            st = os.lstat(dest)
        except FileNotFoundError:
            st = None
        if st is not None and not (stat.S_ISREG(st.st_mode) or stat.S_ISLNK(st.st_mode)):
            # a rename cannot replace it, and removing a directory's contents is not ours to do
            raise StoreCorrupt(f"{dest} is a {fsio.file_kind(st.st_mode)}, not the chunk index",
                               f"remove {dest}: it is a cache (docs/store-format.md C10), rewritten by the next write")
        try:
            _build_cache(self, sorted(present))
        except OSError as e:   # ENOSPC/EIO: typed, and nothing of it left in tmp/ (rule 10)
            raise fsio.io_error(e, "writing the chunk index cache/chunks.idx") from e
        self.index_builds += 1
        self._index = ChunkIndex.open(self)
        self._index.refresh(present)

    def read(self, loc: Location, digest: bytes, oid: str, fds: dict | None = None) -> bytes:
        """A chunk's verified bytes; CorruptObject naming object `oid` and the pack's path."""
        pack, off, n = loc
        p = self.path(pack)
        fd = fds.get(pack) if fds is not None else None
        own = fd is None
        if own:
            try:
                fd, _ = fsio.open_regular(p)
            except (FileNotFoundError, NotADirectoryError):
                raise CorruptObject(oid, f"object {oid} is damaged: its pack {p} is missing",
                                    "restore the object (`ledger pull`, or `ledger add` of the original); "
                                    "then `ledger verify --read-data`") from None
            except fsio.NotRegular as e:
                raise CorruptObject(oid, f"object {oid} is damaged: its pack {p} is a {e.kind}",
                                    f"move {p} aside; then restore the object") from None
            except OSError as e:
                raise fsio.io_error(e, f"reading pack {p}") from e
            if fds is not None:
                fds[pack], own = fd, False
        try:
            # where a chunk is comes from an index or page a local writer could have planted:
            # past the pack's end (even past 2**63) it names no bytes, so say so before pread
            if off + n > os.fstat(fd).st_size:
                raise CorruptObject(oid, f"object {oid} is damaged: its chunk at byte {off} lies beyond the end of "
                                         f"pack {p}",
                                    "restore the object (`ledger pull`, or `ledger add` of the original); "
                                    "then `ledger verify --read-data`")
            data = fsio.read_bounded_at(fd, n, off)
        except OSError as e:
            raise fsio.io_error(e, f"reading pack {p}") from e
        finally:
            if own:
                os.close(fd)
        if len(data) != n or blake3.blake3(data).digest() != digest:
            raise CorruptObject(oid, f"object {oid} is damaged: its chunk at byte {off} of pack {p} "
                                     "does not hash to its name",
                                "restore the object (`ledger pull`, or `ledger add` of the original); "
                                "then `ledger verify --read-data`")
        return data


class PackWriter:
    """One pack being written in tmp/: chunks appended, each new digest once. `close()` adds
    the trailer, fsyncs and renames it into packs/ (before any index names it)."""

    def __init__(self, packs: PackStore, share: bool = True):
        self.packs = packs
        self.name = os.urandom(16)
        self.tmp = fsio.tmp_path(packs.tmp)
        self.fd: int | None = None
        self.entries: list[tuple[bytes, int, int]] = []
        self.mine: dict[bytes, Location] = {}
        # read once: the writer holds the store lock, nobody else adds packs. A repair does not
        # share (a chunk it would reuse may be the damaged one): every chunk is written afresh.
        self.known = packs.known() if share else {}
        self.size = 0
        self.queue: list = []         # chunks located here but not yet written (views of the caller's buffer)

    def flush(self) -> None:
        """Write the queued chunks (the caller flushes before it reuses the buffer they are in)."""
        if not self.queue:
            return
        if self.fd is None:
            self.fd = os.open(self.tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o444)
        faults.io_check("writing a pack")
        views = [memoryview(v) for v in self.queue]
        self.queue = []
        while views:
            n = os.writev(self.fd, views[:1024])
            while views and n >= len(views[0]):
                n -= len(views[0])
                views.pop(0)
            if n:
                views[0] = views[0][n:]

    def locate(self, digest: bytes, data) -> Location:
        """Where this chunk is: an existing copy's location, or appended to this pack."""
        loc = self.mine.get(digest) or self.known.get(digest)
        if loc is not None and loc[2] == len(data):
            return loc
        self.queue.append(data)   # written by flush(), many chunks to one writev
        loc = (self.name, self.size, len(data))
        self.entries.append((digest, self.size, len(data)))
        self.mine[digest] = loc
        self.size += len(data)
        self.packs.chunks_written += 1
        return loc

    def copy(self, digest: bytes, src_fd: int, off: int, n: int) -> Location:
        """Where this chunk is: an existing copy's location, or copied in the kernel
        (copy_file_range) from bytes [off, off+n) of `src_fd` — a file of the store's own whose
        bytes were hashed, never a user's file that could change between hash and copy."""
        loc = self.mine.get(digest) or self.known.get(digest)
        if loc is not None and loc[2] == n:
            return loc
        self.flush()
        if self.fd is None:
            self.fd = os.open(self.tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o444)
        faults.io_check("writing a pack")
        done = 0
        while done < n:
            k = os.copy_file_range(src_fd, self.fd, n - done, off + done)
            if k == 0:
                raise OSError(5, "the store's own copy ended early")
            done += k
        loc = (self.name, self.size, n)
        self.entries.append((digest, self.size, n))
        self.mine[digest] = loc
        self.size += n
        self.packs.chunks_written += 1
        return loc

    def adopt(self, tmp: Path, fd: int, chunks_at: list[tuple[bytes, int, int]], size: int) -> None:
        """Make an already written file of the store's own (`tmp`, open as `fd`, `size` bytes of
        chunks back to back, `chunks_at` = (digest, offset, length) of each) this pack: new
        chunks and the trailer are appended to it. Saves writing a large new object twice."""
        self.tmp, self.fd, self.size = tmp, fd, size
        for d, off, n in chunks_at:
            if d not in self.mine:
                self.mine[d] = (self.name, off, n)
                self.entries.append((d, off, n))
        self.packs.chunks_written += len(self.entries)
        os.lseek(fd, size, os.SEEK_SET)

    def close(self) -> None:
        """Trailer, fsync, rename into packs/, fsync the directory; nothing if nothing was new."""
        self.flush()
        if self.fd is None:
            return
        try:
            fsio.write_all(self.fd, b"".join(TRAILER.pack(*e) for e in self.entries)
                           + TAIL.pack(len(self.entries), PACK_MAGIC), "writing a pack")
            os.fchmod(self.fd, 0o444)   # write-once (an adopted file was made writable)
            faults.point("pack.before-fsync")
            os.fsync(self.fd)
        finally:
            os.close(self.fd)
            self.fd = None
        dest = self.packs.path(self.name)
        new_dir = not dest.parent.is_dir()
        dest.parent.mkdir(parents=True, exist_ok=True)
        os.rename(self.tmp, dest)
        faults.point("pack.after-rename")
        fsio.fsync_dir(dest.parent)
        if new_dir:
            fsio.fsync_dir(self.packs.dir)
        self.packs.packs_written += 1
        if self.packs._index is not None:
            self.packs._index.add_pack(self.name, self.mine)
            if self.packs._index.denied:
                self.packs.rebuild_index()    # a hit its trailer denied: the file lies (forged or stale)

    def abort(self) -> None:
        """Drop the unfinished pack (a failed or refused write)."""
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None
        self.tmp.unlink(missing_ok=True)


def build_pages(entries: list[tuple[bytes, Location]]) -> list[tuple[bytes, bytes, int, int]]:
    """Group (digest, location) entries into pages: (page digest, page bytes, data bytes covered, entries)."""
    pages, cur, covered = [], [], 0
    for i, (d, (pack, off, n)) in enumerate(entries):
        cur.append(ENTRY.pack(d, n, pack, off))
        covered += n
        if page_ends_after(d) or len(cur) == PAGE_MAX or i == len(entries) - 1:
            body = b"".join(cur)
            pages.append((blake3.blake3(body).digest(), body, covered, len(cur)))
            cur, covered = [], 0
    return pages


def index_bytes(size: int, pages: list[tuple[bytes, int, int, Location]]) -> bytes:
    """The index file of an object of `size` bytes: pages as (digest, covered, entries, location)."""
    return HEAD.pack(MAGIC, size, len(pages), 0) + b"".join(
        PAGE_REF.pack(d, cov, k, loc[0], loc[1]) for d, cov, k, loc in pages)


def index_limit(size: int | None = None) -> int:
    """The most bytes an index file may have (reads are bounded): one page per chunk at worst."""
    return HEAD.size + PAGE_REF.size * (1 + (size if size is not None else 1 << 44) // MIN_SIZE)


def read_index(path: Path, oid: str) -> bytes:
    """The bytes of a chunk index, read no further than its header says it reaches: a file of
    another length than HEAD + npages × PAGE_REF is CorruptObject before the rest is read (an
    index padded to gigabytes after a real header was read whole, up to index_limit()'s ~32 GiB,
    before parse_index found it did not add up). parse_index then checks what was read.
    Raises FileNotFoundError, fsio.NotRegular or another OSError as fsio.open_regular does."""
    fd, st = fsio.open_regular(path)
    try:
        head = os.pread(fd, HEAD.size, 0)
        if len(head) < HEAD.size or head[:len(MAGIC)] != MAGIC:
            return head   # truncated, or not an index: parse_index says which
        _, size, npages, _ = HEAD.unpack(head)
        want = HEAD.size + npages * PAGE_REF.size
        if st.st_size != want or want > index_limit(size):
            raise CorruptObject(oid, f"object {oid} is damaged: its chunk index {path} has {st.st_size} bytes "
                                     f"for {npages} pages of a {size}-byte object",
                                "restore the object (`ledger pull`, or `ledger add` of the original)")
        return fsio.read_bounded(fd, want)
    finally:
        os.close(fd)


def parse_index(data: bytes, oid: str, where: Path) -> tuple[int, list[tuple[bytes, int, int, Location]]]:
    """(size, [(page digest, bytes covered, entries, page location)]) of an index; CorruptObject if malformed."""
    def bad(why: str) -> CorruptObject:
        return CorruptObject(oid, f"object {oid} is damaged: its chunk index {where} {why}",
                             "restore the object (`ledger pull`, or `ledger add` of the original)")

    if len(data) < HEAD.size:
        raise bad("is truncated")
    magic, size, npages, _ = HEAD.unpack_from(data)
    if magic != MAGIC:
        raise bad("is not a chunk index")
    if len(data) != HEAD.size + npages * PAGE_REF.size or len(data) > index_limit(size):
        raise bad(f"has {len(data)} bytes for {npages} pages of a {size}-byte object")
    pages = []
    for i in range(npages):
        d, cov, k, pack, off = PAGE_REF.unpack_from(data, HEAD.size + i * PAGE_REF.size)
        pages.append((d, cov, k, (pack, off, k * ENTRY.size)))
    if sum(cov for _, cov, _, _ in pages) != size or any(k == 0 or k > PAGE_MAX for _, _, k, _ in pages):
        raise bad("does not add up")
    return size, pages


def parse_page(data: bytes, entries: int, covered: int, oid: str, where: str) -> list[tuple[bytes, Location]]:
    """The (chunk digest, location) entries of one verified page."""
    out = []
    for i in range(entries):
        d, n, pack, off = ENTRY.unpack_from(data, i * ENTRY.size)
        out.append((d, (pack, off, n)))
    if sum(loc[2] for _, loc in out) != covered or any(loc[2] == 0 or loc[2] > MAX_SIZE for _, loc in out):
        raise CorruptObject(oid, f"object {oid} is damaged: its chunk page {where} does not add up")
    return out


def regular_size(path: Path) -> int | None:
    """lstat size of a regular file, else None."""
    try:
        st = os.lstat(path)
    except (FileNotFoundError, NotADirectoryError):
        return None
    return st.st_size if stat.S_ISREG(st.st_mode) else None


# --- the persistent chunk index (cache/chunks.idx) ------------------------------------------
def store_id(root: Path) -> str:
    """This store's id from its config ("" for a store made before ids): what the chunk index
    records, so an index copied from another store is not used (rule 15's "whose they are")."""
    try:
        cfg = json.loads(fsio.read_small(root / "config", 64 << 10))
    except (OSError, ValueError, RecursionError, fsio.NotRegular):
        return ""
    sid = cfg.get("id") if isinstance(cfg, dict) else None
    return sid if isinstance(sid, str) and sid.isascii() and len(sid) <= 48 else ""


class ChunkIndex:
    """Where each chunk of the packs present is: cache/chunks.idx (sorted entries, mapped, a
    binary search in the bucket of the digest's first two bytes) for the packs it covers, plus
    an overlay read from the trailers of the packs it does not (at most OVERLAY_MIN chunks or an
    eighth of the index, else the writer rewrites the file). Memory does not grow with the
    chunks stored: ~100 B per chunk in a dict before, now the overlay and the mapped pages read.

    Trust: the file is a cache any local process could have written. It is used only if it is
    this store's (its id) and whole (its length adds up); a hit is used only if its pack is
    present and the pack's own trailer lists the same chunk at the same place (one 44-byte read),
    so a forged or stale entry is a miss — the chunk is written again — never a location that
    holds other bytes. Entries of packs gc removed are misses too."""

    FDS = 16   # pack files kept open for the trailer checks of hits

    def __init__(self, packs: PackStore, mm=None, covered=(), count: int = 0, problem: str | None = None):
        self.packs = packs
        self.mm = mm
        self.covered = set(covered)
        self.count = count
        self.problem = problem            # why the file is not usable (missing, another store's, damaged)
        self.overlay: dict[bytes, Location] = {}
        self.loaded: set[bytes] = set()   # packs whose trailers are in the overlay
        self.present: set[bytes] = set()
        self.over = False                 # the uncovered packs hold more than the overlay may
        self.denied = False               # a hit the pack's trailer denied
        self._fan = CACHE_HEAD.size + 16 * len(self.covered)
        self._ent = self._fan + FANOUT.size
        self._starts: dict[bytes, tuple[int, int] | None] = {}
        self._fds: dict[bytes, int] = {}

    @classmethod
    def open(cls, packs: PackStore) -> "ChunkIndex":
        path = packs.root / "cache" / CACHE_NAME
        try:
            fd, st = fsio.open_regular(path)
        except FileNotFoundError:
            return cls(packs, problem="missing")
        except (OSError, fsio.NotRegular):
            return cls(packs, problem="unreadable")
        try:
            head = os.pread(fd, CACHE_HEAD.size, 0)
            if len(head) < CACHE_HEAD.size:
                return cls(packs, problem="damaged")
            magic, sid, npacks, reserved, count = CACHE_HEAD.unpack(head)
            if magic != CACHE_MAGIC or reserved:
                return cls(packs, problem="damaged")
            if sid.rstrip(b"\0").decode("ascii", "replace") != store_id(packs.root):
                return cls(packs, problem="another store's")
            if st.st_size != CACHE_HEAD.size + 16 * npacks + FANOUT.size + count * CACHE_ENTRY.size:
                return cls(packs, problem="damaged")
            mm = mmap.mmap(fd, st.st_size, prot=mmap.PROT_READ)
        finally:
            os.close(fd)
        covered = [bytes(mm[CACHE_HEAD.size + 16 * i:CACHE_HEAD.size + 16 * (i + 1)]) for i in range(npacks)]
        return cls(packs, mm, covered, count)

    def limit(self) -> int:
        return min(SPILL, max(OVERLAY_MIN, self.count // 8))

    def refresh(self, present: set[bytes]) -> None:
        """Follow the packs present now: read the trailers of new packs the file does not cover
        (until the overlay is full), drop packs gone."""
        self.present = set(present)
        for gone in self.loaded - self.present:
            self.overlay = {d: loc for d, loc in self.overlay.items() if loc[0] != gone}
        self.loaded &= self.present
        for name in sorted(self.present - self.covered - self.loaded):
            if len(self.overlay) > self.limit():
                self.over = True
                return
            try:
                entries = list(self.packs.iter_trailer(name))
            except (OSError, fsio.NotRegular, CorruptObject):
                continue
            for d, off, n, _ in entries:
                self.overlay.setdefault(d, (name, off, n))
            self.loaded.add(name)
        self.over = len(self.overlay) > self.limit()

    def due(self) -> bool:
        """Whether the writer should rewrite the file (missing, unusable, too much outside it,
        or covering packs gc removed)."""
        if not self.present:
            return False
        return self.problem is not None or self.over or bool(self.covered - self.present)

    def add_pack(self, name: bytes, mine: dict[bytes, Location]) -> None:
        """A pack this process just wrote (its chunks' locations are its own, not the file's)."""
        for d, loc in mine.items():
            self.overlay.setdefault(d, loc)
        self.loaded.add(name)
        self.present.add(name)

    def get(self, digest: bytes, default=None):
        loc = self.overlay.get(digest)
        if loc is not None:
            return loc
        if self.mm is None or len(digest) != 32:
            return default
        b = int.from_bytes(digest[:2], "big")
        lo, hi = struct.unpack_from(">II", self.mm, self._fan + 4 * b)
        if not lo <= hi <= self.count:
            self.problem = "damaged"
            return default
        mm, ent, size = self.mm, self._ent, CACHE_ENTRY.size
        while lo < hi:
            mid = (lo + hi) // 2
            at = ent + mid * size
            key = mm[at:at + 32]
            if key < digest:
                lo = mid + 1
            elif key > digest:
                hi = mid
            else:
                _, pack, off, n, i = CACHE_ENTRY.unpack_from(mm, at)
                if pack not in self.present or not self._vouched(pack, digest, off, n, i):
                    return default
                return (pack, off, n)
        return default

    def _vouched(self, pack: bytes, digest: bytes, off: int, n: int, i: int) -> bool:
        """The pack's trailer lists this chunk at this place (else the entry is forged or stale)."""
        try:
            if pack not in self._starts:
                try:
                    self._starts[pack] = self.packs.trailer_start(pack)
                except (OSError, fsio.NotRegular, CorruptObject):
                    self._starts[pack] = None
            where = self._starts[pack]
            if where is None or i >= where[1]:
                return self._stale()
            fd = self._fds.get(pack)
            if fd is None:
                if len(self._fds) >= self.FDS:
                    os.close(self._fds.pop(next(iter(self._fds))))
                fd = self._fds[pack] = fsio.open_regular(self.packs.path(pack))[0]
            ok = os.pread(fd, TRAILER.size, where[0] + i * TRAILER.size) == TRAILER.pack(digest, off, n)
        except (OSError, fsio.NotRegular):
            return self._stale()
        return ok or self._stale()

    def _stale(self) -> bool:
        self.problem = "stale or forged"   # rewritten after this write (PackWriter.close) or by the next
        self.denied = True
        return False

    def close(self) -> None:
        for fd in self._fds.values():
            os.close(fd)
        self._fds.clear()


def _build_cache(packs: PackStore, names: list[bytes]) -> None:
    """Write cache/chunks.idx for the packs `names` from their trailers: entries go to at most
    ceil(total / SPILL) spill files in tmp/ by digest range, each then sorted in memory and
    appended, so memory stays ~SPILL entries whatever the store holds. A pack whose trailer is
    damaged is left out (its chunks are then written again, as before)."""
    covered, total = [], 0
    for name in names:
        try:
            total += packs.trailer_start(name)[1]
            covered.append(name)
        except (OSError, fsio.NotRegular, CorruptObject):
            continue
    nspill = max(1, -(-total // SPILL))
    packs.tmp.mkdir(exist_ok=True)
    spills = [fsio.tmp_path(packs.tmp) for _ in range(nspill)] if nspill > 1 else []
    held: list[bytes] = []
    files = [open(p, "xb") for p in spills]
    try:
        for name in covered:
            try:
                for d, off, n, i in packs.iter_trailer(name):
                    rec = CACHE_ENTRY.pack(d, name, off, n, i)
                    if files:
                        files[int.from_bytes(d[:2], "big") * nspill >> 16].write(rec)
                    else:
                        held.append(rec)
            except (OSError, fsio.NotRegular, CorruptObject):
                continue   # entries it gave before the damage stay: each hit is checked against the trailer
        for f in files:
            f.close()
        dest = packs.root / "cache" / CACHE_NAME
        dest.parent.mkdir(exist_ok=True)
        out = fsio.tmp_path(packs.tmp)
        spills.append(out)      # removed below unless renamed into place
        fan = [0] * 65537
        count = 0
        with open(out, "xb") as fo:
            fo.write(b"\0" * CACHE_HEAD.size + b"".join(sorted(covered)) + b"\0" * FANOUT.size)

            def emit(recs: list[bytes]) -> None:
                nonlocal count
                recs.sort()
                last = None
                for r in recs:
                    if r[:32] == last:
                        continue    # the same chunk in two packs: one location is enough
                    last = r[:32]
                    fan[int.from_bytes(r[:2], "big") + 1] += 1
                    count += 1
                    fo.write(r)
            if not files:
                emit(held)
            for p in spills[:-1]:
                data = p.read_bytes()
                emit([data[j:j + CACHE_ENTRY.size] for j in range(0, len(data), CACHE_ENTRY.size)])
            for b in range(65536):
                fan[b + 1] += fan[b]
            fo.seek(0)
            fo.write(CACHE_HEAD.pack(CACHE_MAGIC, store_id(packs.root).encode("ascii"), len(covered), 0, count))
            fo.seek(CACHE_HEAD.size + 16 * len(covered))
            fo.write(FANOUT.pack(*fan))
        os.replace(out, dest)   # a cache (rule 8): no fsync; a torn file fails its length check
    finally:
        for f in files:
            f.close()
        for p in spills:
            p.unlink(missing_ok=True)
