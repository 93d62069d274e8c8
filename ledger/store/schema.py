"""What the store knows about the meaning of a record: the envelope every record shares, and the
hooks that the layers above register for the record kinds they define.

Why the hooks live here and the kinds do not: store/ may import only errors and itself (the
import-layer rule), yet `verify` must check each record against its kind's schema and the index
must project each kind into its tables. So the store owns the interface (KindHooks) and the
registry, and `ledger/records.py` — one home per record kind — fills it when imported. The
registry names that module as its provider (RECORDS_MODULE) and imports it on first use, like a
plugin entry point: store/ holds no import of it (no import edge, no cycle), every program that
opens a store gets every kind, and light commands (`ledger --help`, `log`) never pay the ~25 ms
of building 30 dataclasses. If the provider registers nothing, asking for kinds is an
InternalError: nothing indexes or verifies with a partial registry.

The envelope is the store's own part of every payload (docs/store-format.md, "Record schemas"):
  refs      {name: id | null}       the ref changes the fold applies (null deletes)
  counters  {name: integer}         counter deltas the fold adds
  objects   [[id, size >= 0, kind]] what the transaction wrote or referenced, with sizes
  chunk_lists [[id, 64 hex]]        the chunk-list digest of a chunked object it wrote (C12);
                                    each id one of its objects, once
A record whose envelope breaks these rules cannot be folded: the fold raises JournalCorrupt
naming its seq (`envelope_problem`), so no command acts on a state it cannot compute.
"""

from __future__ import annotations

import importlib
import re
from collections.abc import Callable
from dataclasses import dataclass

from ledger.errors import BadInput, InternalError
from ledger.store.ids import is_id

GetJson = Callable[[str], object]
Rows = dict[str, list[tuple]]

GEN_REF_RE = re.compile(r"^gen-(\d+)$")
MAX_KIND_LEN = 64
_INT64 = 1 << 63


@dataclass(frozen=True)
class KindHooks:
    """The store's view of one record kind, registered from above (ledger/records.py).

    check(payload)               raises BadInput naming the field whose type or meaning is wrong
    project(rec, get_json)       rows the index gains from a record whose payload passed `check`
    object_kinds(payload)        {field: (id, kind the object must have)} for verify to open
    deferred                     the tables `project` fills, when it must read an object per record
                                 to fill them (a turn batch's turns): an index rebuild leaves them
                                 for their first use (store/index.py, "deferred tables")
    dense                        one record per turn batch or turn (most of a long journal, and
                                 never looked up by payload): the index keeps its rows out of the
                                 journal_sparse table that lookups read (store/index.py)
    scan(payload)                check and object_kinds in one: (check's BadInput message or None,
                                 object_kinds' answer, {} when there is a message), for a payload
                                 whose envelope is well-formed; what verify calls on every record
                                 (None: verify calls object_kinds, which checks first)
    line_shape                   (pattern, ((key, kind), ...)) or None: a bytes pattern that, matched
                                 at a canonical line's `,"payload":` member through its `,"prev":`,
                                 proves the envelope well-formed, the kind's checks passed, the
                                 payload's ids exactly its groups that begin "b3:", and object_kinds
                                 {key: (payload[key], kind)} for the pairs given; the shape nearly
                                 every record of a dense kind has, so verify skips those three checks
                                 (tests/store/test_verify_fast.py holds it to their answers)
    line_tokens                  the tokens line_shape's pattern is compiled from (shape_pattern):
                                 literal bytes and the variable parts HEX_ID, COUNT, POSITIVE;
                                 store/blockcheck.py learns per-byte templates of whole lines from
                                 them (None: every line of the kind takes check_line's path)
    line_fields                  LineFields or None: which of line_tokens' variable parts hold what
                                 verify reads from a payload, so a run of the kind's lines proved in
                                 bulk is checked from its columns (None: line by line)"""
    kind: str
    check: Callable[[dict], None]
    project: Callable[[dict, GetJson], Rows]
    object_kinds: Callable[[dict], dict[str, tuple[str, str]]]
    deferred: tuple[str, ...] = ()
    dense: bool = False
    scan: Callable[[dict], tuple[str | None, dict[str, tuple[str, str]]]] | None = None
    line_shape: tuple[re.Pattern, tuple[tuple[str, str], ...]] | None = None
    line_tokens: tuple | None = None
    line_fields: LineFields | None = None


@dataclass(frozen=True)
class LineFields:
    """What a kind's usual line (KindHooks.line_tokens) holds of what verify reads, as indexes of
    its variable parts (in the tokens' order). The tokens MUST make these the whole of it: the
    payload's objects entries exactly `objects` ([id part, size part, kind] each, the kind a
    literal), its counters exactly `counters` ({name: delta part}), no refs, chunk_lists or name,
    and object_kinds exactly `named` ({key: (id part, kind)}) — tests/store/test_blockcheck.py
    holds every registered kind's fields to its records' payloads. Verify, gc's walk and an index
    rebuild then take runs of such lines from their columns (docs/store-format.md)."""
    objects: tuple[tuple[int, int, str], ...] = ()
    counters: tuple[tuple[str, int], ...] = ()
    named: tuple[tuple[str, int, str], ...] = ()


# The variable parts of a kind's usual line (KindHooks.line_tokens); every other token is literal
# bytes. Each part's every value is canonical JSON of its type, so a line made of them and of
# literal bytes that are canonical is canonical (store/blockcheck.py relies on exactly this).
HEX_ID = "hex-id"        # "b3:" and 64 lowercase hex digits: one of the payload's ids (line_shape's groups)
COUNT = "count"          # 0, or 1 to 18 digits without a leading zero (within 64 bits)
POSITIVE = "positive"    # 1 to 18 digits without a leading zero (>= 1)
TOKEN_PATTERNS = {HEX_ID: rb"b3:[0-9a-f]{64}", COUNT: rb"(?:0|[1-9][0-9]{0,17})", POSITIVE: rb"[1-9][0-9]{0,17}"}


def index_time(s: str) -> str:
    """A record's `time` (journal.now's form) as the text DuckDB casts to an index TIMESTAMP:
    the trailing Z off, the T a space. One home: the journal rows, the generations and the runs
    tables all hold a record's time so (store/index.py's runs of lines do it in bulk, the same)."""
    return s.rstrip("Z").replace("T", " ")


def shape_pattern(tokens: tuple) -> re.Pattern:
    """The bytes pattern of a kind's usual payload member (KindHooks.line_shape) from its tokens."""
    return re.compile(b"".join(re.escape(t) if type(t) is bytes else
                               b"(" + TOKEN_PATTERNS[t] + b")" if t == HEX_ID else TOKEN_PATTERNS[t] for t in tokens))


_KINDS: dict[str, KindHooks] = {}
_DENSE: frozenset[str] = frozenset()  # the kinds registered with `dense` (kept as one set: rows_for asks per record)
RECORDS_MODULE = "ledger.records"  # the provider of every kind's hooks, imported on first use
_COMMON: list[Callable[[dict, GetJson], Rows]] = []
_REF_KINDS: list[Callable[[str], str | None]] = []


def register(hooks: KindHooks) -> None:
    """Register one kind's hooks (ledger/records.py does, for every kind it defines)."""
    global _DENSE
    if hooks.kind in _KINDS and _KINDS[hooks.kind] is not hooks:
        raise InternalError(f"record kind {hooks.kind!r} is registered twice")
    _KINDS[hooks.kind] = hooks
    if hooks.dense:
        _DENSE = _DENSE | {hooks.kind}


def register_common(project: Callable[[dict, GetJson], Rows]) -> None:
    """A projection applied to every record with a well-formed envelope (generations from refs)."""
    if project not in _COMMON:
        _COMMON.append(project)


def register_ref_kinds(fn: Callable[[str], str | None]) -> None:
    """`fn(ref name)` -> the "kind" the ref's target object must have, or None for any object."""
    _REF_KINDS[:] = [fn]


def ref_object_kind(name: str) -> str | None:
    """The "kind" the object a ref named `name` must have (HEAD, gen-N: generation), or None."""
    _loaded()
    return _REF_KINDS[0](name) if _REF_KINDS else None


def _loaded() -> dict[str, KindHooks]:
    if not _KINDS:
        importlib.import_module(RECORDS_MODULE)  # registers through register() while importing
        if not _KINDS:
            raise InternalError(f"{RECORDS_MODULE} registered no record kinds",
                                "report it: the store cannot verify or index without them")
    return _KINDS


def hooks(kind: str) -> KindHooks | None:
    """The hooks of record kind `kind`, or None for a kind no one registered."""
    return _loaded().get(kind)


def kinds() -> frozenset[str]:
    """Every registered record kind."""
    return frozenset(_loaded())


def fielded_kinds() -> frozenset[str]:
    """The kinds with line_tokens and line_fields: whose runs of lines proved in bulk verify, gc
    and an index rebuild take from their columns (Journal.scan's `bulk`)."""
    return frozenset(k for k, h in _loaded().items()
                     if h.line_tokens is not None and h.line_fields is not None and len(k) <= MAX_KIND_LEN)


def dense_kinds() -> frozenset[str]:
    """The kinds registered as dense (KindHooks.dense)."""
    _loaded()
    return _DENSE


def common_projections() -> tuple[Callable[[dict, GetJson], Rows], ...]:
    """Projections applied to every record with a well-formed envelope."""
    _loaded()
    return tuple(_COMMON)


_HEX64 = re.compile(r"[0-9a-f]{64}")


def _is_int(v: object) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and -_INT64 <= v < _INT64


def envelope_problem(payload: object) -> str | None:
    """What is wrong with a payload's store-owned part (refs, counters, objects), or None."""
    if not isinstance(payload, dict):
        return "the payload is not an object"
    refs = payload.get("refs")
    if refs is not None:
        if not isinstance(refs, dict):
            return f"payload.refs must be an object of name -> id, not {type(refs).__name__}"
        for name, target in refs.items():
            if not name or any(c.isspace() for c in name) or name.startswith("b3:"):
                return f"payload.refs has a bad ref name {name[:80]!r}"
            if target is not None and not is_id(target):
                return f"payload.refs[{name[:80]!r}] must be an id or null"
    counters = payload.get("counters")
    if counters is not None:
        if not isinstance(counters, dict):
            return f"payload.counters must be an object of name -> integer, not {type(counters).__name__}"
        for name, d in counters.items():
            if not _is_int(d):
                return f"payload.counters[{name[:80]!r}] must be an integer"
    objects = payload.get("objects")
    if objects is not None:
        if not isinstance(objects, list):
            return f"payload.objects must be a list of [id, size, kind], not {type(objects).__name__}"
        for o in objects:
            if not (isinstance(o, list) and len(o) == 3 and is_id(o[0]) and _is_int(o[1]) and o[1] >= 0
                    and isinstance(o[2], str)):
                return "payload.objects entries must be [id, size >= 0, kind]"
    lists = payload.get("chunk_lists")
    if lists is not None:
        named = {o[0] for o in objects} if isinstance(objects, list) else set()
        if not isinstance(lists, list) or not all(
                isinstance(e, list) and len(e) == 2 and isinstance(e[0], str) and e[0] in named
                and isinstance(e[1], str) and _HEX64.fullmatch(e[1]) for e in lists) \
                or len({e[0] for e in lists}) != len(lists):
            return "payload.chunk_lists entries must be [id of one of payload.objects, 64 hex], one per id"
    return None


def refs_of(rec: dict) -> dict:
    """The ref changes in a record's envelope ({} when it names none): for code above the store
    that reads the envelope of records whatever their kind (a bundle's segment), so it needs no
    payload dataclass and no record kind this version defines."""
    refs = rec["payload"].get("refs")
    return refs if isinstance(refs, dict) else {}


def objects_of(rec: dict) -> list:
    """The [id, size, kind] entries in a record's envelope ([] when it names none); like refs_of."""
    objects = rec["payload"].get("objects")
    return objects if isinstance(objects, list) else []


def record_problem(rec: dict) -> str | None:
    """The envelope problem of a parsed record, or its kind's schema problem; None when it means
    something. The record's own fields were checked by journal.parse_line."""
    p = envelope_problem(rec["payload"])
    if p is not None:
        return p
    if not rec["kind"] or len(rec["kind"]) > MAX_KIND_LEN:
        return f"the kind must be 1 to {MAX_KIND_LEN} characters"
    h = hooks(rec["kind"])
    if h is None:
        return None  # a kind this version does not define: the envelope is all it can check
    try:
        h.check(rec["payload"])
    except BadInput as e:
        return e.message
    return None
