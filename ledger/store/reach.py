"""Reachability in bounded memory and in time that grows with what changed, for gc at any length.

docs/store-format.md rule 9: reachable is the closure, through ids inside structured objects,
of every id in every journal record. Holding every record (2+ GiB at a million records) or a
Python set of every id string (~150 bytes an id) does not fit a year of history; ids are kept
as the first 64 bits of their hash in sorted numpy arrays (8 bytes an id).

A 64-bit key can only err one way: an unreachable object whose key equals a reachable one's
looks reachable and is kept (a chance of about n²/2⁶⁵, 3·10⁻⁶ at ten million objects); a
reachable object always finds its own key. gc keeps too much in that case, never too little.

Objects are immutable, and records are only ever appended, so the closure of records 1..N is
a subset of the closure of records 1..N+k: one walk computes two closures at once (rule 9's,
and the retention policy's, which starts from the ids records *name* — not their
`payload.objects` — and does not follow a checkpoint's or receipt's training-state fields),
and ledger/store/gcstate.py keeps both, keyed by the record they were folded to, so the next
gc reads only the records after it and opens only the objects they reach first (rule 22).
Opening one is `classify`: its children are taken only from bytes that hash to its id; an
object that is missing or damaged is *unresolved* (no children yet) and is looked at again by
every gc, so one that arrives later (a pull, a repair) has its children followed then.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterator
from dataclasses import dataclass, field

import numpy as np  # gc's key arrays: 8 bytes an id instead of a Python string's ~150

from ledger.errors import BadInput, CorruptObject, MissingObject
from ledger.store import canonical, fsio, schema
from ledger.store.ids import PREFIX, find_ids, hash_bytes
from ledger.store.objects import hash_fd

STRUCTURED_MAX = 256 << 20   # as Store.closure: a larger object is data, never followed
_FLUSH = 1 << 18             # keys added one at a time are merged into a sorted array this often
_READ_WHOLE = 16 << 20       # objects up to this size are read in one piece to hash and parse them
_HEX2 = re.compile(r"[0-9a-f]{2}")

# The fields of a checkpoint and of a receipt that name training state: reasons to keep it for
# gc (rule 9), not for the retention policy (docs/store-format.md, "Retention").
CUT = {"checkpoint": ("adapter", "optimizer", "rng"), "receipt": ("optimizer_state", "rng_state")}


def key(oid: str) -> int:
    """The 64-bit key of an id: the first 16 hex digits of its hash."""
    return int(oid[len(PREFIX):len(PREFIX) + 16], 16)


_SLICE = 1 << 20   # keys looked up at a time: bounds the positions array to 8 MB


def member(arr: np.ndarray, keys: np.ndarray) -> np.ndarray:
    """A boolean mask: which of `keys` are in the sorted unique array `arr`. Looked up a slice at
    a time: one searchsorted over ten million keys would allocate 80 MB of positions (issue 18,
    gc's first run at 10M records peaked 423 MiB, ~80 MB of it this)."""
    out = np.zeros(len(keys), dtype=bool)
    if not len(arr):
        return out
    for at in range(0, len(keys), _SLICE):
        part = keys[at:at + _SLICE]
        i = np.searchsorted(arr, part)
        i[i == len(arr)] = 0
        out[at:at + len(part)] = arr[i] == part
    return out


def merged(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """The sorted unique union of two sorted unique arrays, allocating only the result (np.union1d
    makes three copies: at ten million keys, 240 MB more than this)."""
    if not len(b):
        return a
    if not len(a):
        return b
    b = b[~member(a, b)]
    return np.insert(a, a.searchsorted(b), b) if len(b) else a


class Keys:
    """A set of ids as uint64 keys: a sorted base array (loaded from the state), a sorted array
    of what was added since, and the latest additions in a small Python set.

    The added keys live in a buffer that grows in place (ndarray.resize: glibc's realloc of a
    large block is an mremap, so no second copy is ever resident) and are merged into it from
    the end. np.insert would allocate the whole merged array beside the old one at every flush:
    at ten million keys gc's first run held a third 78 MB array for that alone (issue 18, 10M
    records: 345 MiB during the walk). Once a view of the buffer has been handed out, the
    buffer is never resized or merged into again (a later flush copies it first), so a view
    neither dangles nor changes."""

    def __init__(self, base: np.ndarray | None = None):
        self.base = np.empty(0, dtype=np.uint64) if base is None else base
        self._buf = np.empty(0, dtype=np.uint64)
        self._n = 0
        self._lent = False           # a view of _buf is out there: never resize it in place
        self._recent: set[int] = set()
        self._all: np.ndarray | None = None

    @property
    def _extra(self) -> np.ndarray:
        return self._buf[:self._n]

    def has(self, k: int) -> bool:
        if k in self._recent:
            return True
        u = np.uint64(k)
        base, n = self.base, self._n
        if len(base):
            i = base.searchsorted(u)
            if i < len(base) and base[i] == u:
                return True
        if n:
            extra = self._buf[:n]
            i = extra.searchsorted(u)
            if i < n and extra[i] == u:
                return True
        return False

    def add(self, k: int) -> None:
        self._all = None
        self._recent.add(k)
        if len(self._recent) >= _FLUSH:
            self._flush()

    def _flush(self) -> None:
        if not self._recent:
            return
        new = np.unique(np.fromiter(self._recent, dtype=np.uint64, count=len(self._recent)))
        self._recent = set()
        old = self._extra
        new = new[~member(old, new)]
        if not len(new):
            return
        n, m = self._n, len(new)
        cap = max(n + m, len(self._buf) + len(self._buf) // 4 + _FLUSH)
        if self._lent:               # a view reads the old keys: merge into a copy instead
            grown = np.empty(max(n + m, len(self._buf)), dtype=np.uint64)
            grown[:n] = old
            self._buf, self._lent = grown, False
        elif n + m > len(self._buf):
            self._buf.resize(cap, refcheck=False)
        _merge_from_the_end(self._buf, n, new)
        self._n = n + m

    def added(self) -> np.ndarray:
        """The keys added since the base (sorted, unique; may include some already in the base)."""
        self._flush()
        self._lent = True
        return self._extra

    def contains(self, keys: np.ndarray) -> np.ndarray:
        """A boolean mask: which of `keys` are in the set."""
        self._flush()
        return member(self.base, keys) | member(self._extra, keys)

    def array(self) -> np.ndarray:
        """Every key, sorted and unique (the base array itself when nothing was added)."""
        self._flush()
        if not self._n:
            return self.base
        if self._all is None:   # kept: gc asks twice (to save the state, then to judge the listing)
            self._lent = True
            self._all = merged(self.base, self._extra)
        return self._all

    def __len__(self) -> int:
        return len(self.array())


def _merge_from_the_end(buf: np.ndarray, n: int, new: np.ndarray) -> None:
    """Merge the sorted keys `new` (none in buf[:n]) into the sorted buf[:n], in place, into
    buf[:n + len(new)]. Old keys move right by the number of new keys below them; moving them
    a slice at a time from the end never overwrites one not yet moved (its place is at or
    right of where it is), and each slice's temporaries are _SLICE keys."""
    at_new = np.searchsorted(buf[:n], new) + np.arange(len(new))
    for hi in range(n, 0, -_SLICE):
        lo = max(0, hi - _SLICE)
        part = buf[lo:hi].copy()
        buf[np.arange(lo, hi) + np.searchsorted(new, part)] = part
    buf[at_new] = new


@dataclass
class Node:
    """What opening an object showed: its children (rule 9's, and the retention policy's with
    training-state fields cut), whether it is a checkpoint or receipt, whether it resolved."""
    children: set = field(default_factory=set)
    kept_children: set = field(default_factory=set)
    special: bool = False
    resolved: bool = True


def classify(store, oid: str) -> Node:
    """Open `oid` and say what it reaches. Children come only from bytes that hash to the id
    (a damaged copy's bytes are not its content); a missing, damaged or unreadable object is
    unresolved (no children yet, looked at again by the next gc). A chunked object, one larger
    than STRUCTURED_MAX, or one that is not a JSON object is data: no children."""
    h = oid[len(PREFIX):]
    try:
        # the whole copy first, as every read prefers it; a plain path, not ObjectStore.open's
        # pathlib and lstat calls (a first walk opens a million of these)
        fd, st = fsio.open_regular(os.path.join(store.objects.dir, h[:2], h[2:]))
    except FileNotFoundError:
        if store.objects.compressed(oid):  # a `.z` file (store/compress.py): decompressed and rehashed
            try:
                data = store.objects.structure(oid, STRUCTURED_MAX)
            except (MissingObject, CorruptObject, fsio.StorageIOError):
                return Node(resolved=False)
            return Node() if data is None else node_of(data)
        # stored as chunks (ledger/store/chunks.py: 16 MiB and up) is data, as Store.closure says
        if store.objects.chunked(oid):
            return Node()
        try:   # packed (ledger/store/packed.py): read from its pack and rehashed
            data = store.objects.structure(oid, STRUCTURED_MAX)
        except (MissingObject, CorruptObject, fsio.StorageIOError):
            return Node(resolved=False)
        return Node() if data is None else node_of(data)
    except (fsio.NotRegular, OSError):   # a link, FIFO or directory in its place; a damaged fan-out
        return Node(resolved=False)
    try:
        if st.st_size > STRUCTURED_MAX:
            return Node()
        try:
            if st.st_size <= _READ_WHOLE:
                data = fsio.read_bounded(fd, st.st_size)
                ok = hash_bytes(data) == oid
            else:
                data = os.pread(fd, 1, 0)
                ok = hash_fd(fd, st.st_size) == oid
        except OSError:
            return Node(resolved=False)
    finally:
        os.close(fd)
    if not ok:
        return Node(resolved=False)
    if not data.startswith(b"{"):
        return Node()
    if st.st_size > _READ_WHOLE:
        try:
            data = store.objects.get_bytes(oid, max_size=STRUCTURED_MAX)
        except Exception:  # noqa: BLE001 - changed under us: damage is verify's to name; look again next time
            return Node(resolved=False)
    return node_of(data)


def node_of(data: bytes) -> Node:
    """The Node of a structured object's verified bytes."""
    if PREFIX.encode() not in data and b"\\u" not in data:
        return Node()   # no id can be in it, literally or escaped: nothing to parse (most turn batches)
    try:
        obj = canonical.loads(data)
    except BadInput:
        return Node()
    children = find_ids(obj)
    kind = obj.get("kind") if isinstance(obj, dict) else None
    if kind in CUT:
        cut = CUT[kind]
        return Node(children, find_ids({k: v for k, v in obj.items() if k not in cut}), special=True)
    return Node(children, children)


def record_ids(rec: dict) -> tuple[set, set]:
    """(every id the record names, the ids it names other than through payload.objects): rule
    9's roots, and the retention policy's (what a transaction wrote is not what it needs)."""
    payload = rec["payload"]
    named = set(rec["inputs"])
    named.update(rec["outputs"])
    if "objects" in payload:
        find_ids({k: v for k, v in payload.items() if k != "objects"}, named)
        return find_ids(payload["objects"], set(named)), named
    find_ids(payload, named)
    return named, named


def shaped_ids(rec: dict, line: bytes) -> tuple[set, set] | None:
    """record_ids from a line of its kind's usual shape (KindHooks.line_shape), or None for any
    other line. A match proves the envelope well-formed and the payload's ids exactly the
    pattern's `b3:` groups, one group an occurrence; those inside `payload.objects` are its
    entries' ids, so the named ones are the groups less one occurrence of each entry's id — the
    same sets record_ids finds by walking the payload (a first gc asks this of every record;
    tests/store/test_reach_keys.py holds the two to each other)."""
    h = schema.hooks(rec["kind"])
    shape = h.line_shape if h is not None else None
    if shape is None:
        return None
    m = shape[0].match(line, line.find(b',"payload":'))
    if m is None:
        return None
    outside = [g.decode() for g in m.groups() if g and g.startswith(b"b3:")]
    every = set(rec["inputs"])
    every.update(rec["outputs"])
    named = set(every)
    for entry in rec["payload"].get("objects", ()):
        outside.remove(entry[0])
        every.add(entry[0])
    named.update(outside)
    every.update(outside)
    return every, named


def run_ids(run):
    """For each row of a run of proved lines of a kind with KindHooks.line_fields (Journal.scan's
    `bulk`): (its inputs, every id it names, the ids it names other than through payload.objects)
    — record_ids' sets, read off the run's columns: the names are the envelope's lists and every
    id part of the kind's tokens (line_shape's groups), and payload.objects' entries are exactly
    line_fields' (tests/store/test_blockcheck.py holds gc's walk of runs to its walk line by line)."""
    entry_parts = {p for p, _, _ in schema.hooks(run.kind).line_fields.objects}
    parts, (in_off, in_text), (out_off, out_text) = run.id_text()
    hexes = list(parts.values())
    # the id parts outside payload.objects: every id part but the entries' (one occurrence each)
    outside = [h for p, h in parts.items() if p not in entry_parts]
    for k in range(len(run)):
        a = 64 * k
        inputs = [PREFIX + in_text[64 * j:64 * j + 64] for j in range(in_off[k], in_off[k + 1])]
        named = set(inputs)
        named.update(PREFIX + out_text[64 * j:64 * j + 64] for j in range(out_off[k], out_off[k + 1]))
        every = set(named)
        every.update(PREFIX + h[a:a + 64] for h in hexes)
        named.update(PREFIX + h[a:a + 64] for h in outside)
        yield inputs, every, named


class Walk:
    """The two closures of gc, grown record by record from a saved state (or from nothing)."""

    def __init__(self, store, reach: np.ndarray | None = None, not_kept: np.ndarray | None = None,
                 inputs: np.ndarray | None = None, unresolved=(), special=()):
        self.store = store
        # The policy's closure is nearly all of rule 9's (only superseded training state is left
        # out), so it is held as what it leaves out: at ten million objects a second closure of
        # its own was another ~98 MB of keys (issue 18: gc's first run at 10M records, 423 MiB).
        self.reach = Keys(reach)                   # rule 9's closure
        self._dropped = Keys(not_kept)             # reached, and not kept when the record that reached it was walked
        self._revived = Keys()                     # dropped, then kept by a later record
        self._pending: set[int] = set()            # reached by the record being walked, not kept (yet)
        self.inputs = Keys(inputs)                 # every id a record names as an input
        self.unresolved: set[str] = set(unresolved)
        self.special: set[str] = set(special)      # checkpoints and receipts the policy keeps
        self.opened = 0                            # objects opened while growing the closures
        self.ready: dict[str, Node] = {}           # Nodes of packed objects a batch read ahead (gc._walk)
        self.resolved = 0                          # unresolved objects that opened whole this time

    def _kept(self, k: int) -> bool:
        """Kept by the policy: reached, and neither waiting for the record being walked to keep
        it nor dropped without being revived since."""
        if k in self._pending or not self.reach.has(k):
            return False
        return not self._dropped.has(k) or self._revived.has(k)

    def _keep(self, k: int) -> None:
        """The policy keeps `k` (reached, not kept so far)."""
        if k in self._pending:
            self._pending.discard(k)
        else:
            self._revived.add(k)

    def add_record(self, rec: dict, ids: tuple[set, set] | None = None) -> None:
        """Grow both closures by what one record names (`ids`: its record_ids, when the caller
        has them already, e.g. from shaped_ids)."""
        every, named = ids if ids is not None else record_ids(rec)
        self.add_ids(rec["inputs"], every, named)

    def add_ids(self, inputs, every, named) -> None:
        """Grow both closures by one record's ids (record_ids' two sets) and its inputs."""
        for oid in inputs:
            self.inputs.add(key(oid))
        self._grow(every, named, {})

    def _grow(self, every, named, memo: dict) -> None:
        # each id is judged once, when it leaves the stack (its key computed once; a first gc
        # makes ten million of these lookups, each a set probe and up to two binary searches)
        stack = list(every)
        while stack:
            oid = stack.pop()
            k = key(oid)
            if k in self._pending or self.reach.has(k):
                continue
            self.reach.add(k)
            self._pending.add(k)
            node = memo.get(oid) or self._open(oid, memo)
            stack.extend(node.children)
        # the policy's closure is inside rule 9's (named ids are among every id, its edges among
        # all edges), so whatever it opens was opened above, in this record or an earlier one
        stack = list(named)
        while stack:
            oid = stack.pop()
            k = key(oid)
            if self._kept(k):
                continue
            self._keep(k)
            node = memo.get(oid) or self._open(oid, memo)
            if node.special:
                self.special.add(oid)
            stack.extend(node.kept_children)
        for k in self._pending:   # reached by this record and not kept by it
            self._dropped.add(k)
        self._pending.clear()

    def _open(self, oid: str, memo: dict) -> Node:
        node = self.ready.pop(oid, None) or classify(self.store, oid)
        self.opened += 1
        memo[oid] = node
        if node.resolved:
            self.unresolved.discard(oid)
        else:
            self.unresolved.add(oid)
        return node

    def retry_unresolved(self) -> None:
        """Objects reached while missing or damaged: any that is now whole has its children
        followed (into the policy's closure too, when the policy keeps it)."""
        for oid in sorted(self.unresolved):
            node = classify(self.store, oid)
            if not node.resolved:
                continue
            self.resolved += 1
            self.unresolved.discard(oid)
            if node.special and self._kept(key(oid)):
                self.special.add(oid)
            self._grow(node.children, node.kept_children if self._kept(key(oid)) else (), {oid: node})

    def is_kept(self, oid: str) -> bool:
        """The policy's closure holds `oid` (or a key equal to its: then it is kept, never removed)."""
        return self._kept(key(oid))

    def has_input(self, oid: str) -> bool:
        return self.inputs.has(key(oid))

    def result(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(reach, reached but not kept, inputs) as sorted arrays, for the saved state."""
        dropped = self._dropped.array()
        return self.reach.array(), dropped[~self._revived.contains(dropped)], self.inputs.array()


_HEXVAL = np.full(256, 255, dtype=np.uint8)
_HEXVAL[np.frombuffer(b"0123456789abcdef", dtype=np.uint8)] = np.arange(16, dtype=np.uint8)


class Listed:
    """One fan-out directory's object files: names (bytes, a `.c`/`.z` suffix kept) and keys."""

    def __init__(self, top: str, sub: str, names: np.ndarray, keys: np.ndarray):
        self.top, self.sub, self.names, self.keys = top, sub, names, keys

    def id(self, i: int) -> str:
        return PREFIX + self.sub + self.names[i][:62].decode()

    def path(self, i: int) -> str:
        return os.path.join(self.top, self.sub, self.names[i].decode())

    def suffixed(self, suffix: str) -> np.ndarray:
        """A mask: which names end with `suffix` (".c", ".z")."""
        want = np.frombuffer(suffix.encode(), dtype=np.uint8)
        m = self.names.view(np.uint8).reshape(len(self.names), 64)
        return (m[:, 62] == want[0]) & (m[:, 63] == want[1])


def listing(store) -> Iterator[Listed]:
    """The object store's files, one fan-out directory at a time, names of well-formed ids only
    (a file not named like an object is left alone: verify reports it). Names are checked and
    turned into keys with array operations, and ids and paths are made only for the few files
    a caller asks about: listing a million objects costs well under a microsecond each (the
    pathlib walk of ObjectStore.iter_ids costs ~5 µs a file)."""
    top = str(store.objects.dir)
    try:
        subs = sorted(e.name for e in os.scandir(top) if e.is_dir(follow_symlinks=False) and _HEX2.fullmatch(e.name))
    except FileNotFoundError:
        return
    for sub in subs:
        try:
            raw = os.listdir(os.path.join(top, sub).encode())
        except (NotADirectoryError, FileNotFoundError):
            continue
        if not raw:
            continue
        raw.sort()
        names = np.array(raw, dtype="S64")   # longer names are cut, then refused below by their length
        lens = np.fromiter((len(n) for n in raw), dtype=np.int64, count=len(raw))
        m = names.view(np.uint8).reshape(len(raw), 64)
        vals = _HEXVAL[m[:, :62]]
        ok = (vals != 255).all(axis=1) & ((lens == 62) | ((lens == 64) & (m[:, 62] == ord("."))
                                                            & ((m[:, 63] == ord("c")) | (m[:, 63] == ord("z")))))
        if not ok.all():
            names, vals = names[ok], vals[ok]
        if not len(names):
            continue
        # the key: the sub-directory's two hex digits, then the name's first fourteen
        keys = np.full(len(names), int(sub, 16), dtype=np.uint64)
        for j in range(14):
            keys = (keys << np.uint64(4)) | vals[:, j].astype(np.uint64)
        yield Listed(top, sub, names, keys)
