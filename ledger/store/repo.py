"""The store: objects + journal + state + index, and the transaction that ties them.

Write ordering (docs/store-format.md): objects first (each fsynced and renamed into place),
then one journal record appended and fsynced — the commit point — then the derived caches
(refs.json, the DuckDB index). A crash before the commit point leaves only unreferenced
objects (gc removes them); a crash after it leaves caches that the next reader or writer
brings up to date from the journal.
"""

from __future__ import annotations

import json
import os
import sys
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from ledger.errors import (BadInput, JournalCorrupt, MissingObject, NotAStore, StoreCorrupt, UnknownRef,
                           UnsupportedFormat)
from ledger.store import canonical, faults, fsio, index
from ledger.store.ids import PREFIX, hash_bytes, is_id, find_ids
from ledger.store.journal import Journal, default_actor, make_record
from ledger.store.lock import Lock
from ledger.store.objects import ObjectStore
from ledger.store.paths import DIRNAME, find_root
from ledger.store.state import State, check_ref_changes, fold

FORMAT_VERSION = 1
@dataclass
class Transaction:
    store: "Store"
    kind: str
    actor: str
    inputs: list = field(default_factory=list)
    outputs: list = field(default_factory=list)
    payload: dict = field(default_factory=dict)
    refs: dict = field(default_factory=dict)
    objects: dict = field(default_factory=dict)  # id -> (size, kind) written or referenced here
    record: dict | None = None
    # Stat-cache entries are written only after the commit, so a hit means "this exact file
    # was committed before" — that is what lets an unchanged re-add skip both hash and record.
    stat_pending: list = field(default_factory=list)

    def _note(self, oid: str, size: int, kind: str) -> str:
        self.objects[oid] = (size, kind)
        return oid

    def put_bytes(self, data: bytes, kind: str = "blob") -> str:
        oid, _ = self.store.objects.put_bytes(bytes(data))
        return self._note(oid, len(data), kind)

    def put_json(self, obj, kind: str | None = None) -> str:
        data = canonical.dumps(obj)
        k = kind or (obj.get("kind") if isinstance(obj, dict) and isinstance(obj.get("kind"), str) else "json")
        return self.put_bytes(data, k)

    def put_file(self, path: str | Path, kind: str = "blob", progress=None) -> str:
        path = Path(path)
        key = self.store.stat_key(path)
        cached = self.store.stat_cache_get(key)
        if cached:
            return self._note(cached, path.stat().st_size, kind)
        if path.stat().st_size >= PRELOAD_INDEX_BYTES and not self.store._index_deferred:
            index.preload()
        oid, size, _ = self.store.objects.put_file(path, progress)
        self.stat_pending.append((key, oid))
        return self._note(oid, size, kind)

    def put_tree(self, directory: str | Path, kind: str = "tree", progress=None) -> str:
        """Every regular file under `directory` as a blob, then a tree object listing them."""
        root = Path(directory)
        entries = []
        for dirpath, dirnames, filenames in os.walk(root, followlinks=False):
            dirnames.sort()
            for name in sorted(filenames):
                p = Path(dirpath) / name
                if p.is_symlink() or not p.is_file():
                    raise BadInput(f"{p} is not a regular file", "ledger stores regular files only; remove links and special files")
                oid = self.put_file(p, progress=progress)
                st = p.stat()
                entries.append({"path": p.relative_to(root).as_posix(), "id": oid, "size": st.st_size,
                                "exec": bool(st.st_mode & 0o111)})
        return self.put_json({"kind": "tree", "entries": entries}, kind)


TAIL_SYNC_MAX = 10_000  # index catch-up reads up to this many records from the journal's end
PRELOAD_INDEX_BYTES = 64 << 20  # a copy this large waits on the disk long enough to hide DuckDB's import


class Store:
    def __init__(self, root: Path):
        # Absolute: training and serving children run in other working directories, and
        # every path handed to them is derived from the root.
        root = Path(root).absolute()
        self.root = root
        self.objects = ObjectStore(root)
        self.journal = Journal(root)
        self.lock = Lock(root)
        self.tmp = root / "tmp"
        self.warnings: list[str] = []
        self._state: State | None = None
        self._scan_end = 0
        self._index_deferred = 0  # > 0 inside index_deferred(): commits leave the index behind

    # --- opening ------------------------------------------------------------------------
    @classmethod
    def init(cls, dir: str | Path = ".") -> "Store":
        p = Path(dir)
        root = p if p.name == DIRNAME else p / DIRNAME
        if (root / "config").exists():
            raise BadInput(f"a ledger store already exists at {root}", "use it as is, or choose another directory")
        for sub in ("objects", "tmp", "cache/stat", "sealed"):
            (root / sub).mkdir(parents=True, exist_ok=True)
        cfg = {"format": FORMAT_VERSION, "hash": "blake3", "ids": "b3:<64 hex>"}
        fsio.atomic_write(root / "config", canonical.dumps(cfg) + b"\n", root / "tmp")
        fsio.fsync_dir(root.parent)
        store = cls(root)
        with store.transaction("init") as tx:
            tx.payload["format"] = FORMAT_VERSION
        return store

    @classmethod
    def open(cls, dir: str | Path | None = None) -> "Store":
        root = find_root(dir)
        try:
            cfg = json.loads((root / "config").read_bytes())
            fmt = cfg["format"]
        except (OSError, ValueError, KeyError, TypeError):
            raise UnsupportedFormat(f"{root}/config is unreadable", "the store's config file is damaged") from None
        if fmt != FORMAT_VERSION:
            raise UnsupportedFormat(f"store format {fmt!r} is not understood by this ledger (knows {FORMAT_VERSION})")
        return cls(root)

    # --- reading ------------------------------------------------------------------------
    def _load_cache(self) -> dict | None:
        try:
            c = json.loads((self.root / "refs.json").read_bytes())
            State.from_json(c)
            int(c["offset"])
            return c
        except (OSError, ValueError, KeyError, TypeError):
            return None

    @property
    def state(self) -> State:
        """The fold of the journal, using refs.json as a starting point when it is current."""
        if self._state is None:
            c = self._load_cache()
            start, offset = State(), 0
            if c and self.journal.path.exists() and self.journal.path.stat().st_size >= c["offset"]:
                start, offset = State.from_json(c), c["offset"]
            scan = self.journal.scan(offset, start.seq + 1, start.head)
            if scan.broken_at is not None and offset:
                scan, start = self.journal.scan(), State()
            if scan.broken_at is not None:
                self.warnings.append(f"journal is damaged at {scan.problem}; showing state before it (run `ledger verify`)")
            self._state = fold(scan.records, start)
            self._scan_end = scan.end
        return self._state

    def get_bytes(self, oid: str) -> bytes:
        return self.objects.get_bytes(oid)

    def get_json(self, oid: str):
        return self.objects.get_json(oid)

    def has(self, oid: str) -> bool:
        return self.objects.has(oid)

    def object_path(self, oid: str) -> Path:
        return self.objects.path(oid)

    def export_file(self, oid: str, dest) -> None:
        self.objects.export_file(oid, Path(dest))

    def resolve(self, name: str) -> str:
        """An exact id, a ref (HEAD, gen-N, a name given to `add --name`), or an 8+ hex prefix."""
        if is_id(name):
            return name
        refs = self.state.refs
        for candidate in (name, f"name/{name}"):
            if candidate in refs:
                return refs[candidate]
        try:
            return self.objects.resolve_prefix(name)
        except UnknownRef:
            raise UnknownRef(f"unknown name or id: {name!r}") from None

    def query(self, sql: str):
        return index.query(self.root, sql)

    # --- writing ------------------------------------------------------------------------
    def _check_writable(self) -> None:
        fstype = fsio.fs_type(self.root)
        if fstype in fsio.NETWORK_FS and os.environ.get("LEDGER_ALLOW_NETFS") != "1":
            raise BadInput(f"the store is on a network filesystem ({fstype}); locking and fsync are not reliable there",
                           "move the store to a local disk, or set LEDGER_ALLOW_NETFS=1 to accept the risk")

    def _writer_state(self) -> tuple[State, int]:
        """The verified state a writer appends to. Refuses to append after tampering."""
        c = self._load_cache()
        size = self.journal.path.stat().st_size if self.journal.path.exists() else 0
        start, offset = State(), 0
        if c and size >= c["offset"] and c.get("digest") == self.journal.prefix_digest(c["offset"]):
            start, offset = State.from_json(c), c["offset"]
        elif c and c["offset"] and size >= c["offset"]:
            self.warnings.append("refs.json did not match the journal; re-checked the whole chain")
        scan = self.journal.scan(offset, start.seq + 1, start.head, keep=True)
        if scan.broken_at is not None:
            raise JournalCorrupt(f"journal is tampered or damaged at {scan.problem}; appends are refused",
                                 "run `ledger verify`; restore the journal from a bundle or backup")
        st = fold(scan.records, start)
        if c and offset == 0 and c["seq"] >= 1 and c["seq"] <= st.seq and scan.records[c["seq"] - 1]["id"] != c["head"]:
            raise JournalCorrupt(f"record {c['seq']} differs from the one committed earlier: history was rewritten",
                                 "restore the journal from a bundle or backup")
        if c and st.seq < c["seq"]:
            raise JournalCorrupt(f"journal ends at record {st.seq} but record {c['seq']} was seen before: records were removed",
                                 "restore the journal from a bundle or backup")
        if scan.torn:
            aside = self.journal.set_aside_tail(scan.end)
            self.warnings.append(f"moved a torn journal tail ({len(scan.torn)} bytes) aside to {aside.name}")
        return st, scan.end

    def _write_cache(self, st: State, offset: int) -> None:
        c = {**st.to_json(), "offset": offset, "digest": self.journal.prefix_digest(offset)}
        fsio.atomic_write(self.root / "refs.json", canonical.dumps(c), self.tmp, durable=False)

    def sync_index(self, st: State | None = None) -> None:
        st = st or self.state

        def records_after(seq: int) -> list[dict]:
            # The usual gap is one record (this commit): read it from the end of the journal
            # rather than scanning a journal of millions of records on every write.
            gap = st.seq - seq
            if 0 < gap <= TAIL_SYNC_MAX:
                recs = self.journal.tail(gap)
                if len(recs) == gap and recs[0]["seq"] == seq + 1:
                    return recs
            return self.journal.scan().records[seq:]

        index.sync(self.root, records_after, st, self.get_json, self.tmp, lambda: self.journal.scan().records)

    @contextmanager
    def index_deferred(self):
        """Commits inside leave the index behind; it is brought up to date once, at the end.
        For a run of transactions that nothing reads the index between (a learn cycle's
        stages). A crash inside leaves a whole index that is behind the journal, which the
        next writer's sync or `ledger query` catches up (docs/store-format.md, rule 8)."""
        self._index_deferred += 1
        try:
            yield
        finally:
            self._index_deferred -= 1
            if not self._index_deferred:
                try:
                    with self.locked(float(os.environ.get("LEDGER_LOCK_WAIT", "0"))):
                        self.sync_index(self._writer_state()[0])
                except Exception as e:  # noqa: BLE001 - derived state only; every commit stands
                    if os.environ.get("LEDGER_DEBUG") == "1":
                        raise
                    self.warnings.append(f"committed, but updating the index failed ({e}); `ledger query` catches it up")

    def rebuild_index(self) -> None:
        with self.locked():
            scan = self.journal.scan()
            st = fold(scan.records)
            index.rebuild(self.root, scan.records, st, self.get_json, self.tmp)
            self._write_cache(st, scan.end)

    @contextmanager
    def locked(self, wait: float = 0.0):
        self._check_writable()
        self.lock.acquire(wait)
        if self.lock.broke:
            self.warnings.append("cleared a lock left by a dead process")
        try:
            self._ensure_dirs()
            yield
        finally:
            self.lock.release()

    @contextmanager
    def transaction(self, kind: str, actor: str | None = None, wait: float | None = None):
        if not wait:  # None or 0 (the CLI's default): LEDGER_LOCK_WAIT may still ask to wait
            wait = float(os.environ.get("LEDGER_LOCK_WAIT", "0"))
        with self.locked(wait):
            st, end = self._writer_state()
            # Code inside the transaction reads store.state (HEAD, counters): it must see the
            # state this transaction appends to, not whatever this object folded earlier.
            self._state, self._scan_end = st, end
            tx = Transaction(self, kind, actor or default_actor())
            yield tx
            check_ref_changes(tx.refs)
            for oid in tx.inputs + tx.outputs + list(tx.refs.values()):
                if oid is not None and not self.objects.has(oid):
                    raise UnknownRef(f"transaction refers to {oid}, which is not in the store")
            payload = dict(tx.payload)
            if tx.refs:
                payload["refs"] = dict(tx.refs)
            if tx.objects:
                payload["objects"] = [[oid, size, k] for oid, (size, k) in sorted(tx.objects.items())]
            rec = make_record(st.seq + 1, st.head, kind, tx.inputs, tx.outputs, tx.actor, payload)
            faults.point("tx.before-append")
            try:
                new_end = self.journal.append(rec, end)
            except OSError as e:
                raise fsio.io_error(e, "appending to the journal") from e
            # --- committed. Everything below is derived and recoverable. ---
            faults.point("tx.committed")
            tx.record = rec
            st = st.apply(rec)
            self._state, self._scan_end = st, new_end
            try:
                for key, oid in tx.stat_pending:
                    self.stat_cache_put(key, oid)
                self._write_cache(st, new_end)
                faults.point("tx.cache-written")
                if not self._index_deferred:
                    self.sync_index(st)
            except Exception as e:  # noqa: BLE001 - derived state only; the commit stands
                if os.environ.get("LEDGER_DEBUG") == "1":
                    raise
                self.warnings.append(f"committed, but updating caches failed ({e}); run `ledger index rebuild`")

    def _ensure_dirs(self) -> None:
        """Recreate the scratch directories a writer needs (tmp/ may be deleted like a cache);
        the lock holder does it, so nothing else races it."""
        if not self.tmp.is_dir():
            try:
                self.tmp.mkdir(exist_ok=True)
            except FileExistsError:
                raise StoreCorrupt(f"{self.tmp} is not a directory", f"remove {self.tmp}; the next write recreates it") from None
            except OSError as e:
                raise fsio.io_error(e, "recreating tmp/") from e
            self.warnings.append("recreated the missing tmp/ directory")

    # --- stat cache ---------------------------------------------------------------------
    def _key(self, text: str) -> Path:
        return self.root / "cache" / "stat" / hash_bytes(text.encode())[len(PREFIX):][:32]

    @staticmethod
    def _stat_text(path: Path) -> str:
        st = path.stat()
        return f"{path.resolve()}\0{st.st_dev}\0{st.st_ino}\0{st.st_size}\0{st.st_mtime_ns}\0{st.st_ctime_ns}"

    def stat_key(self, path: Path) -> Path:
        return self._key(self._stat_text(path))

    def tree_key(self, directory: Path) -> Path:
        """Key of a directory: every file's stat line, so any change anywhere misses."""
        lines = []
        for dirpath, dirnames, filenames in os.walk(directory, followlinks=False):
            dirnames.sort()
            lines.extend(self._stat_text(Path(dirpath) / f) for f in sorted(filenames))
        return self._key("tree\0" + "\n".join(lines))

    def stat_cache_get(self, key: Path) -> str | None:
        try:
            oid = key.read_text().strip()
        except (OSError, UnicodeDecodeError):
            return None
        return oid if is_id(oid) and self.objects.has(oid) else None

    def stat_cache_put(self, key: Path, oid: str) -> None:
        try:
            key.parent.mkdir(parents=True, exist_ok=True)
            fsio.atomic_write(key, oid.encode(), self.tmp, durable=False)
        except OSError:
            pass  # a cache; losing an entry only costs a rehash

    # --- reachability -------------------------------------------------------------------
    def roots(self, records=None) -> set[str]:
        out: set[str] = set()
        for r in records if records is not None else self.journal.scan().records:
            out.update(r["inputs"])
            out.update(r["outputs"])
            find_ids(r["payload"], out)
        return out

    def closure(self, roots, missing: set | None = None) -> set[str]:
        """Every object reachable from `roots`, following ids inside structured objects."""
        seen: set[str] = set()
        stack = list(roots)
        while stack:
            oid = stack.pop()
            if oid in seen:
                continue
            seen.add(oid)
            p = self.objects.path(oid)
            try:
                with open(p, "rb") as f:
                    head = f.read(1)
                    if head != b"{" or os.fstat(f.fileno()).st_size > (256 << 20):
                        continue
                    f.seek(0)
                    data = f.read()
            except FileNotFoundError:
                if missing is not None:
                    missing.add(oid)
                continue
            try:
                obj = canonical.loads(data)
            except BadInput:
                continue
            stack.extend(find_ids(obj) - seen)
        return seen
