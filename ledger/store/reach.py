"""Reachability in bounded memory, for gc at any journal length.

docs/store-format.md rule 9: reachable is the closure, through ids inside structured objects,
of every id in every journal record. Holding every record (2+ GiB at a million records) or a
Python set of every id string (~150 bytes an id) does not fit a year of history; here the
journal is streamed (`Journal.stream`: one record at a time) and ids are kept as the first 64
bits of their hash in sorted numpy arrays (8 bytes an id).

A 64-bit key can only err one way: an unreachable object whose key equals a reachable one's
looks reachable and is kept (a chance of about n²/2⁶⁵, 3·10⁻⁶ at ten million objects); a
reachable object always finds its own key. gc keeps too much in that case, never too little.

The closure walks the object store's listing in passes: the first opens the structured objects
among the roots, each later one only the objects first reached in the pass before (a
generation's adapter tree, then its files), so memory is the key arrays plus one fan-out
batch, whatever the history's length.
"""

from __future__ import annotations

import os
from collections.abc import Iterator

import numpy as np  # gc's key arrays: 8 bytes an id instead of a Python string's ~150

from ledger.errors import BadInput, CorruptObject, MissingObject
from ledger.store import canonical, fsio
from ledger.store.ids import PREFIX, find_ids, is_id
from ledger.store.state import State, fold

STRUCTURED_MAX = 256 << 20   # as Store.closure: a larger object is data, never followed
_FLUSH = 1 << 18             # pending keys merged into the sorted array this often
_BATCH = 1 << 13             # listed objects judged per vectorised lookup
_IDS = 1 << 12               # ids of records gathered as strings before they become keys


def key(oid: str) -> int:
    """The 64-bit key of an id: the first 16 hex digits of its hash."""
    return int(oid[len(PREFIX):len(PREFIX) + 16], 16)


class KeySet:
    """A set of ids as sorted unique uint64 keys, grown in batches."""

    def __init__(self):
        self._sorted = np.empty(0, dtype=np.uint64)
        self._pending: list[int] = []

    def add(self, oid: str) -> None:
        self._pending.append(key(oid))
        if len(self._pending) >= _FLUSH:
            self._merge()

    def add_keys(self, keys: np.ndarray) -> None:
        self._merge()
        self._sorted = np.union1d(self._sorted, keys.astype(np.uint64))

    def _merge(self) -> None:
        if self._pending:
            self._sorted = np.union1d(self._sorted, np.array(self._pending, dtype=np.uint64))
            self._pending = []

    def contains(self, keys: np.ndarray) -> np.ndarray:
        """A boolean mask: which of `keys` are in the set."""
        self._merge()
        s = self._sorted
        if not len(s):
            return np.zeros(len(keys), dtype=bool)
        i = np.searchsorted(s, keys)
        i[i == len(s)] = 0
        return s[i] == keys

    def __len__(self) -> int:
        self._merge()
        return len(self._sorted)


def _record_ids(rec: dict, out: set) -> None:
    out.update(rec["inputs"])
    out.update(rec["outputs"])
    find_ids(rec["payload"], out)


def roots(store) -> tuple[KeySet, State]:
    """Every id any journal record names, and the journal's fold, in one streamed pass. A broken
    chain or a record the fold cannot apply raises JournalCorrupt before anything is judged."""
    keys = KeySet()

    def each() -> Iterator[dict]:
        ids: set[str] = set()
        for rec in store.journal.stream():
            _record_ids(rec, ids)
            if len(ids) > _IDS:
                for oid in ids:
                    keys.add(oid)
                ids.clear()
            yield rec
        for oid in ids:
            keys.add(oid)

    st = fold(each())
    return keys, st


def _children(store, oid: str) -> set[str]:
    """Ids inside structured object `oid` (the same rule as Store.closure); an object that is
    missing, damaged, large or not JSON has none to follow."""
    try:
        data = store.objects.structure(oid, STRUCTURED_MAX)  # whole or compressed (store/compress.py)
    except (MissingObject, CorruptObject, fsio.StorageIOError):
        return set()
    if data is None or PREFIX.encode() not in data:
        return set()   # no id anywhere in it: nothing to parse for (most turn batches)
    try:
        return find_ids(canonical.loads(data))
    except BadInput:
        return set()


def _batches(store) -> Iterator[tuple[list[tuple[str, os.PathLike]], np.ndarray]]:
    """The object store's listing in batches: ([(id, path)], keys), well-formed ids only."""
    items: list = []
    for oid, path in store.objects.iter_ids():
        if is_id(oid):
            items.append((oid, path))
            if len(items) >= _BATCH:
                yield items, np.fromiter((key(i) for i, _ in items), dtype=np.uint64, count=len(items))
                items = []
    if items:
        yield items, np.fromiter((key(i) for i, _ in items), dtype=np.uint64, count=len(items))


def closure(store, reach: KeySet) -> KeySet:
    """Grow `reach` (root keys) to the closure through structured objects; returns it."""
    frontier: KeySet | None = None        # None: the first pass, where the frontier is every root
    while True:
        found: set[int] = set()
        for items, keys in _batches(store):
            mask = (reach if frontier is None else frontier).contains(keys)
            for i in np.flatnonzero(mask):
                for child in _children(store, items[i][0]):
                    found.add(key(child))
        if not found:
            return reach
        new = np.array(sorted(found), dtype=np.uint64)
        new = new[~reach.contains(new)]
        if not len(new):
            return reach
        reach.add_keys(new)
        frontier = KeySet()
        frontier.add_keys(new)


def unreachable(store, reach: KeySet) -> Iterator[tuple[str, os.PathLike]]:
    """(id, path) of present objects (well-formed names) whose key is not reachable."""
    for items, keys in _batches(store):
        mask = reach.contains(keys)
        for i in np.flatnonzero(~mask):
            yield items[i]
