"""Repacking: packs whose chunks are mostly dead after gc are rewritten with only their live ones.

gc removes a pack only when no chunked object staying in the store names it (docs/store-format.md
C5), so a pack shared between a removed version and a kept one keeps the removed version's
chunks forever: after a retention policy prunes superseded checkpoints of large weights, most
bytes of such packs can be dead. `repack` copies the live chunks of every pack whose dead share
is at least `min_dead` into one new pack, rewrites the index (and pages) of every chunked object
that names one of those packs, and only then removes the old packs. An object's id, content and
size never change — only where its chunks lie — so no journal record is written and nothing a
record or cache says becomes wrong (the chunk index cache notices the packs gone, C10).

Crash rules (C11), in order:
  1. the new pack (live chunks, verified as read, then the rewritten pages) is written in tmp/,
     fsynced, renamed into packs/ and the directory fsynced — unnamed by any index yet, so a
     crash here leaves a pack gc removes;
  2. each new index is written in tmp/ and fsynced; then each is renamed over the old index
     (atomic: a reader sees the old index, whose packs are all still there, or the new one,
     whose packs are all durable) and the directories fsynced;
  3. only then are the old packs removed: a crash before leaves packs no index names, gc's.
Nothing half-written is ever visible, and a damaged live chunk stops the repack before any
index changes (CorruptObject naming the object and the pack).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from ledger.store import chunks, faults, fsio

MIN_DEAD = 0.5   # repack a pack once at least half its chunk bytes are named by no object


@dataclass(frozen=True)
class RepackPlan:
    """What a repack would do (dry run) or did: packs rewritten with their sizes and live bytes,
    the chunked objects whose indexes move to the new pack, and the bytes reclaimed."""

    packs: tuple = ()          # (pack path, data bytes, live bytes) of each pack repacked
    objects: tuple = ()        # ids of the chunked objects whose indexes were rewritten
    bytes_before: int = 0      # data bytes of those packs
    bytes_after: int = 0       # data bytes of the new pack (live chunks and rewritten pages)
    new_pack: str | None = None
    applied: bool = False

    @property
    def reclaimed(self) -> int:
        return max(0, self.bytes_before - self.bytes_after) if self.applied else \
            sum(size - live for _, size, live in self.packs)

    def to_json(self) -> dict:
        return {"applied": self.applied, "packs": [list(p) for p in self.packs], "objects": list(self.objects),
                "bytes_before": self.bytes_before, "bytes_after": self.bytes_after, "reclaimed": self.reclaimed,
                "new_pack": self.new_pack}


def _indexes(store):
    """(oid, index path) of every chunk index present (a whole copy beside one still leaves the
    index naming packs: it is rewritten too, so no index ever names a removed pack)."""
    for oid, f in store.objects.iter_ids():
        if f.name.endswith(chunks.SUFFIX) and f.is_file() and not f.is_symlink():
            yield oid, f


def _usage(store) -> tuple[dict, dict]:
    """({pack: data bytes}, {pack: live bytes}): live = the distinct byte ranges of chunks and
    pages some index present names."""
    objects = store.objects
    size: dict[bytes, int] = {}
    for name, _ in objects.packs.iter_packs():
        try:
            size[name] = objects.packs.trailer_start(name)[0]
        except (OSError, fsio.NotRegular, chunks.CorruptObject):
            continue   # a damaged pack is verify's to report, never repacked
    ranges: dict[bytes, set] = {}
    for oid, _ in _indexes(store):
        _, pages = objects._index(oid)
        for _, _, _, (pack, off, n) in pages:
            ranges.setdefault(pack, set()).add((off, n))
        for _, (pack, off, n) in objects.chunk_entries(oid):
            ranges.setdefault(pack, set()).add((off, n))
    return size, {p: sum(n for _, n in r) for p, r in ranges.items()}


def plan(store, min_dead: float = MIN_DEAD) -> RepackPlan:
    """The packs a repack would rewrite: some object names them, and at least `min_dead` of
    their chunk bytes no object names (packs no object names at all are gc's)."""
    size, live = _usage(store)
    picked = tuple(sorted((str(store.objects.packs.path(p)), size[p], live[p]) for p in size
                          if 0 < live.get(p, 0) and size[p] - live[p] >= min_dead * size[p]))
    if not picked:
        return RepackPlan()
    names = {bytes.fromhex(Path(p).parent.name + Path(p).name) for p, _, _ in picked}
    affected = tuple(sorted(oid for oid, _ in _indexes(store) if store.objects.packs_of(oid) & names))
    return RepackPlan(packs=picked, objects=affected, bytes_before=sum(s for _, s, _ in picked))


def repack(store, min_dead: float = MIN_DEAD) -> RepackPlan:
    """Rewrite what plan() finds, under the store lock, in C11's order."""
    with store.locked():
        p = plan(store, min_dead)
        if not p.packs:
            return p
        objects = store.objects
        old = {bytes.fromhex(Path(q).parent.name + Path(q).name) for q, _, _ in p.packs}
        # share=False: chunks are placed in the new pack only if they are in an old one (below);
        # the others stay where they are
        pack = chunks.PackWriter(objects.packs, share=False)
        staged: list[tuple[Path, Path]] = []     # (tmp index, its index path), renamed in step 2
        try:
            fds: dict = {}
            try:
                for oid in p.objects:
                    total, _ = objects._index(oid)
                    entries = []
                    for d, loc in objects.chunk_entries(oid, fds):
                        if loc[0] in old:
                            loc = pack.locate(d, objects.packs.read(loc, d, oid, fds))   # verified
                        entries.append((d, loc))
                    pack.flush()     # the chunk bytes were read into fresh buffers: write them now
                    pages = [(pd, cov, k, pack.locate(pd, body)) for pd, body, cov, k in chunks.build_pages(entries)]
                    pack.flush()
                    staged.append((_stage_index(store, chunks.index_bytes(total, pages)), objects.index_path(oid)))
            finally:
                for fd in fds.values():
                    os.close(fd)
            pack.close()                                             # step 1: durable, named by nothing
            faults.point("repack.pack-written")
            dirs = set()
            for tmp, dest in staged:                                 # step 2: each index atomically
                os.rename(tmp, dest)
                dirs.add(dest.parent)
                faults.point("repack.index-installed")
            for d in sorted(dirs):
                fsio.fsync_dir(d)
            faults.point("repack.indexes-durable")
            for q, _, _ in p.packs:                                  # step 3: the old packs
                os.unlink(q)
        except OSError as e:
            pack.abort()
            raise fsio.io_error(e, "repacking chunks") from e
        except BaseException:
            pack.abort()
            raise
        finally:
            for tmp, _ in staged:
                tmp.unlink(missing_ok=True)
        return RepackPlan(packs=p.packs, objects=p.objects, bytes_before=p.bytes_before, bytes_after=pack.size,
                          new_pack=str(objects.packs.path(pack.name)), applied=True)


def _stage_index(store, data: bytes) -> Path:
    """A new index written to tmp/ and fsynced (renamed over the old one in step 2)."""
    tmp = fsio.tmp_path(store.tmp)
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o444)
    try:
        faults.io_check("writing a chunk index")
        fsio.write_all(fd, data, "writing a chunk index")
        os.fsync(fd)
    except BaseException:
        os.close(fd)
        tmp.unlink(missing_ok=True)
        raise
    os.close(fd)
    return tmp
