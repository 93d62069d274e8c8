"""gc's packing step: small loose objects into packs, packs rid of what gc removes (P3, P4).

Runs inside `gc --prune`, under the store lock, after gc has judged what stays. Three things,
each only when it is due:
  * **pack**: at least packed.MIN_LOOSE small objects (whole, or compressed, at most
    packed.MAX_STORED bytes as stored) have files of their own: each is read, rehashed, and
    appended to a new pack in the order it was written (its file's mtime: the journal's order,
    which is the order every pass over the history reads them); the pack is made durable, and
    only then are the loose files it holds removed. A loose object that does not hash to its id
    stays where it is (verify names it).
  * **drop**: a pack holding an object gc removes (unreachable, or pruned by the retention
    policy) is rewritten without it.
  * **merge**: more than packed.MAX_PACKS small packs (under a quarter of MAX_ENTRIES entries:
    those a later gc adds) are rewritten into one, oldest first.
A rewrite copies each kept entry's stored bytes, verified as they are read, into the new pack;
a damaged entry stops it (CorruptObject naming the object and the pack) before any pack is
removed. The new pack is durable before an old one goes: a crash leaves an object in two places,
both verified on every read, never in none.
"""

from __future__ import annotations

import os
import stat
from dataclasses import dataclass, field

import numpy as np

from ledger.errors import CorruptObject, StoreCorrupt
from ledger.store import compress, faults, fsio, packed, reach, statcache
from ledger.store.ids import PREFIX, hash_bytes


@dataclass(frozen=True)
class PackResult:
    """What the packing step did."""
    objects: int = 0          # loose objects moved into packs
    written: int = 0          # packs written
    replaced: int = 0         # packs removed after their live entries were rewritten
    skipped: str | None = None  # why it did not run (said to the user)


_PART = (1 << 20) // packed.ENTRY.size   # entries of a table read at once (1 MiB)
_TABLE = np.dtype([("key", ">u8"), ("rest", "V24"), ("off", ">u8"), ("len", ">u4"), ("form", "u1"), ("pad", "V3")])


@dataclass(frozen=True)
class Part:
    """A piece of a pack's entry table, as arrays (numpy compares "S32" values as bytes padded
    with zeros, which for values of one length is comparing the bytes; an element read back is
    stripped of its trailing zeros, so a digest is taken from `raw`, never from `digests`)."""
    raw: bytes
    digests: np.ndarray   # "S32", for order only
    keys: np.ndarray      # uint64: a digest's first 8 bytes (reach.key)
    off: np.ndarray
    len: np.ndarray
    form: np.ndarray

    def digest(self, i: int) -> bytes:
        return self.raw[i * packed.ENTRY.size:i * packed.ENTRY.size + 32]


def table_parts(pack: packed.Pack):
    """A pack's entry table a Part at a time (ValueError / OSError: it cannot be read)."""
    for at in range(0, pack.count, _PART):
        k = min(_PART, pack.count - at)
        raw = fsio.read_bounded_at(pack.fd, k * packed.ENTRY.size, pack.table + at * packed.ENTRY.size)
        if len(raw) != k * packed.ENTRY.size:
            raise ValueError("its entry table shrank while it was read")
        t = np.frombuffer(raw, dtype=_TABLE)
        yield Part(raw, np.ndarray((k,), dtype="S32", buffer=raw, strides=(packed.ENTRY.size,)),
                   t["key"].astype(np.uint64), t["off"].astype(np.uint64), t["len"].astype(np.uint64), t["form"])


def unsorted(part: Part, before: bytes | None) -> bool:
    """The piece's digests are not strictly ascending (`before`: the previous piece's last): a
    binary search could miss an entry, or find a planted second one first."""
    d = part.digests
    return bool((len(d) > 1 and not (d[1:] > d[:-1]).all()) or (before is not None and len(d) and not part.digest(0) > before))


def misplaced(pack: packed.Pack, part: Part) -> np.ndarray:
    """A mask: entries whose bytes lie outside the pack's, of an unknown form or too large."""
    return ((part.off < len(packed.MAGIC)) | (part.len > packed.MAX_STORED) | (part.off > pack.data_end)
            | (part.off + part.len > pack.data_end) | (part.form > packed.COMPRESSED))


def unsound(pack: packed.Pack, part: Part, before: bytes | None) -> str | None:
    """What is wrong with a piece of a pack's table, if anything (unsorted, or an entry misplaced)."""
    if unsorted(part, before):
        return "its entries are not sorted by digest"
    bad = misplaced(pack, part)
    if bad.any():
        i = int(np.flatnonzero(bad)[0])
        return f"its entry for b3:{part.digest(i).hex()} lies outside its bytes, is of an unknown form or is too large"
    return None


def sound(pack: packed.Pack) -> bool:
    """The pack's table is sorted, every entry in its place and none overlapping another: what gc
    may remove entries from or rewrite. A pack that is not holds what it holds until verify's
    report is acted on (a planted table declaring a million entries is never listed or copied)."""
    try:
        parts, before = list(table_parts(pack)), None
        for part in parts:
            if unsound(pack, part, before):
                return False
            before = part.digest(len(part.keys) - 1)
        return overlap(parts, [misplaced(pack, p) for p in parts]) is None
    except (OSError, ValueError):
        return False


def overlap(parts: list, masks: list | None = None) -> int | None:
    """The offset of an entry whose bytes overlap the next one's, if any (a writer never makes
    one: a planted table repeating one compressed frame would cost its decompression each time);
    `masks`: entries left out (misplaced ones)."""
    if not parts:
        return None
    keep = np.concatenate([~m for m in masks]) if masks is not None else slice(None)
    off = np.concatenate([p.off for p in parts])[keep]
    n = np.concatenate([p.len for p in parts])[keep]
    order = np.argsort(off, kind="stable")
    off, n = off[order], n[order]
    bad = np.flatnonzero(off[:-1] + n[:-1] > off[1:])
    return int(off[bad[0]]) if len(bad) else None


def table_keys(pack: packed.Pack) -> np.ndarray:
    """The 64-bit keys (reach.key: a digest's first 8 bytes) of a pack's entries, in table
    order (ValueError / OSError on a table that cannot be read)."""
    keys = [part.keys for part in table_parts(pack)]
    return np.concatenate(keys) if keys else np.zeros(0, dtype=np.uint64)


def _holds_any(pack: packed.Pack, keys: np.ndarray) -> bool:
    try:
        return bool(reach.member(keys, table_keys(pack)).any())
    except (OSError, ValueError):
        return False   # an unreadable table: left as it is (verify names the pack)


def _sound_packs(store) -> list:
    return [p for p in store.objects.packed.all() if sound(p)]


SLICE = packed.MAX_ENTRIES // 2   # loose objects judged at once: a pack of them stays above the merge's "small"


@dataclass(frozen=True)
class Candidates:
    """Loose small objects that stay, oldest first, as arrays (about 50 bytes an object: at a
    million of them a list of tuples took ~500 MB, RESULTS session 16): their digests back to
    back in `raw` (in listing order), `order` (which digest is i-th oldest), their forms, and
    which were packed (filled by run)."""
    raw: bytes
    order: np.ndarray
    form: np.ndarray
    moved: np.ndarray
    damaged_packed: list = field(default_factory=list)   # (pack, digest): a pack's damaged copy of a good loose one

    def __len__(self) -> int:
        return len(self.order)

    def digest(self, i: int) -> bytes:
        at = 32 * int(self.order[i])
        return self.raw[at:at + 32]


def loose_slices(store, going: set[str]):
    """The loose small objects that stay (module doc), as Candidates of at most about
    packed.MAX_ENTRIES objects each (whole fan-out directories; so memory stays bounded however
    many are loose), each in the order its files were written; an object held both whole and
    compressed is taken whole (the copy reads prefer)."""
    digests, mtimes, forms, count = [], [], [], 0
    for d in reach.listing(store):
        z = d.suffixed(compress.SUFFIX)
        c = d.suffixed(".c")
        dig, mt, fm = bytearray(), [], []
        for i in np.flatnonzero(~c):
            i = int(i)
            oid = d.id(i)
            if oid in going:
                continue
            try:
                st = os.lstat(d.path(i))
            except FileNotFoundError:
                continue
            if not stat.S_ISREG(st.st_mode) or st.st_size > packed.MAX_STORED or (not z[i] and st.st_size == 0):
                continue   # not a plain file (verify names it), too large to gain, or the empty object
            dig += bytes.fromhex(oid[len(PREFIX):])
            mt.append(st.st_mtime_ns)
            fm.append(packed.COMPRESSED if z[i] else packed.WHOLE)
        if mt:
            digests.append(bytes(dig))
            mtimes.append(np.array(mt, dtype=np.int64))
            forms.append(np.array(fm, dtype=np.uint8))
            count += len(mt)
        if count >= SLICE:
            yield _ordered(digests, mtimes, forms)
            digests, mtimes, forms, count = [], [], [], 0
    if count:
        yield _ordered(digests, mtimes, forms)


def _ordered(digests: list, mtimes: list, forms: list) -> Candidates:
    raw = b"".join(digests)
    digests.clear()
    mtime, form = np.concatenate(mtimes), np.concatenate(forms)
    d = np.frombuffer(raw, dtype="S32")
    by_id = np.lexsort((form, d))    # whole (0) before compressed (1) of one id
    keep = np.ones(len(d), dtype=bool)
    keep[by_id[1:][d[by_id[1:]] == d[by_id[:-1]]]] = False
    del by_id, d
    order = np.flatnonzero(keep)
    order = order[np.argsort(mtime[order], kind="stable")]
    return Candidates(raw, order, form[order], np.zeros(len(order), dtype=bool))


class Writer:
    """A new pack in tmp/: stored bytes appended in the order given (4 MiB writes), its entries
    kept as packed.ENTRY records (48 bytes each) and sorted by digest at the end, a second entry
    of one digest dropped. finish() makes it durable under packed/ before any caller removes a
    loose copy (P3)."""

    def __init__(self, root):
        self.root = root
        self.tmp = fsio.tmp_path(root / "tmp")
        self.fd = os.open(self.tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o644)
        self.at = 0
        self.table = bytearray()
        self._buf: list = []
        self._buffered = 0
        self._write(packed.MAGIC)

    def _write(self, data) -> None:
        self._buf.append(data)
        self._buffered += len(data)
        self.at += len(data)
        if self._buffered >= 4 << 20:
            self._flush()

    def _flush(self) -> None:
        if self._buf:
            fsio.write_all(self.fd, b"".join(self._buf), "writing a pack of objects")
            self._buf, self._buffered = [], 0

    def add(self, digest: bytes, stored: bytes, form: int) -> None:
        """Append one object's stored bytes (verified by the caller)."""
        self.table += packed.ENTRY.pack(digest, self.at, len(stored), form)
        self._write(stored)

    def __len__(self) -> int:
        return len(self.table) // packed.ENTRY.size

    def finish(self):
        """Write the sorted entries and the footer, fsync, rename into packed/ and fsync the
        directory; the pack's path. None (and nothing left behind) if nothing was added."""
        try:
            if not self.table:
                self.abort()
                return None
            rec = np.frombuffer(self.table, dtype=[("d", "S32"), ("rest", "V16")])
            order = np.argsort(rec["d"], kind="stable")
            d = rec["d"][order]
            order = order[np.concatenate(([True], d[1:] != d[:-1]))]   # one entry a digest
            del d
            for at in range(0, len(order), 1 << 16):
                self._write(rec[order[at:at + (1 << 16)]].tobytes())
            self._write(packed.FOOT.pack(len(order), packed.FOOT_MAGIC))
            self._flush()
            faults.point("packed.before-fsync")
            os.fsync(self.fd)
            os.close(self.fd)
            self.fd = -1
            dest_dir = self.root / packed.DIR
            new_dir = not dest_dir.is_dir()
            dest_dir.mkdir(exist_ok=True)
            if new_dir:
                fsio.fsync_dir(self.root)
            dest = dest_dir / f"{os.urandom(16).hex()}{packed.SUFFIX}"
            os.chmod(self.tmp, 0o444)
            os.rename(self.tmp, dest)
            fsio.fsync_dir(dest_dir)
            faults.point("packed.after-rename")
            return dest
        except BaseException:
            self.abort()
            raise

    def abort(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1
        try:
            os.unlink(self.tmp)
        except FileNotFoundError:
            pass


def _intact_in_pack(store, cand: Candidates, i: int) -> bool:
    oid = PREFIX + cand.digest(i).hex()
    hit = store.objects._packed(oid)
    try:
        return hit is not None and store.objects._packed_data(oid, hit) is not None
    except (CorruptObject, fsio.StorageIOError):
        return False


def _stored_loose(store, hexid: str, form: int) -> bytes | None:
    """A loose object's stored bytes if they verify (None: damaged or gone; verify names it)."""
    oid = PREFIX + hexid
    path = store.objects.zpath(oid) if form == packed.COMPRESSED else store.objects.path(oid)
    try:
        raw = fsio.read_small(path, packed.MAX_STORED)
    except (OSError, ValueError, fsio.NotRegular):
        return None
    try:
        data = compress.decode(raw, oid, path) if form == packed.COMPRESSED else raw
    except CorruptObject:
        return None
    return raw if hash_bytes(data) == oid else None


def _stored_packed(store, pack: packed.Pack, digest: bytes, loc: packed.Loc) -> bytes | None:
    """A packed entry's stored bytes, verified. Damaged: None (the entry is left out) where an
    intact copy is held elsewhere (a file of its own, another pack: a repair, or a crash's
    second copy), else CorruptObject, which stops the rewrite before any pack is removed."""
    oid = PREFIX + digest.hex()
    try:
        return store.objects._one_copy(oid, (pack, loc))[0]
    except CorruptObject:
        if _own_file_intact(store, oid) or any(h[0] is not pack and _verifies(store, oid, h)
                                               for h in store.objects.packed.find_all(digest)):
            return None
        raise


def _verifies(store, oid: str, hit) -> bool:
    try:
        store.objects._one_copy(oid, hit)
        return True
    except (CorruptObject, fsio.StorageIOError):
        return False


def _own_file_intact(store, oid: str) -> bool:
    return statcache.has_object(store.objects.path(oid)) and store.objects.intact(oid)


def _by_offset(pack: packed.Pack):
    """(digest, Loc) of a pack's entries in the order their bytes lie: the order they were
    written, which a rewrite keeps."""
    parts = list(table_parts(pack))
    if not parts:
        return
    off = np.concatenate([p.off for p in parts])
    for i in np.argsort(off, kind="stable"):
        part, j = parts[int(i) // _PART], int(i) % _PART
        yield part.digest(j), packed.Loc(pack.name, int(part.off[j]), int(part.len[j]), int(part.form[j]))


def _write(store, items) -> list:
    """New packs of (digest, stored bytes, form) items, MAX_ENTRIES at most each, made durable;
    their paths. On any failure, none of them is left."""
    written = []
    writer = Writer(store.root)
    try:
        for digest, stored, form in items:
            writer.add(digest, stored, form)
            if len(writer) >= packed.MAX_ENTRIES:
                written.append(writer.finish())
                writer = Writer(store.root)
        last = writer.finish()
        if last is not None:
            written.append(last)
    except BaseException:
        writer.abort()
        for p in written:   # durable but unnamed by anything: nothing else has changed yet
            try:
                os.unlink(p)
            except FileNotFoundError:
                pass
        raise
    return written


def run(store, going: set[str], *, refused: str | None = None) -> PackResult:
    """The packing step (module doc). `going`: ids gc removes. `refused`: None, or why loose
    files must not move now (an image serves from this store's files): then only the rewrites
    that drop removed objects run."""
    packs = store.objects.packed
    packs.refresh()
    dead_hex = {o[len(PREFIX):] for o in going}
    dead_keys = np.unique(np.array([reach.key(o) for o in going], dtype=np.uint64))
    written = replaced = moved = 0
    damaged: dict[str, set] = {}   # pack name -> digests of damaged copies whose loose copy is good
    try:
        for cand in ([] if refused else loose_slices(store, going)):
            held = _judge_held(store, cand)
            for name, digest in cand.damaged_packed:
                damaged.setdefault(name, set()).add(digest)
            if len(cand) < packed.MIN_LOOSE:
                continue
            written += len(_write(store, _loose_items(store, cand, held)))
            faults.point("packed.before-removing")
            for i in np.flatnonzero(cand.moved):
                oid = PREFIX + cand.digest(int(i)).hex()
                os.unlink(store.objects.zpath(oid) if cand.form[i] == packed.COMPRESSED else store.objects.path(oid))
            moved += int(cand.moved.sum())
        packs.refresh()
        live = _sound_packs(store)
        rewrite = [p for p in live if p.name in damaged or (len(dead_keys) and _holds_any(p, dead_keys))]
        # merge the small packs (those later gcs add), oldest first so their objects keep their order
        small = sorted((p for p in live if p.count < packed.MAX_ENTRIES // 4),
                       key=lambda p: (os.stat(p.fd).st_mtime_ns, p.name))
        if not refused and len(small) > packed.MAX_PACKS:
            rewrite = small + [p for p in rewrite if p not in small]
        if rewrite:
            written += len(_write(store, ((d, raw, loc.form)
                                          for pack in rewrite for d, loc in _by_offset(pack)
                                          if d.hex() not in dead_hex and d not in damaged.get(pack.name, ())
                                          for raw in (_stored_packed(store, pack, d, loc),) if raw is not None)))
            faults.point("packed.before-removing")
            for pack in rewrite:
                os.unlink(pack.path)
                replaced += 1
    except OSError as e:
        raise fsio.io_error(e, "writing packs of objects, or removing the files a pack now holds") from e
    except ValueError as e:   # a pack's table cut short under us: nothing was removed from it
        raise StoreCorrupt(f"a pack changed while gc rewrote it: {e}", "run `ledger verify --full`") from None
    finally:
        packs.refresh()
    return PackResult(objects=moved, written=written, replaced=replaced, skipped=refused)


def _in_packs(store, cand: Candidates) -> np.ndarray:
    """Which candidates a pack holds already (a loose copy written for an image, or a repair): a
    mask, by key first, then by the whole digest."""
    keys = np.ndarray((len(cand.raw) // 32,), dtype=">u8", buffer=cand.raw, strides=(32,))[cand.order].astype(np.uint64)
    maybe = np.zeros(len(cand), dtype=bool)
    for pack in store.objects.packed.all():
        try:
            maybe |= reach.member(table_keys(pack), keys)
        except (OSError, ValueError):
            continue
    held = np.zeros(len(cand), dtype=bool)
    for i in np.flatnonzero(maybe):
        held[i] = store.objects._packed(PREFIX + cand.digest(int(i)).hex()) is not None
    return held


def _judge_held(store, cand: Candidates) -> np.ndarray:
    """Which candidates a pack holds already. One whose pack copy is intact is marked moved (its
    loose file goes with the slice's, if the slice is packed); one whose pack copy is damaged and
    whose loose copy (what reads get) is intact stays loose, and its pack is rewritten without
    the damaged copy (P4) — whatever the slice's size: a single repair counts."""
    held = _in_packs(store, cand)
    for i in np.flatnonzero(held):
        i = int(i)
        oid = PREFIX + cand.digest(i).hex()
        if store.objects.intact(oid):   # the loose copy, which reads prefer
            if _intact_in_pack(store, cand, i):
                cand.moved[i] = True
            else:
                cand.damaged_packed.extend((h[0].name, cand.digest(i))
                                           for h in store.objects.packed.find_all(cand.digest(i)))
    return held


def _loose_items(store, cand: Candidates, held: np.ndarray):
    """(digest, stored bytes, form) of each candidate whose bytes verify and that no pack holds
    (marked moved)."""
    for i in range(len(cand)):
        if held[i]:
            continue
        raw = _stored_loose(store, cand.digest(i).hex(), int(cand.form[i]))
        if raw is not None:
            cand.moved[i] = True
            yield cand.digest(i), raw, int(cand.form[i])


def dead_entries(store, reachable: np.ndarray) -> list[tuple[str, int]]:
    """(id, stored length) of packed objects no record reaches (gc's plan lists them with the
    unreachable files)."""
    out: dict[str, int] = {}
    for pack in _sound_packs(store):   # an unsound one: nothing in it is removed (verify names it)
        try:
            keys = table_keys(pack)
            for i in np.flatnonzero(~reach.member(reachable, keys)):
                raw = os.pread(pack.fd, packed.ENTRY.size, pack.table + int(i) * packed.ENTRY.size)
                if len(raw) != packed.ENTRY.size:
                    break
                d, _, n, _ = packed.ENTRY.unpack(raw)
                out.setdefault(PREFIX + d.hex(), n)
        except (OSError, ValueError):
            continue
    return list(out.items())


WINDOW = 1 << 20      # bytes of a pack read at once by a pass (Reader.read)
LOOSE_AFTER = 10_000  # ids a pass asks for before objects/ is listed once (Reader.batch)


def node(store, reader: "Reader", oid: str, hit):
    """gc's Node (reach.py) of a packed object: its children from bytes that hash to its id (a
    compressed one decompressed, bounded); unresolved if they do not (looked at again next time)."""
    pack, loc = hit
    try:
        if pack.problem(loc):
            raise ValueError("out of place")
        raw = reader.read(pack, loc)
        data = compress.decode(raw, oid, pack.path) if loc.form == packed.COMPRESSED else raw
        if hash_bytes(data) != oid:
            raise ValueError("damaged")
    except (OSError, ValueError, CorruptObject):
        return reach.classify(store, oid)   # another copy may verify: the object-by-object path decides
    return reach.node_of(data) if data[:1] == b"{" else reach.Node()


class Reader:
    """A pass's lookups and reads of packed objects (verify's journal pass, gc's walk): each pack's entry
    keys in memory (8 bytes an entry, its table read once), an entry confirmed by its whole digest
    with one pread, and its bytes through a window of _WINDOW bytes that moves forward with the
    reads: a pack holds objects in the order they were written, the order the journal names
    them, so the pass reads each pack front to back instead of opening a file per object."""

    def __init__(self, store):
        self.store = store
        self.packs = store.objects.packed
        self.keys: dict = {}       # pack name -> sorted uint64 keys (None: its table cannot be read)
        self.windows: dict = {}    # pack name -> (offset, bytes)
        for p in self.packs.all():
            try:
                self.keys[p.name] = table_keys(p)
            except (OSError, ValueError):
                self.keys[p.name] = None   # verify's listing names the pack
        self.loose = None   # sorted keys (reach.key) of objects/'s files, once a long pass lists it
        self.asked = 0

    def take_loose(self) -> None:
        """List objects/ once (8 bytes a file): resolve() then skips the ids that have a file."""
        self.loose = np.unique(np.concatenate([d.keys for d in reach.listing(self.store)] or [np.zeros(0, np.uint64)]))

    def batch(self, oids: list[str]) -> dict:
        """resolve() once a long pass is under way (LOOSE_AFTER ids asked: objects/ is then
        listed once); before that {} (each object is looked for the plain way, its file first)."""
        if not self.keys:
            return {}
        self.asked += len(oids)
        if self.loose is None:
            if self.asked < LOOSE_AFTER:
                return {}
            self.take_loose()
        return self.resolve(oids)

    def resolve(self, oids: list[str]) -> dict:
        """{id: (pack, Loc)} of those of `oids` that have no file in objects/ (as listed by
        take_loose) and are in a pack: one searchsorted a pack for them all, each match confirmed
        by its entry's whole digest (one pread)."""
        q = np.fromiter((int(o[len(PREFIX):len(PREFIX) + 16], 16) for o in oids), dtype=np.uint64, count=len(oids))
        left = np.flatnonzero(~reach.member(self.loose, q))
        out: dict = {}
        for name, keys in self.keys.items():
            pack = self.packs.open.get(name)
            if keys is None or pack is None or not len(left) or not len(keys):
                continue
            left = left[np.argsort(q[left], kind="stable")]   # sorted needles: searchsorted narrows as it goes
            pos = keys.searchsorted(q[left])
            pos[pos == len(keys)] = 0
            matched = keys[pos] == q[left]
            for j, i in zip(left[matched].tolist(), pos[matched].tolist()):
                hit = self._confirm(pack, keys, i, oids[j])
                if hit is not None:
                    out[oids[j]] = hit
            left = np.array([j for j in left.tolist() if oids[j] not in out], dtype=np.int64)
        return out

    def _confirm(self, pack, keys, i: int, oid: str):
        digest = bytes.fromhex(oid[len(PREFIX):])
        while i < len(keys):   # entries of one key lie together (the table is sorted by digest)
            raw = os.pread(pack.fd, packed.ENTRY.size, pack.table + i * packed.ENTRY.size)
            if len(raw) != packed.ENTRY.size:
                return None
            d, off, n, form = packed.ENTRY.unpack(raw)
            if d == digest:
                return pack, packed.Loc(pack.name, off, n, form)
            if d[:8] != digest[:8]:
                return None
            i += 1
        return None

    def find(self, oid: str):
        """(pack, Loc) of a packed object, or None (not packed, as far as the packs opened say)."""
        if not self.keys:
            return None
        hexid = oid[len(PREFIX):]
        k = np.uint64(int(hexid[:16], 16))
        digest = bytes.fromhex(hexid)
        for name, keys in self.keys.items():
            pack = self.packs.open.get(name)
            if keys is None or pack is None:
                continue
            i = int(keys.searchsorted(k))
            while i < len(keys) and keys[i] == k:
                raw = os.pread(pack.fd, packed.ENTRY.size, pack.table + i * packed.ENTRY.size)
                if len(raw) != packed.ENTRY.size:
                    break
                d, off, n, form = packed.ENTRY.unpack(raw)
                if d == digest:
                    return pack, packed.Loc(name, off, n, form)
                i += 1
        return None

    def read(self, pack, loc) -> bytes:
        """The stored bytes of an entry whose place pack.problem() passed (ValueError: cut short)."""
        w = self.windows.get(pack.name)
        if w is None or not (w[0] <= loc.offset and loc.offset + loc.length <= w[0] + len(w[1])):
            n = max(loc.length, min(WINDOW, pack.data_end - loc.offset))
            w = self.windows[pack.name] = (loc.offset, fsio.read_bounded_at(pack.fd, n, loc.offset))
            if len(w[1]) < loc.length:
                raise ValueError(f"it ends before byte {loc.offset + loc.length}")
        at = loc.offset - w[0]
        return w[1][at:at + loc.length]

    def close(self) -> None:
        self.windows = {}
