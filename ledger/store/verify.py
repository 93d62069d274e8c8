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

import os
import stat
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

from ledger.errors import BadInput, CorruptObject, LedgerError, StoreCorrupt
from ledger.store import fsio, index, schema
from ledger.store.chunks import SUFFIX
from ledger.store.fsio import StorageIOError
from ledger.store.ids import PREFIX
from ledger.store.state import State


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


def _fold_well_formed(records) -> State:
    """The fold over the records whose envelope can be folded (verify reports the others)."""
    st = State()
    for r in records:
        if schema.envelope_problem(r["payload"]) is None:
            st = st.apply(r)
    return st


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


def _check_records(store, records, rep: Report, read_data: bool = False) -> State:
    """Each record against its kind's schema and the objects it names; HEAD against the
    generations. Returns the fold of the well-formed records (docs/store-format.md, "Record schemas").

    The structural pass takes an object's kind from the record that wrote it (payload.objects
    holds [id, size, kind], kind from the object's own "kind" field) when that is the kind
    wanted, like it takes sizes from there; anything else, and every object under read_data, is
    opened and read."""
    kinds: dict[str, str | None] = {}    # id -> kind, read from the object
    recorded: dict[str, set] = {}         # id -> kinds the records that wrote it give it
    if not read_data:
        for r in records:
            objs = r["payload"].get("objects")
            if isinstance(objs, list) and schema.envelope_problem({"objects": objs}) is None:
                for o in objs:
                    recorded.setdefault(o[0], set()).add(o[2])

    def bad(rec, message):
        rep.errors.append({"what": "record", "seq": rec["seq"], "id": rec["id"], "kind": rec["kind"][:64],
                           "message": f"record {rec['seq']} ({rec['kind'][:64]}) is ill-formed: {message}"})

    def wrong_kind(rec, where, oid, want):
        if recorded.get(oid) == {want}:
            return
        got = _object_kind(store, oid, kinds)
        if got is not None and got != want:
            what = f"a {got!r} object" if got else "not a structured object"
            bad(rec, f"{where} names {oid}, which is {what}, not a {want!r} object")

    state = State()
    for rec in records:
        problem = schema.envelope_problem(rec["payload"])
        if problem is not None:
            bad(rec, problem)
            continue  # cannot be folded: its refs are not refs
        if not rec["kind"] or len(rec["kind"]) > schema.MAX_KIND_LEN:
            bad(rec, f"the kind must be 1 to {schema.MAX_KIND_LEN} characters")
        h = schema.hooks(rec["kind"])
        try:  # object_kinds checks the payload against its kind's schema first (one parse per record)
            named = h.object_kinds(rec["payload"]) if h else {}
        except BadInput as e:
            bad(rec, e.message)
            named = {}
        for key, (oid, want) in named.items():
            wrong_kind(rec, f"payload.{key}", oid, want)
        for name, target in (rec["payload"].get("refs") or {}).items():
            want = schema.ref_object_kind(name)
            if want and target is not None:
                wrong_kind(rec, f"ref {name}", target, want)
        state = state.apply(rec)
    head = state.refs.get("HEAD")
    gens = {t for n, t in state.refs.items() if schema.GEN_REF_RE.match(n)}
    if head is not None and head not in gens:
        last = next((r for r in reversed(records) if schema.envelope_problem(r["payload"]) is None
                     and "HEAD" in (r["payload"].get("refs") or {})), None)
        rep.errors.append({"what": "head", "id": head, "seq": last["seq"] if last else None,
                           "message": f"HEAD names {head}, which no gen-N ref names: HEAD is not a generation"
                                      + (f" (moved there by record {last['seq']}, {last['kind'][:64]})"
                                         if last else "")})
    return state


def verify(store, read_data: bool = False, progress=None) -> Report:
    """Check the journal chain, record meaning, caches and objects (rehashing them with read_data)."""
    # Opening the index (importing DuckDB) costs a few hundred ms: do it on a thread while the
    # main thread checks the journal and rehashes objects (BLAKE3 releases the GIL).
    with ThreadPoolExecutor(1) as pool:
        indexed = pool.submit(index.indexed_meta, store.root)
        return _verify(store, read_data, progress, indexed)


def _verify(store, read_data: bool, progress, indexed) -> Report:
    rep = Report()
    j = store.journal
    scan = j.scan()
    rep.stats["records"] = len(scan.records)
    if scan.broken_at is not None:
        rid = None
        try:
            rid = scan.records[-1]["id"] if scan.records else None
        except (IndexError, KeyError):
            pass
        rep.errors.append({"what": "journal", "seq": scan.broken_at, "after": rid,
                           "message": f"journal chain broken at {scan.problem}"})
    elif scan.torn and store.tail_committed(scan) is not None:
        rep.errors.append({"what": "journal", "seq": scan.last_seq + 1,
                           "message": f"record {scan.last_seq + 1} was committed (the index holds it) but its "
                                      "bytes in the journal are damaged"})
    elif scan.torn:
        rep.warnings.append({"what": "journal-tail", "seq": len(scan.records),
                             "message": f"damaged journal tail of {len(scan.torn)} bytes after record "
                                        f"{len(scan.records)} (ignored; the next write moves it aside)"})
    st = _check_records(store, scan.records, rep, read_data)

    cache = store._load_cache()
    if cache:
        by_seq = {r["seq"]: r["id"] for r in scan.records}
        if cache["seq"] > st.seq and scan.broken_at is None:
            rep.errors.append({"what": "journal", "seq": st.seq + 1,
                               "message": f"journal ends at record {st.seq} but refs.json saw record {cache['seq']}: "
                                          "records were removed"})
        elif cache["seq"] in by_seq and by_seq[cache["seq"]] != cache["head"]:
            rep.errors.append({"what": "journal", "seq": cache["seq"],
                               "message": f"record {cache['seq']} differs from the one committed earlier: "
                                          "history was rewritten"})
        elif cache["seq"] <= st.seq and j.path.stat().st_size >= cache["offset"] and cache.get("digest") \
                and j.prefix_digest(cache["offset"]) != cache["digest"] and scan.broken_at is None:
            rep.errors.append({"what": "journal", "seq": cache["seq"],
                               "message": "journal bytes before the last known head changed: history was rewritten"})
        elif cache["seq"] <= st.seq and \
                cache["refs"] != _fold_well_formed(r for r in scan.records if r["seq"] <= cache["seq"]).refs:
            rep.warnings.append({"what": "refs-cache", "message": "refs.json disagrees with the journal fold "
                                                              "(it is rebuilt on the next write)"})

    # Objects the journal reaches, and their sizes as recorded when they were written.
    sizes = {}
    for r in scan.records:
        for o in r["payload"].get("objects") or []:
            if isinstance(o, list) and len(o) == 3:
                sizes[o[0]] = o[1]
    roots = store.roots(scan.records)
    missing: set[str] = set()
    reachable = store.closure(roots, missing)
    for oid in sorted(missing):
        rep.errors.append({"what": "missing", "id": oid, "message": f"object {oid} is referenced but missing"})
    # Objects that aren't regular files (a directory, link or FIFO in an object's place) are
    # judged from lstat alone: nothing here opens what it cannot read safely.

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
        fst = os.lstat(path)  # not `st`: that is the journal's fold, used below
        if not stat.S_ISREG(fst.st_mode):
            rep.errors.append({"what": "corrupt", "id": oid,
                               "message": f"object {oid} is a {fsio.file_kind(fst.st_mode)}, not a stored file"})
            continue
        size = fst.st_size
        if path.name.endswith(SUFFIX):  # a chunk index: the object's size is in it, its bytes in packs
            try:
                size = store.objects.size(oid)
                store.objects.check_chunked(oid)  # pages read and checked, packs present (~60 B per chunk)
            except (CorruptObject, StorageIOError) as e:
                rep.errors.append({"what": "corrupt", "id": oid, "message": e.message})
                continue
        total += size
        if oid in sizes and sizes[oid] != size:
            rep.errors.append({"what": "corrupt", "id": oid,
                               "message": f"object {oid} has {size} bytes, {sizes[oid]} were written"})
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

    meta = indexed.result()
    seq = meta["seq"] if meta else None
    by_seq = {r["seq"]: r["id"] for r in scan.records}
    if meta is None:
        rep.warnings.append({"what": "index",
                             "message": "the DuckDB index is missing or unreadable (`ledger index rebuild`)"})
    elif meta["store"] not in (None, store.store_id):
        rep.errors.append({"what": "index",
                           "message": f"the index belongs to another store ({meta['store']}); its answers "
                                      "are not this journal's (`ledger index rebuild`)"})
    elif seq in by_seq and by_seq[seq] != meta["head"]:
        rep.errors.append({"what": "index", "seq": seq,
                           "message": f"the index ends at a record {seq} that is not this journal's "
                                      "(copied from elsewhere?): `ledger index rebuild`"})
    elif seq != st.seq and not (seq > st.seq and scan.torn):
        rep.warnings.append({"what": "index", "message": f"the index reflects record {seq}, the journal is at "
                                                         f"{st.seq} (`ledger index rebuild`)"})

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
    return rep
