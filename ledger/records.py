"""Every journal record kind, in one place: its name, a frozen payload dataclass, to/from payload,
and its index projection.

A payload dataclass names the fields its writer puts in `payload`. A field is required (`need`)
only where a reader depends on it; descriptive fields are optional (`opt`), but a field that is
present must always have its type. `from_payload(dict)` checks their types and meaning
(ids are well-formed `b3:` ids, counts are non-negative integers, turn
names look like t42, ...) and raises BadInput naming the field; `to_payload()` gives the dict back
(`from_payload(p).to_payload() == p`). Keys a kind does not model are kept verbatim in `extra`,
so a newer writer's fields survive a round trip. The store-owned envelope (refs, counters,
objects) is checked by ledger/store/schema.py, not here. Readers call `read(rec)`: the typed
payload, or JournalCorrupt naming the record.

Layering: the store may import only errors and itself, so this module sits above it and
registers each kind's check and projection into store/schema.py when imported; the registry
names this module as its provider and imports it on first use (schema.py says why).

The rules written here are the MUST rules of docs/store-format.md, "Record schemas".
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Mapping
from dataclasses import MISSING, dataclass, field, fields
from typing import ClassVar

from ledger import runs
from ledger.errors import BadInput, InternalError, JournalCorrupt
from ledger.store import schema
from ledger.store.ids import is_id

TURN_RE = re.compile(r"^t[1-9]\d*$")
RUN_RE = re.compile(r"^run:[0-9a-f]{64}$")
ENVELOPE = ("refs", "counters", "objects")
_INT64 = 1 << 63


# --- absent: an optional field the writer did not write (omitted again by to_payload) ------------
class _Absent:
    _it = None

    def __new__(cls):  # one instance, also after copy.deepcopy or pickle: `x is ABSENT` stays true
        if cls._it is None:
            cls._it = super().__new__(cls)
        return cls._it

    def __bool__(self) -> bool:
        return False

    def __repr__(self) -> str:
        return "ABSENT"


ABSENT = _Absent()


# --- field checks: each returns None or says what the value should be -----------------------------
Check = Callable[[object], str | None]


def _int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and -_INT64 <= v < _INT64


def ID(v):
    return None if is_id(v) else "a b3: id"


def STR(v):
    return None if isinstance(v, str) else "a string"


def TEXT(v):
    return None if isinstance(v, str) and v.strip() else "a non-empty string"


def INT(v):
    return None if _int(v) else "an integer"


def COUNT(v):
    return None if _int(v) and v >= 0 else "a non-negative integer"


def SEQ1(v):
    return None if _int(v) and v >= 1 else "an integer >= 1"


def BOOL(v):
    return None if isinstance(v, bool) else "true or false"


def NUM(v):
    return None if (_int(v) or isinstance(v, float)) and math.isfinite(v) else "a finite number"


def OBJ(v):
    return None if isinstance(v, dict) else "an object"


def LIST(v):
    return None if isinstance(v, list) else "a list"


def ANY(v):
    return None


def RUN(v):
    return None if isinstance(v, str) and RUN_RE.match(v) else "a run id (run:<64 hex>)"


def TURN(v):
    return None if isinstance(v, str) and TURN_RE.match(v) else "a turn name like t42"


def opt_(check: Check) -> Check:
    """`check`, or null."""
    def c(v):
        return None if v is None else (None if check(v) is None else f"{check(v)} or null")
    c.__name__ = f"opt_{check.__name__}"
    return c


def list_of(check: Check) -> Check:
    def c(v):
        if not isinstance(v, list):
            return "a list"
        for i, x in enumerate(v):
            if check(x) is not None:
                return f"a list whose items are each {check(x)} (item {i} is not)"
        return None
    c.__name__ = f"list_of_{check.__name__}"
    return c


def map_of(check: Check) -> Check:
    def c(v):
        if not isinstance(v, dict):
            return "an object"
        for k, x in v.items():
            if check(x) is not None:
                return f"an object whose values are each {check(x)} ({k[:80]!r} is not)"
        return None
    c.__name__ = f"map_of_{check.__name__}"
    return c


def shape(**checks: Check) -> Check:
    """An object with these keys (each checked; more keys are allowed)."""
    def c(v):
        if not isinstance(v, dict):
            return "an object"
        for k, ck in checks.items():
            if k not in v:
                return f"an object with {k!r}"
            if ck(v[k]) is not None:
                return f"an object whose {k!r} is {ck(v[k])}"
        return None
    c.__name__ = "shape"
    return c


def one_of(*values: str) -> Check:
    def c(v):
        return None if v in values else "one of " + ", ".join(values)
    c.__name__ = "one_of"
    return c


OPT_ID, OPT_STR, OPT_INT, OPT_NUM, OPT_OBJ = opt_(ID), opt_(STR), opt_(INT), opt_(NUM), opt_(OBJ)
IDS = list_of(ID)
STRS = list_of(STR)


def need(check: Check, *, key: str | None = None, object_kind: str | None = None):
    """A field the writer always writes. `object_kind`: the id must name a structured object of
    that "kind" (checked by verify, which reads objects)."""
    return field(metadata={"check": check, "key": key, "object_kind": object_kind})


def opt(check: Check, *, key: str | None = None, object_kind: str | None = None):
    """A field the writer writes only sometimes (ABSENT when it did not)."""
    return field(default=ABSENT, metadata={"check": check, "key": key, "object_kind": object_kind})


# --- the base -------------------------------------------------------------------------------------
_FIELDS: dict[type, tuple] = {}
_SPECS: dict[type, tuple] = {}

@dataclass(frozen=True, kw_only=True)
class Payload:
    """One record kind's payload. Subclasses set KIND and declare their fields with need/opt."""
    KIND: ClassVar[str] = ""
    DEFERRED: ClassVar[tuple[str, ...]] = ()  # tables of `project` an index rebuild defers (schema.KindHooks)
    DENSE: ClassVar[bool] = False  # one record per turn batch or turn: kept out of the index's journal_sparse
    refs: object = field(default=ABSENT, metadata={"envelope": True})
    counters: object = field(default=ABSENT, metadata={"envelope": True})
    objects: object = field(default=ABSENT, metadata={"envelope": True})
    extra: Mapping = field(default_factory=dict, metadata={"envelope": True})

    @classmethod
    def _fields(cls):
        # cached per class: verify calls this for every record of a million-record journal
        got = _FIELDS.get(cls)
        if got is None:
            got = _FIELDS[cls] = tuple(f for f in fields(cls) if not f.metadata.get("envelope"))
        return got

    @classmethod
    def _specs(cls) -> tuple[tuple, frozenset]:
        """((name, payload key, check, object kind, required) per field, every key the kind
        models), cached per class: verify checks every record of a million-record journal through
        them, and a field's metadata is a mapping proxy that is slow to read in that loop."""
        got = _SPECS.get(cls)
        if got is None:
            specs = tuple((f.name, f.metadata["key"] or f.name, f.metadata["check"], f.metadata["object_kind"],
                           f.default is MISSING) for f in cls._fields())
            got = _SPECS[cls] = (specs, frozenset(ENVELOPE) | {s[1] for s in specs})
        return got

    def __post_init__(self) -> None:
        # A payload object is valid by construction: a writer that builds one (records.Export(...))
        # gets the same checks `verify` applies, before anything is committed.
        for name, key, check, _, _ in self._specs()[0]:
            v = getattr(self, name)
            if v is ABSENT:
                continue
            problem = check(v)
            if problem is not None:
                raise BadInput(f"{self.KIND} record: payload.{key} must be {problem}")
        env = {k: v for k in ENVELOPE if (v := getattr(self, k)) is not ABSENT}
        bad = schema.envelope_problem(env) if env else None
        if bad is not None:
            raise BadInput(f"{self.KIND} record: {bad}")
        self.check_meaning()

    @classmethod
    def from_payload(cls, p: object) -> Payload:
        """Check `p` against this kind's schema; raises BadInput naming the field."""
        if not isinstance(p, dict):
            raise BadInput(f"a {cls.KIND} record's payload must be an object")
        specs, used = cls._specs()
        kw = {}
        for name, key, _, _, required in specs:
            if key in p:
                kw[name] = p[key]
            elif required:
                raise BadInput(f"{cls.KIND} record: payload.{key} is missing")
        for k in ENVELOPE:
            if k in p:
                kw[k] = p[k]
        # each key of p fills at most one argument: as many arguments as keys means no extra key
        extra = {} if len(kw) == len(p) else {k: v for k, v in p.items() if k not in used}
        return cls(**kw, extra=extra)  # __post_init__ checks

    def check_meaning(self) -> None:
        """Rules across fields (first <= last, ...); raises BadInput."""

    def to_payload(self) -> dict:
        out = dict(self.extra)
        for f in self._fields():
            v = getattr(self, f.name)
            if v is not ABSENT:
                out[f.metadata["key"] or f.name] = v
        for k in ENVELOPE:
            v = getattr(self, k)
            if v is not ABSENT:
                out[k] = v
        return out

    def object_kinds(self) -> dict[str, tuple[str, str]]:
        """{payload key: (id, the kind its object must have)} for the ids present."""
        out = {}
        for name, key, _, want, _ in self._specs()[0]:
            if want:
                v = getattr(self, name)
                if isinstance(v, str):
                    out[key] = (v, want)
        return out

    @staticmethod
    def project(rec: dict, p: Payload, get_json) -> dict[str, list[tuple]]:
        """Rows of the kind's own index tables (none for most kinds)."""
        return {}


def _json_obj(get_json, oid) -> dict:
    """The structured object `oid`, or {} when it is not a JSON object (verify names such a ref;
    a missing or corrupt object still raises its StoreCorrupt error)."""
    try:
        v = get_json(oid)
    except BadInput:
        return {}
    return v if isinstance(v, dict) else {}


# --- the store ----------------------------------------------------------------------------------
@dataclass(frozen=True, kw_only=True)
class Init(Payload):
    KIND: ClassVar[str] = "init"
    format: int = need(SEQ1)


@dataclass(frozen=True, kw_only=True)
class Add(Payload):
    KIND: ClassVar[str] = "add"
    path: str = opt(STR)
    path_escaped: bool = opt(BOOL)   # path is percent-encoded bytes (docs/store-format.md rule 16)
    kind: str = opt(STR)
    size: int = opt(COUNT)
    name: str = opt(TEXT)
    run: str = opt(RUN)                 # an artifact of a tracked run (ledger.track: run.artifact)
    tracked_artifact: str = opt(TEXT)   # the artifact's key in that run's receipt


@dataclass(frozen=True, kw_only=True)
class Gc(Payload):
    """`gc --prune` removed something: unreachable objects, temporary files, dead work folders."""
    KIND: ClassVar[str] = "gc"
    objects_removed: int = need(COUNT)
    bytes_removed: int = need(COUNT)
    tmp_files_removed: int = need(COUNT)
    work_folders_removed: list = need(STRS)
    packs_removed: int = opt(COUNT)        # packs of chunks no object uses any more (ledger/store/chunks.py)
    pack_bytes_removed: int = opt(COUNT)
    objects_packed: int = opt(COUNT)         # small loose objects moved into packs (ledger/store/packing.py)
    object_packs_written: int = opt(COUNT)
    object_packs_replaced: int = opt(COUNT)  # packs rewritten without removed objects, or merged


HEX64_RE = re.compile(r"^[0-9a-f]{64}$")


def PRUNED(v):
    """One removed object of a `prune` record: [hex, size, role, of hex]."""
    ok = (isinstance(v, list) and len(v) == 4 and isinstance(v[0], str) and HEX64_RE.match(v[0])
          and COUNT(v[1]) is None and isinstance(v[2], str) and isinstance(v[3], str) and HEX64_RE.match(v[3]))
    return None if ok else "[64 hex, size, role, 64 hex] (ids without b3:, so not references)"


@dataclass(frozen=True, kw_only=True)
class Prune(Payload):
    """`gc --prune` under a retention policy (ledger/store/retention.py): committed before the
    objects it names are removed (docs/store-format.md, P1). They are named by hex, without
    `b3:`, so they are not references; verify and reads report them as pruned, not missing."""
    KIND: ClassVar[str] = "prune"
    policy: dict = need(shape(name=TEXT, version=SEQ1))
    objects_removed: int = need(COUNT)
    bytes_removed: int = need(COUNT)
    removed: list = need(list_of(PRUNED))


@dataclass(frozen=True, kw_only=True)
class ImportBase(Payload):
    KIND: ClassVar[str] = "import-base"
    base: str = opt(ID, object_kind="base")
    name: str = opt(TEXT)


# --- generations and the learn cycle --------------------------------------------------------------
@dataclass(frozen=True, kw_only=True)
class Genesis(Payload):
    KIND: ClassVar[str] = "genesis"
    generation: int = need(COUNT)


@dataclass(frozen=True, kw_only=True)
class Commit(Payload):
    KIND: ClassVar[str] = "commit"
    generation: int = need(COUNT)
    cycle: int = opt(SEQ1)           # absent when a generation is made outside a learn cycle
    verdict_name: str = opt(TEXT)


@dataclass(frozen=True, kw_only=True)
class Refusal(Payload):
    KIND: ClassVar[str] = "refusal"
    cycle: int = need(SEQ1)
    verdict_name: str = need(TEXT)
    # Only a refusal without a gate verdict (training failed) keeps its reasons here; a gate
    # verdict's reasons stay in the verdict object (sealed from the learner side).
    reasons: list = opt(LIST)
    receipt: str | None = opt(OPT_ID)
    verdict: str | None = opt(OPT_ID)


@dataclass(frozen=True, kw_only=True)
class Rollback(Payload):
    KIND: ClassVar[str] = "rollback"
    head: int = need(COUNT)
    from_: int = opt(COUNT, key="from")  # absent when HEAD is moved by generations.move_head alone
    to: int = opt(COUNT)
    reason: str = opt(STR)

    def check_meaning(self) -> None:
        if self.to is not ABSENT and self.head != self.to:
            raise BadInput(f"rollback record: payload.head ({self.head}) and payload.to ({self.to}) differ")


@dataclass(frozen=True, kw_only=True)
class Adopt(Payload):
    """An imported generation made live (judged by the local gate unless forced, with a reason)."""
    KIND: ClassVar[str] = "adopt"
    generation: int = need(COUNT)
    source_ref: str = need(TEXT)
    source: str = need(ID, object_kind="generation")
    forced: bool = need(BOOL)
    reason: str | None = need(OPT_STR)
    verdict: str | None = need(OPT_ID)

    def check_meaning(self) -> None:
        if not self.forced and self.verdict is None:
            raise BadInput("adopt record: an adoption that was not forced must name the verdict that accepted it")


@dataclass(frozen=True, kw_only=True)
class Capability(Payload):
    KIND: ClassVar[str] = "capability"
    capability: str = need(TEXT)
    action: str = need(one_of("add", "replace"))
    module: str = need(ID)
    manifest: str = need(ID, object_kind="capability-manifest")
    grants: list = need(list_of(OBJ))
    generation: int = need(COUNT)
    # The operator's reason when the module (by content id) regains a grant it was attenuated
    # out of (ledger.capabilities.admission; --regrant-reason).
    regrant: dict = opt(shape(reason=TEXT, widening=list_of(OBJ), held=OBJ))


@dataclass(frozen=True, kw_only=True)
class CapabilityGrant(Payload):
    KIND: ClassVar[str] = "capability-grant"
    capability: str = need(TEXT)
    action: str = need(one_of("grant"))
    grants: list = need(list_of(OBJ))
    previous: list = need(list_of(OBJ))
    generation: int = need(COUNT)


# --- plans, training, receipts ---------------------------------------------------------------------
@dataclass(frozen=True, kw_only=True)
class Compile(Payload):
    KIND: ClassVar[str] = "compile"
    plan: str = need(ID, object_kind="plan")
    spec: str = need(ID, object_kind="spec")
    target: str = need(TEXT)
    spec_source: str = opt(ID)


def _receipt_rows(rec: dict, rid: str, get_json) -> dict[str, list[tuple]]:
    """The receipts and metrics tables: a receipt's plan, spec, rung, adapter and per-step losses."""
    r = _json_obj(get_json, rid)
    losses = r.get("losses") if isinstance(r.get("losses"), list) else []
    losses = [v for v in losses if (_int(v) or isinstance(v, float))]
    timings = r.get("timings") if isinstance(r.get("timings"), dict) else {}
    tps = timings.get("tokens_per_s")
    return {"receipts": [(rid, rec["seq"], r.get("plan"), r.get("spec"), r.get("rung"), r.get("adapter"), len(losses),
                          losses[-1] if losses else None, tps if isinstance(tps, (int, float)) else None)],
            "metrics": [(rid, i + 1, "loss", float(v)) for i, v in enumerate(losses)]}


@dataclass(frozen=True, kw_only=True)
class Train(Payload):
    """An SFT run (trainer absent) or a DPO run (trainer "dpo", with sft_adapter and dataset)."""
    KIND: ClassVar[str] = "train"
    receipt: str = need(ID)
    adapter: str | None = opt(OPT_ID)
    rung: str = opt(TEXT)
    unsandboxed: bool = opt(BOOL)
    wall_s: float = opt(NUM)
    plan: str = opt(ID, object_kind="plan")
    trainer: str = opt(TEXT)
    sft_adapter: str | None = opt(OPT_ID)
    dataset: str = opt(ID)

    @staticmethod
    def project(rec, p, get_json):
        return {**_receipt_rows(rec, p.receipt, get_json), "run_rows": runs.rows_for(rec, p, get_json)}


@dataclass(frozen=True, kw_only=True)
class Checkpoint(Payload):
    KIND: ClassVar[str] = "checkpoint"
    checkpoint: str = need(ID, object_kind="checkpoint")
    plan: str = need(ID, object_kind="plan")
    step: int = need(COUNT)
    # the work folder's name; checkpoints committed before runs were named (2026-12-01) have none,
    # and the learn cycle still resumes from them (ledger.train.job.resumable_checkpoint)
    run: str = opt(STR)


@dataclass(frozen=True, kw_only=True)
class Reproduce(Payload):
    KIND: ClassVar[str] = "reproduce"
    comparison: str = need(ID, object_kind="comparison")
    of: str = need(ID)
    outcome: str = need(TEXT)
    receipt: str = opt(ID)

    @staticmethod
    def project(rec, p, get_json):
        if not p.receipt:
            return {}
        return {**_receipt_rows(rec, p.receipt, get_json), "run_rows": runs.rows_for(rec, p, get_json)}


@dataclass(frozen=True, kw_only=True)
class SandboxViolation(Payload):
    KIND: ClassVar[str] = "sandbox-violation"
    run: str = need(STR)
    trainer: str = need(TEXT)
    violations: list = need(list_of(OBJ))
    checkpoints: list = need(IDS)
    sandboxed: bool = need(BOOL)
    policy: object = need(ANY)
    plan: str = opt(ID)


@dataclass(frozen=True, kw_only=True)
class TrackStart(Payload):
    """A tracked run began (ledger.track): its name, params, seeds, data and source."""
    KIND: ClassVar[str] = "track-start"
    run: str = need(TEXT)
    version: int = need(SEQ1)
    params: dict = need(OBJ)
    seeds: dict = need(OBJ)
    data: dict = need(map_of(ID))
    loss: str = need(TEXT)
    source: dict = need(OBJ)
    started: float = need(NUM)
    pid: int = need(INT)
    host: str = need(STR)
    argv: list = need(STRS)

    @staticmethod
    def project(rec, p, get_json):
        return {"run_rows": runs.rows_for(rec, p, get_json)}


@dataclass(frozen=True, kw_only=True)
class TrackMetrics(Payload):
    """A flush of a tracked run's buffered metric rows (one metrics object)."""
    KIND: ClassVar[str] = "track-metrics"
    run: str = need(RUN)
    metrics: str = need(ID, object_kind="metrics")
    rows: int = need(COUNT)
    first_step: int = need(INT)
    last_step: int = need(INT)

    @staticmethod
    def project(rec, p, get_json):
        body = _json_obj(get_json, p.metrics)
        rows = body.get("rows") if isinstance(body.get("rows"), list) else []
        return {"metrics": [(p.run, r[0], r[1], float(r[2])) for r in rows
                            if isinstance(r, list) and len(r) == 3 and _int(r[0]) and isinstance(r[1], str)
                            and (_int(r[2]) or isinstance(r[2], float))]}


@dataclass(frozen=True, kw_only=True)
class Track(Payload):
    """A tracked run ended: its receipt (trainer "tracked") and status."""
    KIND: ClassVar[str] = "track"
    run: str = need(RUN)
    receipt: str = need(ID, object_kind="receipt")
    status: str = need(one_of("finished", "failed"))
    rung: str | None = need(opt_(one_of("Ran", "Learned")))
    name: str = need(STR)

    @staticmethod
    def project(rec, p, get_json):
        return {"run_rows": runs.rows_for(rec, p, get_json)}


# --- the gate -----------------------------------------------------------------------------------
@dataclass(frozen=True, kw_only=True)
class Seal(Payload):
    KIND: ClassVar[str] = "seal"
    suite: str = need(ID, object_kind="suite")
    suite_hash: str = need(TEXT)
    scored: int = need(COUNT)
    canaries: int = need(COUNT)
    repin: bool = need(BOOL)
    reason: str | None = need(OPT_STR)
    previous: dict | None = need(opt_(shape(suite=ID, suite_hash=STR)))
    changes: object = need(ANY)


@dataclass(frozen=True, kw_only=True)
class Judge(Payload):
    KIND: ClassVar[str] = "judge"
    verdict: str = need(ID, object_kind="verdict")
    verdict_name: str = need(TEXT)
    learner_view: str = need(ID, object_kind="learner-view")
    suite_hash: str = need(STR)
    suite_ref: str = need(ID, object_kind="suite")
    recomputed_suite_hash: str | None = need(OPT_STR)
    candidate: str | None = need(OPT_ID)
    incumbent: str | None = need(OPT_ID)
    scored: bool = need(BOOL)
    wall_s: float = need(NUM)
    score_s: float = need(NUM)
    # gate/2 (ledger.gate.judge.learner_payload): the journal is what the learner side reads, so
    # the payload holds the learner view (verdict, rounded best score) and ids; the budget is
    # keyed on the scored documents' content; a check of the export before training says so.
    best_score: float | None = opt(OPT_NUM)
    budget_key: str | None = opt(OPT_STR)
    before_training: bool = opt(BOOL)
    # Records written before gate/2 carried these (reason codes and budget counts are sealed now).
    reason_codes: list = opt(STRS)
    budget_counted: bool = opt(BOOL)
    budget: dict | None = opt(opt_(shape(used=COUNT, of=COUNT)))

    @staticmethod
    def project(rec, p, get_json):
        # Keys of ledger.verdicts.Verdict.to_json(): reason codes, the pinned suite hash, and the
        # scored set's mean delta and one-sided p (candidate better); None when decided unscored.
        v = _json_obj(get_json, p.verdict)
        stats = v.get("statistics") if isinstance(v.get("statistics"), dict) else {}
        st = stats.get("scored") if isinstance(stats.get("scored"), dict) else {}
        suite = v.get("suite") if isinstance(v.get("suite"), dict) else {}
        codes = v.get("reason_codes") if isinstance(v.get("reason_codes"), list) else []

        def num(x):
            return x if isinstance(x, (int, float)) and not isinstance(x, bool) else None

        return {"verdicts": [(p.verdict, rec["seq"], v.get("verdict"), [str(c) for c in codes], v.get("candidate"),
                              v.get("incumbent"), suite.get("pinned_hash"), num(st.get("mean")),
                              num(st.get("p_better")))]}


# --- experience -----------------------------------------------------------------------------------
@dataclass(frozen=True, kw_only=True)
class Record(Payload):
    """A batch of turns (from `ledger record` or the image's buffer: then with requests, image
    and context)."""
    KIND: ClassVar[str] = "record"
    # one object read per record (a million at a million records): a rebuild defers the table
    DEFERRED: ClassVar[tuple[str, ...]] = ("turns",)
    DENSE: ClassVar[bool] = True  # ~98% of a long journal with outcomes; no lookup asks for them by payload
    turns: str = need(ID, object_kind="turns")
    first: int = need(SEQ1)
    count: int = need(COUNT)
    requests: list = opt(list_of(OPT_STR))
    image: dict = opt(shape(session=STR, **{"from": INT, "upto": INT}))
    context: str = opt(ID, object_kind="image-context")
    # What `ledger record` and the image write for a batch (KindHooks.line_shape): count, the turns
    # counter, first, the batch object as the one objects entry, turns. Integers of at most 18
    # digits are within 64 bits; the counter is non-negative here (a negative one takes the
    # general path); canonical bytes hold no escape inside an id.
    LINE_TOKENS: ClassVar[tuple] = (
        b',"payload":{"count":', schema.COUNT, b',"counters":{"turns":', schema.COUNT, b'},"first":', schema.POSITIVE,
        b',"objects":[["', schema.HEX_ID, b'",', schema.COUNT, b',"turns"]],"turns":"', schema.HEX_ID, b'"},"prev":')
    LINE_SHAPE: ClassVar[tuple] = (schema.shape_pattern(LINE_TOKENS), (("turns", "turns"),))
    # which of LINE_TOKENS' variable parts hold the fields a fold of many batches reads
    # (read_batch_run: a blockcheck.Run's parts, in the tokens' order)
    LINE_PARTS: ClassVar[dict] = {"count": 0, "first": 2, "turns": 5}
    # what verify reads from such a line (schema.LineFields): the one objects entry, the counter,
    # and object_kinds' turns (a run proved in bulk is checked from its columns)
    LINE_FIELDS: ClassVar = schema.LineFields(objects=((3, 4, "turns"),), counters=(("turns", 1),),
                                              named=(("turns", 5, "turns"),))

    @staticmethod
    def project(rec, p, get_json):
        batch = _json_obj(get_json, p.turns)
        turns = batch.get("turns") if isinstance(batch.get("turns"), list) else []
        rows = []
        for i, t in enumerate(turns):
            t = t if isinstance(t, dict) else {}
            rows.append((t.get("id"), rec["seq"], p.first + i, t.get("situation"), t.get("action"), t.get("outcome"),
                         bool(t.get("refusal")), t.get("time"), t.get("generation")))
        return {"turns": rows}


@dataclass(frozen=True, kw_only=True)
class Outcome(Payload):
    KIND: ClassVar[str] = "outcome"
    DENSE: ClassVar[bool] = True  # one per turn given ground truth (see Record)
    turn: str = need(TURN)
    outcome: str = need(TEXT)
    time: str = need(STR)

    @staticmethod
    def project(rec, p, get_json):
        return {"outcomes": [(p.turn, rec["seq"], p.outcome, p.time)]}


@dataclass(frozen=True, kw_only=True)
class Export(Payload):
    KIND: ClassVar[str] = "export"
    dataset: str = need(ID)
    first: int = need(SEQ1)
    last: int = need(SEQ1)
    cycle: int = opt(SEQ1)
    policy: dict = opt(OBJ)       # the learn cycle's trigger policy, when a cycle exported

    def check_meaning(self) -> None:
        if self.last < self.first:
            raise BadInput(f"export record: payload.last ({self.last}) is before payload.first ({self.first})")


@dataclass(frozen=True, kw_only=True)
class Image(Payload):
    """The image's lifecycle (start, pause, resume, restart, stop) with its new context."""
    KIND: ClassVar[str] = "image"
    event: str = opt(TEXT)            # absent when only the context moves (image/context.write)
    generation: str | None = opt(OPT_ID)
    gen: int | None = opt(OPT_INT)
    restored: str | None = opt(OPT_ID)
    context: str = need(ID, object_kind="image-context")


# --- kernels ------------------------------------------------------------------------------------
@dataclass(frozen=True, kw_only=True)
class _KernelRecord(Payload):
    """What every kernel record names: the kernel, the target, and its record object, whose kind
    is the record's own (a kernel-test record names a kernel-test object)."""
    record: str = need(ID)
    kernel: str = need(TEXT)
    target: str = need(TEXT)

    def object_kinds(self) -> dict[str, tuple[str, str]]:
        return {**super().object_kinds(), "record": (self.record, self.KIND)}


@dataclass(frozen=True, kw_only=True)
class _KernelOfBuild(_KernelRecord):
    """A test, bench or gate record: of one build (the kernel-build record it measured)."""
    build: str = need(ID)


@dataclass(frozen=True, kw_only=True)
class KernelBuild(_KernelRecord):
    KIND: ClassVar[str] = "kernel-build"
    arch: str = need(STR)
    cubin: str = need(ID)
    target_profile: dict = need(OBJ)
    gate_dropped: str = opt(ID)


@dataclass(frozen=True, kw_only=True)
class KernelTest(_KernelOfBuild):
    KIND: ClassVar[str] = "kernel-test"
    worst_rel_l2: float | None = need(OPT_NUM)
    tolerance: float = need(NUM)
    unwritten: int = need(COUNT)    # output elements the kernel never wrote, over every case


@dataclass(frozen=True, kw_only=True)
class KernelBench(_KernelOfBuild):
    KIND: ClassVar[str] = "kernel-bench"
    shape: str = need(STR)
    candidate_median_s: float | None = need(OPT_NUM)
    baseline_median_s: float | None = need(OPT_NUM)


@dataclass(frozen=True, kw_only=True)
class KernelGate(_KernelOfBuild):
    KIND: ClassVar[str] = "kernel-gate"
    code_object: str = need(ID)
    verdict: str = need(TEXT)
    code: str | None = need(OPT_STR)


# --- sharing ------------------------------------------------------------------------------------
@dataclass(frozen=True, kw_only=True)
class Import(Payload):
    """A bundle import or pull (with manifest, segment, objects_new) or a fetch (with walked)."""
    KIND: ClassVar[str] = "import"
    source: str = need(STR)
    namespace: str | None = need(OPT_STR)
    signers: list = need(list_of(OBJ))
    bytes_new: int = need(COUNT)
    absent: list = need(IDS)
    manifest: str = opt(ID)
    segment: str | None = opt(OPT_ID)
    objects_new: int = opt(COUNT)
    walked: int = opt(COUNT)
    repaired: list = opt(IDS)     # damaged local copies the import replaced with verified ones


@dataclass(frozen=True, kw_only=True)
class Repair(Payload):
    """Damaged or missing objects replaced by verified copies from a remote or bundle."""
    KIND: ClassVar[str] = "repair"
    source: str = need(STR)
    repaired: list = need(IDS)


@dataclass(frozen=True, kw_only=True)
class Remote(Payload):
    KIND: ClassVar[str] = "remote"
    remote: dict = need(shape(name=TEXT, action=one_of("add", "remove")))


@dataclass(frozen=True, kw_only=True)
class Key(Payload):
    KIND: ClassVar[str] = "key"
    key: dict = need(shape(name=TEXT, fingerprint=TEXT))


@dataclass(frozen=True, kw_only=True)
class Trust(Payload):
    KIND: ClassVar[str] = "trust"
    trust: dict = opt(shape(name=TEXT, fingerprint=TEXT))
    untrust: dict = opt(shape(fingerprint=TEXT))

    def check_meaning(self) -> None:
        if (self.trust is ABSENT) == (self.untrust is ABSENT):
            raise BadInput("trust record: payload must hold exactly one of trust and untrust")


@dataclass(frozen=True, kw_only=True)
class Setting(Payload):
    KIND: ClassVar[str] = "setting"
    setting: dict = need(shape(require_signatures=BOOL))


# --- the registry ---------------------------------------------------------------------------------
KINDS: dict[str, type[Payload]] = {c.KIND: c for c in (
    Init, Add, Gc, Prune, ImportBase, Genesis, Commit, Refusal, Rollback, Adopt, Capability, CapabilityGrant, Compile, Train,
    Checkpoint, Reproduce, SandboxViolation, TrackStart, TrackMetrics, Track, Seal, Judge, Record, Outcome,
    Export, Image, KernelBuild, KernelTest, KernelBench, KernelGate, Import, Repair, Remote, Key, Trust, Setting)}

# The refs whose targets must be objects of a kind (verify reads them): HEAD and gen-N are
# generation manifests; the suite ref is a sealed suite manifest.
REF_KINDS = {"HEAD": "generation", "suite": "suite"}


def ref_object_kind(name: str) -> str | None:
    if schema.GEN_REF_RE.match(name):
        return "generation"
    return REF_KINDS.get(name)


def read(rec: dict) -> Payload:
    """The typed payload of a journal record, for code that acts on it: an ill-formed payload is
    JournalCorrupt (exit 4) naming the record, as `verify` reports it — never a KeyError later."""
    try:
        return parse(rec)
    except BadInput as e:
        raise JournalCorrupt(f"journal record {rec.get('seq')} is ill-formed: {e.message}",
                             "run `ledger verify`; restore .ledger/journal from a backup or bundle",
                             seq=rec.get("seq")) from None


def read_batch_line(rec: dict, line: bytes) -> tuple[int, str, int] | None:
    """(first, turns, count) of a turn batch whose checked journal line has Record.LINE_SHAPE,
    else None (then `read` it). The match proves the envelope well-formed, every Record check
    passed and the payload's keys exactly count, counters, first, objects and turns, so `read`
    would give these values and no others, without building the dataclass (~6 us a record, and
    nearly every record of a long journal is a batch: the report's first fold asks this)."""
    if rec["kind"] != Record.KIND or not Record.LINE_SHAPE[0].match(line, line.find(b',"payload":')):
        return None
    p = rec["payload"]
    return p["first"], p["turns"], p["count"]


def read_batch_run(run) -> tuple:
    """(firsts, counts, turns) of a run of turn batches proved in bulk (a blockcheck.Run of
    Record lines, Journal.scan's `bulk`): the integer columns of payload.first and payload.count,
    and turns(k), row k's payload.turns. Each is what `read_batch_line` gives for that line: the
    run's lines passed a template of Record.LINE_TOKENS, the shape read_batch_line matches."""
    parts = Record.LINE_PARTS
    return run.parts[parts["first"]], run.parts[parts["count"]], lambda k: run.hex_id(parts["turns"], k)


def write(tx, p: Payload) -> None:
    """Give the record that transaction `tx` appends the payload `p` (checked when `p` was built).
    The one way a writer outside the store fills a payload: the kind's dataclass, never a dict."""
    if p.KIND != tx.kind:
        raise InternalError(f"a {tx.kind} transaction was given a {p.KIND} payload",
                            "this is a bug in the code that wrote it; rerun with LEDGER_DEBUG=1 and report it")
    new = p.to_payload()
    # generations.new_generation and move_head write the number a record carries; the kind's writer
    # then gives the whole payload, which must agree with what is there
    clash = sorted(k for k in new.keys() & tx.payload.keys() if new[k] != tx.payload[k])
    if clash:
        raise InternalError(f"a {tx.kind} payload would change {', '.join(clash)} already written in this transaction",
                            "this is a bug in the code that wrote it; rerun with LEDGER_DEBUG=1 and report it")
    tx.payload.update(new)


def write_field(tx, name: str, value) -> None:
    """One field of the payload that transaction `tx` appends, for a helper that writers of
    several kinds call (generations.new_generation's number, move_head's head, image/context.write's
    context): it must be a field that tx's kind models, of that field's type. The kind's writer
    gives the whole payload with write(), which must agree."""
    cls = KINDS.get(tx.kind)
    f = next((f for f in cls._fields() if f.name == name), None) if cls is not None else None
    if f is None:
        raise InternalError(f"a {tx.kind} record has no payload field {name!r} (ledger/records.py)",
                            "this is a bug in the code that wrote it; rerun with LEDGER_DEBUG=1 and report it")
    problem = f.metadata["check"](value)
    if problem is not None:
        raise InternalError(f"{tx.kind} record: payload.{f.metadata['key'] or name} must be {problem}",
                            "this is a bug in the code that wrote it; rerun with LEDGER_DEBUG=1 and report it")
    tx.payload[f.metadata["key"] or name] = value


def given(v, default=None):
    """An optional field's value, or `default` where the writer did not write it (ABSENT)."""
    return default if v is ABSENT else v


def parse(rec: dict) -> Payload:
    """The typed payload of a journal record; BadInput if its kind is not one of KINDS or its
    payload breaks the kind's schema."""
    cls = KINDS.get(rec.get("kind"))
    if cls is None:
        raise BadInput(f"record kind {str(rec.get('kind'))[:64]!r} is not one this version defines")
    return cls.from_payload(rec.get("payload"))


def _generation_rows(rec: dict, get_json) -> dict[str, list[tuple]]:
    """The generations table: one row per gen-N ref a record sets, from the manifest it names."""
    rows = []
    for name, target in (rec["payload"].get("refs") or {}).items():
        m = schema.GEN_REF_RE.match(name)
        if m and target:
            g = _json_obj(get_json, target)
            rows.append((int(m.group(1)), target, g.get("parent"), g.get("base"), g.get("adapter"), g.get("receipt"),
                         g.get("verdict"), rec["seq"], schema.index_time(rec["time"])))
    return {"generations": rows} if rows else {}


def _hooks(cls: type[Payload]) -> schema.KindHooks:
    def check(payload):
        cls.from_payload(payload)

    def project(rec, get_json):
        if cls.project is Payload.project:
            return {}  # a kind with no tables of its own: no parse (an index rebuild replays every record)
        return cls.project(rec, cls.from_payload(rec["payload"]), get_json)

    def object_kinds(payload):
        return cls.from_payload(payload).object_kinds()

    return schema.KindHooks(cls.KIND, check, project, object_kinds, cls.DEFERRED, cls.DENSE, _scan_check(cls),
                            getattr(cls, "LINE_SHAPE", None), getattr(cls, "LINE_TOKENS", None),
                            getattr(cls, "LINE_FIELDS", None))


def _scan_check(cls: type[Payload]):
    """KindHooks.scan for `cls`: from_payload's checks, in its order and with its messages, and
    object_kinds' answer, without building the dataclass (verify runs it on every record of a long
    journal: ~1 us, the dataclass ~7.5). A kind with rules across fields (check_meaning) or its own
    object_kinds builds it."""
    if cls.check_meaning is not Payload.check_meaning or cls.object_kinds is not Payload.object_kinds:
        def built(payload):
            try:
                p = cls.from_payload(payload)
            except BadInput as e:
                return e.message, {}
            return None, p.object_kinds()
        return built
    specs, _ = cls._specs()
    kind = cls.KIND
    required = tuple(key for _, key, _, _, req in specs if req)
    checks = tuple((key, check, want) for _, key, check, want, _ in specs)

    def scan(payload):
        for key in required:
            if key not in payload:
                return f"{kind} record: payload.{key} is missing", {}
        kinds = {}
        for key, check, want in checks:
            if key in payload:
                v = payload[key]
                problem = check(v)
                if problem is not None:
                    return f"{kind} record: payload.{key} must be {problem}", {}
                if want and isinstance(v, str):
                    kinds[key] = (v, want)
        return None, kinds
    return scan


for _cls in KINDS.values():
    schema.register(_hooks(_cls))
schema.register_common(_generation_rows)
schema.register_ref_kinds(ref_object_kind)
