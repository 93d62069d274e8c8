"""Repacking: packs whose chunks are mostly dead after gc are rewritten with only their live ones.

gc removes a pack only when no chunked object staying in the store names it (docs/store-format.md
C5), so a pack shared between a removed version and a kept one keeps the removed version's
chunks forever: after a retention policy prunes superseded checkpoints of large weights, most
bytes of such packs can be dead. `repack` copies the live chunks of every pack whose dead share
is at least `min_dead` into one new pack, rewrites the index (and the pages that list a moved
chunk) of every chunked object that names one of those packs, and only then removes the old
packs. A page rewritten kills its old copy, so the packs picked are those at least `min_dead`
dead once the repack is done (plan()): a fixed point, the plan after a repack is empty. An object's id, content and
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

import blake3

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


def _usage(store) -> tuple[dict, dict, dict, dict]:
    """What the packs present hold and who names it: ({pack: data bytes}, {pack: {(offset,
    length) of a chunk some index present names}}, {pack: {(offset, length) of a page some
    index names: the packs its entries name}}, {oid: the packs its pages and chunks are in})."""
    objects = store.objects
    size: dict[bytes, int] = {}
    for name, _ in objects.packs.iter_packs():
        try:
            size[name] = objects.packs.trailer_start(name)[0]
        except (OSError, fsio.NotRegular, chunks.CorruptObject):
            continue   # a damaged pack is verify's to report, never repacked
    chunk_at: dict[bytes, set] = {}
    page_at: dict[bytes, dict] = {}
    packs_of: dict[str, set] = {}
    fds: dict = {}
    try:
        for oid, _ in _indexes(store):
            mine = packs_of[oid] = set()
            for _, _, entries, (pack, off, n) in _pages(objects, oid, fds):
                named = {loc[0] for _, loc in entries}
                page_at.setdefault(pack, {}).setdefault((off, n), set()).update(named)
                for _, (cp, coff, cn) in entries:
                    chunk_at.setdefault(cp, set()).add((coff, cn))
                mine |= named | {pack}
    finally:
        for fd in fds.values():
            os.close(fd)
    return size, chunk_at, page_at, packs_of


def _pages(objects, oid: str, fds: dict):
    """(page digest, data bytes it covers, its entries, its location) of each page of a
    chunked object, in order, each page verified as it is read."""
    for digest, covered, k, loc in objects._index(oid)[1]:
        page = objects.packs.read(loc, digest, oid, fds)
        where = f"at byte {loc[1]} of {objects.packs.path(loc[0])}"
        yield digest, covered, chunks.parse_page(page, k, covered, oid, where), loc


def _live(ranges) -> int:
    return sum(n for _, n in ranges)


def plan(store, min_dead: float = MIN_DEAD) -> RepackPlan:
    """The packs a repack would rewrite: some object names them, and at least `min_dead` of
    their chunk bytes no object names once the repack is done (packs no object names at all
    are gc's).

    "Once done", because a repack itself kills bytes in packs it leaves alone: every page that
    lists a chunk it moves is written again in the new pack, and the old copy of that page,
    wherever it lies, is then named by nothing. A pack holding a small object's last chunk and
    that object's page (a few KiB of page beside a tail of a few hundred bytes) passes the test
    before and fails it after — so a repack that did not count it would leave a mostly dead
    pack behind, and its own plan would never be empty. The packs picked therefore grow until
    no pack left alone crosses the threshold with those pages counted dead: a fixed point, and
    the plan after the repack is empty (docs/store-format.md C11)."""
    size, chunk_at, page_at, packs_of = _usage(store)

    def after(p: bytes, picked: set) -> int:
        """Bytes of pack `p` (left alone) still named once the packs `picked` are repacked:
        every chunk named in it (chunks move only out of picked packs), and each page whose
        entries name no picked pack (the others are rewritten in the new pack)."""
        ranges = set(chunk_at.get(p, ()))
        ranges |= {r for r, named in page_at.get(p, {}).items() if not named & picked}
        return _live(ranges)

    live = {p: _live(chunk_at.get(p, set()) | set(page_at.get(p, {}))) for p in size}
    picked: set[bytes] = set()
    while True:
        more = {p for p in size if p not in picked and live[p] > 0
                and size[p] - after(p, picked) >= min_dead * size[p]}
        if not more:
            break
        picked |= more
    if not picked:
        return RepackPlan()
    rows = tuple(sorted((str(store.objects.packs.path(p)), size[p], live[p]) for p in picked))
    affected = tuple(sorted(oid for oid, ps in packs_of.items() if ps & picked))
    return RepackPlan(packs=rows, objects=affected, bytes_before=sum(size[p] for p in picked))


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
                    total = objects._index(oid)[0]
                    pages = []
                    # page by page, keeping the index's pages as they are: a page that names no
                    # old pack and lies outside them stays where it is (plan() counts on it)
                    for pd, body, cov, k, loc in _moved_pages(objects, oid, old, pack, fds):
                        if body is not None:
                            loc = pack.locate(pd, body)
                            pack.flush()     # the page is a fresh buffer too: write it now
                        pages.append((pd, cov, k, loc))
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


def _moved_pages(objects, oid: str, old: set, pack, fds: dict):
    """(page digest, the page's new bytes or None where it stays as it is, data bytes it
    covers, entries, its location) of each page of `oid`, in order, its chunks in the `old`
    packs copied (verified as read) into `pack`. A page is rewritten when it names a moved
    chunk or lies in an old pack; its boundaries never change (the same chunks, in order)."""
    for pd, cov, entries, loc in _pages(objects, oid, fds):
        moved = False
        out = []
        for d, cloc in entries:
            if cloc[0] in old:
                cloc = pack.locate(d, objects.packs.read(cloc, d, oid, fds))   # verified
                moved = True
            out.append((d, cloc))
        pack.flush()     # the chunk bytes were read into fresh buffers: write them now
        if not moved and loc[0] not in old:
            yield pd, None, cov, len(entries), loc
            continue
        body = b"".join(chunks.ENTRY.pack(d, n, cp, off) for d, (cp, off, n) in out)
        yield blake3.blake3(body).digest(), body, cov, len(entries), loc


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
