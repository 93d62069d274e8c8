"""The store: objects + journal + state + index, and the transaction that ties them.

Write ordering (docs/store-format.md): objects first (each fsynced and renamed into place),
then one journal record appended and fsynced — the commit point — then the derived caches
(refs.json, the DuckDB index). A crash before the commit point leaves only unreferenced
objects (gc removes them); a crash after it leaves caches that the next reader or writer
brings up to date from the journal.
"""

from __future__ import annotations

import difflib
import fcntl
import json
import os
import re
import shutil
import time
import uuid
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import orjson

from ledger.errors import (
    BadInput,
    CorruptObject,
    InternalError,
    JournalCorrupt,
    LedgerError,
    Locked,
    MissingObject,
    StoreCorrupt,
    UnknownRef,
    UnsupportedFormat,
    check_interrupt,
)
from ledger.store import canonical, faults, fsio, index, retention, schema, statcache, trees
from ledger.store.ids import find_ids, is_id
from ledger.store.journal import Journal, default_actor, make_record, stat_identity
from ledger.store.lock import Lock
from ledger.store.objects import ObjectStore
from ledger.store.paths import DIRNAME, FORMAT_VERSION, FORMATS, find_root
from ledger.store.state import Fold, State, check_ref_changes


@dataclass
class Transaction:
    """One transaction: the objects it writes and the one record it appends on exit."""
    store: "Store"
    kind: str
    actor: str
    inputs: list = field(default_factory=list)
    outputs: list = field(default_factory=list)
    payload: dict = field(default_factory=dict)
    refs: dict = field(default_factory=dict)
    objects: dict = field(default_factory=dict)  # id -> (size, kind) written or referenced here
    # id -> chunk-list digest of a chunked object whose index this process wrote or checked
    # whole and by name (payload.chunk_lists: what lets verify --read-data hash it once, C12)
    chunk_lists: dict = field(default_factory=dict)
    record: dict | None = None
    # Stat-cache entries are written only after the commit, so a hit means "this exact file
    # was committed before" — that is what lets an unchanged re-add skip both hash and record.
    stat_pending: list = field(default_factory=list)

    def _note(self, oid: str, size: int, kind: str) -> str:
        self.objects[oid] = (size, kind)
        listed = self.store.objects.lists.get(oid)
        if listed is not None:
            self.chunk_lists[oid] = listed
        return oid

    def put_bytes(self, data: bytes, kind: str = "blob", compressed: bool = False) -> str:
        oid, _ = self.store.objects.put_bytes(bytes(data), compressed=compressed and self.store.compresses)
        return self._note(oid, len(data), kind)

    def put_json(self, obj, kind: str | None = None) -> str:
        data = canonical.dumps(obj)
        k = kind or (obj.get("kind") if isinstance(obj, dict) and isinstance(obj.get("kind"), str) else "json")
        return self.put_bytes(data, k, compressed=True)  # structured: stored compressed where it pays (Z1)

    def put_file(self, path: str | Path, kind: str = "blob", progress=None, identity: tuple | None = None) -> str:
        path = Path(path)
        key = self.store.stat_key(path)
        if identity is not None and key.identity != identity:   # trees.put_tree: the file its walk saw
            raise BadInput(f"{path} changed while it was being added", "retry when nothing is writing to it")
        cached = self.store.stat_cache_get(key)
        if cached:
            return self._note(cached, key.size, kind)
        if key.size >= PRELOAD_INDEX_BYTES and not self.store._index_deferred:
            index.preload()
        oid, size, _ = self.store.objects.put_file(path, progress, expect_stat=key.identity)
        self.stat_pending.append((key, oid))
        return self._note(oid, size, kind)

    def put_tree(self, directory: str | Path, kind: str = "tree", progress=None) -> str:
        """Every regular file under `directory` as a blob, then a tree object listing them
        (ledger/store/trees.py: names are bytes, escaped where they are not UTF-8)."""
        return trees.put_tree(self, directory, kind, progress)

    def record_object(self, oid: str, kind: str) -> str:
        """Name an object already in the store as written by this transaction (it goes into
        the record's `objects`, so gc, bundles and the index see it). Refuses an absent one."""
        return self._note(oid, self.store.objects.size(oid), kind)


CONFIG_MAX = 64 << 10   # config is ~100 bytes: never read more
REFS_MAX = 256 << 20    # refs.json holds every ref: generous, but bounded


def _new_store_id() -> str:
    # not a b3: id, so nothing mistakes it for a reference to an object
    return "store-" + uuid.uuid4().hex


@dataclass(frozen=True)
class StatKey:
    """A stat-cache entry's name, and what is needed to judge and use a hit."""
    path: Path                 # the entry's file under cache/stat/
    size: int                  # bytes covered (a file's size, or a folder's total)
    newest_ns: int             # newest mtime/ctime of the files covered (the racy check)
    identity: tuple | None     # (dev, ino, size, mtime_ns) of a single file: put_file checks it


RACY_RETRIES = 50  # a tick is at most a few ms: then refs.json stays racy and the next writer re-checks
READER_CACHE_GAP = 1000  # a reader that folds this many records past refs.json moves it to the head
TAIL_SYNC_MAX = 10_000  # index catch-up reads up to this many records from the journal's end
PRELOAD_INDEX_BYTES = 64 << 20  # a copy this large waits on the disk long enough to hide DuckDB's import


class Store:
    """A store: objects, journal, state, index and lock, and the transaction that ties them."""
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
        self._config: dict | None = None
        self._work_locks: dict[Path, int] = {}  # work folder -> the fd holding its flock
        self._pruned: dict | None = None  # ids `prune` records removed (pruned())

    # --- opening ------------------------------------------------------------------------
    @classmethod
    def init(cls, dir: str | Path = ".") -> "Store":
        p = Path(dir)
        root = p if p.name == DIRNAME else p / DIRNAME
        if (root / "config").exists():
            raise BadInput(f"a ledger store already exists at {root}", "use it as is, or choose another directory")
        for sub in ("objects", "tmp", "cache/stat", "sealed"):
            (root / sub).mkdir(parents=True, exist_ok=True)
        cfg = {"format": FORMAT_VERSION, "hash": "blake3", "ids": "b3:<64 hex>", "id": _new_store_id()}
        fsio.atomic_write(root / "config", canonical.dumps(cfg) + b"\n", root / "tmp")
        fsio.fsync_dir(root.parent)
        store = cls(root)
        with store.transaction("init") as tx:
            tx.payload["format"] = FORMAT_VERSION
        return store

    @classmethod
    def open(cls, dir: str | Path | None = None) -> "Store":
        root = find_root(dir)
        store = cls(root)
        fmt = store.config["format"]
        if fmt not in FORMATS or isinstance(fmt, bool):
            raise UnsupportedFormat(f"store format {fmt!r} is not understood by this ledger (knows {FORMAT_VERSION})")
        return store

    @property
    def compresses(self) -> bool:
        """Structured objects are written compressed (format 2; Z1, Z5, Z6)."""
        return self.config.get("format") == FORMAT_VERSION

    @property
    def config(self) -> dict:
        if self._config is None:
            try:
                cfg = json.loads(fsio.read_small(self.root / "config", CONFIG_MAX))
                cfg["format"]
            except (OSError, ValueError, KeyError, TypeError, RecursionError, fsio.NotRegular):
                raise UnsupportedFormat(f"{self.root}/config is unreadable",
                                        "the store's config file is damaged") from None
            self._config = cfg
        return self._config

    @property
    def store_id(self) -> str | None:
        """This store's identity (config "id"): caches record it, so a cache copied from
        another store is recognised. None only for a store made before ids, until its next
        writer gives it one."""
        sid = self.config.get("id")
        return sid if isinstance(sid, str) else None

    def _ensure_format(self) -> None:
        """Upgrade a format-1 store to format 2 (lock holder only; Z6): its objects stay as they
        are, new structured objects may be compressed, and a ledger that knows only format 1
        refuses the store instead of finding `.z` objects missing."""
        if self.config.get("format") == FORMAT_VERSION:
            return
        cfg = {**self.config, "format": FORMAT_VERSION}
        fsio.atomic_write(self.root / "config", canonical.dumps(cfg) + b"\n", self.tmp)
        self._config = cfg

    def _ensure_id(self) -> None:
        """Migrate a store made before store ids: give it one (lock holder only)."""
        if self.store_id is not None:
            return
        cfg = {**self.config, "id": _new_store_id()}
        fsio.atomic_write(self.root / "config", canonical.dumps(cfg) + b"\n", self.tmp)
        self._config = cfg

    # --- reading ------------------------------------------------------------------------
    def _load_cache(self) -> dict | None:
        """refs.json if it is this store's (a copy from another store is ignored), with the
        file's own mtime under "written_ns" (the racy rule of rule 19)."""
        try:
            fd, fst = fsio.open_regular(self.root / "refs.json")
            try:
                if fst.st_size > REFS_MAX:
                    return None
                c = json.loads(fsio.read_bounded(fd, fst.st_size))
            finally:
                os.close(fd)
            State.from_cache(c)
            j = c.get("journal")
            if not isinstance(c.get("offset"), int) or isinstance(c["offset"], bool) or c["offset"] < 0 \
                    or not (j is None or (isinstance(j, list) and all(type(x) is int for x in j))) \
                    or not (c.get("store") is None or isinstance(c["store"], str)):
                raise ValueError("offset, journal or store")  # written by anyone: every field typed
        except (OSError, ValueError, KeyError, TypeError, AttributeError, RecursionError, fsio.NotRegular):
            return None
        if c.get("store", self.store_id) != self.store_id:  # no "store": written before store ids
            return None
        c["written_ns"] = fst.st_mtime_ns
        return c

    @staticmethod
    def _cache_vouches(c: dict | None, ident: list | None) -> bool:
        """refs.json vouches for the journal's bytes before its offset when the journal file is
        still exactly the one its writer left (rule 19): same device, inode, size, mtime and
        ctime, the size being the cache's offset, and that identity taken strictly before
        refs.json itself was written (git's racy rule: a change within the same timestamp tick
        could leave the stat unchanged)."""
        j = c.get("journal") if c else None
        return (isinstance(j, list) and len(j) == 5 and ident is not None and j == ident
                and j[2] == c["offset"] and j[4] < c["written_ns"])

    @property
    def state(self) -> State:
        """The fold of the journal, using refs.json as a starting point when it is current.

        Readers fold only the records after refs.json's head. Where there is no usable refs.json
        the reader folds the whole journal once and writes one (atomically, as a writer would:
        rule 8), so the next read costs the records since, not the whole history again."""
        if self._state is None:
            c = self._load_cache()
            ident = self.journal.identity()
            start, offset = State(), 0
            if c and ident is not None and ident[2] >= c["offset"] \
                    and self.journal.record_id_before(c["offset"]) == c["head"]:
                # the cache is a starting point only if the journal's record at its offset is its head
                start, offset = State.from_cache(c), c["offset"]
            # refs.json not used as a start is still evidence (rule 6): its head must be the
            # record at its seq. Note that record's id as the fold passes it.
            want = c["seq"] if c else None
            iwant, ihead = self._index_evidence() if not offset else (None, None)
            f, scan, seen = self._fold_noting(start, offset, want, iwant)
            if scan.broken_at is not None and offset:
                start, offset = State(), 0
                f, scan, seen = self._fold_noting(start, offset, want, iwant)
            rewritten = bool(offset == 0 and c and 1 <= c["seq"] <= f.seq and seen.get("id") != c["head"])
            if offset == 0 and not rewritten and iwant is not None and iwant <= f.seq \
                    and seen.get("index") != ihead:
                rewritten, c = True, {"seq": iwant}
            if scan.broken_at is not None:
                self.warnings.append(f"journal is damaged at {scan.problem}; showing state before it "
                                     "(run `ledger verify`)")
            elif scan.torn and self.tail_committed(scan) is not None:
                self.warnings.append(f"committed record {scan.last_seq + 1} is damaged; showing state before it "
                                     "(run `ledger verify`)")
            elif rewritten:
                # A reader's cache would replace the only record of the old head, and the next
                # writer would then append to the rewritten history: leave refs.json as it is.
                self.warnings.append(f"record {c['seq']} differs from the one committed earlier: history was "
                                     "rewritten (writes are refused; run `ledger verify`)")
            elif offset == 0 and scan.end and not scan.torn and (c is None or c["seq"] <= f.seq):
                # A whole, clean fold from record 1: what a writer's cache is. It vouches for the
                # journal's bytes (rule 19) only if nothing was appended while it was read.
                self._reader_write_cache(f.state(), scan.end, ident if ident and ident[2] == scan.end else None)
            elif offset and f.seq - start.seq >= READER_CACHE_GAP and not scan.torn:
                # refs.json far behind (records appended by something that wrote no cache): move
                # it to the head so the next read is cheap. It vouches for nothing — this fold did
                # not read the bytes before the old offset — and the old one vouched for nothing
                # either (the file has grown since), so no writer loses by it.
                self._reader_write_cache(f.state(), scan.end, None)
            self._state = f.state()
            self._scan_end = scan.end
        return self._state

    def _fold_noting(self, start: State, offset: int, want: int | None, iwant: int | None):
        """Fold the journal from `offset` on top of `start`, streaming, noting the ids of the
        records at seq `want` (refs.json's head) and `iwant` (the index's head) as they pass:
        the evidence of rule 6 that readers and writers both check. Returns (fold, scan, seen)."""
        f, seen = Fold(start), {}

        def each(rec):
            f.add(rec)
            if rec["seq"] == want:
                seen["id"] = rec["id"]
            if rec["seq"] == iwant:
                seen["index"] = rec["id"]

        scan = self.journal.scan(offset, start.seq + 1, start.head, keep=False, each=each)
        return f, scan, seen

    def _reader_write_cache(self, st: State, offset: int, ident: list | None) -> None:
        """Write refs.json for a reader that folded the whole journal (no lock: the file is
        renamed into place whole, so any reader sees an old or a new one; a writer that commits
        meanwhile writes its own after). A store this process cannot write is left as it is."""
        if not self.tmp.is_dir():
            return
        try:
            self._write_cache(st, offset, ident)
        except (OSError, LedgerError):
            pass  # a cache: the next reader folds again

    def refresh(self) -> State:
        """Fold the journal again (another process may have committed since this Store
        object last read it) and return the current state."""
        self._state = None
        return self.state

    @property
    def journal_end(self) -> int:
        """Byte offset just after the last whole record of the state last folded."""
        self.state
        return self._scan_end

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

    @staticmethod
    def _ref_hint(name: str, refs: dict) -> str:
        """Did-you-mean for a ref: the closest names (`Head` → HEAD, `gen1` → gen-1), else what exists."""
        names = sorted(n.removeprefix("name/") for n in refs if not n.startswith(("remote:", "key:", "setting:")))
        folded = {n.lower().replace("-", "").replace("_", ""): n for n in names}
        key = name.lower().replace("-", "").replace("_", "")
        close = [folded[key]] if key in folded else difflib.get_close_matches(name, names, n=3, cutoff=0.6)
        if close:
            return "did you mean " + " or ".join(f"`{c}`" for c in close) + "?"
        if key == "head" or re.fullmatch(r"gen\d+", key):
            return "no generation is committed yet: `ledger run` makes gen-1 (see `ledger gens`)"
        if not names:
            return "the store has no refs yet; pass an object id (8+ hex digits), e.g. from `ledger log`"
        shown = ", ".join(names[:6]) + (", …" if len(names) > 6 else "")
        return f"refs here: {shown}; or pass an object id (8+ hex digits)"

    def resolve(self, name: str) -> str:
        """An exact id, a ref (HEAD, gen-N, a name given to `add --name`), or an 8+ hex prefix."""
        if is_id(name):
            if not self.objects.has(name):
                self._not_stored(name)
            return name
        refs = self.state.refs
        for candidate in (name, f"name/{name}"):
            if candidate in refs:
                return refs[candidate]
        try:
            return self.objects.resolve_prefix(name)
        except UnknownRef:
            raise UnknownRef(f"unknown name or id: {name!r}", self._ref_hint(name, refs)) from None

    def _not_stored(self, oid: str):
        """An exact id with no regular file behind it: corruption if the journal reaches it
        (missing or damaged), else just an id this store never had (bad input, exit 2)."""
        try:
            self.objects.size(oid)  # raises CorruptObject for a directory, link or FIFO in its place
        except MissingObject:
            pass
        if oid in self.pruned():
            p = self.pruned()[oid]
            raise MissingObject(oid, f"object {oid} ({p['role']}) was removed by retention policy {p['policy']} "
                                     f"(prune record {p['seq']})",
                                "it was superseded training state; `ledger gc` says what each policy keeps")
        if oid in self.closure(self.roots()):
            raise MissingObject(oid)
        raise UnknownRef(f"{oid} is not in this store (not found)", "check the id; `ledger log` lists what was stored")

    def replace_damaged(self, oid: str, source) -> bool:
        """Replace a missing or damaged object with a verified copy (`source`: its bytes, or a
        file holding them). The copy must hash to `oid` (CorruptObject otherwise, nothing
        changes); the swap is one rename. Returns True if it replaced something, False if the
        stored copy was intact. Takes the lock unless the caller holds it (a transaction)."""
        if self.lock.held:
            done = self.objects.replace_damaged(oid, source)
        else:
            with self.locked(float(os.environ.get("LEDGER_LOCK_WAIT", "0"))):
                done = self.objects.replace_damaged(oid, source)
        self._report_repairs()
        return done

    def _report_repairs(self) -> None:
        while self.objects.repaired:
            oid = self.objects.repaired.pop(0)
            self.warnings.append(f"replaced the damaged copy of object {oid} with a verified one")

    def query(self, sql: str):
        """Read-only SQL on the index; a deferred table the SQL names (the turns a rebuild left for
        their first use, store/index.py) is filled first, under the lock, unless a writer holds it
        (then a warning says the table is incomplete)."""
        if index.mentions_deferred(sql) and index.deferred_behind(self.root):
            try:
                self.complete_index()
            except Locked:
                self.warnings.append(f"the index's {', '.join(index.deferred_tables())} table is not filled yet and a "
                                     "writer holds the lock: its rows stop early; query again when it is done")
        return index.query(self.root, sql)

    def complete_index(self) -> None:
        """Fill the index's deferred tables (store/index.py) up to its seq."""
        with self.locked():
            why = index.complete(self.root, self.get_json)
        if why is not None:
            self.warnings.append(f"{why}: the index is not to be trusted; run `ledger index rebuild`")

    # --- writing ------------------------------------------------------------------------
    def _check_writable(self) -> None:
        fstype = fsio.fs_type(self.root)
        if fstype in fsio.NETWORK_FS and os.environ.get("LEDGER_ALLOW_NETFS") != "1":
            raise BadInput(f"the store is on a network filesystem ({fstype}); locking and fsync are not reliable there",
                           "move the store to a local disk, or set LEDGER_ALLOW_NETFS=1 to accept the risk")

    def _writer_state(self) -> tuple[State, int]:
        """The verified state a writer appends to. Refuses to append after tampering.

        O(record) when refs.json vouches for the journal (rule 19: the file is exactly the one
        the last writer left): nothing before its offset is read. Otherwise (a writer died
        between its commit and its cache, a cache of another store or from before a change, a
        journal edited, truncated or replaced) the whole chain is re-checked, streaming, and
        the next cache vouches again."""
        c = self._load_cache()
        ident = self.journal.identity()
        size = ident[2] if ident else 0
        start, offset = State(), 0
        if self._cache_vouches(c, ident) and self.journal.record_id_before(c["offset"]) == c["head"]:
            start, offset = State.from_cache(c), c["offset"]
        elif c and c["offset"] and size >= c["offset"]:
            self.warnings.append("refs.json did not vouch for the journal (changed since its last writer); "
                                 "re-checked the whole chain")
        want = c["seq"] if c and offset == 0 else None
        iwant, ihead = self._index_evidence() if offset == 0 else (None, None)
        f, scan, seen = self._fold_noting(start, offset, want, iwant)
        if scan.broken_at is not None:
            raise JournalCorrupt(f"journal is tampered or damaged at {scan.problem}; appends are refused",
                                 "run `ledger verify`; restore the journal from a bundle or backup")
        st = f.state()
        if want is not None and want >= 1 and want <= st.seq and seen.get("id") != c["head"]:
            raise JournalCorrupt(f"record {c['seq']} differs from the one committed earlier: history was rewritten",
                                 "restore the journal from a bundle or backup")
        if iwant is not None and iwant <= st.seq and seen.get("index") != ihead:
            raise JournalCorrupt(f"record {iwant} differs from the one this store's index holds: history was "
                                 "rewritten or the journal replaced; appends are refused",
                                 "restore .ledger/journal from a bundle or backup; to keep this journal "
                                 "instead, run `ledger index rebuild`")
        if c and st.seq < c["seq"]:
            raise JournalCorrupt(f"journal ends at record {st.seq} but record {c['seq']} was seen before: "
                                 "records were removed",
                                 "restore the journal from a bundle or backup")
        if scan.torn:
            committed = self.tail_committed(scan)
            if committed is not None:
                raise JournalCorrupt(f"record {committed} was committed (the index holds it) but its bytes in "
                                     "the journal are damaged; appends are refused",
                                     "restore .ledger/journal from a bundle or backup; "
                                     "`ledger verify` names the record")
            try:
                aside = self.journal.set_aside_tail(scan.end)
            except OSError as e:
                raise fsio.io_error(e, "moving a torn journal tail aside") from e
            self.warnings.append(f"moved a torn journal tail ({len(scan.torn)} bytes) aside to {aside.name}")
        return st, scan.end

    def _index_evidence(self) -> tuple[int | None, str | None]:
        """(seq, head) of this store's index, for rule 6: like refs.json's, its head must be the
        journal's record at its seq (an index of another store, or from before ids, says nothing).
        Read only where the whole journal is folded anyway (no refs.json vouched)."""
        meta = index.indexed_meta(self.root)
        if meta is None or meta["store"] is None or meta["store"] != self.store_id or meta["seq"] < 1:
            return None, None
        return meta["seq"], meta["head"]

    def tail_committed(self, scan) -> int | None:
        """Bytes after the last whole record are a torn append unless a cache says the record
        after it was committed: then they are a damaged committed record. Returns that
        record's seq, or None. (A lost refs.json leaves the index to say so; refs.json's own
        evidence is checked by the writer and verify as "records were removed".)"""
        last_seq, last_id = scan.last_seq, scan.last_id
        meta = index.indexed_meta(self.root)
        if meta is None or meta["store"] not in (None, self.store_id) or meta["seq"] <= last_seq:
            return None
        if last_seq and index.indexed_id_at(self.root, last_seq) != last_id:
            return None  # the index is of another history: no evidence either way
        return last_seq + 1

    def index_current(self) -> bool:
        """The index projects exactly this store's journal up to its current state."""
        meta = index.indexed_meta(self.root)
        st = self.state
        # an index from before store ids has none (the next sync records it)
        return meta is not None and (meta["seq"], meta["head"]) == (st.seq, st.head) \
            and meta["store"] in (None, self.store_id)

    def _write_cache(self, st: State, offset: int, ident: list | None) -> None:
        """refs.json: the state at `offset`, and (when given) the journal identity that lets the
        next writer trust the bytes before it without reading them (rule 19)."""
        c = {**st.to_json(), "offset": offset, "store": self.store_id}
        if ident is not None:
            c["journal"] = ident
        path = self.root / "refs.json"
        fsio.atomic_write(path, canonical.dumps(c), self.tmp, durable=False)
        # The racy rule: refs.json vouches only if it was written strictly after the journal's
        # last change. Written within the same timestamp tick (coarse clocks give the journal's
        # ctime and this file's mtime the same value about one commit in six here), it is
        # touched again a tick later, so the next writer need not re-check the whole chain.
        for _ in range(RACY_RETRIES if ident is not None else 0):
            if os.stat(path).st_mtime_ns > ident[4]:
                break
            time.sleep(0.001)
            os.utime(path)

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

        # a rebuild (missing or foreign index) is fed by a scan, one record at a time (bounded memory)
        why = index.sync(self.root, records_after, st, self.get_json, self.tmp,
                         lambda: self._index_feeder()[0], self.store_id)
        if why is not None:
            self.warnings.append(f"the index was {why}: rebuilt it from the journal")

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
                    self.warnings.append(f"committed, but updating the index failed ({e}); "
                                         "`ledger query` catches it up")

    def rebuild_index(self) -> None:
        with self.locked():
            ident = self.journal.identity()
            # streamed: the scan hands each record to the fold and the index's batches, so a
            # rebuild holds one batch (index.BATCH_RECORDS), never the whole journal
            f = Fold()
            feed, done = self._index_feeder(f)
            try:
                index.rebuild(self.root, feed, f.state, self.get_json, self.tmp, self.store_id)
                scan, st = done["scan"], f.state()
                if scan.broken_at is None:
                    self._write_cache(st, scan.end, ident if ident and ident[2] == scan.end else None)
            except OSError as e:
                raise fsio.io_error(e, "rebuilding the index") from e

    def _index_feeder(self, f: Fold | None = None):
        """(feed, done): the feeder a rebuild replays the journal through (index._write calls
        feed(add, add_run)), and the dict its scan lands in ("scan"). Each record goes to `add` and
        to the fold `f`, if any (its envelope checked once for both: an ill-formed one stops the
        fold, JournalCorrupt naming the record, rule R4); a run of lines proved in bulk
        (docs/store-format.md, "Lines proved in bulk") goes to `add_run` whole where the index
        takes it so, else record by record, as the scan gives proved lines."""
        done: dict = {}

        def feed(add, add_run):
            def each(rec, line):
                bad = schema.envelope_problem(rec["payload"])
                if f is not None:
                    f.add(rec, checked=bad is None)
                add(rec, line, bad)

            def run_rows(run):
                if add_run(run):
                    if f is not None:
                        f.add_rows(run, 0, len(run))
                    return
                for k in range(len(run)):
                    line = run.line(k)
                    rec = orjson.loads(line)   # proved: canonical, well-formed, hashing to its id
                    if f is not None:
                        f.add(rec, checked=True)
                    add(rec, line, None)
            bulk = {k: run_rows for k in schema.fielded_kinds()}
            done["scan"] = self.journal.scan(keep=False, each=each, lines=True, bulk=bulk)
        return feed, done

    @contextmanager
    def locked(self, wait: float = 0.0):
        self._check_writable()
        self.lock.acquire(wait)
        if self.lock.broke:
            self.warnings.append("cleared a lock left by a dead process")
        try:
            self._ensure_dirs()
            self._ensure_id()
            self._ensure_format()
            yield
        finally:
            self.lock.release()

    @contextmanager
    def transaction(self, kind: str, actor: str | None = None, wait: float | None = None):
        if not wait:  # None or 0 (the CLI's default): LEDGER_LOCK_WAIT may still ask to wait
            wait = float(os.environ.get("LEDGER_LOCK_WAIT", "0"))
        with self.locked(wait):
            with self.transaction_held(kind, actor) as tx:
                yield tx

    @contextmanager
    def transaction_held(self, kind: str, actor: str | None = None):
        """A transaction for a caller that holds the lock already (inside `locked()`), e.g.
        gc, which decides only under the lock whether there is anything to record."""
        if not self.lock.held:
            raise InternalError("transaction_held() outside locked()")
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
        if tx.chunk_lists:
            payload["chunk_lists"] = [[oid, d] for oid, d in sorted(tx.chunk_lists.items()) if oid in tx.objects]
        rec = make_record(st.seq + 1, st.head, kind, tx.inputs, tx.outputs, tx.actor, payload)
        # Every writer's record meets its kind's schema (ledger/records.py) before it can commit:
        # the check verify makes of a stored record, made once where the record is written.
        problem = schema.record_problem(rec)
        if problem is not None:
            raise InternalError(f"refusing to commit an ill-formed {kind} record: {problem}",
                                "this is a bug in the code that wrote it; rerun with LEDGER_DEBUG=1 and report it")
        # A Ctrl-C that something on the way swallowed (rule 24) stops the record here, before
        # it becomes visible: the objects written so far are unreferenced, as after any interrupt.
        check_interrupt()
        faults.point("tx.before-append")
        try:
            new_end = self.journal.append(rec, end)
        except OSError as e:
            raise fsio.io_error(e, "appending to the journal") from e
        # --- committed. Everything below is derived and recoverable. ---
        faults.point("tx.committed")
        self._report_repairs()
        tx.record = rec
        st = st.apply(rec)
        self._state, self._scan_end = st, new_end
        try:
            for key, oid in tx.stat_pending:
                self.stat_cache_put(key, oid)
            appended = self.journal.appended
            self._write_cache(st, new_end, stat_identity(appended) if appended and appended.st_size == new_end
                              else None)
            faults.point("tx.cache-written")
            if not self._index_deferred:
                self.sync_index(st)
        except Exception as e:  # noqa: BLE001 - derived state only; the commit stands
            if os.environ.get("LEDGER_DEBUG") == "1":
                raise
            self.warnings.append(f"committed, but updating caches failed ({e}); run `ledger index rebuild`")

    # --- work folders -------------------------------------------------------------------
    def work_folder(self, prefix: str) -> Path:
        """A fresh folder under tmp/ for work done outside the lock (a training run's inputs
        and outputs). This process holds a flock on it until `discard_work_folder` or its exit,
        so gc can tell a live run's folder (kept) from a killed one's (removed)."""
        if not prefix or "/" in prefix or prefix.startswith("."):
            raise BadInput(f"bad work folder prefix {prefix!r}")
        while True:
            try:
                self.tmp.mkdir(exist_ok=True)
            except OSError as e:
                raise fsio.io_error(e, "creating tmp/") from e
            path = self.tmp / f"{prefix}-{uuid.uuid4().hex[:12]}"
            try:
                path.mkdir()
                fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
            except OSError as e:
                raise fsio.io_error(e, "creating a work folder") from e
            fcntl.flock(fd, fcntl.LOCK_EX)  # waits only while a gc that judged it is removing it
            # a gc may have taken this fresh folder for a dead one before we locked it
            try:
                same = os.path.samestat(os.fstat(fd), os.lstat(path))
            except FileNotFoundError:
                same = False
            if same:
                self._work_locks[path] = fd
                return path
            os.close(fd)

    def discard_work_folder(self, path: Path) -> None:
        """Remove a work folder made by `work_folder` and give up its lock."""
        path = Path(path)
        try:
            shutil.rmtree(path, ignore_errors=True)
        finally:
            fd = self._work_locks.pop(path, None)
            if fd is not None:
                os.close(fd)

    def _ensure_dirs(self) -> None:
        """Recreate the scratch directories a writer needs (tmp/ may be deleted like a cache);
        the lock holder does it, so nothing else races it."""
        if not self.tmp.is_dir():
            try:
                self.tmp.mkdir(exist_ok=True)
            except FileExistsError:
                raise StoreCorrupt(f"{self.tmp} is not a directory",
                                   f"remove {self.tmp}; the next write recreates it") from None
            except OSError as e:
                raise fsio.io_error(e, "recreating tmp/") from e
            self.warnings.append("recreated the missing tmp/ directory")

    # --- stat cache ---------------------------------------------------------------------
    # git's "racy" rule: a file's stat says nothing about a rewrite within the same timestamp
    # tick. An entry is trusted only if every file it covers was last modified strictly before
    # the entry itself was written (both times from the filesystem's clock): such an entry is
    # never written (stat_cache_put), and one that reads as racy is ignored (stat_cache_get).
    # (the entry names, stat lines and lookups are ledger/store/statcache.py's, which answers an
    # unchanged `ledger add FILE` before this module loads)
    def _key(self, text: str) -> Path:
        return statcache.entry_path(self.root, text, self.store_id)

    _stat_line = staticmethod(statcache.stat_line)

    def stat_key(self, path: Path) -> "StatKey":
        text, st = self._stat_line(Path(path))
        return StatKey(self._key(text), st.st_size, max(st.st_mtime_ns, st.st_ctime_ns),
                       (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns))

    def tree_key(self, directory: Path) -> "StatKey":
        """Key of a directory: every file's stat line, so any change anywhere misses."""
        lines, newest, total = [], 0, 0

        def fail(e: OSError):
            raise BadInput(f"{e.filename} could not be read while adding ({e.strerror})",
                           "retry when nothing is changing the folder") from None

        for dirpath, dirnames, filenames in os.walk(directory, followlinks=False, onerror=fail):
            dirnames.sort()
            for f in sorted(filenames):
                text, st = self._stat_line(Path(dirpath) / f)
                lines.append(text)
                newest, total = max(newest, st.st_mtime_ns, st.st_ctime_ns), total + st.st_size
        return StatKey(self._key("tree\0" + "\n".join(lines)), total, newest, None)

    def stat_cache_get(self, key: "StatKey") -> str | None:
        return statcache.lookup(self.root, key.path, key.newest_ns, key.size, blob=key.identity is not None)

    def stat_cache_put(self, key: "StatKey", oid: str) -> None:
        statcache.put(self.root, self.tmp, key.path, key.newest_ns, oid, key.size)

    # --- reachability -------------------------------------------------------------------
    def roots(self, records=None) -> set[str]:
        out: set[str] = set()
        for r in records if records is not None else self.journal.scan().records:
            out.update(r["inputs"])
            out.update(r["outputs"])
            find_ids(r["payload"], out)
        return out

    def pruned(self) -> dict[str, dict]:
        """Ids a retention policy removed ({id: {"seq", "policy", "role"}}, from the journal's
        `prune` records; ledger/store/retention.py). Read once per Store object, and only
        where an object is found missing."""
        if self._pruned is None:
            pruned = retention.pruned_ids(self.journal.stream())
            # what a ref names is live whatever a prune record says (the default policy never
            # prunes a ref's target; a hand-written prune record must not hide its loss)
            for oid in self.state.refs.values():
                pruned.pop(oid, None)
            # and only what a policy could have removed (the field of the checkpoint or receipt
            # the entry names): a forged record cannot hide the loss of any other object
            self._pruned = retention.honoured(self, pruned)
        return self._pruned

    def closure(self, roots, missing: set | None = None, damaged: set | None = None) -> set[str]:
        """Every object reachable from `roots`, following ids inside structured objects."""
        seen: set[str] = set()
        stack = list(roots)
        while stack:
            oid = stack.pop()
            if oid in seen:
                continue
            seen.add(oid)
            try:
                data = self.objects.structure(oid)  # whole or compressed (store/compress.py)
            except MissingObject:
                if self.objects.chunked(oid):
                    continue  # stored as chunks: a large blob, never structure (ledger/store/chunks.py)
                if missing is not None and oid not in self.pruned():
                    missing.add(oid)  # (one a `prune` record removed is not missing: retention.py)
                continue
            except (CorruptObject, fsio.StorageIOError):
                if damaged is not None:
                    damaged.add(oid)
                continue
            if data is None:
                continue
            try:
                obj = canonical.loads(data)
            except BadInput:
                continue
            stack.extend(find_ids(obj) - seen)
        return seen
