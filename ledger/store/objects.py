"""The object store: immutable blobs named by the BLAKE3 hash of their bytes.

Layout: objects/<first 2 hex>/<remaining 62 hex>. Write once: an object is written to tmp/,
fsynced, made read-only, renamed into place and its directory fsynced. An existing object is
never rewritten. Every read re-checks the hash (BLAKE3 is cheap), so nothing corrupt is served.
An object of at least chunks.THRESHOLD bytes is stored as content-defined chunks in packs
instead, with an index `objects/ab/cd….c` (ledger/store/chunks.py); its id is still the hash of
its whole content, and `stream`, `get_bytes`, `export_file` and `intact` read both forms.
A structured object (canonical JSON, `put_bytes(compress=True)`) may be stored zstd-compressed as
`objects/ab/cd….z` (ledger/store/compress.py); its id is the hash of its uncompressed bytes, and
every read decompresses (bounded) and rehashes. `structure` is how gc, verify and sharing look
inside an object for the ids it names, whichever form it has.
"""

from __future__ import annotations

import contextlib
import errno
import mmap
import os
import stat
from pathlib import Path

import blake3

from ledger.errors import AmbiguousRef, BadInput, CorruptObject, MissingObject, UnknownRef
from ledger.store import canonical, chunks, compress, faults, fsio, packed, statcache
from ledger.store.ids import PREFIX, PREFIX_RE, hash_bytes, hex_of, is_id

CHUNK = 16 << 20  # 16 MiB: large enough for multi-threaded hashing, small enough for the 200 MiB budget
MMAP_MIN = 4 << 20


STRUCTURED_MAX = 256 << 20  # the largest object read as structure (JSON); as Store.closure


def hash_fd(fd: int, size: int) -> str:
    """Hash the first `size` bytes of an open regular file: memory-mapped and multi-threaded
    for large files, as fast as b3sum."""
    h = blake3.blake3(max_threads=blake3.blake3.AUTO)
    if size >= MMAP_MIN:
        with mmap.mmap(fd, size, access=mmap.ACCESS_READ) as m, memoryview(m) as view:
            h.update(view)
    elif size:
        h.update(fsio.read_bounded(fd, size))
    return PREFIX + h.hexdigest()


def hash_file(path: Path) -> str:
    """Rehash a file, never following a link or blocking on a special file (NotRegular)."""
    fd, st = fsio.open_regular(path)
    try:
        return hash_fd(fd, st.st_size)
    finally:
        os.close(fd)


MAP = 16 << 20   # the most bytes one worker maps at once: mapped pages count in RSS until unmapped


def _hash_window(h, fd: int, off: int, n: int) -> None:
    """Feed bytes [off, off+n) of fd to the hasher through memory maps of MAP bytes at most."""
    end = off + n
    while off < end:
        k = min(MAP, end - off)
        start = off - off % mmap.ALLOCATIONGRANULARITY  # maps must start on a granule boundary
        with mmap.mmap(fd, k + off - start, offset=start, access=mmap.ACCESS_READ) as m:
            with memoryview(m) as view:
                h.update(view[off - start:])
        off += k


def _hash_chunks(fd: int, part: list[tuple[int, int]]) -> list[tuple[bytes, int, int]]:
    """(BLAKE3 digest, offset, length) of each chunk (offset, length) of fd, back to back in
    `part`, through a memory map of just their range."""
    first, end = part[0][0], part[-1][0] + part[-1][1]
    base = first - first % mmap.ALLOCATIONGRANULARITY
    with mmap.mmap(fd, end - base, offset=base, access=mmap.ACCESS_READ) as m:
        with memoryview(m) as view:
            return [(blake3.blake3(view[o - base:o - base + n]).digest(), o, n) for o, n in part]


INTACT_MAP = 32 << 20   # the window of a pack ObjectStore._chunked_intact maps at once (two at most)
# threads hashing chunks against their names beside the one feeding the whole hash (which uses
# every core itself on large updates): one per two cores, at least one, at most four
_NAMERS = max(1, min(4, (os.cpu_count() or 2) // 2))


def _windows(entries):
    """(pack, [(digest, offset, length), ...]) groups of a chunked object's entries, in order:
    consecutive chunks of one pack that fit in INTACT_MAP bytes from the first one's offset."""
    pack, lo, part = None, 0, []
    for d, (p, off, n) in entries:
        if part and (p != pack or off < lo or off + n - lo > INTACT_MAP):
            yield pack, part
            part = []
        if not part:
            pack, lo = p, off
        part.append((d, off, n))
    if part:
        yield pack, part


def _feed(h, view, start: int, part) -> None:
    """Update the whole hash with a window's chunks in order, back-to-back ones in one call."""
    lo = hi = None
    for _, off, n in part:
        if off == hi:
            hi += n
            continue
        if lo is not None:
            h.update(view[lo - start:hi - start])
        lo, hi = off, off + n
    h.update(view[lo - start:hi - start])


def _names_match(view, start: int, part) -> bool:
    """Every chunk of a window hashes to its name (BLAKE3 releases the GIL on large inputs)."""
    return all(blake3.blake3(view[off - start:off - start + n]).digest() == d for d, off, n in part)


def _window_done(item) -> bool:
    """Wait for a mapped window's workers, unmap it; whether its chunks matched their names."""
    try:
        for f in item[2]:
            f.exception()   # waits: no worker may still read the map when it is closed
        return all([f.result() is not False for f in item[2]])
    finally:
        _unmap(item)


def _unmap(item) -> None:
    m, view = item[0], item[1]
    view.release()
    try:
        m.close()
    except BufferError:
        pass   # a worker's traceback still holds a slice: the map goes with it (the error is raised)


def _strip(name: str) -> str:
    """The hex part of a file name in a fan-out directory (a `.c` or `.z` form is its object)."""
    return name.removesuffix(chunks.SUFFIX).removesuffix(compress.SUFFIX)


def _reader(data):
    """read_into(view, offset) over bytes in memory (ObjectStore._put_chunked)."""
    src = memoryview(data)

    def read_into(view, off):
        n = min(len(view), len(src) - off)
        view[:n] = src[off:off + n]
        return n
    return read_into


class ObjectStore:
    """The objects/ directory: write-once files named by their hash, every read verified."""
    def __init__(self, root: Path):
        self.dir = root / "objects"
        self.tmp = root / "tmp"
        self.packs = chunks.PackStore(root)
        self.packed = packed.Packs(root)   # small objects moved into packs by gc (store/packed.py)
        self.repaired: list[str] = []  # ids whose damaged copy a write replaced (the caller reports them)
        self.chunked_min = chunks.THRESHOLD  # objects this large are stored as chunks (tests lower it)
        # id -> hex BLAKE3 of the chunk list of a chunked object whose index this process wrote,
        # or found intact by hashing it whole and every chunk by name: a transaction naming the
        # object records it (payload.chunk_lists), so verify --read-data hashes it once (C12)
        self.lists: dict[str, str] = {}

    # --- naming -------------------------------------------------------------------------
    def path(self, oid: str) -> Path:
        if not is_id(oid):
            raise BadInput(f"not an object id: {oid!r}", "ids look like b3:<64 hex>")
        h = hex_of(oid)
        return self.dir / h[:2] / h[2:]

    def index_path(self, oid: str) -> Path:
        """Where a chunked object's index lives (ledger/store/chunks.py)."""
        p = self.path(oid)
        return p.with_name(p.name + chunks.SUFFIX)

    def zpath(self, oid: str) -> Path:
        """Where a compressed structured object lives (ledger/store/compress.py)."""
        p = self.path(oid)
        return p.with_name(p.name + compress.SUFFIX)

    def has(self, oid: str) -> bool:
        """A regular file is stored under this id, whole, as a chunk index or compressed (not a
        link, directory or FIFO), or packed (store/packed.py)."""
        return statcache.has_object(self.path(oid)) or self._packed(oid) is not None

    def chunked(self, oid: str) -> bool:
        """The object is stored as chunks (its index is here, and no whole copy is)."""
        try:
            os.lstat(self.path(oid))
            return False
        except (FileNotFoundError, NotADirectoryError):
            pass
        try:
            return stat.S_ISREG(os.lstat(self.index_path(oid)).st_mode)
        except (FileNotFoundError, NotADirectoryError):
            return False

    def compressed(self, oid: str) -> bool:
        """The object is stored compressed: something is at its `.z` name and no whole copy is (a
        link, FIFO or directory there is then read as CorruptObject, never as missing)."""
        return not self._lexists(self.path(oid)) and self._lexists(self.zpath(oid))

    def _read_compressed(self, oid: str) -> bytes:
        """The verified bytes of a compressed object: the file read bounded (Z4), decompressed
        no further than its header declares, rehashed against the id."""
        p = self.zpath(oid)
        try:
            with self._read_errors(oid):
                try:
                    raw = fsio.read_small(p, compress.file_limit())
                except ValueError:
                    raise CorruptObject(oid, f"object {oid} is damaged: {p} is larger than a compressed object can be") from None
        except MissingObject:
            # packed by a gc since compressed() saw the file: the pack is durable before a file goes
            return self._packed_data(oid, self._packed_or_missing(oid))
        data = compress.decode(raw, oid, p)
        if hash_bytes(data) != oid:
            raise CorruptObject(oid)
        return data

    def compressed_size(self, oid: str) -> int:
        """The uncompressed size a compressed object's header declares (header checked only)."""
        p = self.zpath(oid)
        try:
            fd, _ = fsio.open_regular(p)
        except FileNotFoundError:
            return self._packed_size(oid, self._packed_or_missing(oid))   # packed meanwhile (as above)
        except fsio.NotRegular as e:
            raise self._not_regular(oid, e.kind) from None
        except OSError as e:
            raise fsio.io_error(e, f"reading object {oid}") from e
        try:
            head = os.pread(fd, compress.HEADER.size, 0)
        except OSError as e:
            raise fsio.io_error(e, f"reading object {oid}") from e
        finally:
            os.close(fd)
        return compress.declared_size(head, oid, p)

    def structure(self, oid: str, limit: int | None = None) -> bytes | None:
        """The bytes of `oid` if it is structure to look for ids in (starts with `{`, at most
        `limit` bytes, default STRUCTURED_MAX), else None (a blob, a large or chunked object).
        Whole copies are peeked, not rehashed (as reachability always did); compressed ones are
        decompressed and so verified. MissingObject, CorruptObject and I/O errors propagate."""
        limit = STRUCTURED_MAX if limit is None else limit
        if self.compressed(oid):
            if self.compressed_size(oid) > limit:
                return None
            data = self._read_compressed(oid)
            return data if data[:1] == b"{" else None
        try:
            fd, st = self.open(oid)
        except MissingObject:
            hit = self._packed_or_missing(oid)
            if self._packed_size(oid, hit) > limit:
                return None
            data = self._packed_data(oid, hit)
            return data if data[:1] == b"{" else None
        try:
            if st.st_size > limit or os.pread(fd, 1, 0) != b"{":
                return None
            return fsio.read_bounded(fd, st.st_size)
        except OSError as e:
            raise fsio.io_error(e, f"reading object {oid}") from e
        finally:
            os.close(fd)

    def _fanout_damaged(self, oid: str) -> CorruptObject:
        return CorruptObject(oid, f"{self.path(oid).parent} is not a directory: objects/ is damaged",
                             f"move {self.path(oid).parent} aside; then restore what `ledger verify` names")

    def size(self, oid: str) -> int:
        """The object's size in bytes (a chunked object's is in its index, a compressed one's in
        its header)."""
        if self.chunked(oid):
            return self._index(oid)[0]
        if self.compressed(oid):
            return self.compressed_size(oid)
        try:
            st = os.lstat(self.path(oid))
        except FileNotFoundError:
            return self._packed_size(oid, self._packed_or_missing(oid))
        except NotADirectoryError:
            raise self._fanout_damaged(oid) from None
        if not stat.S_ISREG(st.st_mode):
            raise self._not_regular(oid, fsio.file_kind(st.st_mode))
        return st.st_size

    @staticmethod
    def _not_regular(oid: str, kind: str) -> CorruptObject:
        return CorruptObject(oid, f"object {oid} is a {kind}, not a stored file",
                             "restore it from a remote or bundle (`ledger pull`, or `ledger add` of the original); "
                             "then `ledger verify --read-data`")

    @contextlib.contextmanager
    def _read_errors(self, oid: str):
        """What reading an object's file can raise, as the store's typed errors."""
        try:
            yield
        except FileNotFoundError:
            raise MissingObject(oid) from None
        except NotADirectoryError:
            raise self._fanout_damaged(oid) from None
        except fsio.NotRegular as e:
            raise self._not_regular(oid, e.kind) from None
        except OSError as e:
            raise fsio.io_error(e, f"reading object {oid}") from e

    def open(self, oid: str) -> tuple[int, os.stat_result]:
        """Open an object's file for reading, safely (see fsio.open_regular); typed errors."""
        with self._read_errors(oid):
            return fsio.open_regular(self.path(oid))

    # --- packed objects (ledger/store/packed.py) -------------------------------------------
    # Every form of its own file (whole, `.c`, `.z`) is looked for first: a loose copy is
    # preferred, as a whole copy is over a chunk index (P2). Only a miss asks the packs.
    def _packed(self, oid: str) -> tuple[packed.Pack, packed.Loc] | None:
        if not is_id(oid):
            raise BadInput(f"not an object id: {oid!r}", "ids look like b3:<64 hex>")
        return self.packed.find(bytes.fromhex(hex_of(oid)))

    def _where(self, hit) -> str:
        pack, loc = hit
        return f"{pack.path} at byte {loc.offset}"

    def _packed_stored(self, oid: str, hit) -> bytes:
        """The stored bytes of a packed entry, its place checked first (CorruptObject)."""
        pack, loc = hit
        why = pack.problem(loc)
        if why is None:
            try:
                return pack.read(loc)
            except ValueError as e:
                why = str(e)
            except OSError as e:
                raise fsio.io_error(e, f"reading object {oid} from {pack.path}") from e
        raise CorruptObject(oid, f"object {oid} is damaged: {pack.path} holds {why}",
                            "restore the object (`ledger pull`, or `ledger add` of the original); "
                            "then `ledger verify --read-data`")

    def _packed_verified(self, oid: str, hit) -> tuple[bytes, bytes]:
        """(stored bytes, content) of a packed object, the content decompressed (bounded) if
        stored so and rehashed against the id. Where `hit` is damaged, another pack's copy that
        verifies is taken (a crash mid-rewrite leaves two; verify names the damaged one);
        CorruptObject (the first copy's) if none does."""
        try:
            return self._one_copy(oid, hit)
        except CorruptObject as first:
            for other in self.packed.find_all(bytes.fromhex(hex_of(oid))):
                if other[0] is hit[0] and other[1] == hit[1]:
                    continue
                try:
                    return self._one_copy(oid, other)
                except CorruptObject:
                    continue
            raise first

    def _one_copy(self, oid: str, hit) -> tuple[bytes, bytes]:
        raw = self._packed_stored(oid, hit)
        data = compress.decode(raw, oid, self._where(hit)) if hit[1].form == packed.COMPRESSED else raw
        if hash_bytes(data) != oid:
            raise CorruptObject(oid, f"object {oid} is damaged: its bytes in {self._where(hit)} do not hash to it",
                                "restore the object (`ledger pull`, or `ledger add` of the original)")
        return raw, data

    def _packed_data(self, oid: str, hit) -> bytes:
        """The verified content of a packed object."""
        return self._packed_verified(oid, hit)[1]

    def _packed_size(self, oid: str, hit) -> int:
        """A packed object's size: its stored length, or what its compressed header declares."""
        pack, loc = hit
        if loc.form == packed.WHOLE:
            why = pack.problem(loc)
            if why:
                raise CorruptObject(oid, f"object {oid} is damaged: {pack.path} holds {why}")
            return loc.length
        return compress.declared_size(self._packed_stored(oid, hit)[:compress.HEADER.size], oid, self._where(hit))

    def _packed_or_missing(self, oid: str):
        """The packed entry of an object with no file of its own; MissingObject if none."""
        hit = self._packed(oid)
        if hit is None:
            raise MissingObject(oid)
        return hit

    def packed_only(self, oid: str) -> bool:
        """The object is held only in a pack (no file of its own, whole, chunked or compressed)."""
        return not statcache.has_object(self.path(oid)) and self._packed(oid) is not None

    def loosen(self, oid: str) -> Path:
        """Give a packed object a file of its own again (lock holder only) and return it: what a
        sandbox is granted is one object's file, never a pack, which holds other objects (P5).
        The content is verified first; the file is written as any object is (tmp, fsync,
        rename, fsync). An object with a file of its own is returned as it is."""
        for p in (self.path(oid), self.zpath(oid)):
            kind = self._kind_at(p)
            if kind == "file":
                return p
            if kind is not None:   # a link in its place could make a grant reach any file (a pack)
                raise self._not_regular(oid, kind)
        hit = self._packed_or_missing(oid)
        stored = self._packed_verified(oid, hit)[0]
        compressed = hit[1].form == packed.COMPRESSED
        dest = self.zpath(oid) if compressed else self.path(oid)
        tmp = fsio.tmp_path(self.tmp)
        try:
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
            try:
                fsio.write_all(fd, stored, "writing an object")
                os.fsync(fd)
            finally:
                os.close(fd)
            os.chmod(tmp, stat.S_IRUSR | stat.S_IRGRP | stat.S_IROTH)
            new_dir = not dest.parent.is_dir()
            dest.parent.mkdir(parents=True, exist_ok=True)
            os.rename(tmp, dest)
            fsio.fsync_dir(dest.parent)
            if new_dir:
                fsio.fsync_dir(self.dir)
        except OSError as e:
            raise fsio.io_error(e, f"writing object {oid} out of its pack") from e
        finally:
            tmp.unlink(missing_ok=True)
        return dest

    # --- chunked objects (ledger/store/chunks.py) ------------------------------------------
    def _index(self, oid: str) -> tuple[int, list]:
        """(size, pages) of a chunked object's index, read safely and bounded."""
        p = self.index_path(oid)
        try:
            data = chunks.read_index(p, oid)   # no further than its header says (a padded index is refused unread)
        except FileNotFoundError:
            raise MissingObject(oid) from None
        except fsio.NotRegular as e:
            raise self._not_regular(oid, e.kind) from None
        except ValueError:
            raise CorruptObject(oid, f"object {oid} is damaged: its chunk index {p} is too large") from None
        except OSError as e:
            raise fsio.io_error(e, f"reading object {oid}") from e
        return chunks.parse_index(data, oid, p)

    def chunk_entries(self, oid: str, fds: dict | None = None) -> list[tuple[bytes, tuple]]:
        """(chunk digest, (pack, offset, length)) of every chunk of a chunked object, in
        order; each page verified as it is read."""
        out = []
        for digest, covered, k, loc in self._index(oid)[1]:
            page = self.packs.read(loc, digest, oid, fds)
            out.extend(chunks.parse_page(page, k, covered, oid, f"at byte {loc[1]} of {self.packs.path(loc[0])}"))
        return out

    def packs_of(self, oid: str) -> set[bytes]:
        """The packs a chunked object's pages and chunks are in (gc keeps them)."""
        fds: dict = {}
        try:
            found = {loc[0] for _, _, _, loc in self._index(oid)[1]}
            found |= {loc[0] for _, loc in self.chunk_entries(oid, fds)}
        finally:
            for fd in fds.values():
                os.close(fd)
        return found

    def check_chunked(self, oid: str) -> None:
        """The index and pages of a chunked object are sound and every pack they name is a
        regular file (the chunks' bytes are checked by `intact`). CorruptObject otherwise."""
        for pack in sorted(self.packs_of(oid)):
            if chunks.regular_size(self.packs.path(pack)) is None:
                raise CorruptObject(oid, f"object {oid} is damaged: its pack {self.packs.path(pack)} is missing",
                                    "restore the object (`ledger pull`, or `ledger add` of the original)")

    def stream(self, oid: str, block: int = CHUNK):
        """The object's bytes as a sequence of buffers, every chunk verified as it is read and
        the whole checked against the id at the end (CorruptObject: the caller must discard
        what it wrote). Works for whole and chunked objects alike."""
        h = blake3.blake3(max_threads=blake3.blake3.AUTO)
        if self.chunked(oid):
            fds: dict = {}
            try:
                for d, loc in self.chunk_entries(oid, fds):
                    data = self.packs.read(loc, d, oid, fds)
                    h.update(data)
                    yield data
            finally:
                for fd in fds.values():
                    os.close(fd)
        elif self.compressed(oid):
            data = self._read_compressed(oid)
            h.update(data)
            yield memoryview(data)
        else:
            try:
                fd, st = self.open(oid)
            except MissingObject:   # packed (by a gc, maybe just now: its pack is durable first)
                data = self._packed_data(oid, self._packed_or_missing(oid))
                h.update(data)
                yield memoryview(data)
                fd = None
            if fd is not None:
                yield from self._stream_file(oid, fd, st, block, h)
        if PREFIX + h.hexdigest() != oid:
            raise CorruptObject(oid)

    @staticmethod
    def _stream_file(oid: str, fd: int, st, block: int, h):
        """A whole object's file in blocks, each fed to `h` (closes fd)."""
        try:
            buf = bytearray(min(block, st.st_size) or 1)
            done = 0
            while done < st.st_size:
                try:
                    n = os.preadv(fd, [memoryview(buf)[:min(block, st.st_size - done)]], done)
                except OSError as e:
                    raise fsio.io_error(e, f"reading object {oid}") from e
                if n == 0:
                    break
                view = memoryview(buf)[:n]
                h.update(view)
                yield view
                done += n
        finally:
            os.close(fd)

    def check_data(self, oid: str, listed: str | None = None) -> tuple[bool, str]:
        """Rehash a stored object: (intact, how). `listed` is the chunk-list digest the journal
        recorded for it (payload.chunk_lists, C12), if any. `how`: "whole" (not chunked: hashed
        whole), "list" (chunked, and its index's chunk list hashes to `listed`: the whole content
        is hashed against the id once, with every core, and the chunks' names are the ones the
        recording writer checked), "names" (chunked, nothing recorded: the whole and every chunk
        against its name, each byte hashed twice) or "other-list" (chunked, its index lists other
        chunks than were recorded: checked as "names", and the caller says so)."""
        if not self.chunked(oid):
            return self.intact(oid), "whole"
        fds: dict = {}
        try:
            entries = self.chunk_entries(oid, fds)
        except (MissingObject, CorruptObject):
            return False, "names"
        finally:
            for fd in fds.values():
                os.close(fd)
        how = "names" if listed is None else "list" if listed == chunks.list_digest(entries) else "other-list"
        try:
            return self._chunked_intact(oid, names=how != "list", entries=entries), how
        except (MissingObject, CorruptObject):
            return False, how

    def _chunked_intact(self, oid: str, names: bool = True, entries: list | None = None) -> bool:
        """Whole-content check of a chunked object, and (`names`) every chunk against its name,
        hashed in one pass from memory maps of its packs (no copy into a buffer first): each
        window of at most INTACT_MAP bytes of one pack is mapped once, and while one worker feeds
        the window's chunks to the whole hash (in order, BLAKE3's own threads on every core)
        others hash each chunk against its name; the main thread maps the next
        window meanwhile. At most two windows are mapped at once (mapped pages count in RSS).
        Where a chunk lies comes from pages a local writer could have planted: a window reaching
        beyond its pack's end (fstat of the pack as opened, never following a link) is damage and
        is never mapped, and the bytes hashed are exactly those the verified pages account for
        (they add up to the index's size). False on any damage. Found intact with the names
        checked, the chunk list is known good: remembered for the next record (self.lists).
        `entries`: the object's chunk_entries, if the caller has read them already."""
        from concurrent.futures import ThreadPoolExecutor, wait  # only a chunked object needs them (~9 ms)
        fds: dict = {}
        ends: dict = {}
        pending: list = []   # (map, view, [whole-hash future, names futures...]) of the windows in flight
        try:
            if entries is None:
                entries = self.chunk_entries(oid, fds)
            h = blake3.blake3(max_threads=blake3.blake3.AUTO)
            k = _NAMERS if names else 0
            with ThreadPoolExecutor(1) as whole, ThreadPoolExecutor(max(1, k)) as namers:  # one: the whole in order
                try:
                    for pack, part in _windows(entries):
                        fd = fds.get(pack)
                        if fd is None:
                            try:
                                fd = fds[pack] = fsio.open_regular(self.packs.path(pack))[0]
                            except (OSError, fsio.NotRegular):
                                return False
                        if pack not in ends:
                            ends[pack] = os.fstat(fd).st_size
                        first, end = min(o for _, o, _ in part), max(o + n for _, o, n in part)
                        if end > ends[pack]:
                            return False   # beyond the pack's end: touching such a mapped page is SIGBUS
                        start = first - first % mmap.ALLOCATIONGRANULARITY   # maps start on a granule
                        # Not MAP_POPULATE: populating reads the pages one at a time on this thread
                        # while the hashers wait (2 GiB from disk: 2.3-3.7 s wall and 2.6-4.7 s CPU
                        # against 1.5 s and 0.9 s faulting them in with the kernel's readahead, as
                        # b3sum's map does; from the page cache ~0.02 s of sys more; RESULTS, session 8)
                        m = mmap.mmap(fd, end - start, flags=mmap.MAP_SHARED,
                                      prot=mmap.PROT_READ, offset=start)
                        view = memoryview(m)
                        pending.append((m, view, [whole.submit(_feed, h, view, start, part)]
                                        + [namers.submit(_names_match, view, start, part[i::k]) for i in range(k)]))
                        if len(pending) > 1 and not _window_done(pending.pop(0)):
                            return False
                    while pending:
                        if not _window_done(pending.pop(0)):
                            return False
                    if PREFIX + h.hexdigest() != oid:
                        return False
                    if names:
                        self.lists[oid] = chunks.list_digest(entries)
                    return True
                finally:
                    for item in pending:   # left by an early return: wait for its workers, then unmap
                        wait(item[2])
                        _unmap(item)
        finally:
            for fd in fds.values():
                os.close(fd)

    def files(self, oid: str) -> list[Path]:
        """Every file that holds the object's bytes: the object file, or a chunked object's
        index and packs (what a sandbox must be granted to read it)."""
        for p in (self.path(oid), self.zpath(oid), self.index_path(oid)):
            kind = self._kind_at(p)
            if kind not in (None, "file"):   # granted by path: a link there would grant what it names
                raise self._not_regular(oid, kind)
        if self.compressed(oid):
            return [self.zpath(oid)]   # read through the store (a child opens a Store to read it)
        if self.packed_only(oid):
            raise MissingObject(oid, f"object {oid} is packed: only a file of its own can be granted",
                                "the caller gives it one first (ObjectStore.loosen, under the lock)")
        if not self.chunked(oid):
            return [self.path(oid)]
        return [self.index_path(oid)] + sorted(self.packs.path(p) for p in self.packs_of(oid))

    def intact(self, oid: str) -> bool:
        """The stored object is present, regular and hashes to its id (False on any damage)."""
        if self.chunked(oid):
            try:
                return self._chunked_intact(oid)
            except (MissingObject, CorruptObject):
                return False
        if self.compressed(oid):
            try:
                self._read_compressed(oid)
                return True
            except (MissingObject, CorruptObject):
                return False
        try:
            fd, st = self.open(oid)
        except MissingObject:
            try:
                hit = self._packed(oid)
                return hit is not None and self._packed_data(oid, hit) is not None
            except (CorruptObject, fsio.StorageIOError):
                return False
        except CorruptObject:
            return False
        try:
            return hash_fd(fd, st.st_size) == oid
        finally:
            os.close(fd)

    def iter_ids(self):
        """Every object file present (for verify and gc only — state comes from the journal)."""
        if not self.dir.is_dir():
            return
        for sub in sorted(self.dir.iterdir()):
            if not sub.is_dir() or sub.is_symlink():
                yield PREFIX + sub.name, sub  # not a fan-out directory: verify names it as foreign
                continue
            if len(sub.name) == 2:
                for f in sorted(sub.iterdir()):
                    # a chunk index `<hex>.c` or a compressed `<hex>.z` is the object `<hex>`
                    # (and a whole copy may sit beside it)
                    yield PREFIX + sub.name + _strip(f.name), f

    def resolve_prefix(self, prefix: str) -> str:
        p = prefix[len(PREFIX):] if prefix.startswith(PREFIX) else prefix
        if not PREFIX_RE.match(p):
            raise UnknownRef(f"unknown name or id: {prefix!r}")
        sub = self.dir / p[:2]
        found = {PREFIX + p[:2] + _strip(f.name) for f in sub.iterdir()
                 if f.name.startswith(p[2:])} if sub.is_dir() else set()
        for pack in self.packed.all():
            try:
                found |= {PREFIX + h for h in pack.prefixed(p.lower())}
            except OSError:
                continue   # an unreadable pack hides its objects (verify names it)
        matches = sorted(found)
        if not matches:
            raise UnknownRef(f"no object matches {prefix!r}")
        if len(matches) > 1:
            raise AmbiguousRef(f"{prefix!r} matches {len(matches)} objects: {', '.join(sorted(matches)[:3])}…")
        return matches[0]

    # --- reading (always verified) ------------------------------------------------------
    def get_bytes(self, oid: str, max_size: int | None = None) -> bytes:
        """The verified bytes of an object; reads no more than the file's size (or max_size)."""
        if self.chunked(oid):
            size = self.size(oid)
            if max_size is not None and size > max_size:
                raise BadInput(f"object {oid} is {size} bytes, more than the {max_size} expected here")
            return b"".join(bytes(b) for b in self.stream(oid))
        if self.compressed(oid):
            size = self.size(oid)
            if max_size is not None and size > max_size:
                raise BadInput(f"object {oid} is {size} bytes, more than the {max_size} expected here")
            return self._read_compressed(oid)
        try:
            fd, st = self.open(oid)
        except MissingObject:
            hit = self._packed_or_missing(oid)
            size = self._packed_size(oid, hit)
            if max_size is not None and size > max_size:
                raise BadInput(f"object {oid} is {size} bytes, more than the {max_size} expected here") from None
            return self._packed_data(oid, hit)
        try:
            if max_size is not None and st.st_size > max_size:
                raise BadInput(f"object {oid} is {st.st_size} bytes, more than the {max_size} expected here")
            data = fsio.read_bounded(fd, st.st_size)
        except OSError as e:
            raise fsio.io_error(e, f"reading object {oid}") from e
        finally:
            os.close(fd)
        if hash_bytes(data) != oid:
            raise CorruptObject(oid)
        return data

    def get_json(self, oid: str):
        # bounded: structured objects are never this large (Store.closure treats a larger one as
        # data), and a chunk index planted in a small object's place could otherwise declare
        # gigabytes of real, verifying chunks that are assembled before the whole hash fails
        data = self.get_bytes(oid, max_size=STRUCTURED_MAX)
        try:
            return canonical.loads(data)
        except BadInput as e:
            raise BadInput(f"object {oid} is not a structured (JSON) object", "use `ledger cat` for blobs") from e

    def verify_file(self, oid: str) -> None:
        if self.compressed(oid):
            self._read_compressed(oid)
            return
        if self.chunked(oid):
            for _ in self.stream(oid):  # names the damaged chunk, if one is
                pass
            return
        try:
            fd, st = self.open(oid)
        except MissingObject:
            self._packed_data(oid, self._packed_or_missing(oid))
            return
        try:
            ok = hash_fd(fd, st.st_size) == oid
        finally:
            os.close(fd)
        if not ok:
            raise CorruptObject(oid)

    def export_file(self, oid: str, dest: Path) -> None:
        """Stream an object to `dest`, verifying while copying; dest appears only if it is good."""
        dest = Path(dest)
        tmp = dest.with_name(f".{dest.name}.ledger-tmp-{os.getpid()}")
        if self.compressed(oid) or self.chunked(oid) or self.packed_only(oid):
            # a compressed object is read and verified before anything is written; a chunked one
            # streams, every chunk verified, then the whole (the generator raises before the end)
            pieces = [self._read_compressed(oid)] if self.compressed(oid) else self.stream(oid)  # packed: one piece
            self._export_pieces(tmp, dest, pieces)
            return
        h = blake3.blake3(max_threads=blake3.blake3.AUTO)
        try:
            fd, st = self.open(oid)
        except MissingObject:   # packed by a gc since packed_only() looked: read from its pack
            self._export_pieces(tmp, dest, [self._packed_data(oid, self._packed_or_missing(oid))])
            return
        try:
            with open(tmp, "wb") as fo:
                buf = bytearray(CHUNK)
                done = 0
                while done < st.st_size:
                    n = os.preadv(fd, [memoryview(buf)[:min(CHUNK, st.st_size - done)]], done)
                    if n == 0:
                        break
                    view = memoryview(buf)[:n]
                    h.update(view)
                    fo.write(view)
                    done += n
                fo.flush()
                os.fsync(fo.fileno())
            if PREFIX + h.hexdigest() != oid:
                raise CorruptObject(oid)
            os.replace(tmp, dest)
        finally:
            os.close(fd)
            if tmp.exists():
                tmp.unlink()

    @staticmethod
    def _export_pieces(tmp: Path, dest: Path, pieces) -> None:
        """Write verified pieces to tmp, fsync, rename to dest (a piece raising leaves no dest)."""
        try:
            with open(tmp, "wb") as fo:
                for data in pieces:
                    fo.write(data)
                fo.flush()
                os.fsync(fo.fileno())
            os.replace(tmp, dest)
        finally:
            if tmp.exists():
                tmp.unlink()

    # --- writing (lock holder only) -----------------------------------------------------
    def _install(self, tmp: Path, oid: str, dest: Path | None = None) -> bool:
        """Rename a complete, fsynced tmp file (hashing to oid, or a chunk index of oid's bytes:
        dest is then its index path) into place. Returns False if an intact copy was there
        already. A damaged copy (wrong bytes, or a directory, link or FIFO in its place) is
        replaced atomically, and said so in `repaired`."""
        dest = dest or self.path(oid)
        try:
            present = os.lstat(dest)
        except FileNotFoundError:
            present = None
        except NotADirectoryError:
            raise self._fanout_damaged(oid) from None
        if (present is not None or self.has(oid)) and self.intact(oid):
            tmp.unlink()
            return False
        os.chmod(tmp, stat.S_IRUSR | stat.S_IRGRP | stat.S_IROTH)
        new_dir = not dest.parent.is_dir()
        dest.parent.mkdir(parents=True, exist_ok=True)
        if present is not None and stat.S_ISDIR(present.st_mode):
            # rename(2) cannot replace a directory with a file: move it out of objects/ first
            # (into tmp/, which gc empties). The object is absent for that moment, never wrong.
            os.rename(dest, fsio.tmp_path(self.tmp).with_suffix(".damaged"))
        faults.point("object.before-rename")
        os.rename(tmp, dest)  # atomic: readers see the damaged file or the good one
        faults.point("object.after-rename")
        fsio.fsync_dir(dest.parent)
        if new_dir:
            fsio.fsync_dir(self.dir)
        if present is not None:
            self.repaired.append(oid)
        return True

    def replace_damaged(self, oid: str, source: bytes | Path) -> bool:
        """Replace a missing or damaged object with a verified copy (lock holder only).

        `source` is the object's bytes or a file holding them; it must hash to `oid`
        (CorruptObject otherwise: nothing is changed). Returns True if the stored copy was
        missing or damaged and is now replaced, False if it was intact already."""
        if isinstance(source, (bytes, bytearray, memoryview)):
            data = bytes(source)
            if hash_bytes(data) != oid:
                raise CorruptObject(oid, f"the copy offered for {oid} does not hash to it", "find an intact copy")
            if self.intact(oid):
                return False
            if len(data) >= self.chunked_min:
                return self._put_chunked(_reader(data), len(data), lambda _: None, oid, share=False)[0]
            return self._write_new(data, oid, compressed=self._lexists(self.zpath(oid)))[1]
        if self.intact(oid):
            return False
        return self.put_file(Path(source), expect=oid, share=False)[2]  # refuses a copy that hashes otherwise

    def put_bytes(self, data: bytes, compressed: bool = False) -> tuple[str, bool]:
        """Store `data` (returns id, newly stored). `compressed`: a structured object, stored as
        `.z` if zstd makes it at least 1/8 smaller (Z1) — unless a whole copy is in its place
        (damaged: replaced by a whole copy, so reads, which prefer the whole copy, see it)."""
        oid = hash_bytes(data)
        if self.intact(oid):  # an existing copy is checked, so a re-put repairs a damaged one
            return oid, False
        if len(data) >= self.chunked_min:
            return oid, self._put_chunked(_reader(data), len(data), lambda _: None, oid)[0]
        return self._write_new(data, oid, compressed=compressed and not self._lexists(self.path(oid)))

    @staticmethod
    def _kind_at(p: Path) -> str | None:
        """"file" for a regular file at p, the kind of anything else there, None if nothing is."""
        try:
            mode = os.lstat(p).st_mode
        except (FileNotFoundError, NotADirectoryError):
            return None
        return "file" if stat.S_ISREG(mode) else fsio.file_kind(mode)

    @staticmethod
    def _lexists(p: Path) -> bool:
        try:
            os.lstat(p)
            return True
        except (FileNotFoundError, NotADirectoryError):
            return False

    def _put_chunked(self, read_into, size: int, on_fresh, oid: str | None = None, check=None,
                     share: bool = True) -> tuple[bool, str]:
        """Store an object of `size` bytes as chunks (ledger/store/chunks.py). `read_into(view,
        offset)` fills `view` with the bytes at `offset` and returns how many it read;
        `on_fresh(view)` sees each block as it is read (the caller's whole-content hash, on a
        worker beside the chunking) and may return a future that must finish before the block's
        buffer is reused. `oid`, if known, is the id, else `check()` returns it after the last
        block (and may refuse). Order: new chunks and pages into one pack in tmp/, fsynced and
        renamed into packs/; then the index fsynced and renamed into objects/ (the object's
        commit point). Returns (newly stored, id)."""
        pack = chunks.PackWriter(self.packs, share)
        # two buffers, each a block plus room for the chunk the previous block ended in (a
        # cut forced by the block's end is re-cut with the next block's bytes after it): no
        # block is ever copied, only that one chunk
        bufs = [bytearray(CHUNK + chunks.MAX_SIZE), bytearray(CHUNK + chunks.MAX_SIZE)]
        pending: list = []
        try:
            entries: list[tuple[bytes, tuple]] = []
            carry, done, k, prev = 0, 0, 0, None
            while done < size:
                if len(pending) > 1:
                    pending.pop(0).result()    # the buffer about to be refilled is hashed
                buf = memoryview(bufs[k % 2])
                if carry:
                    buf[:carry] = prev[-carry:]
                n = read_into(buf[carry:carry + min(CHUNK, size - done)], done)
                if n == 0:
                    break  # the source shrank: check() refuses it
                done += n
                k += 1
                fut = on_fresh(buf[carry:carry + n])
                if fut is not None:
                    pending.append(fut)
                window = buf[:carry + n]
                cuts = chunks.cut(window)
                carry = 0
                for i, (off, m) in enumerate(cuts):
                    if i == len(cuts) - 1 and done < size:
                        carry = m
                        break
                    view = window[off:off + m]
                    d = blake3.blake3(view).digest()
                    entries.append((d, pack.locate(d, view)))
                pack.flush()                   # before this buffer is refilled
                prev = window
            for f in pending:
                f.result()
            if carry:  # the source shrank mid-read: stored anyway only to be refused by check()
                view = prev[-carry:]
                d = blake3.blake3(view).digest()
                entries.append((d, pack.locate(d, view)))
            oid = oid or check()
            pages = [(d, cov, k, pack.locate(d, body)) for d, body, cov, k in chunks.build_pages(entries)]
            pack.flush()
            faults.point("chunks.written")
            pack.close()
        except OSError as e:
            pack.abort()
            raise fsio.io_error(e, "writing a pack") from e
        except BaseException:
            pack.abort()
            raise
        return self._install_index(oid, sum(loc[2] for _, loc in entries), pages, chunks.list_digest(entries))

    def _install_index(self, oid: str, total: int, pages, listed: str) -> tuple[bool, str]:
        """Write a chunked object's index to tmp/, fsync it and rename it into objects/ (the
        object's commit point; its pack is durable already). Returns (newly stored, id).
        `listed` is its chunk list's digest, of chunks this write named from the bytes whose
        hash is the id: remembered for the record (self.lists) when this index is the one
        installed."""
        tmp = fsio.tmp_path(self.tmp)
        try:
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
            try:
                fsio.write_all(fd, chunks.index_bytes(total, pages), "writing a chunk index")
                faults.point("object.before-fsync")
                os.fsync(fd)
            finally:
                os.close(fd)
            new = self._install(tmp, oid, self.index_path(oid))
            if new:
                self.lists[oid] = listed
            return new, oid
        except OSError as e:
            tmp.unlink(missing_ok=True)
            raise fsio.io_error(e, "writing a chunk index") from e
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise

    def _write_new(self, data: bytes, oid: str, compressed: bool = False) -> tuple[str, bool]:
        dest = None
        if compressed:
            z = compress.encode(data)
            if z is not None:
                data, dest = z, self.zpath(oid)
        tmp = fsio.tmp_path(self.tmp)
        try:
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
            try:
                fsio.write_all(fd, data, "writing an object")
                faults.point("object.before-fsync")
                os.fsync(fd)
            finally:
                os.close(fd)
            return oid, self._install(tmp, oid, dest)
        except OSError as e:
            tmp.unlink(missing_ok=True)
            raise fsio.io_error(e, "writing an object") from e
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise

    @staticmethod
    def _open_source(src: Path) -> tuple[int, os.stat_result]:
        """Open a file being added: a user's file, possibly changing under us. Its absence or
        strangeness is bad input, not an I/O error of the store."""
        try:
            return fsio.open_regular(src)
        except FileNotFoundError:
            raise BadInput(f"{src} vanished while it was being added", "retry when nothing is changing it") from None
        except fsio.NotRegular as e:
            raise BadInput(f"{src} is a {e.kind}, not a regular file",
                           "ledger stores regular files only; remove links and special files") from None
        except OSError as e:
            raise BadInput(f"cannot read {src}: {e.strerror}", "check its permissions") from None

    def put_file(self, src: Path, progress=None, expect: str | None = None,
                 expect_stat: tuple | None = None, share: bool = True) -> tuple[str, int, bool]:
        """Copy a file into the store, hashing while copying. Memory stays small. A file of at
        least `chunked_min` bytes is stored as chunks instead (_put_file_chunked).

        The copy is done by the kernel (copy_file_range, as `cp` does), so its cost is the
        disk's. A worker thread hashes each copied window of the *destination* straight from
        the page cache through a short-lived memory map (no extra copy; multi-threaded BLAKE3,
        GIL released), so the id is the hash of exactly the bytes stored. The destination is
        ours alone, so no one can truncate it under the map. A source that changes during the
        copy is refused, and so is one that is not the file `expect_stat` (dev, ino, size,
        mtime_ns) describes: the stat cache keys the entry by that stat.
        """
        src = Path(src)
        fd_in, st0 = self._open_source(src)
        if expect_stat is not None and (st0.st_dev, st0.st_ino, st0.st_size, st0.st_mtime_ns) != tuple(expect_stat):
            os.close(fd_in)
            raise BadInput(f"{src} changed while it was being added", "retry when nothing is writing to it")
        if st0.st_size >= self.chunked_min:
            try:
                return self._put_file_chunked(src, fd_in, st0, progress, expect, share)
            finally:
                os.close(fd_in)
        tmp = fsio.tmp_path(self.tmp)
        h = blake3.blake3(max_threads=blake3.blake3.AUTO)
        try:
            fd = os.open(tmp, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o644)
            try:
                from concurrent.futures import ThreadPoolExecutor  # only large files need it (import: ~9 ms)

                with ThreadPoolExecutor(1) as pool:  # one worker: windows are hashed in order
                    pending = []
                    self._copy(fd_in, fd, st0.st_size, progress,
                               on_window=lambda off, n: pending.append(pool.submit(_hash_window, h, fd, off, n)))
                    for f in pending:
                        f.result()
                faults.point("object.before-fsync")
                os.fsync(fd)
            finally:
                os.close(fd)
            st1 = os.fstat(fd_in)
            if (st0.st_size, st0.st_mtime_ns) != (st1.st_size, st1.st_mtime_ns) or os.stat(tmp).st_size != st0.st_size:
                raise BadInput(f"{src} changed while it was being added", "retry when nothing is writing to it")
            oid = PREFIX + h.hexdigest()
            if expect is not None and oid != expect:
                raise CorruptObject(expect, f"the copy offered for {expect} ({src}) does not hash to it",
                                    "find an intact copy")
            return oid, st0.st_size, self._install(tmp, oid)
        except OSError as e:
            tmp.unlink(missing_ok=True)
            raise fsio.io_error(e, f"adding {src}") from e
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise
        finally:
            os.close(fd_in)

    def _put_file_chunked(self, src: Path, fd_in: int, st0: os.stat_result, progress, expect,
                          share: bool = True) -> tuple[str, int, bool]:
        """put_file for a large file. The bytes are copied by the kernel into a file of our own
        in tmp/ (copy_file_range, as `cp` does: user-space copies cost ~2x on this VM), and a
        worker hashes and cuts each copied window of *that* file from the page cache, so the id
        and every chunk's name are of exactly the bytes stored. Then: if most chunks are in the
        store already (a new version), only the new ones are copied into a new pack and the
        copy is dropped; otherwise the copy itself becomes the pack (pages and trailer appended)."""
        from concurrent.futures import ThreadPoolExecutor  # only large files need it (import: ~9 ms)

        size = st0.st_size
        h = blake3.blake3(max_threads=blake3.blake3.AUTO)
        pos = [0]                                # where the chunk not yet cut starts
        named: list = []                         # futures of [(digest, offset in the copy, length)], in order

        # Three passes of CPU over the bytes (the whole hash, the cut, each chunk's hash; ~0.8,
        # 1.0 and 0.9 s a GiB each on this VM) run on separate threads while the kernel copies:
        # the whole hash in window order on one, the cut in window order on another, and the
        # chunks' hashes, half a window each, on two more (BLAKE3 releases the GIL). Run one
        # after the other on one worker, they were the add's critical path; and on a machine
        # shared with other work, more runnable threads also get more of the CPU.
        def cut_window(fd: int, off: int, n: int) -> None:
            # MAP bytes at a time (plus the chunk the previous piece ended in): RSS stays bounded
            for end in [*range(off + MAP, off + n, MAP), off + n]:
                start = pos[0]
                base = start - start % mmap.ALLOCATIONGRANULARITY
                with mmap.mmap(fd, end - base, offset=base, access=mmap.ACCESS_READ) as m:
                    view = memoryview(m)[start - base:]
                    try:
                        cuts = chunks.cut(view)
                    finally:
                        view.release()
                last = len(cuts) - 1 if end < size else len(cuts)  # a cut forced by the piece's end waits
                mine = [(start + co, cn) for co, cn in cuts[:last]]
                pos[0] = start + cuts[last][0] if last < len(cuts) else end
                half = (len(mine) + 1) // 2
                for part in (mine[:half], mine[half:]):
                    if part:
                        named.append(names.submit(_hash_chunks, fd, part))

        tmp = fsio.tmp_path(self.tmp)
        fd = None
        try:
            fd = os.open(tmp, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o644)
            with ThreadPoolExecutor(1) as hasher, ThreadPoolExecutor(1) as cutter, ThreadPoolExecutor(2) as names:
                pending = []

                def on_window(off: int, n: int) -> None:
                    pending.append(hasher.submit(_hash_window, h, fd, off, n))
                    pending.append(cutter.submit(cut_window, fd, off, n))
                self._copy(fd_in, fd, size, progress, on_window=on_window)
                for f in pending:
                    f.result()
                cut: list[tuple[bytes, int, int]] = [c for f in named for c in f.result()]
            st1 = os.fstat(fd_in)
            if (st0.st_size, st0.st_mtime_ns) != (st1.st_size, st1.st_mtime_ns) or os.fstat(fd).st_size != size \
                    or pos[0] != size:
                raise BadInput(f"{src} changed while it was being added", "retry when nothing is writing to it")
            oid = PREFIX + h.hexdigest()
            if expect is not None and oid != expect:
                raise CorruptObject(expect, f"the copy offered for {expect} ({src}) does not hash to it",
                                    "find an intact copy")
            if self.has(oid) and self.intact(oid):
                return oid, size, False
            pack = chunks.PackWriter(self.packs, share)
            try:
                held = sum(n for d, _, n in cut if (pack.known.get(d) or (None, 0, -1))[2] == n)
                if 2 * held >= size:
                    # mostly here already: copy only the new chunks (from our copy, in the kernel)
                    entries = [(d, pack.copy(d, fd, off, n)) for d, off, n in cut]
                else:
                    # mostly new: our copy is the pack, its chunks where they already are
                    pack.adopt(tmp, fd, cut, size)
                    fd = None   # the pack owns it now
                    entries = [(d, pack.mine[d]) for d, _, _ in cut]
                pages = [(d, cov, k, pack.locate(d, body)) for d, body, cov, k in chunks.build_pages(entries)]
                pack.flush()
                faults.point("chunks.written")
                pack.close()
            except BaseException:
                pack.abort()
                raise
            new, oid = self._install_index(oid, size, pages, chunks.list_digest(entries))
            return oid, size, new
        except OSError as e:
            raise fsio.io_error(e, f"adding {src}") from e
        finally:
            if fd is not None:
                os.close(fd)
            tmp.unlink(missing_ok=True)

    @staticmethod
    def _copy(fd_in: int, fd_out: int, size: int, progress, on_window) -> None:
        """Copy `size` bytes of fd_in (the caller's, opened safely) to fd_out's position."""
        step = 64 << 20
        done = 0
        kernel = True
        while done < size:
            faults.io_check("copying a file into the store")
            if kernel:
                try:
                    n = os.copy_file_range(fd_in, fd_out, min(step, size - done), done)
                except OSError as e:
                    if e.errno not in (errno.EXDEV, errno.ENOSYS, errno.EOPNOTSUPP, errno.EINVAL) or done:
                        raise
                    kernel = False  # this filesystem pair can't copy in-kernel: plain reads and writes
                    continue
            else:
                data = os.pread(fd_in, min(CHUNK, size - done), done)
                n = len(data)
                if n:
                    fsio.write_all(fd_out, data, "copying a file into the store")
            if n == 0:
                break  # the file shrank: caught by the size check after the copy
            on_window(done, n)
            done += n
            if progress:
                progress(n)

    def remove(self, oid: str) -> None:
        """Unlink the object's file (a whole copy and a chunk index alike); its chunks are gc's."""
        removed = False
        for p in (self.path(oid), self.index_path(oid), self.zpath(oid)):
            try:
                p.unlink()
                removed = True
            except FileNotFoundError:
                pass
        if not removed:
            raise FileNotFoundError(self.path(oid))


