"""Garbage collection: delete only what no journal record reaches, and only dead scratch.

Reachability is computed from the journal itself (inputs, outputs and every id mentioned
in any payload, then the closure through structured objects), never from caches. A dry run
is the default; pruning needs the lock, so no transaction can be writing objects meanwhile.

tmp/ holds two things: files a lock holder was writing (a crashed writer's leftovers: gc runs
under the lock, so none is being written) and work folders of runs outside the lock (a
training run). A work folder is live while its process holds a flock on it
(`Store.work_folder`); gc takes that flock itself before removing one, so it never removes a
live run's folder, and one that a killed run left behind goes. What was removed is recorded
in the journal as a `gc` record (counts and tmp/ names only: ids of deleted objects would be
references to nothing).
"""

from __future__ import annotations

import errno
import fcntl
import os
import shutil
import stat
import time
from dataclasses import dataclass

import numpy as np  # the listing's keys and masks (reach.py)

from ledger.errors import JournalCorrupt
from ledger.store import chunks, fsio, gcstate, packing, reach, retention, schema
from ledger.store import scan as scanner
from ledger.store.ids import PREFIX
from ledger.store.state import Fold, State

COLLECT_EVERY = 5_000  # records walked between collections of the young generation (the walk runs without the collector)


@dataclass(frozen=True)
class GcPlan:
    """What gc found (or, pruned, removed): unreachable objects, tmp/ files, dead and live work folders."""
    unreachable: tuple = ()       # (id, size)
    tmp_files: tuple = ()         # names in tmp/ that are not work folders
    work_dead: tuple = ()         # work folders in tmp/ no live process holds
    work_live: tuple = ()         # work folders in tmp/ a live run holds (kept)
    reachable: int = 0
    pruned: bool = False
    policy: str = retention.DEFAULT.name
    retained: tuple = ()          # (id, size, role, of): superseded training state the policy removes
    packs: tuple = ()             # (pack path, size): packs no remaining chunked object uses
    record: int | None = None     # seq of the `prune` record (pruned, and the policy removed something)
    packing: packing.PackResult = packing.PackResult()   # what the packing step did (pruned only)

    @property
    def bytes(self) -> int:
        return sum(s for _, s in self.unreachable)

    @property
    def retained_bytes(self) -> int:
        return sum(s for _, s, _, _ in self.retained)

    @property
    def pack_bytes(self) -> int:
        return sum(s for _, s in self.packs)

    def to_json(self) -> dict:
        return {"pruned": self.pruned, "reachable": self.reachable, "unreachable": [list(x) for x in self.unreachable],
                "unreachable_bytes": self.bytes, "tmp_files": list(self.tmp_files),
                "work_folders_removed" if self.pruned else "work_folders_dead": list(self.work_dead),
                "work_folders_live": list(self.work_live),
                "policy": self.policy, "superseded": [list(x) for x in self.retained],
                "superseded_bytes": self.retained_bytes, "packs": [p for p, _ in self.packs],
                "pack_bytes": self.pack_bytes, "prune_record": self.record,
                "objects_packed": self.packing.objects, "packs_written": self.packing.written,
                "packs_replaced": self.packing.replaced, "packing_skipped": self.packing.skipped}


def _folder_is_live(path) -> bool:
    """Someone holds the folder's flock (Store.work_folder). Asks without keeping it."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return False
    except OSError as e:
        if e.errno in (errno.EWOULDBLOCK, errno.EAGAIN):
            return True
        raise
    finally:
        os.close(fd)  # closing drops a flock we took


def _scan_tmp(store) -> tuple[tuple, tuple, tuple]:
    files, dead, live = [], [], []
    if not store.tmp.is_dir():
        return (), (), ()
    for p in sorted(store.tmp.iterdir()):
        try:
            st = os.lstat(p)
        except FileNotFoundError:
            continue
        if stat.S_ISDIR(st.st_mode):
            (live if _folder_is_live(p) else dead).append(p.name)
        else:
            files.append(p.name)   # regular files, and links or FIFOs: never opened, only unlinked
    return tuple(files), tuple(dead), tuple(live)


def _dead_packs(store, chunked: list[str], going: set[str]) -> tuple:
    """Packs (ledger/store/chunks.py) that no chunked object staying in the store (listed with
    a chunk index, not in `going`) uses: (path, size)."""
    live: set[bytes] = set()
    for oid in chunked:
        if oid in going:
            continue
        try:
            live |= store.objects.packs_of(oid)
        except Exception:  # noqa: BLE001 - a damaged index: keep every pack (verify reports the object)
            return ()
    dead = []
    for name, path in store.objects.packs.iter_packs():
        if name not in live:
            try:
                dead.append((str(path), os.lstat(path).st_size))
            except FileNotFoundError:
                continue
    return tuple(dead)


def _walk(store) -> reach.Walk:
    """Both closures (ledger/store/reach.py) up to the journal's end: from gc's saved state when
    it is usable (rule 22: only the records after it are read), else from record 1. A broken
    chain, or a record the fold cannot apply, is JournalCorrupt before anything is judged. The
    state is saved again for the next gc (a cache: written whole or not at all)."""
    saved, why = gcstate.load(store)
    if why:
        store.warnings.append(f"gc's saved reach state was not used ({why}): walked every record")
    if saved is None:
        w, start, offset = reach.Walk(store), State(), 0
    else:
        w = reach.Walk(store, saved.reach, saved.not_kept, saved.inputs, saved.unresolved, saved.special)
        start, offset = saved.state, saved.offset
    f = Fold(start)
    n = [0]

    def each(rec, line):
        ids = reach.shaped_ids(rec, line)   # a line of its kind's usual shape: its envelope is proven too
        f.add(rec, checked=ids is not None)
        w.add_record(rec, ids)
        n[0] += 1
        if n[0] % COLLECT_EVERY == 0:
            scanner.collect_young()

    def each_run(run):   # a run of proved lines (docs/store-format.md, "Lines proved in bulk")
        f.add_rows(run, 0, len(run))
        rows = list(reach.run_ids(run))
        if packs is not None:   # a run's packed objects found in one lookup, read from their packs in order
            ids = [oid for _, every, _ in rows for oid in every if not w.reach.has(reach.key(oid))]
            w.ready = {oid: packing.node(store, packs, oid, hit) for oid, hit in packs.batch(ids).items()}
        if warmer.on:   # the objects are coming from the disk: the run's read ahead
            warmer.ahead([oid[len(PREFIX):] for _, every, _ in rows for oid in every])
        began, opened = time.perf_counter(), w.opened
        for inputs, every, named in rows:
            w.add_ids(inputs, every, named)
        warmer.took(w.opened - opened, time.perf_counter() - began)
        before, n[0] = n[0], n[0] + len(run)
        if n[0] // COLLECT_EVERY != before // COLLECT_EVERY:
            scanner.collect_young()

    bulk = {k: each_run for k in schema.fielded_kinds()}
    warmer = fsio.Warmer(store.objects.dir)   # reads ahead while the objects come from the disk
    packs = packing.Reader(store) if store.objects.packed.all() else None
    try:
        with scanner.without_collector():  # a walk over every record (store/scan.py says why)
            scan = store.journal.scan(offset, start.seq + 1, start.head, keep=False, each=each, lines=True,
                                      bulk=bulk)
    except JournalCorrupt as e:
        raise JournalCorrupt(f"{e.message}; gc refuses to judge reachability", e.hint) from None
    finally:
        warmer.close()
    if scan.broken_at is not None:
        raise JournalCorrupt(f"journal chain is broken at {scan.problem}; gc refuses to judge reachability",
                             "run `ledger verify`")
    w.retry_unresolved()
    if saved is None or f.seq != start.seq or w.opened or w.resolved:
        r, nk, inputs = w.result()
        failed = gcstate.save(store, f.state(), scan.end, r, nk, inputs, w.unresolved, w.special)
        if failed:
            store.warnings.append(f"could not save gc's reach state ({failed}): the next gc walks every record again")
    return w


def plan(store, policy: retention.Policy | None = None) -> GcPlan:
    """What `gc --prune` would remove under `policy` (default: superseded-training-state,
    ledger/store/retention.py). Takes no lock and writes nothing but gc's own cache (rule 22)."""
    pol = policy or retention.DEFAULT
    w = _walk(store)
    reachable = w.reach.array()
    unreachable, chunked = [], []
    for d in reach.listing(store):
        is_chunked = d.suffixed(chunks.SUFFIX)
        chunked.extend(d.id(i) for i in np.flatnonzero(is_chunked))
        for i in np.flatnonzero(~reach.member(reachable, d.keys)):
            oid, path = d.id(i), d.path(i)
            try:
                st = os.lstat(path)
            except FileNotFoundError:
                continue
            size = st.st_size if stat.S_ISREG(st.st_mode) else 0
            if is_chunked[i] and size:
                try:
                    size = store.objects.size(oid)  # a chunk index: the object's size is in it
                except Exception:  # noqa: BLE001 - a damaged index is removed all the same
                    pass
            unreachable.append((oid, size))
    listed = {o for o, _ in unreachable}
    unreachable.extend(e for e in packing.dead_entries(store, reachable) if e[0] not in listed)
    retained = retention.select(store, pol, w).remove
    going = {o for o, _ in unreachable} | {o for o, *_ in retained}
    files, dead, live = _scan_tmp(store)
    return GcPlan(tuple(unreachable), files, dead, live, len(reachable), policy=pol.name, retained=retained,
                  packs=_dead_packs(store, chunked, going))


def _remove_dead_folder(path) -> bool:
    """Remove a work folder after taking its flock ourselves (so its run cannot be live and
    no new run can be starting in it). False if a run holds it after all."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except FileNotFoundError:
        return False
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as e:
            if e.errno in (errno.EWOULDBLOCK, errno.EAGAIN):
                return False
            raise
        shutil.rmtree(path)  # never follows links inside (rmtree is symlink-attack safe with dir fds)
        return True
    finally:
        os.close(fd)


def _remove_object_file(p) -> None:
    st = os.lstat(p)
    if stat.S_ISDIR(st.st_mode):
        shutil.rmtree(p)   # a directory in an object's place: junk, and unreachable
    else:
        os.unlink(p)


def prune(store, policy: retention.Policy | None = None, packing_refused=None) -> GcPlan:
    """Remove what plan() finds, under the lock. Superseded training state is recorded first
    (one `prune` record naming the policy and every object it removes: rule P1), then
    removed; what no record reaches is removed; then small loose objects are packed and packs
    rid of what went (store/packing.py; `packing_refused()`, asked under the lock: None, or why
    loose files must stay now); all of it recorded as one `gc` record."""
    with store.locked():
        p = plan(store, policy)
        seq = None
        if p.retained:
            with store.transaction_held("prune") as tx:  # retention.PRUNE_KIND (a literal: test_records reads it)
                tx.payload.update(retention.Pruning(policy or retention.DEFAULT, p.retained).payload())
            seq = tx.record["seq"]
        try:
            for oid, *_ in p.retained:
                if not store.objects.packed_only(oid):   # a packed one goes with its pack's rewrite
                    store.objects.remove(oid)
            for oid, _ in p.unreachable:
                for path in (store.objects.path(oid), store.objects.index_path(oid), store.objects.zpath(oid)):
                    if os.path.lexists(path):
                        _remove_object_file(path)
            for path, _ in p.packs:
                os.unlink(path)
            for name in p.tmp_files:
                (store.tmp / name).unlink(missing_ok=True)
            removed = tuple(name for name in p.work_dead if _remove_dead_folder(store.tmp / name))
        except OSError as e:
            raise fsio.io_error(e, "removing unreachable files") from e
        going = {o for o, _ in p.unreachable} | {o for o, *_ in p.retained}
        pk = packing.run(store, going, refused=packing_refused() if packing_refused else None)
        live = p.work_live + tuple(n for n in p.work_dead if n not in removed)
        done = GcPlan(p.unreachable, p.tmp_files, removed, live, p.reachable, pruned=True, policy=p.policy,
                      retained=p.retained, packs=p.packs, record=seq, packing=pk)
        if p.unreachable or p.tmp_files or removed or p.packs or pk.written or pk.replaced:
            with store.transaction_held("gc") as tx:
                tx.payload.update({"objects_removed": len(p.unreachable), "bytes_removed": done.bytes,
                                   "tmp_files_removed": len(p.tmp_files), "work_folders_removed": list(removed)})
                if p.packs:
                    tx.payload.update({"packs_removed": len(p.packs), "pack_bytes_removed": done.pack_bytes})
                if pk.written or pk.replaced:
                    tx.payload.update({"objects_packed": pk.objects, "object_packs_written": pk.written,
                                       "object_packs_replaced": pk.replaced})
        return done
