"""Packed objects: many small objects in one file (docs/store-format.md, "Packed objects").

A year of turns is millions of objects of a few hundred bytes each. As one file each they take a
4 KiB block apiece (3.9 GB on disk for 531 MB of content at 1M records), and a pass over the
history opens, stats, reads and closes every one of them — from the disk, at random, once the
store outgrows the page cache. `ledger gc --prune` therefore moves small objects (whole or
compressed, at most MAX_STORED bytes as stored) into packs: `packed/<32 hex>.pack`, written once,
their bytes in the order the journal names them, so a pass over the history reads each pack
front to back.

Pack layout (big-endian):

    header   "ledger-packed\\0\\0\\1" (16 B)
    bytes    each object's stored bytes, back to back (a whole object's content, or a
             compressed object's whole `.z` file: store/compress.py)
    entries  per object, sorted by digest (strictly ascending): digest 32 B, offset u64,
             length u32, form u8 (0 whole, 1 compressed), 3 zero bytes (48 B)
    footer   count u64, "ledger-pkidx\\0\\0\\0\\1" (16 B)

A pack is a cache of objects, never an authority: every object read from one is rehashed against
its id (decompressed first, bounded, if compressed), exactly as a loose file is. A pack whose
header, footer or entry table does not add up holds nothing (its objects read as missing, and
verify names it); an entry pointing outside the pack's bytes is CorruptObject for that object.
Entries are found by binary search, so an unsorted table can only hide an entry, never return
another object's bytes as this one's (the hash would refuse them anyway). Packs are opened as
every store file is (fsio.open_regular: no link, no FIFO), never mapped (a shrunk file would be
SIGBUS): entries and bytes are read with pread, bounded by the size fstat gave.
"""

from __future__ import annotations

import bisect
import os
import re
import struct
import threading
from dataclasses import dataclass
from pathlib import Path

from ledger.errors import StoreCorrupt
from ledger.store import fsio

DIR = "packed"
SUFFIX = ".pack"
MAGIC = b"ledger-packed\x00\x00\x01"
FOOT_MAGIC = b"ledger-pkidx\x00\x00\x00\x01"
ENTRY = struct.Struct(">32sQIB3x")   # digest, offset, length, form
FOOT = struct.Struct(">Q16s")        # count, FOOT_MAGIC
WHOLE, COMPRESSED = 0, 1
MAX_STORED = 64 << 10      # larger objects stay files of their own: packing them gains little
MAX_ENTRIES = 1 << 20      # per pack: its entry table (48 MiB) is read in pieces, never whole
MIN_LOOSE = 256            # gc --prune packs once at least this many small objects are loose
MAX_PACKS = 8              # more than this many packs are merged into one by gc --prune
MAX_FILES = 256           # packs a store may hold (256M objects); more is damage, never opened (descriptors)
GONE_KEPT = 16            # descriptors of rewritten packs kept open for reads under way (Packs.gone)
NAME_RE = re.compile(r"[0-9a-f]{32}\.pack")   # fullmatch only


@dataclass(frozen=True)
class Loc:
    """Where one packed object's stored bytes are."""
    pack: str          # the pack's file name
    offset: int
    length: int
    form: int          # WHOLE or COMPRESSED


class Pack:
    """One open pack: its descriptor, size and entry table's place (checked to add up)."""

    def __init__(self, path: Path):
        self.path = path
        self.name = path.name
        self.fd, st = fsio.open_regular(path)   # raises NotRegular / OSError: the caller skips it
        try:
            self.size = st.st_size
            self.count, self.table = self._layout()
        except BaseException:
            os.close(self.fd)
            raise
        self.data_end = self.table   # an entry's bytes must lie in [len(MAGIC), table)

    def _layout(self) -> tuple[int, int]:
        """(count, offset of the entry table); ValueError if the header or footer is wrong."""
        if self.size < len(MAGIC) + FOOT.size:
            raise ValueError("shorter than a header and a footer")
        if os.pread(self.fd, len(MAGIC), 0) != MAGIC:
            raise ValueError("not a pack's header")
        foot = os.pread(self.fd, FOOT.size, self.size - FOOT.size)
        if len(foot) != FOOT.size:
            raise ValueError("its footer cannot be read")
        count, magic = FOOT.unpack(foot)
        if magic != FOOT_MAGIC:
            raise ValueError("not a pack's footer")
        if count > MAX_ENTRIES or len(MAGIC) + count * ENTRY.size + FOOT.size > self.size:
            raise ValueError(f"its footer declares {count} entries, more than it can hold")
        return count, self.size - FOOT.size - count * ENTRY.size

    def digest_at(self, i: int) -> bytes:
        return os.pread(self.fd, 32, self.table + i * ENTRY.size)

    def find(self, digest: bytes) -> Loc | None:
        """The entry for `digest` (binary search over the sorted table), or None."""
        return next(self.find_all(digest), None)

    def find_all(self, digest: bytes):
        """Every entry for `digest` (a planted table may repeat one), from the first in order."""
        i = bisect.bisect_left(range(self.count), digest, key=self.digest_at)
        while i < self.count:
            raw = os.pread(self.fd, ENTRY.size, self.table + i * ENTRY.size)
            if len(raw) != ENTRY.size:
                return   # cut short under us: what is left of it holds nothing
            d, off, n, form = ENTRY.unpack(raw)
            if d != digest:
                return
            yield Loc(self.name, off, n, form)
            i += 1

    def prefixed(self, prefix: str, most: int = 2) -> list[str]:
        """Hex digests in this pack starting with the hex `prefix` (at most `most`)."""
        lo = bytes.fromhex((prefix + "0" * 64)[:64])
        i = bisect.bisect_left(range(self.count), lo, key=self.digest_at)
        out: list[str] = []
        while i < self.count and len(out) < most:
            h = self.digest_at(i).hex()
            if not h.startswith(prefix):
                break
            if h not in out:   # a planted table may repeat a digest: distinct ids only
                out.append(h)
            i += 1
        return out

    def problem(self, loc: Loc) -> str | None:
        """Why an entry cannot be read (None if its place is sound)."""
        if loc.form not in (WHOLE, COMPRESSED):
            return f"an entry of unknown form {loc.form}"
        if loc.length > MAX_STORED:
            return f"an entry of {loc.length} bytes, more than a packed object can be"
        if loc.offset < len(MAGIC) or loc.offset + loc.length > self.data_end:
            return f"an entry outside its bytes (offset {loc.offset}, {loc.length} bytes)"
        return None

    def read(self, loc: Loc) -> bytes:
        """The stored bytes of an entry whose place problem() passed (ValueError if the file
        gives fewer: it shrank)."""
        data = fsio.read_bounded_at(self.fd, loc.length, loc.offset)
        if len(data) != loc.length:
            raise ValueError(f"it ends before byte {loc.offset + loc.length}")
        return data

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1


class Packs:
    """The store's packs, opened on first use and looked at again when an object is not found in
    them (a gc may have packed it since: its loose file is gone only after its pack is durable)."""

    def __init__(self, root: Path):
        self.dir = root / DIR
        self.open: dict[str, Pack] = {}
        self.bad: dict[str, str] = {}      # pack name -> why it holds nothing (verify names it)
        self.listed: frozenset | None = None
        self.gone: list[Pack] = []
        self._lock = threading.RLock()   # find() and all() see the packs of one refresh()

    def names(self) -> list[str]:
        """The pack file names present (others in packed/ are not packs: verify names them)."""
        try:
            names = sorted(n for n in os.listdir(self.dir) if NAME_RE.fullmatch(n))
        except (FileNotFoundError, NotADirectoryError):
            return []
        except OSError as e:
            raise fsio.io_error(e, f"listing {self.dir}") from e
        if len(names) > MAX_FILES:
            raise StoreCorrupt(f"{self.dir} holds {len(names)} packs, more than the {MAX_FILES} a store makes "
                               "(planted?)", f"move {self.dir} aside; then `ledger verify` names what is missing")
        return names

    def refresh(self) -> bool:
        """Open the packs that appeared, forget those gone; whether anything changed."""
        with self._lock:
            return self._refresh()

    def _refresh(self) -> bool:
        names = frozenset(self.names())
        if names == self.listed:
            return False
        for gone in set(self.open) - names:
            # a rewritten pack: no longer asked, but its descriptor is closed only by close(), so
            # a read another thread is making from it (an unlinked file stays readable) never
            # meets a closed or reused descriptor
            self.gone.append(self.open.pop(gone))
        while len(self.gone) > GONE_KEPT:
            self.gone.pop(0).close()
        for gone in set(self.bad) - names:
            del self.bad[gone]
        for n in sorted(names - set(self.open) - set(self.bad)):
            try:
                self.open[n] = Pack(self.dir / n)
            except fsio.NotRegular as e:
                self.bad[n] = f"a {e.kind}, not a pack"
            except ValueError as e:
                self.bad[n] = str(e)
            except OSError as e:
                self.bad[n] = f"unreadable ({e.strerror})"
        self.listed = names
        return True

    def find(self, digest: bytes) -> tuple[Pack, Loc] | None:
        """The first pack and entry holding `digest`, looking at the directory again on a miss."""
        return next(iter(self.find_all(digest)), None)

    def find_all(self, digest: bytes) -> list[tuple[Pack, Loc]]:
        """Every (pack, entry) holding `digest`, in pack order (a crash mid-rewrite leaves two
        copies: a reader takes the first that verifies), looking at the directory again on a miss."""
        with self._lock:
            if self.listed is None:
                self._refresh()
            for again in (False, True):
                if again and not self._refresh():
                    return []
                hits = []
                for pack in self.open.values():
                    try:
                        hits += [(pack, loc) for loc in pack.find_all(digest)]
                    except OSError:
                        continue   # an unreadable table hides its entries; verify reports the pack
                if hits:
                    return hits
            return []

    def all(self) -> list[Pack]:
        with self._lock:
            if self.listed is None:
                self._refresh()
            return [self.open[n] for n in sorted(self.open)]

    def close(self) -> None:
        with self._lock:
            for p in [*self.open.values(), *self.gone]:
                p.close()
            self.open, self.bad, self.listed, self.gone = {}, {}, None, []
