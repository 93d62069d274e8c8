"""Lookups of journal records by kind and payload field, answered by the index, not a walk.

The learn cycle and the gate ask "the latest `train` record of this plan", "every `judge`
record of this budget key", "the latest checkpoint of this plan": on a journal of millions of
records a walk for a record that is not there (a new plan, a new candidate) reads everything.
Here the DuckDB index answers for the records it projects, and only the records the journal
gained since (the index lags inside a cycle, and after a crash) are read, from the journal's
end.

The hash chain stays the authority (docs/store-format.md, rule 15):
- the index is used only if it is this store's and the journal's record at the index's seq is
  the index's head (checked on the walk back over the gap, which reaches that record); an index
  of another store or another history, or one that leads the journal, is not used;
- every record taken from the index is rebuilt from its row and must hash to its id;
- an index that is missing, unreadable, of another layout (an older INDEX_VERSION), stale in any
  of those ways, or whose row does not hash, is never trusted: the lookup walks the journal (the
  old cost, the right answer) and says so in `store.warnings`, naming the fix (`ledger index
  rebuild`).
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterator

from ledger.store import index


def _slow(store, why: str) -> None:
    msg = f"{why}: looked records up by walking the journal (`ledger index rebuild` makes it fast again)"
    if msg not in store.warnings:
        store.warnings.append(msg)


def _matches(rec: dict, kinds: tuple[str, ...], where: dict[str, str]) -> bool:
    p = rec["payload"]
    return rec["kind"] in kinds and all(isinstance(p.get(k), str) and p[k] == v for k, v in where.items())


def records(store, kinds: str | tuple[str, ...], where: dict[str, str] | None = None,
            limit: int | None = None) -> Iterator[dict]:
    """Records of `kinds` whose payload field `key` is the string `where[key]` for every key,
    newest first, from the index plus the journal's records after it (see the module doc).
    Callers check anything beyond string equality on the records themselves. `limit`: at most
    that many (the newest), read as such from the index."""
    kinds = (kinds,) if isinstance(kinds, str) else tuple(kinds)
    where = dict(where or {})
    found = _answer(store, index.lookup_rows(store.root, kinds, where, limit), lambda r: _matches(r, kinds, where))
    yield from found if limit is None else itertools.islice(found, limit)


def by_id_prefix(store, hexpart: str, limit: int = 2) -> list[dict]:
    """Up to `limit` records whose id starts with `b3:` + `hexpart` (lowercase hex), newest first
    (`ledger show` of a record id as `ledger log` prints it)."""
    want = "b3:" + hexpart
    out = []
    for r in _answer(store, index.rows_by_id_prefix(store.root, hexpart, limit), lambda r: r["id"].startswith(want)):
        out.append(r)
        if len(out) == limit:
            break
    return out


def _answer(store, found, match: Callable[[dict], bool]) -> Iterator[dict]:
    """The records `match` selects, newest first: the index's rows `found` (meta, rows) once the
    index is shown to be this journal's, plus the journal's records after it; else a walk."""
    if found is None or isinstance(found, str):
        # a string: the index's layout is not this code's (another version; index._layout_problem)
        _slow(store, "the index is missing or unreadable" if found is None else f"the index is {found}")
        yield from (r for r in store.journal.backwards() if match(r))
        return
    meta, rows = found
    if meta["store"] not in (None, store.store_id):
        _slow(store, "the index belongs to another store")
        yield from (r for r in store.journal.backwards() if match(r))
        return
    # The journal's records after the index's seq, newest first; the walk ends on the record at
    # the index's seq, which must be the index's head.
    gap: list[dict] = []
    joined = meta["seq"] == 0 and meta["head"] is None
    for r in store.journal.backwards():
        if r["seq"] > meta["seq"]:
            gap.append(r)
            continue
        joined = r["seq"] == meta["seq"] and r["id"] == meta["head"]
        break
    if not joined:
        _slow(store, "the index is not a projection of this journal (another history, or ahead of it)")
        yield from (r for r in store.journal.backwards() if match(r))
        return
    yield from (r for r in gap if match(r))
    for i, row in enumerate(rows):
        rec = index.record_from_row(row)
        if rec is None:
            _slow(store, f"the index's row for record {row[0]} does not hash to its id")
            below = rows[i - 1][0] if i else meta["seq"] + 1
            yield from (r for r in store.journal.backwards() if r["seq"] < below and match(r))
            return
        yield rec


def recorded_sizes(store, oid: str) -> set[int]:
    """The sizes the records that wrote `oid` give it (`payload.objects`: [id, size, kind]),
    from the index plus the journal after it (see the module doc). Empty if no record wrote it.
    What a chunk index declares is checked against this before a long read (`ledger cat`): an
    index is not named by its own bytes, so only the journal vouches for an object's size."""
    def writes(r: dict) -> bool:
        objs = r["payload"].get("objects")
        return isinstance(objs, list) and any(isinstance(o, list) and o and o[0] == oid for o in objs)

    out: set[int] = set()
    for r in _answer(store, index.rows_writing(store.root, oid), writes):
        out.update(o[1] for o in r["payload"]["objects"]
                   if isinstance(o, list) and len(o) > 1 and o[0] == oid and type(o[1]) is int)
    return out


def latest(store, kinds: str | tuple[str, ...], where: dict[str, str] | None = None,
           pred: Callable[[dict], bool] | None = None) -> dict | None:
    """The newest record of `kinds` matching `where` (and `pred(payload)`, if given), or None."""
    return next((r for r in records(store, kinds, where) if pred is None or pred(r["payload"])), None)
