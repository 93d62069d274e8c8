"""`ledger verify`: structure always; content with read_data.

Like restic's `check` / `check --read-data`: the structural pass reads the journal, the
caches and the object *names*; the data pass rehashes every object's bytes. Findings are
errors (exit 4, naming ids and records), warnings (recoverable: torn tail, stale index)
or information (dangling objects that gc would remove). Every record is also checked for
meaning: its envelope and its kind's schema (store/schema.py, filled by ledger/records.py), the
kinds of the objects it names, and that HEAD names a generation; a failure is an error naming
the record's seq.
"""

from __future__ import annotations

import json
import os
import stat
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

from ledger.errors import BadInput, CorruptObject, LedgerError, StoreCorrupt
from ledger.store import canonical, compress, fsio, index, schema
from ledger.store.chunks import SUFFIX
from ledger.store.fsio import StorageIOError
from ledger.store.ids import PREFIX, find_ids, hash_bytes
from ledger.store.journal import now
from ledger.store.state import Fold, State


@dataclass
class Report:
    """What verify found: errors (exit 4), warnings, information, and counts."""
    errors: list = field(default_factory=list)    # {"what", "id"?, "seq"?, "message"}
    warnings: list = field(default_factory=list)
    info: list = field(default_factory=list)
    stats: dict = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return not self.errors

    def to_json(self) -> dict:
        return {"ok": self.ok, "errors": self.errors, "warnings": self.warnings, "info": self.info, "stats": self.stats}


def _object_kind(store, oid: str, cache: dict) -> str | None:
    """The "kind" of structured object `oid`; "" when it is present but not a JSON object with a
    kind; None when it cannot be read (missing or corrupt objects are reported on their own)."""
    if oid not in cache:
        try:
            obj = store.get_json(oid)
        except StoreCorrupt:
            cache[oid] = None
        except LedgerError:
            cache[oid] = ""
        else:
            k = obj.get("kind") if isinstance(obj, dict) else None
            cache[oid] = k if isinstance(k, str) else ""
    return cache[oid]


class _RecordChecks:
    """Each record against its kind's schema and the objects it names; HEAD against the
    generations (docs/store-format.md, "Record schemas"). Fed one record at a time, so a
    journal of any length is checked in memory that grows with its distinct objects, never
    with its records.

    The structural pass takes an object's kind from a record that wrote it (payload.objects
    holds [id, size, kind], kind from the object's own "kind" field) when that is the kind
    wanted, like it takes sizes from there; anything else, and every object under read_data, is
    opened and read. `start` is the state the checked records follow (a watermark's)."""

    def __init__(self, store, rep: Report, read_data: bool, start: State | None = None):
        self.store, self.rep, self.read_data = store, rep, read_data
        self.kinds: dict[str, str | None] = {}   # id -> kind, read from the object
        self.recorded: dict[str, object] = {}    # id -> kind (or set of kinds) the records that wrote it give it
        self.sizes: dict[str, int] = {}          # id -> size as recorded when written
        self.roots: set[str] = set()             # every id the checked records name
        self.fold = Fold(start)
        self.head_moved: dict | None = None      # the last checked record that moved HEAD
        self.checked = 0
        self.watch: dict[int, str] = {}          # seq -> id, for the seqs the caches name
        self.state_at: dict[int, State] = {}
        self.want: set[int] = set()

    def _bad(self, rec, message):
        self.rep.errors.append({"what": "record", "seq": rec["seq"], "id": rec["id"], "kind": rec["kind"][:64],
                                "message": f"record {rec['seq']} ({rec['kind'][:64]}) is ill-formed: {message}"})

    def _wrong_kind(self, rec, where, oid, want):
        if self.recorded.get(oid) == want:
            return
        got = _object_kind(self.store, oid, self.kinds)
        if got is not None and got != want:
            what = f"a {got!r} object" if got else "not a structured object"
            self._bad(rec, f"{where} names {oid}, which is {what}, not a {want!r} object")

    def add(self, rec: dict) -> None:
        self.checked += 1
        if rec["seq"] in self.want:
            self.watch[rec["seq"]] = rec["id"]
        self.roots.update(rec["inputs"])
        self.roots.update(rec["outputs"])
        find_ids(rec["payload"], self.roots)
        objs = rec["payload"].get("objects")
        if isinstance(objs, list):
            for o in objs:
                if isinstance(o, list) and len(o) == 3:
                    self.sizes[o[0]] = o[1]
        problem = schema.envelope_problem(rec["payload"])
        if problem is not None:
            self._bad(rec, problem)
            self._snapshot(rec["seq"])
            return  # cannot be folded: its refs are not refs
        if not self.read_data and objs:
            for o in objs:
                had = self.recorded.get(o[0])
                if had is None:
                    self.recorded[o[0]] = o[2]
                elif had != o[2]:
                    self.recorded[o[0]] = ()  # recorded with two kinds: read the object itself
        if not rec["kind"] or len(rec["kind"]) > schema.MAX_KIND_LEN:
            self._bad(rec, f"the kind must be 1 to {schema.MAX_KIND_LEN} characters")
        h = schema.hooks(rec["kind"])
        try:  # object_kinds checks the payload against its kind's schema first (one parse per record)
            named = h.object_kinds(rec["payload"]) if h else {}
        except BadInput as e:
            self._bad(rec, e.message)
            named = {}
        for key, (oid, want) in named.items():
            self._wrong_kind(rec, f"payload.{key}", oid, want)
        refs = rec["payload"].get("refs") or {}
        for name, target in refs.items():
            want = schema.ref_object_kind(name)
            if want and target is not None:
                self._wrong_kind(rec, f"ref {name}", target, want)
        if "HEAD" in refs:
            self.head_moved = {"seq": rec["seq"], "kind": rec["kind"]}
        self.fold.add(rec, checked=True)
        self._snapshot(rec["seq"])

    def _snapshot(self, seq: int) -> None:
        if seq in self.want:
            self.state_at[seq] = self.fold.state()

    def finish(self) -> State:
        """The fold of the well-formed records; reports HEAD if it is not a generation."""
        state = self.fold.state()
        head = state.refs.get("HEAD")
        gens = {t for n, t in state.refs.items() if schema.GEN_REF_RE.match(n)}
        if head is not None and head not in gens:
            last = self.head_moved
            self.rep.errors.append({"what": "head", "id": head, "seq": last["seq"] if last else None,
                                    "message": f"HEAD names {head}, which no gen-N ref names: HEAD is not a generation"
                                               + (f" (moved there by record {last['seq']}, {last['kind'][:64]})"
                                                  if last else "")})
        return state


WATERMARK = ("cache", "verified.json")  # under the store root: the last clean verify (rule 20)
WATERMARK_MAX = 256 << 20


def _state_digest(st: State) -> str:
    return hash_bytes(canonical.dumps(st.to_json()))


def load_watermark(store) -> tuple[dict | None, str | None]:
    """The watermark of the last clean verify and None, or None and why it cannot be used
    (None, None when there is none). It is used only if it is this store's, its state hashes
    to its digest, and the journal's record ending at its offset is its record (same id, same
    seq): then every record up to it was checked by a verify and is still the record checked."""
    path = store.root.joinpath(*WATERMARK)
    try:
        w = json.loads(fsio.read_small(path, WATERMARK_MAX))
        st = State.from_cache(w["state"])
        offset, seq, rid = w["offset"], w["seq"], w["id"]
        if type(offset) is not int or type(seq) is not int:
            raise ValueError("offset or seq")
    except FileNotFoundError:
        return None, None
    except (OSError, ValueError, KeyError, TypeError, AttributeError, fsio.NotRegular):
        return None, "it is unreadable"
    if w.get("store") != store.store_id:
        return None, "it belongs to another store"
    if _state_digest(st) != w.get("state_digest") or (st.seq, st.head) != (seq, rid):
        return None, "its state does not match its digest"
    rec = store.journal.record_before(offset)
    if rec is None or rec["id"] != rid or rec["seq"] != seq:
        return None, f"the journal no longer holds its record {seq} at byte {offset}"
    w["_state"] = st
    return w, None


def _set_aside_refs(store) -> str:
    """Move a refs.json that states what the journal does not into tmp/ (kept for inspection;
    `gc --prune` removes it). A writer that replaced it meanwhile only loses its vouching."""
    aside = store.tmp / f"refs-rejected-{os.urandom(8).hex()}.json"
    try:
        os.rename(store.root / "refs.json", aside)
    except OSError as e:
        return f"could not move it aside ({e.strerror}): delete .ledger/refs.json"
    return f"moved it aside to tmp/{aside.name} (the next write rebuilds it from the journal)"


def _write_watermark(store, st: State, offset: int, rep: Report) -> None:
    """Record the clean check up to `offset` (a cache: written whole or not at all)."""
    w = {"store": store.store_id, "seq": st.seq, "id": st.head, "offset": offset, "state": st.to_json(),
         "state_digest": _state_digest(st), "time": now()}
    path = store.root.joinpath(*WATERMARK)
    try:
        path.parent.mkdir(exist_ok=True)
        fsio.atomic_write(path, canonical.dumps(w), store.tmp, durable=False)
    except OSError as e:
        rep.info.append({"what": "watermark", "message": f"could not record the verified watermark ({e.strerror}); "
                                                         "the next verify checks everything again"})


def verify(store, read_data: bool = False, progress=None, full: bool = False) -> Report:
    """Check the journal chain, record meaning, caches and objects (rehashing them with read_data).

    Incremental by default (rule 20): from the watermark the last clean verify recorded, only
    the records after it are checked (and that the watermark's record is still at its offset);
    `full` (and `read_data`, which rehashes every object) checks everything from record 1."""
    # Opening the index (importing DuckDB) costs a few hundred ms: do it on a thread while the
    # main thread checks the journal and rehashes objects (BLAKE3 releases the GIL).
    with ThreadPoolExecutor(1) as pool:
        indexed = pool.submit(index.indexed_meta, store.root)
        return _verify(store, read_data, progress, indexed, full or read_data)


def _start(store, rep: Report, full: bool):
    """Where this verify starts: (watermark or None). Says why when a watermark is not used."""
    if full:
        rep.stats["mode"] = "full"
        return None
    w, why = load_watermark(store)
    if w is not None:
        # refs.json at the journal's end, yet the file is not the one its last writer left: the
        # bytes were changed in place since (rule 19), so the records before the watermark are
        # no longer known to be the ones checked.
        c = store._load_cache()
        ident = store.journal.identity()
        if c and ident is not None and c.get("journal") and c["offset"] == ident[2] \
                and not store._cache_vouches(c, ident):
            w, why = None, "the journal file changed since its last commit, not by an append"
    if w is None:
        rep.stats["mode"] = "full"
        if why:
            rep.warnings.append({"what": "watermark", "message": f"the watermark of the last verify was not used "
                                                                 f"({why}): checked every record"})
        return None
    rep.stats["mode"] = "incremental"
    rep.stats["from_seq"] = w["seq"]
    return w


def _chunked_size(store, oid: str, rep: Report) -> int | None:
    """A chunked object's size from its index, after its pages are read and checked and its packs
    found (~60 B per chunk); None, with the error reported, when any of that fails."""
    try:
        size = store.objects.size(oid)
        store.objects.check_chunked(oid)
    except (CorruptObject, StorageIOError) as e:
        rep.errors.append({"what": "corrupt", "id": oid, "message": e.message})
        return None
    return size


def _compressed_size(store, oid: str, rep: Report) -> int | None:
    """A compressed object's size from its header (checked; the frame is read by --read-data);
    None, with the error reported, when the header is not one."""
    try:
        return store.objects.size(oid)
    except (CorruptObject, StorageIOError) as e:
        rep.errors.append({"what": "corrupt", "id": oid, "message": e.message})
        return None


def _size_matches(oid: str, size: int, sizes: dict, rep: Report) -> bool:
    """Whether a stored object has the size its writer recorded (an error reported if not)."""
    if oid in sizes and sizes[oid] != size:
        rep.errors.append({"what": "corrupt", "id": oid,
                           "message": f"object {oid} has {size} bytes, {sizes[oid]} were written"})
        return False
    return True


def _check_all_objects(store, reachable: set, sizes: dict, rep: Report, read_data: bool, progress) -> None:
    """Every file in objects/: a stored file of its recorded size (rehashed with read_data);
    those no record reaches are reported as dangling. Objects that aren't regular files (a
    directory, link or FIFO in an object's place) are judged from lstat alone: nothing here
    opens what it cannot read safely."""
    present = {}
    for oid, path in store.objects.iter_ids():
        present[oid] = path
    rep.stats["objects"] = len(present)
    total = 0
    for oid, path in present.items():
        hexpart = oid[len(PREFIX):]
        if len(hexpart) != 64 or any(c not in "0123456789abcdef" for c in hexpart):
            rep.errors.append({"what": "foreign-file", "id": None, "message": f"unexpected file in objects/: {path}"})
            continue
        fst = os.lstat(path)
        if not stat.S_ISREG(fst.st_mode):
            rep.errors.append({"what": "corrupt", "id": oid,
                               "message": f"object {oid} is a {fsio.file_kind(fst.st_mode)}, not a stored file"})
            continue
        size = fst.st_size
        if path.name.endswith(SUFFIX):  # a chunked object's index: its size is the one the index gives
            size = _chunked_size(store, oid, rep)
            if size is None:
                continue
        elif path.name.endswith(compress.SUFFIX):  # compressed (store/compress.py): its header's size
            size = _compressed_size(store, oid, rep)
            if size is None:
                continue
        total += size
        if not _size_matches(oid, size, sizes, rep):
            continue
        if read_data:
            try:
                good = store.objects.intact(oid)
            except StorageIOError as e:
                rep.errors.append({"what": "unreadable", "id": oid, "message": e.message})
                continue
            if not good:
                rep.errors.append({"what": "corrupt", "id": oid, "message": f"object {oid} does not hash to its name"})
            if progress:
                progress(size)
    rep.stats["bytes"] = total
    dangling = sorted(set(present) - reachable)
    if dangling:
        rep.info.append({"what": "dangling", "count": len(dangling), "ids": dangling[:50],
                         "message": f"{len(dangling)} object(s) no record reaches (`ledger gc` removes them)"})


def _check_named_objects(store, named: set, sizes: dict, rep: Report) -> None:
    """An incremental verify's object pass: only the objects the checked records reach, each a
    stored file of its recorded size. Dangling objects are counted by a full verify."""
    total = 0
    for oid in sorted(named):
        path = store.objects.path(oid)
        try:
            fst = os.lstat(path)
        except OSError:
            if store.objects.chunked(oid):  # stored as chunks (ledger/store/chunks.py): check index, pages, packs
                size = _chunked_size(store, oid, rep)
            elif store.objects.compressed(oid):  # compressed (store/compress.py): the size its header declares
                size = _compressed_size(store, oid, rep)
            else:
                continue
            if size is not None:
                total += size
                _size_matches(oid, size, sizes, rep)
            continue
        if not stat.S_ISREG(fst.st_mode):
            rep.errors.append({"what": "corrupt", "id": oid,
                               "message": f"object {oid} is a {fsio.file_kind(fst.st_mode)}, not a stored file"})
            continue
        total += fst.st_size
        _size_matches(oid, fst.st_size, sizes, rep)
    rep.stats["objects"] = len(named)
    rep.stats["bytes"] = total


def _verify(store, read_data: bool, progress, indexed, full: bool) -> Report:
    rep = Report()
    j = store.journal
    w = _start(store, rep, full)
    cache = store._load_cache()
    checks = _RecordChecks(store, rep, read_data, w["_state"] if w else None)
    if cache:
        checks.want.add(cache["seq"])
    meta = indexed.result()
    if meta:
        checks.want.add(meta["seq"])
    if w:
        checks.watch[w["seq"]] = w["id"]
        checks.state_at[w["seq"]] = w["_state"]
        scan = j.scan(w["offset"], w["seq"] + 1, w["id"], keep=False, each=checks.add)
    else:
        scan = j.scan(keep=False, each=checks.add)
    rep.stats["records"] = scan.last_seq
    rep.stats["checked"] = checks.checked
    if scan.broken_at is not None:
        rep.errors.append({"what": "journal", "seq": scan.broken_at, "after": scan.last_id,
                           "message": f"journal chain broken at {scan.problem}"})
    elif scan.torn and store.tail_committed(scan) is not None:
        rep.errors.append({"what": "journal", "seq": scan.last_seq + 1,
                           "message": f"record {scan.last_seq + 1} was committed (the index holds it) but its "
                                      "bytes in the journal are damaged"})
    elif scan.torn:
        rep.warnings.append({"what": "journal-tail", "seq": scan.last_seq,
                             "message": f"damaged journal tail of {len(scan.torn)} bytes after record "
                                        f"{scan.last_seq} (ignored; the next write moves it aside)"})
    st = checks.finish()

    if cache:
        cseq = cache["seq"]
        if cseq > st.seq and scan.broken_at is None:
            rep.errors.append({"what": "journal", "seq": st.seq + 1,
                               "message": f"journal ends at record {st.seq} but refs.json saw record {cseq}: "
                                          "records were removed"})
        elif cseq in checks.watch and checks.watch[cseq] != cache["head"]:
            rep.errors.append({"what": "journal", "seq": cseq,
                               "message": f"record {cseq} differs from the one committed earlier: "
                                          "history was rewritten"})
        elif cseq in checks.state_at and (cache["refs"], cache.get("counters") or {}) != \
                (checks.state_at[cseq].refs, checks.state_at[cseq].counters):
            # Not a stale cache (its head is the journal's record): a state no fold gives. A
            # writer that refs.json vouches for starts from it and carries it forward, and
            # readers resolve refs through it, so this is an error, and the file is set aside
            # (a cache, rule 8: the next writer re-checks the chain and writes the fold's).
            # Incremental, the fold compared with starts from the watermark's state, which a
            # forger could have written instead: only a full fold says which one lies.
            rep.errors.append({"what": "refs-cache", "seq": cseq,
                               "message": f"refs.json's refs or counters at record {cseq} are not the "
                                          f"journal's fold there (forged or damaged); {_set_aside_refs(store)}"
                               if w is None else
                               f"refs.json's refs or counters at record {cseq} are not the fold from the "
                               "last verify's watermark (one of them is forged or damaged): run "
                               "`ledger verify --full`, which sets a false refs.json aside"})

    # Objects the journal reaches, and their sizes as recorded when they were written.
    sizes = checks.sizes
    missing: set[str] = set()
    reachable = store.closure(checks.roots, missing)
    for oid in sorted(missing):
        rep.errors.append({"what": "missing", "id": oid, "message": f"object {oid} is referenced but missing"})
    if w:
        _check_named_objects(store, reachable - missing, sizes, rep)
    else:
        _check_all_objects(store, reachable, sizes, rep, read_data, progress)

    seq = meta["seq"] if meta else None
    if meta is None:
        rep.warnings.append({"what": "index",
                             "message": "the DuckDB index is missing or unreadable (`ledger index rebuild`)"})
    elif meta["store"] not in (None, store.store_id):
        rep.errors.append({"what": "index",
                           "message": f"the index belongs to another store ({meta['store']}); its answers "
                                      "are not this journal's (`ledger index rebuild`)"})
    elif seq in checks.watch and checks.watch[seq] != meta["head"]:
        rep.errors.append({"what": "index", "seq": seq,
                           "message": f"the index ends at a record {seq} that is not this journal's "
                                      "(copied from elsewhere?): `ledger index rebuild`"})
    elif seq != st.seq and not (seq > st.seq and scan.torn):
        rep.warnings.append({"what": "index", "message": f"the index reflects record {seq}, the journal is at "
                                                         f"{st.seq} (`ledger index rebuild`)"})

    if w is None and meta and meta["store"] in (None, store.store_id) \
            and not any(e["what"] == "index" for e in rep.errors):
        # A lookup checks each row it reads (rule 21); a row deleted from the index (a lookup,
        # the gate's budget count among them, would miss its record) shows only in the counts.
        n, rows = meta["seq"], index.journal_row_counts(store.root)
        if rows is not None and rows != (n, n, min(1, n), n):
            rep.errors.append({"what": "index", "seq": n,
                               "message": f"the index's journal table holds {rows[0]} rows ({rows[1]} distinct) for "
                                          f"records 1..{n}: rows were deleted or added (`ledger index rebuild`)"})

    if not store.tmp.is_dir():
        rep.warnings.append({"what": "tmp", "message": "the tmp/ directory is missing (the next write recreates it)"})
    tmp = [p.name for p in store.tmp.iterdir()] if store.tmp.is_dir() else []
    if tmp:
        rep.info.append({"what": "tmp", "count": len(tmp),
                         "message": f"{len(tmp)} leftover temporary file(s) from interrupted writes "
                                    "(`ledger gc --prune`)"})
    info = store.lock.read()
    if info:
        rep.info.append({"what": "lock", "message": f"lock held by {info.describe()} ({info.status()})"})
    if rep.ok and scan.broken_at is None and scan.last_seq:
        _write_watermark(store, st, scan.end, rep)
    return rep
