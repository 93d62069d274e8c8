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

import errno
import itertools
import json
import os
import re
import stat
import sys
import time
from dataclasses import dataclass, field

from ledger.errors import BadInput, CorruptObject, LedgerError, MissingObject, StoreCorrupt
from ledger.store import canonical, chunks, compress, fsio, index, packed, schema
from ledger.store.fsio import StorageIOError
from ledger.store.ids import PREFIX, find_ids, hash_bytes, is_id
from ledger.store.journal import now
from ledger.store.scan import collect_young, without_collector
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
        self.objects = _Objects(store, rep, read_data)
        self.fold = Fold(start)
        self.head_moved: dict | None = None      # the last checked record that moved HEAD
        self.checked = 0
        self.watch: dict[int, str] = {}          # seq -> id, for the seqs the caches name
        self.state_at: dict[int, State] = {}
        self.want: set[int] = set()
        self.meta_future = None                  # the index's meta, while its thread still runs
        self.meta: dict | None = None

    def _bad(self, rec, message):
        self.rep.errors.append(_record_error(rec, message))

    def take_meta(self) -> dict | None:
        """The index's meta, once its thread is done; its seq is then watched like the caches'."""
        self.meta, self.meta_future = self.meta_future.result(), None
        if self.meta and type(self.meta.get("seq")) is int:
            self.want.add(self.meta["seq"])
        return self.meta

    def add(self, rec: dict, line: bytes) -> None:
        if self.meta_future is not None and not self.checked & 1023 and self.meta_future.done():
            self.take_meta()
        self.checked += 1
        seq = rec["seq"]
        if seq in self.want:
            self.watch[seq] = rec["id"]
        payload = rec["payload"]
        kind = rec["kind"]
        h = schema.hooks(kind)
        shape = h.line_shape if h is not None else None
        m = shape[0].match(line, line.find(b',"payload":')) if shape is not None else None
        if m is not None:
            # the kind's usual shape (KindHooks.line_shape): the line's bytes prove the envelope,
            # the kind's checks, the payload's ids and its object kinds at once
            problem = None
            entries = payload["objects"]
            names = set(rec["inputs"])
            names.update(rec["outputs"])
            names.update(g.decode() for g in m.groups() if g and g.startswith(b"b3:"))
            named = {key: (payload[key], want) for key, want in shape[1]}
        else:
            problem = schema.envelope_problem(payload)
            objs = payload.get("objects")
            if problem is None:
                entries = objs or ()   # the envelope says: a list of [id, size >= 0, kind]
            else:
                entries = [o for o in objs if isinstance(o, list) and len(o) == 3 and is_id(o[0])] \
                    if isinstance(objs, list) else []
            names = _ids_of(rec, line)
        at = self.objects.record(names, entries)
        if problem is not None:
            self._bad(rec, problem)
            self._snapshot(seq)
            return  # cannot be folded: its refs are not refs
        if self.read_data and "chunk_lists" in payload:
            self.objects.listed(payload["chunk_lists"], rec["seq"])
        if not kind or len(kind) > schema.MAX_KIND_LEN:
            self._bad(rec, f"the kind must be 1 to {schema.MAX_KIND_LEN} characters")
        if m is not None:
            pass   # named above
        elif h is None:
            named = None
        elif h.scan is not None:   # the kind's checks and object_kinds in one (no dataclass built)
            problem, named = h.scan(payload)
            if problem is not None:
                self._bad(rec, problem)
        else:
            try:  # object_kinds checks the payload against its kind's schema first (one parse per record)
                named = h.object_kinds(payload)
            except BadInput as e:
                self._bad(rec, e.message)
                named = None
        who = (seq, rec["id"], kind[:64])
        if named:
            for key, (oid, want) in named.items():
                self.objects.want(who, at, entries, f"payload.{key}", oid, want)
        refs = payload.get("refs")
        if refs:
            for name, target in refs.items():
                want = schema.ref_object_kind(name)
                if want and target is not None:
                    self.objects.want(who, at, entries, f"ref {name}", target, want)
            if "HEAD" in refs:
                self.head_moved = {"seq": seq, "kind": kind}
        self.fold.add(rec, checked=True)
        if seq in self.want:
            self.state_at[seq] = self.fold.state()

    def add_run(self, run) -> None:
        """A run of proved lines of a kind with KindHooks.line_fields (Journal.scan's `bulk`),
        checked as `add` checks each of its records (docs/store-format.md, "Lines proved in bulk").
        Each line passed a template of its kind's usual line, so it matches the kind's line_shape,
        for which `add` takes the line's bytes as proof of the envelope, the kind's checks and the
        payload's ids; what `add` then reads from the payload is in the run's columns (line_fields
        says which): the names (the envelope's lists and every id part), the objects entries, the
        wanted kinds, and the counters' deltas (Fold.add_rows).

        Nearly every row names one object only, which its one objects entry writes (a turn batch):
        consecutive such rows go to the objects' batch together (_Objects.record_written), the rest
        one at a time, in order, so the batch sees what `add` would give it, in the same order."""
        f = schema.hooks(run.kind).line_fields
        n = len(run)
        kind = run.kind
        hexes, *lists = run.id_text()
        ids = run.ids.tobytes().decode("ascii")
        seqs = run.seq.tolist()
        sizes = {p: run.parts[p].tolist() for _, p, _ in f.objects}
        objects, want, fold = self.objects, self.want, self.fold
        single = _names_one_written(run, f)
        if single is not None:
            (part, size_part, written_kind), (key, _, wanted) = f.objects[0], f.named[0]
            where, written = f"payload.{key}", not self.read_data and written_kind == wanted
            one, one_size = hexes[part], sizes[size_part]
        folded = 0   # rows the fold has applied
        k = 0
        while k < n:
            if self.meta_future is not None and self.meta_future.done():
                self.take_meta()
            if single is not None and single[k]:
                if objects.records >= _BATCH:
                    objects.flush()
                # up to the batch's end, a row of another shape, or a seq a cache names (inclusive)
                e, last = k + 1, min(n, k + _BATCH - objects.records)
                while e < last and single[e] and seqs[e - 1] not in want:
                    e += 1
                objects.record_written([f"b3:{one[64 * j:64 * j + 64]}" for j in range(k, e)], one_size[k:e],
                                       seqs[k:e], [f"b3:{ids[64 * j:64 * j + 64]}" for j in range(k, e)],
                                       kind, where, wanted, written)
                self.checked += e - k
                k = e - 1   # the last row of the segment, for the watched seq below
            else:
                self.checked += 1
                seq, a = seqs[k], 64 * k
                # in `add`'s order (inputs, outputs, then the payload's ids): a set's order can follow
                # insertion, and the batch examines, so reports, what it names in that order
                names = set()
                for offsets, text in lists:
                    for j in range(offsets[k], offsets[k + 1]):
                        names.add("b3:" + text[64 * j:64 * j + 64])
                names.update(["b3:" + h[a:a + 64] for h in hexes.values()])
                entries = [("b3:" + hexes[i][a:a + 64], sizes[z][k], ok) for i, z, ok in f.objects]
                at = objects.record(names, entries)
                who = (seq, "b3:" + ids[a:a + 64], kind)
                for key_, p, wanted_ in f.named:
                    objects.want(who, at, entries, f"payload.{key_}", "b3:" + hexes[p][a:a + 64], wanted_)
            seq = seqs[k]
            if seq in want:
                self.watch[seq] = "b3:" + ids[64 * k:64 * k + 64]
                fold.add_rows(run, folded, k + 1)
                folded = k + 1
                self.state_at[seq] = fold.state()
            k += 1
        if folded < n:
            fold.add_rows(run, folded, n)

    def bulk(self) -> dict:
        """Journal.scan's `bulk` for this check: add_run for every kind whose lines it can take."""
        return {kind: self.add_run for kind in schema.fielded_kinds()}

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


def _names_one_written(run, f) -> list[bool] | None:
    """For each row of `run`, whether it names exactly one id, the id of its one objects entry:
    every id part equal, no inputs, and no outputs or only that id. None where the kind's lines
    have other than one objects entry and one named object (every row then takes add's way)."""
    if len(f.objects) != 1 or len(f.named) != 1:
        return None
    import numpy as np

    parts = [p for p, tok in enumerate(run.tokens) if tok == schema.HEX_ID]
    one = run.parts[f.objects[0][0]]
    ok = np.ones(len(run), bool)
    for p in parts:
        ok &= (run.parts[p] == one).all(axis=1)
    (in_at, _), (out_at, out_hex) = run.envelope_lists()
    ok &= np.diff(in_at) == 0
    outs = np.diff(out_at)
    ok &= outs <= 1
    rows = np.flatnonzero(outs == 1)
    ok[rows] &= (out_hex[out_at[:-1][rows]] == one[rows]).all(axis=1)
    return ok.tolist()


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
    except (OSError, ValueError, KeyError, TypeError, AttributeError, RecursionError, fsio.NotRegular):
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


def _write_watermark(store, st: State, offset: int, rep: Report, index_entry: dict | None = None) -> None:
    """Record the clean check up to `offset` (a cache: written whole or not at all), and the index
    file it read (rule 20), if any."""
    w = {"store": store.store_id, "seq": st.seq, "id": st.head, "offset": offset, "state": st.to_json(),
         "state_digest": _state_digest(st), "time": now()}
    if index_entry is not None:
        w["index"] = index_entry
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
    `full` (and `read_data`, which rehashes every object) checks everything from record 1. The
    index is opened unless it is the very file the last clean verify checked (rule 20's index
    identity; never with `full`)."""
    mark = load_watermark(store)
    seen = _IndexSeen.take(store.root)
    vouched = None if full else _index_vouched(mark[0], seen, rows=read_data)
    if vouched is not None:
        return _verify(store, read_data, progress, None, full or read_data, mark, seen, vouched)
    # Opening the index (importing DuckDB) costs a few hundred ms: do it on a thread while the
    # main thread checks the journal and rehashes objects (BLAKE3 releases the GIL). Imported
    # here: concurrent.futures (with logging, queue) is ~10 ms of start-up a verify that takes
    # the index from the watermark does not need.
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(1) as pool:
        indexed = pool.submit(index.indexed_meta, store.root)
        return _verify(store, read_data, progress, indexed, full or read_data, mark, seen, None)


# --- the index's identity in the watermark (rule 20) -----------------------------------------------
# Opening index.duckdb costs ~0.14 s of CPU (DuckDB's import, then a full verify's row counts of
# journal and journal_sparse): most of a small store's verify. A clean verify that read the index
# records which file it read — its identity and its WAL's, the meta it read, whether the row checks
# ran — and the next verify takes those answers instead of reading the file again when the file is
# still exactly that one: the same answers, since the answers are the file's.
INDEX_FILES = ("index.duckdb", "index.duckdb.wal")
RACY_NS = 2_000_000_000   # an index changed less than this before the identity was taken is not vouched for


def _identity_of(path) -> list | None:
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return None
    return [st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns] if stat.S_ISREG(st.st_mode) else []


def _index_code() -> list:
    """What the answers read from an index depend on besides its bytes: this ledger's index
    version and dense kinds (index._version_problem refuses an index of others)."""
    return [index.INDEX_VERSION, sorted(schema.dense_kinds())]


@dataclass
class _IndexSeen:
    """index.duckdb and its WAL as a verify found them, before reading either."""
    identity: list | None      # [index's, WAL's]; None when there is no index file (or an OS error)
    racy: bool                 # changed within RACY_NS of `taken`: a change in the same tick could leave it equal

    @classmethod
    def take(cls, root) -> "_IndexSeen":
        taken = time.time_ns()   # before the stat: any change after it gets a ctime past `taken - RACY_NS`
        try:
            main, wal = (_identity_of(root / name) for name in INDEX_FILES)
        except OSError:
            return cls(None, True)
        if not main:
            return cls(None, True)   # no index (or not a regular file): nothing to vouch for
        ident = [main, wal]
        newest = max(i[4] for i in ident if i)
        return cls(ident if wal != [] else None, newest > taken - RACY_NS)

    def still(self, root) -> bool:
        """The index files are still exactly the ones taken."""
        return self.identity is not None and self.identity == _IndexSeen.take(root).identity


def _index_vouched(w: dict | None, seen: _IndexSeen, rows: bool) -> dict | None:
    """The watermark's record of the index, when the index is the very file it names (same
    identity, WAL included, and this ledger's index code) and, with `rows`, the last verify ran
    the row checks on it; None otherwise (the index is then read)."""
    got = w.get("index") if w is not None else None
    if not isinstance(got, dict) or seen.identity is None or got.get("identity") != seen.identity \
            or got.get("code") != _index_code() or got.get("checks") not in ("meta", "rows"):
        return None
    meta = got.get("meta")
    if not isinstance(meta, dict) or set(meta) != {"seq", "head", "store", "deferred"} \
            or type(meta["seq"]) is not int or type(meta["deferred"]) is not int \
            or not all(v is None or type(v) is str for v in (meta["head"], meta["store"])):
        return None
    if rows and got["checks"] != "rows":
        return None
    return got


def _start(store, rep: Report, full: bool, mark: tuple):
    """Where this verify starts: (watermark or None). Says why when a watermark is not used."""
    if full:
        rep.stats["mode"] = "full"
        return None
    w, why = mark
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


def _record_error(rec: dict, message: str) -> dict:
    return {"what": "record", "seq": rec["seq"], "id": rec["id"], "kind": rec["kind"][:64],
            "message": f"record {rec['seq']} ({rec['kind'][:64]}) is ill-formed: {message}"}


_ID_BYTES = re.compile(rb"b3:[0-9a-f]{64}")
_HEX64 = re.compile(r"[0-9a-f]{64}")
_PLAIN_NAMES = re.compile(r"(?:[0-9a-f]{62}\n)*")   # a fan-out directory's names, one a line: whole files


def _ids_of(rec: dict, line: bytes) -> set[str]:
    """Every id the record names: inputs, outputs and the ids in its payload (find_ids' rule).

    Read off the line's bytes where that gives find_ids' answer exactly, ~4x cheaper than walking
    the parsed payload: the line is canonical JSON (journal.parse_line checked it), so the payload
    is the text between `,"payload":` and the record's last `,"prev":` (keys sort actor, id,
    inputs, kind, outputs, payload, prev, seq, time; no bare quote is inside a string); an id
    matched there lies inside one string, key or value (":" follows a key's closing quote, never a
    "3"). Two things make the text differ from the strings: an escape (a backslash: `\\b3:…` is a
    backspace and "3:…") and a key ending in hash/digest, whose values find_ids skips (`hash":` in
    canonical bytes is only such a key). Either present: find_ids on the parsed payload."""
    out = set(rec["inputs"])
    out.update(rec["outputs"])
    start = line.find(b',"payload":')
    end = line.rfind(b',"prev":')
    if start < 0 or end < start or line.find(b"\\", start, end) >= 0 or line.find(b'hash":', start, end) >= 0 \
            or line.find(b'digest":', start, end) >= 0:
        find_ids(rec["payload"], out)
    else:
        out.update(m.decode() for m in _ID_BYTES.findall(line, start, end))
    return out


# --- the ids already checked: keyed 64-bit hashes in sorted numpy runs ----------------------------
# A verify of ten million records names ~ten million objects; a set of their id strings costs ~150
# bytes each (1.3 GiB at a million records measured), these keys 8. A key is the id's hash under a
# key this process drew at random (Python's SipHash of str, whose key is per-process random unless
# PYTHONHASHSEED fixes it; otherwise a multiply-shift hash with a random multiplier, a universal
# family): whoever writes objects cannot choose two ids whose keys collide, as they could with the
# ids' own first 64 bits (2^32 tries). A collision makes the later id look checked already; its
# chance is about n^2/2^64 per run (5e-6 at ten million ids), and another run draws another key.
if sys.flags.hash_randomization:
    def _key(oid: str) -> int:
        return hash(oid)
else:  # pragma: no cover - PYTHONHASHSEED set: str hashes are predictable
    _MUL = int.from_bytes(os.urandom(32), "big") | 1
    _MASK = (1 << 256) - 1

    def _key(oid: str) -> int:
        return (((_MUL * int(oid[len(PREFIX):], 16)) & _MASK) >> 192) - (1 << 63)


def _np():
    """numpy, imported when verify first needs it: the ids already checked are 8 bytes each in
    sorted arrays, not ~150 in a set of strings, but only once there are _SET_MAX of them. Its
    import costs ~0.09 s of CPU (benchmarks/RESULTS.md, session 8), a quarter of a verify of a
    small store, so a store of a few thousand objects never pays it."""
    import numpy
    return numpy


class _Seen:
    """A set of keys: a Python set of ints up to _SET_MAX keys (~70 bytes a key, at most ~300 KB),
    then sorted int64 runs. A new run is merged into the one before it while it is at least half
    that one's size (a binary counter: adding n keys costs O(n log n), a lookup one searchsorted per
    run), up to runs of _RUN_MAX keys, which are never merged again: merging two runs copies them,
    so the largest merge, not the set, would set the peak (two copies of every key at the end of a
    ten-million-object verify, 160 MB more). The runs are disjoint (a batch adds only keys no run
    holds), so a merge is a sort of the two, no dedup. Either form answers membership exactly."""

    def __init__(self):
        self.small: set[int] | None = set()
        self.runs: list = []    # numpy int64 arrays, once `small` has overflowed

    def add(self, keys) -> None:
        """Add ints that no earlier add gave (a batch's new keys)."""
        if self.small is not None:
            self.small.update(keys)
            if len(self.small) <= _SET_MAX:
                return
            keys, self.small = self.small, None   # the first run: every key so far
        np = _np()
        arr = np.fromiter(keys, dtype=np.int64)
        if not len(arr):
            return
        arr.sort()
        self.runs.append(arr)
        while len(self.runs) > 1 and len(self.runs[-2]) < _RUN_MAX and 2 * len(self.runs[-1]) >= len(self.runs[-2]):
            b = self.runs.pop()
            a = self.runs.pop()
            merged = np.concatenate((a, b))
            del a, b
            merged.sort(kind="stable")   # two sorted runs: timsort merges them in one pass
            self.runs.append(merged)

    def contains(self, keys: list[int]):
        """Whether each key is held, in order (a list or a boolean array: index or iterate it)."""
        if self.small is not None:
            small = self.small
            return [k in small for k in keys]
        np = _np()
        keys = np.fromiter(keys, dtype=np.int64, count=len(keys))
        found = np.zeros(len(keys), dtype=bool)
        for r in self.runs:
            i = np.searchsorted(r, keys)
            i[i == len(r)] = 0
            found |= r[i] == keys
        return found

    def contains_all(self, keys: list[int]) -> bool:
        if self.small is not None:
            small = self.small
            return all(k in small for k in keys)
        return bool(self.contains(keys).all())

    def nbytes(self) -> int:
        if self.small is not None:
            return sys.getsizeof(self.small) + 32 * len(self.small)
        return sum(r.nbytes for r in self.runs)


_RUN_MAX = 1 << 20            # keys in a run that is merged no more (8 MiB)
_SET_MAX = 4096               # keys held in a set before the first run (numpy imported only then)
_BATCH = 256                  # records whose named objects are judged together (one vectorised lookup)
_KINDS_CACHE = 4096           # objects whose "kind" is remembered (a cache: cleared when full)
_OPEN = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
_SMALL = 1 << 16              # objects up to this size are read in one call (then checked for "{")
STRUCTURED_MAX = 256 << 20    # as Store.closure: a larger object is data, never followed


class _NoPacks:
    """The reader of a store without packs: numpy and packing.py are never imported for it."""
    keys: dict = {}

    def find(self, oid: str):
        return None

    def close(self) -> None:
        pass


def _reader(store):
    if not store.objects.packed.all():
        return _NoPacks()
    from ledger.store import packing  # imports numpy: only a store with packs pays for it
    return packing.Reader(store)


class _Objects:
    """The objects the checked records reach, checked as the journal streams by, in memory that
    does not grow with records or objects beyond 8 bytes an id (rule 20).

    Per batch of records: the ids they name that no earlier batch named are opened once each —
    present, a regular file (opened without following links, without blocking, fstat'ed), of every
    size a record recorded for it — and a structured one is read for the ids inside it (Store.closure's
    rule: at most 256 MiB and starting with "{"; parsed only where an id or an escape is in its bytes),
    which are checked the same way. A record's wanted kind (→kind, HEAD) is taken from the record
    itself when it writes the object (its payload.objects entry, the object first named by it),
    otherwise read from the object. Missing ids are kept as strings (what verify reports), and a
    full verify then lists objects/ once, checking what no record reached (dangling) and any second
    copy (a chunk index or a compressed file beside a whole one)."""

    def __init__(self, store, rep: Report, read_data: bool):
        self.store, self.rep, self.read_data = store, rep, read_data
        self.dir = os.fspath(store.objects.dir)
        self.seen = _Seen()
        self.errors: list = []          # object errors, reported after the journal's and the caches'
        self.missing: set[str] = set()  # candidates: the pruned are taken out at the end
        self.reported: set[str] = set()  # ids an error was reported for (once each)
        self.kinds: dict[str, str | None] = {}   # caches of a few thousand entries, cleared when full
        self.sizes: dict[str, int | None] = {}
        self.count = self.bytes = 0
        self.subdirs: dict[str, int | None] = {}   # fan-out name -> open directory (see _subdir)
        self.warmer = fsio.Warmer(self.dir)        # reads ahead while the objects come from the disk
        self.packed: object = None     # opened at the first object with no file of its own
        # read_data: id -> (chunk-list digest, seq of the record) that the records writing a chunked
        # object recorded (C12); ("", seq) where two records disagree. Only ids stored as chunks
        # are kept, so it grows with the chunked objects (>= 16 MiB each), not with records.
        self.lists: dict[str, tuple[str, int]] = {}
        self.hashed = {"list": 0, "names": 0, "other-list": 0}
        self._clear()

    def _clear(self) -> None:
        self.first: dict[str, int] = {}          # id -> index of the batch's first record naming it
        self.entries: list[tuple[str, object]] = []  # (id, size recorded)
        self.kind_checks: list[tuple] = []
        self.records = 0

    # --- fed by _RecordChecks --------------------------------------------------------------------
    def record(self, names: set[str], entries) -> int:
        """A record naming `names` and recording `entries` ([id, size, kind] each): its index in
        the batch (what a kind check of it refers to). A full batch is judged when the next
        record comes (or at finish), so a record's kind checks are always in its own batch."""
        if self.records >= _BATCH:
            self.flush()
        i = self.records
        self.records += 1
        first = self.first
        for oid in names:
            if oid not in first:
                first[oid] = i
        self.entries.extend((o[0], o[1]) for o in entries)
        return i

    def record_written(self, oids: list, sizes: list, seqs: list, rids: list, kind: str, where: str,
                       want: str, written: bool) -> None:
        """Records each naming one object, oids[k], which their one payload.objects entry writes
        ([oid, sizes[k], kind recorded]) and which payload `where` wants of kind `want` (`written`:
        the entry records `want`, and not read_data): what `record` then `want` do for each, in
        order. The caller keeps them within the batch (flushed first when full)."""
        i = self.records
        first = self.first
        for j, oid in enumerate(oids, i):
            if oid not in first:
                first[oid] = j
        self.entries.extend(zip(oids, sizes))
        self.kind_checks.extend((seq, rid, kind, where, oid, want, written, j)
                                for j, seq, rid, oid in zip(itertools.count(i), seqs, rids, oids))
        self.records = i + len(oids)

    def want(self, who: tuple, index: int, entries, where: str, oid: str, want: str) -> None:
        """Record `who` ((seq, id, kind), index `index` of the batch) names `oid` at `where` as an object of kind
        `want`. Its own payload.objects vouches for that kind when every entry of it for `oid`
        records `want` (and at least one does), never under read_data; the batch then checks only
        that the record is the first to name the object (else it is read for its kind)."""
        if self.read_data:
            written = False
        elif len(entries) == 1:   # most records write one object (a turn batch)
            written = entries[0][0] == oid and entries[0][2] == want
        else:
            written = any(o[0] == oid for o in entries) and all(o[2] == want for o in entries if o[0] == oid)
        self.kind_checks.append((*who, where, oid, want, written, index))

    def flush(self) -> None:
        """Judge the batch: open what it names for the first time (and what that reaches)."""
        first = self.first
        names = list(first)
        keys = [_key(n) for n in names]
        old = self.seen.contains(keys)
        sizes: dict[str, int | None] = {}     # id -> size found (None: missing or damaged)
        done: set[int] = set()
        todo = [(n, int(k)) for n, k, o in zip(names, keys, old) if not o]
        fresh = {n for n, _ in todo}
        while todo:
            children: set[str] = set()
            packed_hits = self._packed_batch(todo)
            if packed_hits:   # held in packs, with no file of their own: read from the packs' windows
                for oid, k in todo:
                    hit = packed_hits.get(oid)
                    if hit is not None and k not in done:
                        done.add(k)
                        sizes[oid] = size = self._examine_packed(oid, hit, children)
                        self._remember(oid, size)
                todo = [t for t in todo if t[0] not in packed_hits]
            if self.warmer.on:   # the objects are coming from the disk: the next ones read ahead
                self.warmer.ahead([oid[len(PREFIX):] for oid, _ in todo])
            began, opened = time.perf_counter(), len(done)
            for oid, k in todo:
                if k in done:
                    continue
                done.add(k)
                sizes[oid] = size = self._examine(oid, children)
                self._remember(oid, size)
            self.warmer.took(len(done) - opened, time.perf_counter() - began)
            nxt = [(c, _key(c)) for c in children]
            nxt = [(c, k) for c, k in nxt if k not in done]
            if nxt:
                nxt = [ck_ for ck_, o in zip(nxt, self.seen.contains([k for _, k in nxt])) if not o]
            todo = nxt
        for oid, recorded in self.entries:
            size = sizes[oid] if oid in sizes else self._size(oid)
            if size is not None and size != recorded and oid not in self.reported:
                self.reported.add(oid)
                self.errors.append({"what": "corrupt", "id": oid,
                                    "message": f"object {oid} has {size} bytes, {recorded} were written"})
        self._judge_kinds(fresh, first)
        self.seen.add(done)
        self._clear()
        collect_young()   # the scan runs without the cyclic collector (_verify): the young, once a batch

    def _judge_kinds(self, fresh: set, first: dict) -> None:
        for seq, rid, kind, where, oid, want, written, at in self.kind_checks:
            if written and oid in fresh and first.get(oid) == at:
                continue  # written by this record, which says it is of that kind (read_data: never)
            got = self._kind(oid)
            if got is not None and got != want:
                what = f"a {got!r} object" if got else "not a structured object"
                self.rep.errors.append(_record_error({"seq": seq, "id": rid, "kind": kind},
                                                     f"{where} names {oid}, which is {what}, not a {want!r} object"))

    def listed(self, entries: list, seq: int) -> None:
        """A record's payload.chunk_lists (its envelope checked): every record must agree (C12)."""
        for oid, digest in entries:
            had = self.lists.get(oid)
            if had is None:
                if self.store.objects.chunked(oid):
                    self.lists[oid] = (digest, seq)
            elif had[0] != digest:
                self.lists[oid] = ("", seq)

    # --- one object ------------------------------------------------------------------------------
    def _examine(self, oid: str, children: set) -> int | None:
        """Check one named object; its size (None if missing or damaged, reported); the ids inside
        a structured one are added to `children`."""
        h = oid[len(PREFIX):]
        sub = self._subdir(h[:2])
        try:
            fd = os.open(h[2:], _OPEN, dir_fd=sub) if sub is not None else os.open(f"{self.dir}/{h[:2]}/{h[2:]}", _OPEN)
        except FileNotFoundError:
            return self._examine_other(oid, children)
        except NotADirectoryError:
            return None   # a file in place of the fan-out directory: the listing names it (foreign)
        except OSError as e:
            kind = {errno.ELOOP: "symbolic link", errno.ENXIO: "socket"}.get(e.errno)
            self._error(oid, "corrupt" if kind else "unreadable",
                        f"object {oid} is a {kind}, not a stored file" if kind
                        else fsio.io_error(e, f"reading object {oid}").message)
            return None
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode):
                self._error(oid, "corrupt", f"object {oid} is a {fsio.file_kind(st.st_mode)}, not a stored file")
                return None
            size = st.st_size
            self.count += 1
            self.bytes += size
            if 0 < size <= STRUCTURED_MAX:
                data = os.read(fd, size) if size <= _SMALL else os.pread(fd, 1, 0)
                if data[:1] == b"{":
                    if len(data) < size:
                        data = fsio.read_bounded(fd, size)
                    self._children(data, children)
            return size
        except OSError as e:
            self._error(oid, "unreadable", fsio.io_error(e, f"reading object {oid}").message)
            return None
        finally:
            os.close(fd)

    def _subdir(self, fan: str) -> int | None:
        """An open descriptor of fan-out directory objects/<fan> (opened once: an object is then
        opened by its name in it, not by walking the whole path again), or None where that is not
        a plain directory — then the object is opened by its path, as any reader opens it (a
        file in the directory's place is named by the listing)."""
        fd = self.subdirs.get(fan, -1)
        if fd == -1:
            try:
                fd = os.open(f"{self.dir}/{fan}", os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
            except OSError:
                fd = None
            self.subdirs[fan] = fd
        return fd

    def close(self) -> None:
        """Stop the warm-ups, then close the fan-out directories' descriptors (theirs too)."""
        self.warmer.close()
        if self.packed is not None:
            self.packed.close()
        for fd in self.subdirs.values():
            if fd is not None:
                os.close(fd)
        self.subdirs = {}

    def _examine_other(self, oid: str, children: set) -> int | None:
        """An object with no whole file: chunked (index, pages and packs checked), compressed (its
        header's size; the ids inside read through the store, which decompresses and rehashes), or
        missing (reported at the end unless a retention policy pruned it)."""
        ob = self.store.objects
        if self.packed is None:
            self.packed = _reader(self.store)
        hit = self.packed.find(oid)
        if hit is not None:
            return self._examine_packed(oid, hit, children)
        if ob.chunked(oid):
            try:
                size = ob.size(oid)
                if not self.read_data:   # with read_data the listing reads every chunk (C2), and names
                    ob.check_chunked(oid)  # a damaged page or missing pack only if the whole fails
            except (CorruptObject, StorageIOError) as e:
                self._error(oid, "corrupt", e.message)
                return None
        else:
            try:
                size = ob.size(oid)
                data = ob.structure(oid)
            except MissingObject:
                self.missing.add(oid)
                return None
            except (CorruptObject, StorageIOError) as e:
                self._error(oid, "corrupt", e.message)
                return None
            if data is not None:
                self._children(data, children)
        self.count += 1
        self.bytes += size
        return size

    def _packed_batch(self, todo: list) -> dict:
        """The packed objects of a batch with no file of their own, found in one lookup once a
        long pass is under way (packing.Reader.batch): a packed object then costs no failed open."""
        if self.packed is None:
            self.packed = _reader(self.store)
        return self.packed.batch([oid for oid, _ in todo]) if self.packed.keys else {}

    def _examine_packed(self, oid: str, hit, children: set) -> int | None:
        """A packed object (store/packed.py): its entry's place checked, its size the stored
        length (a compressed one's header's), and a structured one read for the ids inside it
        (a compressed one decompressed and rehashed, as its own `.z` file would be)."""
        pack, loc = hit
        why = pack.problem(loc)
        try:
            raw = None if why else self.packed.read(pack, loc)
        except ValueError as e:
            why = str(e)
        except OSError as e:
            self._error(oid, "unreadable", fsio.io_error(e, f"reading object {oid} from {pack.path}").message)
            return None
        if why:
            self._error(oid, "corrupt", f"object {oid} is damaged: {pack.path} holds {why}")
            return None
        try:
            if loc.form == packed.COMPRESSED:
                where = f"{pack.path} at byte {loc.offset}"
                size = compress.declared_size(raw, oid, where)
                data = compress.decode(raw, oid, where)
                if hash_bytes(data) != oid:
                    raise CorruptObject(oid, f"object {oid} is damaged: its bytes in {where} do not hash to it")
            else:
                size, data = loc.length, raw
                if self.read_data and hash_bytes(data) != oid:   # the listing rehashes entries too; this names the copy read
                    raise CorruptObject(oid, f"object {oid} is damaged: its bytes in {pack.path} at byte "
                                             f"{loc.offset} do not hash to it")
        except CorruptObject as e:
            self._error(oid, "corrupt", e.message)
            return None
        self.count += 1
        self.bytes += size
        if data[:1] == b"{":
            self._children(data, children)
        return size

    @staticmethod
    def _children(data: bytes, children: set) -> None:
        # no id and no escape (that could spell one) in the bytes: nothing to parse for (most turns)
        if b"b3:" not in data and b"\\u" not in data:
            return
        try:
            find_ids(canonical.loads(data), children)
        except BadInput:
            pass

    def _size(self, oid: str) -> int | None:
        """The size of an object an earlier batch examined (a record naming it again with a size:
        the same few objects, often, so the last few thousand sizes are remembered)."""
        if oid in self.sizes:
            return self.sizes[oid]
        h = oid[len(PREFIX):]
        try:
            st = os.lstat(f"{self.dir}/{h[:2]}/{h[2:]}")
            size = st.st_size if stat.S_ISREG(st.st_mode) else None
        except FileNotFoundError:
            try:
                size = self.store.objects.size(oid)   # chunked or compressed
            except (MissingObject, CorruptObject, StorageIOError):
                size = None   # reported when it was examined
        except OSError:
            size = None
        self._remember(oid, size)
        return size

    def _remember(self, oid: str, size: int | None) -> None:
        if len(self.sizes) >= _KINDS_CACHE:
            self.sizes.clear()
        self.sizes[oid] = size

    def _kind(self, oid: str) -> str | None:
        """The "kind" of structured object `oid`; "" when it is present but not a JSON object with a
        kind; None when it cannot be read (missing or corrupt objects are reported on their own)."""
        if oid not in self.kinds:
            if len(self.kinds) >= _KINDS_CACHE:
                self.kinds.clear()
            try:
                obj = self.store.get_json(oid)
            except StoreCorrupt:
                self.kinds[oid] = None
            except LedgerError:
                self.kinds[oid] = ""
            else:
                k = obj.get("kind") if isinstance(obj, dict) else None
                self.kinds[oid] = k if isinstance(k, str) else ""
        return self.kinds[oid]

    def _error(self, oid: str | None, what: str, message: str) -> None:
        if oid is not None:
            if oid in self.reported:
                return
            self.reported.add(oid)
        self.errors.append({"what": what, "id": oid, "message": message})

    # --- after the journal -----------------------------------------------------------------------
    def finish(self) -> None:
        """The last batch; then the missing ids, sorted (a pruned one is not missing, rule P3)."""
        try:
            self.flush()
        finally:
            self.close()   # the warmer's threads and every directory, however the batch ends
        if self.missing:
            pruned = self.store.pruned()
            for oid in sorted(self.missing):
                if oid not in pruned:
                    self.rep.errors.append({"what": "missing", "id": oid,
                                            "message": f"object {oid} is referenced but missing"})
        self.rep.errors.extend(self.errors)
        self.errors = []

    def listing(self, progress) -> None:
        """A full verify's pass over objects/: every file there is an object (foreign names are
        errors); those no record reaches are counted as dangling and checked like the others (a
        regular file, a chunked or compressed one's index or header); a second copy of a reached
        object is checked too. With read_data every object is rehashed once."""
        ob, rep = self.store.objects, self.rep
        total_ids, dangling, first_dangling = 0, 0, []
        plain_ids = 0

        def all_reached(fan: str, names: list) -> bool:
            # A directory of whole files only, every one an object the journal pass examined (the
            # usual case): nothing of it is left to judge, so no entry of it is looked at alone.
            nonlocal plain_ids
            if self.read_data or not self.seen.contains_all([_key(PREFIX + fan + n) for n in names]):
                return False
            plain_ids += len(names)
            return True

        for groups in _groups(ob.dir, all_reached):
            ids = [g[0][0] for g in groups]
            reached_all = self.seen.contains([_key(i) for i in ids])
            for group, reached in zip(groups, reached_all):
                total_ids, dangling = self._judge(group, bool(reached), progress, total_ids, dangling, first_dangling)
        total_ids += plain_ids
        total_ids, dangling = self._list_packs(progress, total_ids, dangling, first_dangling)
        self.rep.errors.extend(self.errors)
        self.errors = []
        rep.stats["objects"] = total_ids
        rep.stats["bytes"] = self.bytes
        if self.read_data and any(self.hashed.values()):
            rep.stats["chunked_hashed"] = dict(self.hashed)
            twice = self.hashed["names"]
            if twice:
                # not a silent fallback (C12): which objects cost twice the hashing, and why
                rep.info.append({"what": "chunk-list", "count": twice,
                                 "message": f"{twice} chunked object(s) have no chunk list recorded (written before "
                                            "records carried one), or two records disagree about it: hashed "
                                            "whole and every chunk by name"})
        if dangling:
            rep.info.append({"what": "dangling", "count": dangling, "ids": first_dangling,
                             "message": f"{dangling} object(s) no record reaches (`ledger gc` removes them)"})

    def _list_packs(self, progress, total_ids: int, dangling: int, first_dangling: list) -> tuple[int, int]:
        """A full verify's pass over packed/ (store/packed.py): every file there is a pack (foreign
        names are errors), whose header, footer and entry table add up (sorted, each entry's bytes
        inside the pack, of a known form and size); an entry with no file of its own in objects/ is
        an object like a listed one (counted, dangling if no record reaches it), one with a file
        too is a second copy, whose size must be the first's. With read_data every entry is
        rehashed (decompressed first, bounded, if compressed)."""
        packs = self.store.objects.packed
        packs.refresh()
        try:
            names = sorted(os.listdir(packs.dir))
        except (FileNotFoundError, NotADirectoryError):
            names = []
        for n in names:
            if not packed.NAME_RE.fullmatch(n):
                self.errors.append({"what": "foreign-file", "id": None,
                                    "message": f"unexpected file in packed/: {packs.dir / n}"})
        for n, why in sorted(packs.bad.items()):
            self.errors.append({"what": "corrupt", "id": None,
                                "message": f"pack {packs.dir / n} holds nothing readable: {why}"})
        present = packs.all()
        if not present:
            return total_ids, dangling
        from ledger.store import packing, reach  # numpy: only a store with packs pays for it

        np = _np()
        loose = np.unique(np.concatenate([d.keys for d in reach.listing(self.store)] or [np.zeros(0, np.uint64)]))
        for pack in present:
            try:
                parts = list(packing.table_parts(pack))
            except (OSError, ValueError) as e:
                self.errors.append({"what": "unreadable", "id": None, "message": f"pack {pack.path}: {e}"})
                continue
            bad = self._pack_problems(pack, parts)
            if bad is None:
                continue   # its table cannot be trusted to say what it holds: named, not judged entry by entry
            for part, misplaced in zip(parts, bad):
                second = reach.member(loose, part.keys)
                oids = [PREFIX + part.digest(j).hex() for j in range(len(part.keys))]
                reached = self.seen.contains([_key(o) for o in oids])
                for j, oid in enumerate(oids):
                    if misplaced[j]:
                        continue
                    loc = packed.Loc(pack.name, int(part.off[j]), int(part.len[j]), int(part.form[j]))
                    total_ids, dangling = self._judge_packed(oid, pack, loc, bool(second[j]), bool(reached[j]),
                                                             progress, total_ids, dangling, first_dangling)
        return total_ids, dangling

    def _pack_problems(self, pack, parts: list):
        """Name what is wrong with a pack's table: None where it is not sorted (nothing in it is
        then judged: a planted table could list a million entries) or its entries overlap (which
        a writer never does: a planted table repeating one compressed frame would cost its
        decompression for every entry); else each part's mask of misplaced entries (those are
        named once, counted, and skipped; the others are judged)."""
        from ledger.store import packing  # numpy: as _list_packs

        hint = "restore what verify names missing or damaged (`ledger pull`, `ledger add`), then `ledger gc --prune`"
        before = None
        for part in parts:
            if packing.unsorted(part, before):
                self.errors.append({"what": "corrupt", "id": None,
                                    "message": f"pack {pack.path}: its entries are not sorted by digest; {hint}"})
                return None
            before = part.digest(len(part.keys) - 1)
        masks = [packing.misplaced(pack, part) for part in parts]
        at = packing.overlap(parts, masks)
        if at is not None:
            self.errors.append({"what": "corrupt", "id": None,
                                "message": f"pack {pack.path}: its entries overlap at byte {at}; {hint}"})
            return None
        count = sum(int(m.sum()) for m in masks)
        if count:
            first = next(part.digest(int(_np().flatnonzero(m)[0])) for part, m in zip(parts, masks) if m.any())
            self.errors.append({"what": "corrupt", "id": None,
                                "message": f"pack {pack.path}: {count} entr{'y' if count == 1 else 'ies'} (the first for "
                                           f"b3:{first.hex()}) lie outside its bytes, are of an unknown form or too "
                                           f"large; {hint}"})
        return masks

    def _judge_packed(self, oid: str, pack, loc, second: bool, reached: bool, progress, total_ids: int,
                      dangling: int, first_dangling: list) -> tuple[int, int]:
        """One entry of a pack (see _list_packs); returns the counts grown."""
        ob = self.store.objects
        hit = (pack, loc)
        size = None
        if second or not reached:
            try:
                size = ob._packed_size(oid, hit)
            except CorruptObject as e:
                self._error(oid, "corrupt", e.message)
            except StorageIOError as e:
                self._error(oid, "unreadable", e.message)
        if second:
            whole = self._size(oid)
            if size is not None and whole is not None and whole != size:
                self._error(oid, "corrupt", f"object {oid} has {size} bytes in {pack.path}, "
                                            f"{whole} in the copy its records reach")
        else:
            total_ids += 1
            if not reached:
                dangling += 1
                if len(first_dangling) < 50:
                    first_dangling.append(oid)
                if size is not None:
                    self.count += 1
                    self.bytes += size
        if self.read_data and oid not in self.reported:
            try:
                ob._packed_data(oid, hit)
            except CorruptObject as e:
                self.rep.errors.append({"what": "corrupt", "id": oid, "message": e.message})
            except StorageIOError as e:
                self.rep.errors.append({"what": "unreadable", "id": oid, "message": e.message})
            if progress:
                progress(size if size is not None else loc.length)
        return total_ids, dangling

    def _judge(self, group: list, reached: bool, progress, total_ids: int, dangling: int,
               first_dangling: list) -> tuple[int, int]:
        """One object of the listing (all its files); returns the counts grown."""
        ob, rep = self.store.objects, self.rep
        oid = group[0][0]
        if not _HEX64.fullmatch(oid, len(PREFIX)):
            for _, entry in group:
                rep.errors.append({"what": "foreign-file", "id": None,
                                   "message": f"unexpected file in objects/: {entry.path}"})
            return total_ids, dangling
        total_ids += 1
        if not reached:
            dangling += 1
            if len(first_dangling) < 50:
                first_dangling.append(oid)
        # the copy the journal pass examined: the whole file, else the chunk index, else the compressed one
        order = {"": 0, chunks.SUFFIX: 1, compress.SUFFIX: 2}
        examined = min(group, key=lambda g: order.get(_suffix(g[1].name), 3))[1] if reached else None
        size = None
        for _, entry in group:
            if entry is examined:
                continue
            got = self._entry_size(oid, entry)
            if got is None:
                continue
            if reached:
                whole = self._size(oid)
                if whole is not None and whole != got:
                    self._error(oid, "corrupt", f"object {oid} has {got} bytes in {entry.path}, "
                                                f"{whole} in the copy its records reach")
            elif size is None:
                size = got
                self.count += 1
                self.bytes += got
        if self.read_data and oid in self.reported:
            # already found damaged (its size is not what was written, say): its error stands, and
            # rehashing what a planted chunk index declares (any size) would only cost the time
            if progress:
                progress(size if size is not None else 0)
        elif self.read_data:
            listed = self.lists.get(oid, ("", 0))
            try:
                good, how = ob.check_data(oid, listed[0] or None)
            except StorageIOError as e:
                rep.errors.append({"what": "unreadable", "id": oid, "message": e.message})
                return total_ids, dangling
            if how in self.hashed:
                self.hashed[how] += 1
            if how == "other-list" and good:
                rep.warnings.append({"what": "chunk-list", "id": oid, "seq": listed[1],
                                     "message": f"object {oid}: its chunk index lists other chunks than record "
                                                f"{listed[1]} recorded (rewritten outside ledger?); its content is "
                                                "intact (hashed whole and every chunk by name)"})
            if not good and oid not in self.reported:
                message = f"object {oid} does not hash to its name"
                if ob.chunked(oid):
                    try:
                        ob.check_chunked(oid)   # which page or pack, if that is what is wrong
                    except (CorruptObject, StorageIOError) as e:
                        message = e.message
                rep.errors.append({"what": "corrupt", "id": oid, "message": message})
            if progress:
                progress(size if size is not None else (self._size(oid) or 0))
        return total_ids, dangling

    def _entry_size(self, oid: str, entry) -> int | None:
        """One file of the listing judged on its own: a regular file (from the directory entry's
        type, lstat only when it is not one: nothing is opened that cannot be read safely), and its
        object's size (a chunk index's after its pages are checked, a compressed file's header's)."""
        if not entry.is_file(follow_symlinks=False):
            try:
                kind = fsio.file_kind(entry.stat(follow_symlinks=False).st_mode)
            except OSError:
                return None   # gone meanwhile
            self._error(oid, "corrupt", f"object {oid} is a {kind}, not a stored file")
            return None
        suffix = _suffix(entry.name)
        ob = self.store.objects
        try:
            if suffix == chunks.SUFFIX:
                size = ob._index(oid)[0]
                ob.check_chunked(oid)
                return size
            if suffix == compress.SUFFIX:
                return ob.compressed_size(oid)
            return entry.stat(follow_symlinks=False).st_size
        except (CorruptObject, StorageIOError) as e:
            self._error(oid, "corrupt", e.message)
        except (MissingObject, FileNotFoundError):
            pass    # removed meanwhile (a gc)
        return None


def _suffix(name: str) -> str:
    for s in (chunks.SUFFIX, compress.SUFFIX):
        if name.endswith(s):
            return s
    return ""


def _groups(objdir, taken=None):
    """The files of objects/ grouped by the object they hold, in id order, one fan-out directory at
    a time: lists of [(id, DirEntry)] (a whole file, a chunk index `<hex>.c` and a compressed
    `<hex>.z` are one object). A file or link in place of a fan-out directory is a group of its own
    (its name is no id, so it is reported as foreign). `taken(fan, names)` is first offered the
    names of each directory whose every name is 62 hex digits (whole files of well-named objects):
    when it answers True the directory is its, and yields nothing."""
    try:
        top = sorted(os.scandir(objdir), key=lambda e: e.name)
    except (FileNotFoundError, NotADirectoryError):
        return
    for sub in top:
        if not sub.is_dir(follow_symlinks=False):
            yield [[(PREFIX + sub.name, sub)]]
            continue
        if len(sub.name) != 2:
            continue
        if taken is not None:
            try:
                names = os.listdir(sub.path)
            except OSError:
                names = None   # listed again below, where what is wrong is said
            if names:
                text = "\n".join(names) + "\n"
                if text.count("\n") == len(names) and _PLAIN_NAMES.fullmatch(text) and taken(sub.name, names):
                    continue
        groups: list = []
        for e in sorted(os.scandir(sub.path), key=lambda e: e.name):
            oid = PREFIX + sub.name + e.name[:len(e.name) - len(_suffix(e.name))]
            if groups and groups[-1][0][0] == oid:
                groups[-1].append((oid, e))
            else:
                groups.append([(oid, e)])
        if groups:
            yield groups


def _note_record_at(store, checks: _RecordChecks, st: State, seq, after: int) -> None:
    """The id of the checked record at `seq` (the index's), for the index check: the head, or found
    walking back from the journal's end over the records the index lags behind (what it costs)."""
    if type(seq) is not int or seq in checks.watch or not after < seq <= st.seq:
        return
    if seq == st.seq:
        checks.watch[seq] = st.head
        return
    for rec in store.journal.backwards(strict=False):
        if rec["seq"] <= seq:
            if rec["seq"] == seq:
                checks.watch[seq] = rec["id"]
            return


def _verify(store, read_data: bool, progress, indexed, full: bool, mark: tuple, seen: _IndexSeen,
            vouched: dict | None) -> Report:
    rep = Report()
    j = store.journal
    w = _start(store, rep, full, mark)
    cache = store._load_cache()
    checks = _RecordChecks(store, rep, read_data, w["_state"] if w else None)
    if cache:
        checks.want.add(cache["seq"])
    # The index's meta comes from a thread that imports DuckDB (~0.5 s): if it is not there yet,
    # it is waited for only after the object pass (a --read-data rehash overlaps it).
    if vouched is not None:
        # the very index file the last clean verify read (rule 20): its meta is what it read
        checks.meta = dict(vouched["meta"])
        checks.want.add(checks.meta["seq"])
        rep.stats["index"] = "unchanged"
    else:
        checks.meta_future = indexed
        if indexed.done():
            checks.take_meta()
        rep.stats["index"] = "read"
    if w:
        checks.watch[w["seq"]] = w["id"]
        checks.state_at[w["seq"]] = w["_state"]
    # A whole-history pass: without the cyclic collector (store/scan.py says why), each batch of
    # object checks collecting the young generation instead (_Objects.flush).
    try:
        with without_collector():
            if w:
                scan = j.scan(w["offset"], w["seq"] + 1, w["id"], keep=False, each=checks.add, lines=True,
                              bulk=checks.bulk())
            else:
                scan = j.scan(keep=False, each=checks.add, lines=True, bulk=checks.bulk())
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

        # The objects the checked records reach were checked as they streamed by (_Objects); the
        # missing ones are reported now that every prune record is known, then a full verify lists
        # objects/ for what no record reaches.
        checks.objects.finish()
        if w:
            rep.stats["objects"], rep.stats["bytes"] = checks.objects.count, checks.objects.bytes
        else:
            checks.objects.listing(progress)
        # (a long scan learns the meta on its way, polling every 1024 records, and notes the record at
        # its seq as it passes; only a record it passed before that is looked up afterwards)
        meta = checks.take_meta() if checks.meta_future is not None else checks.meta
        if meta:
            _note_record_at(store, checks, st, meta["seq"], w["seq"] if w else 0)

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

        rows_checked = vouched is not None and vouched["checks"] == "rows"
        if w is None and meta and meta["store"] in (None, store.store_id) and not rows_checked \
                and not any(e["what"] == "index" for e in rep.errors):
            # A lookup checks each row it reads (rule 21); a row deleted from the index (a lookup,
            # the gate's budget count among them, would miss its record) shows only in the counts.
            n, rows = meta["seq"], index.journal_row_counts(store.root)
            rows_checked = rows is not None
            if rows is not None and rows != (n, n, min(1, n), n):
                rep.errors.append({"what": "index", "seq": n,
                                   "message": f"the index's journal table holds {rows[0]} rows ({rows[1]} distinct) for "
                                              f"records 1..{n}: rows were deleted or added (`ledger index rebuild`)"})
            sparse = index.sparse_rows_problem(store.root)  # the copy lookups read (rule 21)
            if sparse is not None:
                rep.errors.append({"what": "index", "seq": n, "message": sparse})

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
            _write_watermark(store, st, scan.end, rep, _index_entry(store, seen, vouched, meta, rows_checked))
        return rep
    finally:
        checks.objects.close()   # the warmer's threads and the directories, however verify ends (idempotent)


def _index_entry(store, seen: _IndexSeen, vouched: dict | None, meta: dict | None, rows: bool) -> dict | None:
    """What the watermark records of the index (rule 20): the file this verify read (or took from
    the watermark), if it is still that file and was not racy when taken; None otherwise."""
    if vouched is not None:
        entry = vouched       # carried forward, the row checks as the verify that ran them left them
    elif meta is None or seen.racy:
        return None
    else:
        entry = {"identity": seen.identity, "meta": meta, "checks": "rows" if rows else "meta", "code": _index_code()}
    return entry if seen.still(store.root) else None
