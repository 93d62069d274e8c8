"""The store's own verbs: init, add, cat, show, verify, gc, query, index rebuild, unlock.

Part of ledger.api (see its docstring): import the verbs from there, `from ledger import api`."""

from __future__ import annotations

import base64
import errno
import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO, Callable, Mapping

from ledger.api._base import MAX_INLINE_BYTES, Result, StoreLike, Wrapped, human_bytes, store_root, take_warnings
from ledger.api._open import open_store
from ledger.errors import BadInput, CorruptObject, Locked, StoreCorrupt, UnknownRef
from ledger.store import Store, canonical, fsio, index, lookup, retention
from ledger.store.add import add_path
from ledger.store.lock import Lock


@dataclass(frozen=True)
class Initialised(Result):
    """The store `init` created."""
    store: str
    head: str | None
    seq: int


def init(directory: str | os.PathLike | None = None) -> Initialised:
    """Create an empty store (DIRECTORY/.ledger, default ./.ledger) with its first journal record."""
    p = Path(directory or ".")
    try:
        s = Store.init(p)
    except OSError as e:
        if e.errno in (errno.ENOSPC, errno.EIO, errno.EDQUOT):
            raise fsio.io_error(e, f"creating a store in {p}") from None
        # the folder given is a file, a FIFO, a link loop or a dangling link, or lies under a
        # file: the user's path, not ledger, so exit 2 naming it (mkdir fails before writing)
        raise BadInput(f"cannot create a store in {p}: {e.strerror or e}",
                       "give a folder (new or existing) to hold .ledger/") from None
    return Initialised(str(s.root), s.state.head, s.state.seq)


@dataclass(frozen=True)
class Added(Result):
    """What one `add` stored: the id, size and kind, and whether it was unchanged."""
    id: str
    size: int
    kind: str
    name: str | None
    unchanged: bool
    seq: int | None = None    # None when unchanged: nothing was written

    def to_json(self):
        out = super().to_json()
        if self.unchanged:
            out.pop("seq")
        return out


def tree_size(path: str | os.PathLike) -> int:
    """Bytes `add` would read (for a progress bar); links are not followed."""
    p = Path(path)
    if p.is_file():
        return p.stat().st_size
    return sum(f.stat().st_size for f in p.rglob("*") if f.is_file() and not f.is_symlink())


def add(path: str | os.PathLike, *, kind: str | None = None, name: str | None = None, wait: float = 0.0,
        bar: Callable[[int], None] | None = None, store: StoreLike = None) -> Added:
    """Store a file or folder as immutable objects and record it (one `add` record). `bar(n)` is
    called as bytes are read."""
    s = open_store(store)
    r = add_path(s, Path(path), kind=kind or None, name=name, wait=wait, **({"bar": bar} if bar else {}))
    return Added(r["id"], r["size"], r["kind"], r["name"], r["unchanged"], r.get("seq"), warnings=take_warnings(s))


@dataclass(frozen=True)
class Catted(Result):
    """An object's verified bytes as `cat` wrote or returned them."""
    id: str
    size: int
    data: bytes | None = None   # None when streamed to `out`

    def to_json(self):
        try:
            body = {"text": self.data.decode("utf-8")}
        except UnicodeDecodeError:
            body = {"base64": base64.b64encode(self.data).decode()}
        return {"id": self.id, "size": self.size, **body}


def cat(ref: str, out: BinaryIO | None = None, *, store: StoreLike = None) -> Catted:
    """An object's verified bytes: in `data` (objects up to 64 MiB), or written to `out` (any
    size; large objects stream through a verified temporary copy, never whole in memory)."""
    s = open_store(store)
    oid = s.resolve(ref)
    size = s.objects.size(oid)
    if s.objects.chunked(oid):
        # A chunk index is not named by its own bytes: one planted in an object's place can
        # repeat real pages to declare terabytes that every chunk verifies and only the whole
        # hash, at the end, refutes — hours of reading. The size the records that wrote the
        # object give it bounds the read before it starts (docs/store-format.md, C2).
        recorded = lookup.recorded_sizes(s, oid)
        if recorded and size not in recorded:
            raise CorruptObject(oid, f"object {oid} is damaged: its chunk index declares {size} bytes, the journal "
                                     f"recorded {', '.join(map(str, sorted(recorded)))}; nothing was read",
                                "restore the object (`ledger repair --from SOURCE`, or `ledger add` of the "
                                "original); `ledger verify` names what else is damaged")
    if out is None:
        if size > MAX_INLINE_BYTES:
            raise BadInput(f"{oid} is {human_bytes(size)}; --json carries objects up to 64 MiB",
                           "use `ledger cat` without --json")
        return Catted(oid, size, s.get_bytes(oid), warnings=take_warnings(s))
    if size > MAX_INLINE_BYTES:
        with tempfile.TemporaryDirectory() as td:
            tmp = Path(td) / "obj"
            s.export_file(oid, tmp)
            with open(tmp, "rb") as f:
                shutil.copyfileobj(f, out, 1 << 20)
    else:
        out.write(s.get_bytes(oid))
    return Catted(oid, size, warnings=take_warnings(s))


@dataclass(frozen=True)
class Shown(Result):
    """An object (structured: its parsed JSON in `object`; a blob: only its size), or, when the
    ref names a journal record instead, that record in `record`."""

    id: str | None
    size: int | None = None
    object: Any = None
    record: Mapping | None = None

    @property
    def structured(self) -> bool:
        return self.object is not None

    def to_json(self):
        if self.record is not None:
            return self.record
        if self.object is None:
            return {"id": self.id, "size": self.size, "structured": False}
        return {"id": self.id, "size": self.size, "structured": True, "object": self.object}


def show(ref: str, *, store: StoreLike = None) -> Shown:
    """Describe an object (id, prefix, name, gen-N, HEAD), or a journal record (an id prefix of
    at least 8 hex digits)."""
    s = open_store(store)
    try:
        oid = s.resolve(ref)
    except UnknownRef:
        hexpart = ref.removeprefix("b3:")
        if len(hexpart) < 8 or any(c not in "0123456789abcdef" for c in hexpart):
            raise
        # from the index (ledger/store/lookup.py), not a scan of all history held in memory
        found = lookup.by_id_prefix(s, hexpart, limit=2)
        if not found:
            raise
        if len(found) > 1:
            raise BadInput(f"{ref!r} matches more than one journal record", "give more hex digits") from None
        return Shown(None, record=found[0])
    size = s.objects.size(oid)
    data = s.get_bytes(oid) if size <= MAX_INLINE_BYTES else None
    obj = None
    if data is not None and data[:1] == b"{":
        try:
            obj = canonical.loads(data)
        except BadInput:
            obj = None
    return Shown(oid, size, obj)


def read_json(oid: str, *, store: StoreLike = None):
    """A structured object, verified (what the CLI's renderers read for a receipt's loss curve)."""
    return open_store(store).get_json(oid)


@dataclass(frozen=True)
class Verified(Wrapped):
    """ledger.store.verify's Report in `result`; failure(): StoreCorrupt when it found faults."""

    read_data: bool = False

    def failure(self):
        rep = self.result
        if rep.ok:
            return None
        from ledger.sharing import repair as repair_mod  # ~100 ms (sharing, records): only a failed verify needs it

        damaged = repair_mod.damaged_ids(rep)
        hint = (f"`ledger repair --from REMOTE|BUNDLE` replaces the {len(damaged)} missing or damaged object(s) "
                "with verified copies" if damaged else "restore the named records from a bundle or backup")
        return StoreCorrupt(f"verify found {len(rep.errors)} fault(s); first: {rep.errors[0]['message']}", hint)


def verify(*, read_data: bool = False, full: bool = False, progress=None, store: StoreLike = None) -> Verified:
    """Check the journal chain, the caches and the objects: from the last clean verify's
    watermark on (docs/store-format.md, rule 20), or every record with `full`; `read_data`
    (which implies full) rehashes every byte."""
    s = open_store(store)
    # verify's id keys are numpy arrays (~0.15-0.25 s to import): add, cat and every other
    # command of this module must not pay that at start-up (an unchanged re-add is ~0.1 s)
    from ledger.store.verify import verify as run_verify

    rep = run_verify(s, read_data=read_data, full=full, **({"progress": progress} if progress else {}))
    return Verified(result=rep, read_data=read_data, warnings=take_warnings(s))


@dataclass(frozen=True)
class Collected(Wrapped):
    """ledger.store.gc's GcPlan in `result`."""

    pruned: bool = False


def gc(*, prune: bool = False, policy: str | None = None, store: StoreLike = None) -> Collected:
    """The objects no journal record reaches, and the superseded training state the retention
    `policy` removes (default superseded-training-state; ledger/store/retention.py); with
    `prune`, delete them (the policy's removals recorded first, as a `prune` record)."""
    s = open_store(store)
    from ledger.store import gc as gcmod  # ~70 ms (gc's reachability imports numpy): not on every command's path

    pol = retention.policy(policy)
    if prune:
        from ledger.image import protocol  # ~60 ms: only a prune asks whether an image serves (packing)

        p = gcmod.prune(s, pol, packing_refused=lambda: protocol.keeper_serving(s.root))
    else:
        p = gcmod.plan(s, pol)
    return Collected(result=p, pruned=prune, warnings=take_warnings(s))


@dataclass(frozen=True)
class Repacked(Wrapped):
    """ledger.store.repack's RepackPlan in `result` (applied, or what would be done)."""


def repack(*, apply: bool = False, min_dead: float = 0.5, store: StoreLike = None) -> Repacked:
    """Packs of chunks at least `min_dead` of whose bytes no object names (after gc): with
    `apply`, their live chunks are copied into one new pack, the indexes of the objects that
    named them rewritten, then they are removed (docs/store-format.md C11). Ids never change."""
    if not 0 < min_dead <= 1:
        raise BadInput(f"--min-dead {min_dead} is not a fraction in (0, 1]", "e.g. --min-dead 0.5")
    s = open_store(store)
    from ledger.store import repack as rp  # only this command reads every chunk index

    res = rp.repack(s, min_dead) if apply else rp.plan(s, min_dead)
    return Repacked(result=res, warnings=take_warnings(s))


@dataclass(frozen=True)
class QueryResult(Result):
    """The columns and rows of one read-only SQL query over the index."""
    columns: tuple[str, ...]
    rows: tuple[tuple, ...]

    def to_json(self):
        return [dict(zip(self.columns, r)) for r in self.rows]


def query(sql: str, *, store: StoreLike = None) -> QueryResult:
    """Read-only SQL over the DuckDB index. An index that lags the journal (a crash after a commit)
    is brought up to date first when nobody is writing; otherwise a warning says so."""
    s = open_store(store)
    warn = []
    seq = index.indexed_seq(s.root)
    if not s.index_current():  # behind, or not this store's projection (copied from another store)
        try:   # a reader never waits for the lock
            with s.locked():
                s.sync_index()
        except Locked:
            warn.append(f"the index is behind the journal ({seq} < {s.state.seq}) and a writer holds the lock")
    cols, rows = s.query(sql)
    return QueryResult(tuple(cols), tuple(tuple(r) for r in rows), warnings=take_warnings(s) + tuple(warn))


@dataclass(frozen=True)
class Rebuilt(Result):
    """The journal seq a fresh index was rebuilt to."""
    rebuilt: bool
    seq: int


def index_rebuild(*, store: StoreLike = None) -> Rebuilt:
    """Recreate the DuckDB index by replaying the journal."""
    s = open_store(store)
    s.rebuild_index()
    return Rebuilt(True, s.state.seq, warnings=take_warnings(s))


@dataclass(frozen=True)
class Unlocked(Result):
    """Whether `unlock` cleared a dead holder's lock, and whose."""
    cleared: bool
    holder: Mapping | None
    describe: str = ""

    def to_json(self):
        return {"cleared": self.cleared, "holder": self.holder}

    def failure(self):
        if self.holder is None or self.cleared:
            return None
        if self.holder["status"] == "live":
            return Locked(f"lock is held by a live process ({self.describe}); not cleared", "wait for it to finish")
        return Locked(f"lock is held from another host ({self.describe}); not cleared",
                      "if you know that process is dead, pass --force-other-host")


def unlock(*, force_other_host: bool = False, store: StoreLike = None) -> Unlocked:
    """Clear the store lock if (and only if) its holder is dead (or, with `force_other_host`, held
    from another host). failure(): Locked when it was not cleared."""
    lock = Lock(store_root(store))
    # clear_invalid: a symlink, FIFO or empty directory at the lock path is no one's lock
    cleared, info = lock.break_if_dead(force_other_host, clear_invalid=True)
    holder = None if info is None else {"pid": info.pid, "host": info.host, "status": info.status(), "kind": info.kind}
    return Unlocked(cleared, holder, info.describe() if info is not None else "")
