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
  * **merge**: more than packed.MAX_PACKS packs are rewritten into as few as MAX_ENTRIES allows.
A rewrite copies each kept entry's stored bytes, verified as they are read, into the new pack;
a damaged entry stops it (CorruptObject naming the object and the pack) before any pack is
removed. The new pack is durable before an old one goes: a crash leaves an object in two places,
both verified on every read, never in none.
"""

from __future__ import annotations

import os
import stat
from dataclasses import dataclass

import numpy as np

from ledger.errors import CorruptObject
from ledger.store import compress, faults, fsio, packed, reach
from ledger.store.ids import PREFIX, hash_bytes


@dataclass(frozen=True)
class Packed:
    """What the packing step did."""
    objects: int = 0          # loose objects moved into packs
    written: int = 0          # packs written
    replaced: int = 0         # packs removed after their live entries were rewritten
    skipped: str | None = None  # why it did not run (said to the user)


_ENTRY = np.dtype([("key", ">u8"), ("rest", "V24"), ("off", ">u8"), ("len", ">u4"), ("form", "u1"), ("pad", "V3")])


def table_keys(pack: packed.Pack) -> np.ndarray:
    """The 64-bit keys (reach.key: a digest's first 8 bytes) of a pack's entries, in table
    order, read a piece at a time (ValueError / OSError on a table that cannot be read)."""
    parts = []
    step = (1 << 20) // packed.ENTRY.size
    for at in range(0, pack.count, step):
        k = min(step, pack.count - at)
        raw = fsio.read_bounded_at(pack.fd, k * packed.ENTRY.size, pack.table + at * packed.ENTRY.size)
        if len(raw) != k * packed.ENTRY.size:
            raise ValueError("its entry table shrank while it was read")
        parts.append(np.frombuffer(raw, dtype=_ENTRY)["key"].astype(np.uint64))
    return np.concatenate(parts) if parts else np.zeros(0, dtype=np.uint64)


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


def unsound(pack: packed.Pack, part: Part, before: bytes | None) -> str | None:
    """What is wrong with a piece of a pack's table, if anything: entries not strictly sorted by
    digest (`before`: the previous piece's last digest; a binary search could miss an entry), or
    an entry outside the pack's bytes, of an unknown form or larger than a packed object can be."""
    d = part.digests
    if (len(d) > 1 and not (d[1:] > d[:-1]).all()) or (before is not None and len(d) and not part.digest(0) > before):
        return "its entries are not sorted by digest"
    bad = ((part.off < len(packed.MAGIC)) | (part.off + part.len > pack.data_end) | (part.len > packed.MAX_STORED)
           | (part.form > packed.COMPRESSED))
    if bad.any():
        i = int(np.flatnonzero(bad)[0])
        return f"its entry for b3:{part.digest(i).hex()} lies outside its bytes, is of an unknown form or is too large"
    return None


def _holds_any(pack: packed.Pack, keys: np.ndarray) -> bool:
    try:
        return bool(reach.member(keys, table_keys(pack)).any())
    except (OSError, ValueError):
        return False   # an unreadable table: left as it is (verify names the pack)


def _loose_candidates(store, going: set[str]) -> list[tuple[int, str, int]]:
    """(mtime_ns, hex, form) of every loose small object that stays, oldest first."""
    out = []
    for d in reach.listing(store):
        z = d.suffixed(compress.SUFFIX)
        c = d.suffixed(".c")
        for i in np.flatnonzero(~c):
            oid, path = d.id(int(i)), d.path(int(i))
            if oid in going:
                continue
            try:
                st = os.lstat(path)
            except FileNotFoundError:
                continue
            if not stat.S_ISREG(st.st_mode) or st.st_size > packed.MAX_STORED:
                continue
            if not z[i] and st.st_size == 0:
                continue   # the empty object: nothing to gain
            out.append((st.st_mtime_ns, oid[len(PREFIX):], packed.COMPRESSED if z[i] else packed.WHOLE))
    out.sort()
    # a whole copy and a compressed one of the same object: the whole one is what reads prefer
    seen: set[str] = set()
    kept = []
    for item in sorted(out, key=lambda t: (t[1], t[2])):
        if item[1] not in seen:
            seen.add(item[1])
            kept.append(item)
    kept.sort()
    return kept


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


def _stored_packed(store, pack: packed.Pack, digest: bytes, loc: packed.Loc) -> bytes:
    """A packed entry's stored bytes, verified; CorruptObject stops the rewrite."""
    oid = PREFIX + digest.hex()
    hit = (pack, loc)
    store.objects._packed_data(oid, hit)
    return store.objects._packed_stored(oid, hit)


def run(store, going: set[str], *, refused: str | None = None) -> Packed:
    """The packing step (module doc). `going`: ids gc removes. `refused`: None, or why loose
    files must not move now (an image serves from this store's files): then only the rewrites
    that drop removed objects run."""
    packs = store.objects.packed
    packs.refresh()
    dead_hex = {o[len(PREFIX):] for o in going}
    dead_keys = np.unique(np.array([reach.key(o) for o in going], dtype=np.uint64))
    live = packs.all()
    dropping = [p for p in live if _holds_any(p, dead_keys)] if len(dead_keys) else []
    candidates = [] if refused else _loose_candidates(store, going)
    pack_loose = len(candidates) >= packed.MIN_LOOSE
    merging = not refused and len(live) + (1 if pack_loose else 0) > packed.MAX_PACKS
    rewrite = live if merging else dropping
    if not pack_loose and not rewrite:
        return Packed(skipped=refused)
    written, moved, loose_done = [], 0, []
    writer = packed.Writer(store.root)
    try:
        def spill():
            nonlocal writer
            if len(writer) >= packed.MAX_ENTRIES:
                written.append(writer.finish())
                writer = packed.Writer(store.root)
        for pack in rewrite:   # kept entries first: they are the older objects
            for digest, loc in pack.entries():
                if digest.hex() in dead_hex:
                    continue
                if writer.add(digest, _stored_packed(store, pack, digest, loc), loc.form):
                    spill()
        if pack_loose:
            for _, hexid, form in candidates:
                raw = _stored_loose(store, hexid, form)
                if raw is None:
                    continue
                if writer.add(bytes.fromhex(hexid), raw, form):
                    moved += 1
                    loose_done.append((hexid, form))
                    spill()
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
    faults.point("packed.before-removing")
    try:
        for pack in rewrite:
            os.unlink(pack.path)
        for hexid, form in loose_done:
            oid = PREFIX + hexid
            os.unlink(store.objects.zpath(oid) if form == packed.COMPRESSED else store.objects.path(oid))
    except OSError as e:
        raise fsio.io_error(e, "removing files a pack now holds") from e
    packs.refresh()
    return Packed(objects=moved, written=len(written), replaced=len(rewrite), skipped=refused)


def dead_entries(store, reachable: np.ndarray) -> list[tuple[str, int]]:
    """(id, stored length) of packed objects no record reaches (gc's plan lists them with the
    unreachable files)."""
    out = []
    for pack in store.objects.packed.all():
        try:
            keys = table_keys(pack)
        except (OSError, ValueError):
            continue   # an unreadable table: nothing in it is removed (verify names the pack)
        for i in np.flatnonzero(~reach.member(reachable, keys)):
            raw = os.pread(pack.fd, packed.ENTRY.size, pack.table + int(i) * packed.ENTRY.size)
            d, _, n, _ = packed.ENTRY.unpack(raw)
            out.append((PREFIX + d.hex(), n))
    return out
