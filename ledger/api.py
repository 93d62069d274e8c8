"""The porcelain: one function per verb the `ledger` CLI offers, for Python users and for the CLI.

    from ledger import api
    api.init("project")
    api.add("data/train.jsonl", kind="dataset", name="train", store="project")
    res = api.run_cycle(LearnOptions(min_turns=150), store="project")
    print(res.to_json())

Every verb takes `store=`: a Store, a store folder (DIR or DIR/.ledger), or None for the store
found from the current folder or any parent (like git; LEDGER_DIR when set). Every verb returns a
frozen dataclass (a `Result`) whose `to_json()` is exactly what `ledger VERB --json` prints
(schemas: docs/json.md); `warnings` holds what the store warned about on the way, and
`failure()` the error the CLI raises after printing the result (a training run stopped by a
non-finite loss, a reproduction that diverged, a cycle that was not due, ...): a Python caller
may raise it or read the result. Errors are LedgerError subclasses (ledger/errors.py).

The CLI (ledger/cli/) calls only this module: it parses arguments and renders results. Every
domain module is imported inside the verbs that use it, not at the top: importing them all costs
~0.3 s (gate/seal and gate/judge alone ~140 ms each, measured with `python -X importtime`),
which `ledger log -n 20` (~0.06 s in all) must not pay; torch, transformers and peft load only in
the verbs that train, judge or serve, inside the modules they call.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any, BinaryIO, Callable, Mapping, Sequence

from ledger.errors import BadInput, ImageUnavailable, LedgerError, Locked, NotAStore, Refused, StoreCorrupt, UnknownRef
from ledger.options import LearnOptions, ServeOptions

__all__ = ["LearnOptions", "ServeOptions", "Result"]  # the verbs are listed in docs/store-api.md

MAX_INLINE_BYTES = 64 << 20   # `cat --json` and `show` read objects up to this size into memory

StoreLike = Any  # a Store, a folder (str or PathLike), or None: the store found from the current folder


def _open(store: StoreLike):
    """A Store for `store` (see the module docstring)."""
    from ledger.store import Store

    if isinstance(store, Store):
        return store
    return Store.open(None if store is None else str(store))


def _root(store: StoreLike) -> Path:
    """The store's folder without opening it (the cheap path of `log`, `act`, `image status`)."""
    from ledger.store import Store
    from ledger.store.paths import find_root

    if isinstance(store, Store):
        return store.root
    return find_root(None if store is None else str(store))


def human_bytes(n: float) -> str:
    """1536 -> '1.5 KiB' (messages and the CLI's tables)."""
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n} B"


def _warnings(store) -> tuple[str, ...]:
    out = tuple(getattr(store, "warnings", ()))
    if store is not None:
        store.warnings.clear()
    return out


@dataclass(frozen=True)
class Result:
    """What every verb returns. `to_json()` is the `--json` output; `warnings` are the store's
    warnings raised on the way (printed by the CLI on stderr); `failure()` is the error the
    CLI exits with after printing the result, or None."""

    warnings: tuple[str, ...] = field(default=(), kw_only=True, compare=False)

    def to_json(self):
        return {f.name: getattr(self, f.name) for f in fields(self) if f.name != "warnings"}

    def failure(self) -> LedgerError | None:
        return None


@dataclass(frozen=True)
class Wrapped(Result):
    """A domain module's own result object (it has its own `to_json()`), plus the warnings."""

    result: Any = None

    def to_json(self):
        return self.result.to_json()


# --- the store ------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Initialised(Result):
    store: str
    head: str | None
    seq: int


def init(directory: str | os.PathLike | None = None) -> Initialised:
    """Create an empty store (DIRECTORY/.ledger, default ./.ledger) with its first journal record."""
    from ledger.store import Store

    s = Store.init(Path(directory or "."))
    return Initialised(str(s.root), s.state.head, s.state.seq)


@dataclass(frozen=True)
class Added(Result):
    id: str
    size: int
    kind: str
    name: str | None
    unchanged: bool
    seq: int | None = None    # None when unchanged: nothing was written

    def to_json(self):
        out = super().to_json()
        if self.unchanged:
            out.pop("seq")
        return out


def tree_size(path: str | os.PathLike) -> int:
    """Bytes `add` would read (for a progress bar); links are not followed."""
    p = Path(path)
    if p.is_file():
        return p.stat().st_size
    return sum(f.stat().st_size for f in p.rglob("*") if f.is_file() and not f.is_symlink())


def add(path: str | os.PathLike, *, kind: str | None = None, name: str | None = None, wait: float = 0.0,
        bar: Callable[[int], None] | None = None, store: StoreLike = None) -> Added:
    """Store a file or folder as immutable objects and record it (one `add` record). `bar(n)` is
    called as bytes are read."""
    from ledger.store.add import add_path

    s = _open(store)
    r = add_path(s, Path(path), kind=kind or None, name=name, wait=wait, **({"bar": bar} if bar else {}))
    return Added(r["id"], r["size"], r["kind"], r["name"], r["unchanged"], r.get("seq"), warnings=_warnings(s))


@dataclass(frozen=True)
class Catted(Result):
    id: str
    size: int
    data: bytes | None = None   # None when streamed to `out`

    def to_json(self):
        import base64

        try:
            body = {"text": self.data.decode("utf-8")}
        except UnicodeDecodeError:
            body = {"base64": base64.b64encode(self.data).decode()}
        return {"id": self.id, "size": self.size, **body}


def cat(ref: str, out: BinaryIO | None = None, *, store: StoreLike = None) -> Catted:
    """An object's verified bytes: in `data` (objects up to 64 MiB), or written to `out` (any
    size; large objects stream through a verified temporary copy, never whole in memory)."""
    import shutil
    import tempfile

    s = _open(store)
    oid = s.resolve(ref)
    size = s.objects.size(oid)
    if out is None:
        if size > MAX_INLINE_BYTES:
            raise BadInput(f"{oid} is {human_bytes(size)}; --json carries objects up to 64 MiB",
                           "use `ledger cat` without --json")
        return Catted(oid, size, s.get_bytes(oid))
    if size > MAX_INLINE_BYTES:
        with tempfile.TemporaryDirectory() as td:
            tmp = Path(td) / "obj"
            s.export_file(oid, tmp)
            with open(tmp, "rb") as f:
                shutil.copyfileobj(f, out, 1 << 20)
    else:
        out.write(s.get_bytes(oid))
    return Catted(oid, size)


@dataclass(frozen=True)
class Shown(Result):
    """An object (structured: its parsed JSON in `object`; a blob: only its size), or, when the
    ref names a journal record instead, that record in `record`."""

    id: str | None
    size: int | None = None
    object: Any = None
    record: Mapping | None = None

    @property
    def structured(self) -> bool:
        return self.object is not None

    def to_json(self):
        if self.record is not None:
            return self.record
        if self.object is None:
            return {"id": self.id, "size": self.size, "structured": False}
        return {"id": self.id, "size": self.size, "structured": True, "object": self.object}


def show(ref: str, *, store: StoreLike = None) -> Shown:
    """Describe an object (id, prefix, name, gen-N, HEAD), or a journal record (an id prefix of
    at least 8 hex digits)."""
    from ledger.store import canonical

    s = _open(store)
    try:
        oid = s.resolve(ref)
    except UnknownRef:
        rec = next((r for r in s.journal.scan().records if r["id"].startswith(ref) or r["id"][3:].startswith(ref)),
                   None)
        if rec is None or len(ref.removeprefix("b3:")) < 8:
            raise
        return Shown(None, record=rec)
    size = s.objects.size(oid)
    data = s.get_bytes(oid) if size <= MAX_INLINE_BYTES else None
    obj = None
    if data is not None and data[:1] == b"{":
        try:
            obj = canonical.loads(data)
        except BadInput:
            obj = None
    return Shown(oid, size, obj)


def read_json(oid: str, *, store: StoreLike = None):
    """A structured object, verified (what the CLI's renderers read for a receipt's loss curve)."""
    return _open(store).get_json(oid)


RECEIPT_RECORDS = ("train", "reproduce")  # records whose payload names a receipt (its losses)


@dataclass(frozen=True)
class Log(Result):
    records: tuple[Mapping, ...]
    losses: Mapping[int, Any] = field(default_factory=dict)   # seq -> loss trace of the receipt it names

    def to_json(self):
        return list(self.records)


def log(n: int = 20, *, kind: str | None = None, losses: bool = False, store: StoreLike = None) -> Log:
    """The last `n` journal records (of `kind`), newest last. Reads only the journal's end (fast on
    millions of records) and never opens the index. `losses`: also read the loss traces of the
    receipts the shown records name (only those)."""
    from ledger.store.journal import Journal
    from ledger.store.objects import ObjectStore

    root = _root(store)
    j = Journal(root)
    recs = [r for r in j.scan().records if r["kind"] == kind][-n:] if kind else j.tail(n)
    traces = {}
    wanted = [r for r in recs if r["kind"] in RECEIPT_RECORDS and isinstance(r["payload"].get("receipt"), str)]
    if losses and wanted:
        objects = ObjectStore(root)
        for r in wanted:   # a missing or corrupt receipt raises, as any read does
            body = objects.get_json(r["payload"]["receipt"])
            traces[r["seq"]] = body.get("losses") if isinstance(body, dict) else None
    return Log(tuple(recs), traces)


@dataclass(frozen=True)
class Verified(Wrapped):
    """ledger.store.verify's Report in `result`; failure(): StoreCorrupt when it found faults."""

    read_data: bool = False

    def failure(self):
        rep = self.result
        if rep.ok:
            return None
        from ledger.sharing import repair as repair_mod

        damaged = repair_mod.damaged_ids(rep)
        hint = (f"`ledger repair --from REMOTE|BUNDLE` replaces the {len(damaged)} missing or damaged object(s) "
                "with verified copies" if damaged else "restore the named records from a bundle or backup")
        return StoreCorrupt(f"verify found {len(rep.errors)} fault(s); first: {rep.errors[0]['message']}", hint)


def verify(*, read_data: bool = False, progress=None, store: StoreLike = None) -> Verified:
    """Check the journal chain, the caches and every object (`read_data`: rehash every byte)."""
    from ledger.store.verify import verify as run_verify

    s = _open(store)
    rep = run_verify(s, read_data=read_data, **({"progress": progress} if progress else {}))
    return Verified(result=rep, read_data=read_data, warnings=_warnings(s))


@dataclass(frozen=True)
class Collected(Wrapped):
    """ledger.store.gc's GcPlan in `result`."""

    pruned: bool = False


def gc(*, prune: bool = False, store: StoreLike = None) -> Collected:
    """The objects no journal record reaches; with `prune`, delete them."""
    from ledger.store import gc as gcmod

    s = _open(store)
    p = gcmod.prune(s) if prune else gcmod.plan(s)
    return Collected(result=p, pruned=prune, warnings=_warnings(s))


@dataclass(frozen=True)
class QueryResult(Result):
    columns: tuple[str, ...]
    rows: tuple[tuple, ...]

    def to_json(self):
        return [dict(zip(self.columns, r)) for r in self.rows]


def query(sql: str, *, store: StoreLike = None) -> QueryResult:
    """Read-only SQL over the DuckDB index. An index that lags the journal (a crash after a commit)
    is brought up to date first when nobody is writing; otherwise a warning says so."""
    from ledger.store import index

    s = _open(store)
    warn = []
    seq = index.indexed_seq(s.root)
    if not s.index_current():  # behind, or not this store's projection (copied from another store)
        try:   # a reader never waits for the lock
            with s.locked():
                s.sync_index()
        except Locked:
            warn.append(f"the index is behind the journal ({seq} < {s.state.seq}) and a writer holds the lock")
    cols, rows = s.query(sql)
    return QueryResult(tuple(cols), tuple(tuple(r) for r in rows), warnings=_warnings(s) + tuple(warn))


@dataclass(frozen=True)
class Rebuilt(Result):
    rebuilt: bool
    seq: int


def index_rebuild(*, store: StoreLike = None) -> Rebuilt:
    """Recreate the DuckDB index by replaying the journal."""
    s = _open(store)
    s.rebuild_index()
    return Rebuilt(True, s.state.seq, warnings=_warnings(s))


@dataclass(frozen=True)
class Unlocked(Result):
    cleared: bool
    holder: Mapping | None
    describe: str = ""

    def to_json(self):
        return {"cleared": self.cleared, "holder": self.holder}

    def failure(self):
        if self.holder is None or self.cleared:
            return None
        if self.holder["status"] == "live":
            return Locked(f"lock is held by a live process ({self.describe}); not cleared", "wait for it to finish")
        return Locked(f"lock is held from another host ({self.describe}); not cleared",
                      "if you know that process is dead, pass --force-other-host")


def unlock(*, force_other_host: bool = False, store: StoreLike = None) -> Unlocked:
    """Clear the store lock if (and only if) its holder is dead (or, with `force_other_host`, held
    from another host). failure(): Locked when it was not cleared."""
    from ledger.store.lock import Lock

    lock = Lock(_root(store))
    cleared, info = lock.break_if_dead(force_other_host)
    holder = None if info is None else {"pid": info.pid, "host": info.host, "status": info.status()}
    return Unlocked(cleared, holder, info.describe() if info is not None else "")


# --- plans and training ---------------------------------------------------------------------------
@dataclass(frozen=True)
class Targets(Result):
    targets: tuple[Any, ...]   # ledger.plan.targets.Target, in listing order

    def to_json(self):
        return [{**t.body(), "id": t.id} for t in self.targets]


def targets(file: str | os.PathLike | None = None) -> Targets:
    """The target profiles: built-in, plus those in the TOML `file`."""
    from ledger.plan import targets as t

    return Targets(tuple(t.available(file).values()))


@dataclass(frozen=True)
class Compiled(Result):
    """`plan`: ledger.plan.compile's Plan (its body and id); `explain`: what changed from another
    plan, when asked."""

    plan: Any
    new: bool
    target: str
    explain: Mapping | None = None

    def to_json(self):
        b = self.plan.body
        out = {"plan": self.plan.id, "new": self.new, "target": self.target, "fits": True,
               "memory_bytes": b["memory"]["total_bytes"], "usable_bytes": b["fit"]["usable_bytes"],
               "parameters": b["parameters"]}
        if self.explain is not None:
            out["explain"] = self.explain
        return out


def compile(spec: str | os.PathLike, *, target: str | None = None, targets_file: str | os.PathLike | None = None,
            explain: str | None = None, store: StoreLike = None) -> Compiled:
    """Compile a spec (TOML) for a target (default: the spec's compile.target) into a plan, or
    raise CompileRejected (exit 3) naming what does not fit. `explain`: another plan to compare."""
    from ledger.plan import compile as comp
    from ledger.plan import spec as speclib
    from ledger.plan import targets as t

    sp = speclib.load(Path(spec))
    tgt = t.get(target or sp.get("compile.target"), targets_file)
    s = _open(store)
    res = comp.compile_spec(s, sp, tgt)
    diff = comp.explain(comp.load(s, explain), res.plan) if explain else None
    return Compiled(res.plan, res.new, tgt.name, diff, warnings=_warnings(s))


def plan_ref(ref: str, *, store: StoreLike = None, say: Callable[[str], None] | None = None) -> str:
    """A plan ref as is, or a spec .toml compiled first for its own target (its plan id)."""
    p = Path(ref)
    if p.suffix == ".toml" and p.is_file():
        from ledger.plan import compile as comp
        from ledger.plan import spec as speclib
        from ledger.plan import targets as t

        sp = speclib.load(p)
        res = comp.compile_spec(_open(store), sp, t.get(sp.get("compile.target")))
        if say:
            say(f"compiled {p} → plan {res.plan.id}")
        return res.plan.id
    return ref


@dataclass(frozen=True)
class Trained(Wrapped):
    """ledger.train.run's TrainResult in `result` (receipt_id, receipt, rung). failure(): Refused
    when training stopped on a non-finite loss (the receipt is committed, at a lower rung)."""

    def failure(self):
        r = self.result
        st = r.receipt["stopped"]
        if not st:
            return None
        return Refused(f"training stopped: {st['reason']} ({st['loss']}) at step {st['step']}; receipt {r.receipt_id} "
                       f"is at rung {r.rung} and has no adapter to judge", "lower optimizer.lr and compile again")


def train(plan: str, *, resume: str | None = None, unsandboxed: bool = False, progress=None,
          store: StoreLike = None, say: Callable[[str], None] | None = None) -> Trained:
    """Run a plan (a ref, or a spec .toml compiled first) in a sandboxed child; commit adapter,
    checkpoints and a receipt. `progress(dict)` gets step, steps, loss, tokens_per_s."""
    from ledger.train import run as trainlib

    s = _open(store)
    ref = plan_ref(plan, store=s, say=say)
    res = trainlib.train(s, ref, resume=resume, unsandboxed=unsandboxed, progress=progress)
    return Trained(result=res, warnings=_warnings(s))


def parse_override(text: str) -> tuple[str, Any]:
    """`section.field=VALUE` (VALUE read as TOML; a bare word is a string) -> (key, value)."""
    import tomllib

    key, sep, raw = text.partition("=")
    if not sep or not key.strip():
        raise BadInput(f"--override {text!r}: expected section.field=VALUE", "e.g. --override optimizer.lr=0.001")
    try:
        value = tomllib.loads(f"v = {raw.strip()}")["v"]
    except tomllib.TOMLDecodeError:
        value = raw.strip()  # a bare word is a string, as a user would mean it
    return key.strip(), value


@dataclass(frozen=True)
class Reproduced(Wrapped):
    """ledger.train.reproduce's ReproduceResult in `result`. failure(): Refused unless it
    reproduced (Diverged, MissingInputs), after the comparison is committed."""

    def failure(self):
        r = self.result
        if r.outcome not in ("Diverged", "MissingInputs"):
            return None
        return Refused(f"reproduce: {r.outcome} (comparison {r.comparison_id})",
                       "see the comparison above: `ledger show " + r.comparison_id[:15] + "`")


def reproduce(receipt: str, *, overrides: Mapping[str, Any] | None = None, loss_tol: float = 1e-4,
              weight_tol: float = 1e-4, unsandboxed: bool = False, source: str | None = None, progress=None,
              store: StoreLike = None) -> Reproduced:
    """Re-execute a receipt from its pinned inputs in a fresh process and compare. `source`: first
    fetch the receipt's closure from a remote, bundle file, remote folder or s3:// URL."""
    from ledger.train import reproduce as rep

    s = _open(store)
    if source:
        from ledger.sharing import fetch_closure

        receipt = fetch_closure(s, source, [receipt]).requested[0]  # verified; what it lacks → MissingInputs
    res = rep.reproduce(s, receipt, overrides=dict(overrides or {}),
                        tolerance={"loss_abs": loss_tol, "weight_abs": weight_tol}, unsandboxed=unsandboxed,
                        progress=progress)
    return Reproduced(result=res, warnings=_warnings(s))


@dataclass(frozen=True)
class ImportedBase(Result):
    base: str
    name: str | None


def import_base(path: str | os.PathLike, *, name: str | None = None, store: StoreLike = None) -> ImportedBase:
    """Import base weights (a Hugging Face Llama folder, or a .gguf file) as objects (one
    `import-base` record); `name` names it (then model.base = NAME in a spec)."""
    from ledger.artefacts import model as modellib

    p = Path(path)
    s = _open(store)
    with s.transaction("import-base") as tx:
        if p.is_file() and p.suffix == ".gguf":
            oid = modellib.import_gguf(tx, s, p)
        else:
            oid = modellib.import_hf_dir(tx, p)
        tx.outputs.append(oid)
        tx.payload["base"] = oid
        if name:
            tx.refs[f"name/{name}"] = oid
            tx.payload["name"] = name
    return ImportedBase(oid, name, warnings=_warnings(s))


# --- experience and the learn cycle ---------------------------------------------------------------
@dataclass(frozen=True)
class Recorded(Result):
    turns: str        # the batch object
    first: int
    last: int
    count: int
    seq: int
    pending: int = 0  # turns waiting for a cycle, this batch included (not in to_json)

    def to_json(self):
        return {"turns": self.turns, "first": self.first, "last": self.last, "count": self.count, "seq": self.seq}


def read_text(path: str | os.PathLike) -> str:
    """A UTF-8 text file, or BadInput naming why it cannot be read."""
    try:
        return Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise BadInput(f"cannot read {path}: {e}", "give a readable UTF-8 file") from None


def record(turns: str | Sequence[Mapping], *, source: str = "input", wait: float = 0.0,
           store: StoreLike = None) -> Recorded:
    """Append turns to the experience buffer (one `record` record): JSONL text, or a list of
    dicts (situation, action, outcome, refusal, time, ...); any bad row fails the whole batch."""
    import json

    from ledger import experience

    text = turns if isinstance(turns, str) else "\n".join(json.dumps(dict(t)) for t in turns)
    rows = experience.parse_turns(text, source)
    s = _open(store)
    r = experience.record(s, rows, wait=wait)
    return Recorded(r["turns"], r["first"], r["last"], r["count"], r["seq"], experience.pending(s),
                    warnings=_warnings(s))


@dataclass(frozen=True)
class Exported(Wrapped):
    """ledger.experience's Export in `result` (id, first, last)."""


def export(*, store: StoreLike = None) -> Exported:
    """Export the turns recorded since the last export as a Parquet dataset object."""
    from ledger import experience

    s = _open(store)
    return Exported(result=experience.export(s), warnings=_warnings(s))


@dataclass(frozen=True)
class Cycle(Wrapped):
    """ledger.cycle's CycleResult in `result` (cycle, outcome, verdict, reasons, generation,
    stages, score, ...). failure(): Refused when no cycle was due."""

    def failure(self):
        r = self.result
        if r.outcome != "not-due":
            return None
        return Refused("no cycle is due: " + "; ".join(r.missing), "record more experience, wait, or pass --force")


def run_cycle(options: LearnOptions = LearnOptions(), *, progress: Callable[[str, str], None] | None = None,
              train_progress=None, store: StoreLike = None) -> Cycle:
    """One learn cycle: export → compile → train → judge → commit (only on Accept), or the rest of
    an interrupted one. A running image is paused for a cycle that will run (it finishes the
    request in flight, its turns are committed) and serves HEAD again afterwards.
    `progress(stage, message)` is told each stage."""
    import contextlib

    from ledger import cycle
    from ledger.image import client

    s = _open(store)
    with client.paused(s) if cycle.will_run(s, options) else contextlib.nullcontext():
        res = cycle.run_cycle(s, options, progress=progress, train_progress=train_progress)
    return Cycle(result=res, warnings=_warnings(s))


def genesis(*, spec: str | os.PathLike | None = None, store: StoreLike = None):
    """gen-0, the base model with no adapter (the first incumbent), made if there is no generation
    yet; returns HEAD's Generation."""
    from ledger import cycle

    s = _open(store)
    return cycle.ensure_genesis(s, cycle.load_spec(spec))


@dataclass(frozen=True)
class Gens(Result):
    rows: tuple[Mapping, ...]                       # ledger.lineage.generation_rows
    losses: Mapping[str, Any] = field(default_factory=dict)   # receipt id -> its loss trace

    def to_json(self):
        return list(self.rows)


def gens(*, losses: bool = False, store: StoreLike = None) -> Gens:
    """Generations, with the verdict and score that admitted each; HEAD marked. `losses`: also
    read each generation's receipt loss trace."""
    from ledger.lineage import generation_rows

    s = _open(store)
    rows = generation_rows(s)
    traces = {r["receipt"]: s.get_json(r["receipt"]).get("losses") for r in rows if losses and r["receipt"]}
    return Gens(tuple(rows), traces, warnings=_warnings(s))


@dataclass(frozen=True)
class Diff(Result):
    body: Mapping   # ledger.diff.diff: kind, a, b, fields, receipt, verdicts, data, adapter

    def to_json(self):
        return self.body


def diff(a: str, b: str, *, store: StoreLike = None) -> Diff:
    """What changed between two generations, receipts or plans, field by field."""
    from ledger.diff import diff as run_diff

    s = _open(store)
    return Diff(run_diff(s, a, b), warnings=_warnings(s))


@dataclass(frozen=True)
class RolledBack(Result):
    from_: str
    to: str
    head: str
    seq: int

    def to_json(self):
        return {"from": self.from_, "to": self.to, "head": self.head, "seq": self.seq}


def rollback(target: str | None = None, *, undo: bool = False, reason: str = "", wait: float = 0.0,
             store: StoreLike = None) -> RolledBack:
    """Move HEAD to `target` (default: HEAD's parent), or `undo` the last rollback: one journal
    record; nothing is deleted."""
    from ledger import generations

    s = _open(store)
    r = generations.rollback(s, target, undo=undo, reason=reason, wait=wait)
    return RolledBack(r["from"], r["to"], r["head"], r["seq"], warnings=_warnings(s))


@dataclass(frozen=True)
class CheckedOut(Result):
    generation: str
    id: str
    dir: str
    files: tuple[str, ...]
    adapter: str | None
    base: str | None

    def to_json(self):
        return {**super().to_json(), "files": list(self.files)}


def checkout(ref: str, directory: str | os.PathLike, *, with_base: bool = True, store: StoreLike = None) -> CheckedOut:
    """Write a new folder that peft.PeftModel.from_pretrained loads as is (the base under base/)."""
    from ledger import generations

    s = _open(store)
    r = generations.checkout(s, ref, Path(directory), with_base=with_base)
    return CheckedOut(r["generation"], r["id"], r["dir"], tuple(r["files"]), r["adapter"], r["base"],
                      warnings=_warnings(s))


@dataclass(frozen=True)
class Demo(Result):
    story: Mapping

    def to_json(self):
        return self.story


def demo(directory: str | os.PathLike = "ledger-demo", *, show=None) -> Demo:
    """The whole story on the built-in tiny model in a fresh store at `directory`: seal, record,
    learn, refuse, diff, roll back, verify. `show`: a ledger.demo.story.Show that renders it."""
    from ledger.demo.story import run_demo

    return Demo(run_demo(Path(directory), show=show))


# --- the gate -------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Sealed(Wrapped):
    """ledger.gate.seal's SealResult in `result` (suite, new, repinned, changes)."""


@dataclass(frozen=True)
class Restored(Result):
    suite: Any      # the pinned SealedSuite
    path: str

    def to_json(self):
        return {**self.suite.summary(), "restored": self.path}


def seal(suite_dir: str | os.PathLike, *, base: str | None = None, repin: bool = False, reason: str | None = None,
         store: StoreLike = None) -> Sealed:
    """Seal a suite folder (eval/ and canary/ documents, optional settings.toml) where training
    cannot read it, and pin its hash against `base` (default HEAD's base): one `seal` record.
    A different suite needs `repin` and a `reason` (else Refused, exit 3)."""
    from ledger.gate import seal as seallib

    s = _open(store)
    res = seallib.seal(s, Path(suite_dir), base=base, repin=repin, reason=reason)
    return Sealed(result=res, warnings=_warnings(s))


def seal_restore(*, store: StoreLike = None) -> Restored:
    """Rewrite the pinned suite's sealed copy from its objects."""
    from ledger.gate import seal as seallib

    s = _open(store)
    path = seallib.restore(s)
    warn = _warnings(s)
    return Restored(seallib.require_pinned(s), str(path), warnings=warn)


def write_demo_suite(directory: str | os.PathLike) -> Path:
    """Write the built-in task's small suite (10 scored + 4 canary documents) to seal."""
    from ledger.gate import seal as seallib

    return seallib.write_demo_suite(Path(directory))


@dataclass(frozen=True)
class Judged(Result):
    """The verdict (ledger.verdicts' Verdict in `verdict`), its stored body and ids."""

    verdict: Any
    verdict_id: str
    record: Mapping
    body: Mapping       # the verdict object as stored (what `ledger show VERDICT` renders)

    def to_json(self):
        out = self.verdict.to_json()
        out.pop("sealed")  # per-document losses stay in the verdict object: `ledger cat VERDICT`
        return {**out, "verdict_id": self.verdict_id, "record": self.record["id"],
                "learner_view_id": self.record["payload"]["learner_view"]}


def judge(candidate: str, *, against: str | None = None, export: str | None = None,
          progress: Callable[[str], None] | None = None, store: StoreLike = None) -> Judged:
    """Score candidate and incumbent (default HEAD) on the sealed suite and record the verdict
    (one `judge` record). Every verdict reached is returned, refusals included (the verdict is
    data); a spent suite budget is Refused (exit 3)."""
    from ledger.gate import judge as judgelib

    s = _open(store)
    v, vid, rec = judgelib.judge(s, candidate, against, export_dataset=export, progress=progress)
    return Judged(v, vid, rec, s.get_json(vid), warnings=_warnings(s))


@dataclass(frozen=True)
class DpoTrained(Wrapped):
    """ledger.train.dpo's DpoResult in `result`. failure(): Refused when it stopped early."""

    def failure(self):
        r = self.result
        st = r.receipt["stopped"]
        if not st:
            return None
        return Refused(f"DPO stopped: {st['reason']} at step {st['step']}; receipt {r.receipt_id} has no adapter",
                       "lower --lr or --beta and retry")


def dpo(pairs: str, *, sft: str, beta: float = 0.1, lr: float = 1e-4, steps: int = 50, batch: int = 8, seed: int = 0,
        threads: int = 1, unsandboxed: bool = False, progress=None, store: StoreLike = None) -> DpoTrained:
    """Train a DPO adapter on preference pairs (a .jsonl or .parquet file, or a stored Parquet
    object) on top of the SFT adapter `sft` in a sandboxed child (one `train` record)."""
    from ledger.train import dpo as dpolib

    cfg = dpolib.DpoConfig(beta=beta, lr=lr, steps=steps, batch=batch, seed=seed, threads=threads)
    s = _open(store)
    res = dpolib.train_dpo(s, pairs, sft, config=cfg, unsandboxed=unsandboxed, progress=progress)
    return DpoTrained(result=res, warnings=_warnings(s))


@dataclass(frozen=True)
class Reported(Result):
    info: Mapping      # path, bytes, generations, cycles, gate_runs, receipts, rollbacks

    def to_json(self):
        return self.info


def report(output: str | os.PathLike = "report.html", *, store: StoreLike = None) -> Reported:
    """Write the store's history as one self-contained HTML file (offline: no script, no network)."""
    from ledger import report as reportlib

    s = _open(store)
    info = reportlib.write(s, Path(output))
    return Reported(info, warnings=_warnings(s))


def report_html(*, store: StoreLike = None) -> tuple[str, tuple[str, ...]]:
    """The report page as text (for `-o -`), and the store's warnings."""
    from ledger import report as reportlib

    s = _open(store)
    html = reportlib.render(reportlib.gather(s))
    return html, _warnings(s)


# --- capabilities ---------------------------------------------------------------------------------
def _handles(texts: Sequence[str]):
    from ledger.capabilities.manifest import Handle

    return [Handle.parse(t) for t in texts]


@dataclass(frozen=True)
class CapabilityAdmitted(Wrapped):
    """ledger.capabilities.admission's Admission in `result` (name, generation, module, grants,
    outcomes)."""


def capability_add(source: str | os.PathLike, manifest: str | os.PathLike, *, grants: Sequence[str] | None = None,
                   no_grants: bool = False, replace: bool = False, note: str = "", wait: float = 0.0,
                   store: StoreLike = None) -> CapabilityAdmitted:
    """Compile (WAT, wasm or C), test with zero authority, and admit a capability as a new
    generation. `grants`: handles (dir:PATH:ro|rw, stdout, stderr; default what the manifest
    declares); `no_grants`: none at all."""
    from ledger.capabilities import admission

    if no_grants and grants:
        raise BadInput("--no-grants and --grant contradict each other", "give one of them")
    hs = [] if no_grants else (_handles(grants) if grants else None)
    s = _open(store)
    res = admission.admit(s, Path(source), Path(manifest), grants=hs, replace=replace, note=note, wait=wait)
    return CapabilityAdmitted(result=res, warnings=_warnings(s))


@dataclass(frozen=True)
class Granted(Result):
    name: str
    generation: Any          # the new Generation
    grants: tuple[Any, ...]
    previous: tuple[Any, ...]

    def to_json(self):
        return {"name": self.name, "generation": self.generation.n, "generation_id": self.generation.id,
                "grants": [h.to_json() for h in self.grants], "previous": [h.to_json() for h in self.previous]}


def capability_grant(name: str, handles: Sequence[str] = (), *, none: bool = False, note: str = "",
                     wait: float = 0.0, store: StoreLike = None) -> Granted:
    """Set a live capability's handles in a new generation; grants only narrow (anything wider is
    Refused, exit 3). `none`: drop every handle."""
    from ledger.capabilities import registry

    if not handles and not none:
        raise BadInput("give the new set of handles, or --none to drop them all",
                       "e.g. `ledger capability grant notes dir:data/sub:ro stdout`")
    if handles and none:
        raise BadInput("--none and handles contradict each other", "give one of them")
    s = _open(store)
    gen, old, new = registry.grant(s, name, [] if none else _handles(handles), note=note, wait=wait)
    return Granted(name, gen, grants=tuple(new), previous=tuple(old), warnings=_warnings(s))


@dataclass(frozen=True)
class Called(Wrapped):
    """ledger.capabilities.runtime's call result in `result` (stdout, stderr, results)."""


def capability_call(name: str, export: str, args: Sequence[str] = (), *, fuel: int | None = None,
                    timeout_ms: int | None = None, store: StoreLike = None) -> Called:
    """Run an export of a capability live in HEAD with exactly its granted handles, under fuel
    and time limits."""
    from ledger.capabilities import registry

    s = _open(store)
    res = registry.call(s, name, export, list(args), fuel=fuel, time_ms=timeout_ms)
    return Called(result=res, warnings=_warnings(s))


@dataclass(frozen=True)
class Capabilities(Result):
    generation: int | None
    entries: tuple[Any, ...]          # registry Entry, one per capability
    details: tuple[Mapping, ...]      # each entry's JSON with exports, description, declared, limits

    def to_json(self):
        return {"generation": self.generation, "capabilities": list(self.details)}


def capability_list(gen: str = "HEAD", *, store: StoreLike = None) -> Capabilities:
    """The capabilities live in a generation, with their grants and the generation that admitted each."""
    from ledger.capabilities import registry

    s = _open(store)
    items = registry.entries(s, gen)
    data = []
    for e in items:
        m = registry.load_manifest(s, e)
        data.append({**e.to_json(), "exports": [x.to_json() for x in m.exports], "description": m.description,
                     "declared": [h.to_json() for h in m.handles], "limits": m.limits.to_json()})
    return Capabilities(items[0].generation if items else None, tuple(items), tuple(data), warnings=_warnings(s))


# --- kernels --------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Kernels(Result):
    kernels: tuple[Mapping, ...]

    def to_json(self):
        return list(self.kernels)


def kernel_list(*, store: StoreLike = None) -> Kernels:
    """Registered kernels, their requirements, and per target the current build/test/bench/gate
    (readable without a store)."""
    from ledger.kernels import store_records as sr

    try:
        s = _open(store)
    except NotAStore:
        s = None  # the registry is readable without a store
    return Kernels(tuple(sr.status(s)), warnings=_warnings(s))


@dataclass(frozen=True)
class KernelRecorded(Wrapped):
    """ledger.kernels.store_records' Recorded in `result` (record, record_id, target, journal)."""

    kernel: str = ""


@dataclass(frozen=True)
class KernelGated(KernelRecorded):
    """failure(): Refused when the gate refused the build (the refusal is recorded)."""

    ref: str = ""

    def failure(self):
        r = self.result
        d = r.record
        if d.accepted:
            return None
        return Refused(f"kernel gate refused {self.kernel} for {r.target}: {d.code}: {d.reason}",
                       f"the refusal is recorded ({r.record_id[:15]}); fix the kernel, rebuild, test and bench again")


def kernel_build(name: str, *, target: str | None, store: StoreLike = None) -> KernelRecorded:
    """Compile a kernel for a target with NVRTC; store source, options, NVRTC version, arch, PTX, cubin."""
    from ledger.kernels import store_records as sr

    if target is None:
        raise BadInput("kernel build needs --target", "e.g. --target h200 (a profile), sm_90, or local")
    s = _open(store)
    return KernelRecorded(result=sr.record_build(s, name, target), kernel=name, warnings=_warnings(s))


def kernel_test(name: str, *, target: str | None = None, shapes: Sequence[str] | None = None, seed: int = 0,
                store: StoreLike = None) -> KernelRecorded:
    """Run the stored build on this GPU over a shape sweep; record the worst error vs the float64 oracle."""
    from ledger.kernels import store_records as sr

    s = _open(store)
    res = sr.record_test(s, name, target, shapes=list(shapes) if shapes else None, seed=seed)
    return KernelRecorded(result=res, kernel=name, warnings=_warnings(s))


def kernel_bench(name: str, *, target: str | None = None, shape: str | None = None, launches: int = 50,
                 warmup: int = 10, store: StoreLike = None) -> KernelRecorded:
    """Time the stored build beside its torch baseline (CUDA events, same run); record medians."""
    from ledger.kernels import store_records as sr

    s = _open(store)
    res = sr.record_bench(s, name, target, shape=shape, launches=launches, warmup=warmup)
    return KernelRecorded(result=res, kernel=name, warnings=_warnings(s))


def kernel_gate(name: str, *, target: str | None = None, test: str | None = None, bench: str | None = None,
                store: StoreLike = None) -> KernelGated:
    """Admit or refuse the current build: wrong or not faster than its baseline is refused (recorded)."""
    from ledger.kernels import store_records as sr

    s = _open(store)
    res = sr.record_gate(s, name, target, test=test, bench=bench)
    return KernelGated(result=res, kernel=name, ref=sr.ref_name("gate", name, res.target), warnings=_warnings(s))


# --- sharing --------------------------------------------------------------------------------------
@dataclass(frozen=True)
class BundleWritten(Wrapped):
    """ledger.sharing.bundle's create result in `result` (path, objects, bytes, manifest, signed_by)."""


@dataclass(frozen=True)
class Imported(Wrapped):
    """ledger.sharing's import result in `result` (namespace, refs, objects, signers, absent)."""


@dataclass(frozen=True)
class Pulled(Result):
    imports: tuple[Any, ...]   # one import result per remote ref namespace

    def to_json(self):
        return [r.to_json() for r in self.imports]


@dataclass(frozen=True)
class BundleListing(Wrapped):
    """ledger.sharing.bundle's listing in `result` (header, signers, records)."""


def bundle_create(refs: Sequence[str], output: str | os.PathLike, *, sign: str | None = None, origin: str | None = None,
                  progress=None, store: StoreLike = None) -> BundleWritten:
    """Write the closure of `refs` plus the journal records that made them into one file
    (`sign`: with this key of yours; `origin`: the receiver's suggested namespace)."""
    from ledger.sharing import bundle

    s = _open(store)
    res = bundle.create(s, list(refs), Path(output), key_name=sign, origin=origin, progress=progress)
    return BundleWritten(result=res, warnings=_warnings(s))


def bundle_import(file: str | os.PathLike, *, namespace: str | None = None, jobs: int = 4, progress=None,
                  store: StoreLike = None) -> Imported:
    """Verify a bundle whole, then import it into a namespace (local HEAD never changes)."""
    from ledger.sharing import bundle

    s = _open(store)
    res = bundle.import_bundle(s, Path(file), namespace=namespace, progress=progress, jobs=jobs)
    return Imported(result=res, warnings=_warnings(s))


def bundle_ls(file: str | os.PathLike, *, store: StoreLike = None) -> BundleListing:
    """A bundle's table of contents, signers and journal segment (imports nothing; without a
    store its signers read as untrusted)."""
    from ledger.sharing import bundle

    try:
        s = _open(store)
    except NotAStore:
        s = None  # listing needs no store
    return BundleListing(result=bundle.ls(s, Path(file)), warnings=_warnings(s))


@dataclass(frozen=True)
class Remote(Wrapped):
    """ledger.sharing.remote's RemoteConfig in `result` (name, url, options)."""


@dataclass(frozen=True)
class Remotes(Result):
    remotes: tuple[Any, ...]

    def to_json(self):
        return [c.to_json() for c in self.remotes]


@dataclass(frozen=True)
class Done(Result):
    """A verb whose answer is a small fixed object (remote remove, key untrust, key require, ...)."""

    body: Mapping

    def to_json(self):
        return self.body


def remote_add(name: str, url: str, *, endpoint_url: str | None = None, options: Sequence[str] = (),
               store: StoreLike = None) -> Remote:
    """Configure a remote (recorded in the journal; credentials are never stored). `options`:
    extra S3 client options as KEY=VALUE."""
    from ledger.sharing import remote

    opts = {}
    if endpoint_url:
        opts["endpoint_url"] = endpoint_url
    for o in options:
        k, eq, v = o.partition("=")
        if not eq or not k:
            raise BadInput(f"--option {o!r} is not KEY=VALUE", "e.g. --option region_name=eu-west-1")
        opts[k] = v
    s = _open(store)
    return Remote(result=remote.add(s, name, url, opts), warnings=_warnings(s))


def remote_list(*, store: StoreLike = None) -> Remotes:
    """The configured remotes."""
    from ledger.sharing import remote

    s = _open(store)
    return Remotes(tuple(remote.configured(s).values()), warnings=_warnings(s))


def remote_remove(name: str, *, store: StoreLike = None) -> Done:
    """Forget a remote (a journal record; nothing on the remote is touched)."""
    from ledger.sharing import remote

    s = _open(store)
    remote.remove(s, name)
    return Done({"removed": name}, warnings=_warnings(s))


def _backend(store, name: str):
    from ledger.sharing import remote

    cfg = remote.get(store, name)
    return remote.open_backend(cfg.url, cfg.options)


@dataclass(frozen=True)
class Pushed(Wrapped):
    """ledger.sharing's push result in `result` (up_to_date, objects_sent, bytes_sent, refs, absent)."""

    remote: str = ""


def push(remote_name: str, refs: Sequence[str] = ("HEAD",), *, sign: str | None = None, jobs: int = 4,
         full: bool = False, progress=None, store: StoreLike = None) -> Pushed:
    """Send the closure of `refs` and its journal segment to a remote (only missing objects move;
    a rerun after an interruption resumes)."""
    from ledger.sharing import push as push_mod

    s = _open(store)
    res = push_mod.push(s, _backend(s, remote_name), list(refs) or ["HEAD"], key_name=sign, progress=progress,
                        jobs=jobs, full=full)
    return Pushed(result=res, remote=remote_name, warnings=_warnings(s))


def pull(remote_name: str, refs: Sequence[str] | None = None, *, namespace: str | None = None, jobs: int = 4,
         progress=None, store: StoreLike = None) -> Pulled:
    """Fetch refs (default all) from a remote into REMOTE/… (or NAMESPACE/…); local HEAD never
    changes. Every object is verified on arrival; signatures are checked against trusted keys."""
    from ledger.sharing import fetch as fetch_mod

    s = _open(store)
    res = fetch_mod.pull(s, _backend(s, remote_name), list(refs) if refs else None, namespace=namespace or remote_name,
                         source=remote_name, progress=progress, jobs=jobs)
    return Pulled(tuple(res), warnings=_warnings(s))


@dataclass(frozen=True)
class Fetched(Wrapped):
    """ledger.sharing's fetch result in `result` (imports, fetched_objects, fetched_bytes, missing)."""


def fetch(source: str, ids: Sequence[str], *, namespace: str | None = None, jobs: int = 4, progress=None,
          store: StoreLike = None) -> Fetched:
    """Bring the closure of `ids` (such as a colleague's receipt) here from a remote, bundle file,
    remote folder or s3:// URL, verified."""
    from ledger.sharing import fetch as fetch_mod

    s = _open(store)
    res = fetch_mod.fetch_closure(s, source, list(ids), namespace=namespace, progress=progress, jobs=jobs)
    return Fetched(result=res, warnings=_warnings(s))


@dataclass(frozen=True)
class Repaired(Wrapped):
    """ledger.sharing.repair's result in `result` (repaired, not_held, refused, remaining);
    fails with StoreCorrupt (exit 4) while damage remains."""

    def failure(self):
        from ledger.sharing import repair as repair_mod

        return repair_mod.failure(self.result)


def repair(source: str, *, jobs: int = 4, progress=None, store: StoreLike = None) -> Repaired:
    """Replace every missing or damaged object `verify --read-data` finds with a verified copy
    from `source` (a configured remote, a bundle file, a remote folder or an s3:// URL)."""
    from ledger.sharing import fetch as fetch_mod
    from ledger.sharing import repair as repair_mod

    s = _open(store)
    res = repair_mod.repair(s, fetch_mod.open_source(s, source), progress=progress, jobs=jobs)
    return Repaired(result=res, warnings=_warnings(s))


@dataclass(frozen=True)
class KeyCreated(Result):
    key: Any   # the PublicKey

    def to_json(self):
        return {**self.key.to_json(), "fingerprint": self.key.fingerprint, "id": self.key.id}


def key_create(name: str, *, store: StoreLike = None) -> KeyCreated:
    """Create an ed25519 key pair; the private half stays in .ledger/keys/ (0600)."""
    from ledger.sharing import keys

    s = _open(store)
    pub = keys.create(s, name)
    return KeyCreated(pub, warnings=_warnings(s))


@dataclass(frozen=True)
class Keys(Result):
    own: tuple[Mapping, ...]
    trusted: tuple[Mapping, ...]
    require_signatures: bool

    def to_json(self):
        return {"own": list(self.own), "trusted": list(self.trusted), "require_signatures": self.require_signatures}


def key_list(*, store: StoreLike = None) -> Keys:
    """Your keys and the keys you trust."""
    from ledger.sharing import keys

    s = _open(store)
    own = keys.own_keys(s)
    mine = {o.fingerprint for o in own.values()}
    trusted = {fp: k for fp, k in keys.trusted_keys(s).items() if fp not in mine}
    return Keys(tuple({"name": k.name, "fingerprint": k.fingerprint,
                       "private": (keys.keys_dir(s) / f"{k.name}.ed25519").is_file()} for k in own.values()),
                tuple({"name": k.name, "fingerprint": k.fingerprint} for k in trusted.values()),
                keys.signatures_required(s), warnings=_warnings(s))


@dataclass(frozen=True)
class KeyExported(Result):
    data: bytes           # the public key file's bytes
    fingerprint: str
    written: str | None   # the file written, or None

    def to_json(self):
        return {"written": self.written, "fingerprint": self.fingerprint}


def key_export(name: str, output: str | os.PathLike | None = None, *, store: StoreLike = None) -> KeyExported:
    """Your public key as a file for colleagues' `ledger key trust` (written to `output` if given)."""
    from ledger.sharing import keys
    from ledger.store import canonical

    s = _open(store)
    own = keys.own_keys(s)
    if name not in own:
        raise UnknownRef(f"no key named {name!r}", "see `ledger key list`")
    data = canonical.dumps(own[name].to_json()) + b"\n"
    if output:
        Path(output).write_bytes(data)
    return KeyExported(data, own[name].fingerprint, str(output) if output else None, warnings=_warnings(s))


def key_trust(file: str | os.PathLike, *, name: str | None = None, store: StoreLike = None) -> Done:
    """Trust a colleague's public key file (or a PEM/OpenSSH ed25519 key with `name`)."""
    from ledger.sharing import keys

    s = _open(store)
    pub = keys.read_public_key_file(Path(file), name)
    keys.trust(s, pub)
    return Done({"name": pub.name, "fingerprint": pub.fingerprint}, warnings=_warnings(s))


def key_untrust(fingerprint: str, *, store: StoreLike = None) -> Done:
    """Stop trusting a key (by fingerprint or a unique prefix of it)."""
    from ledger.sharing import keys

    s = _open(store)
    keys.untrust(s, fingerprint)
    return Done({"untrusted": fingerprint}, warnings=_warnings(s))


def key_require(on: bool, *, store: StoreLike = None) -> Done:
    """Require (or stop requiring) a trusted signature on every bundle import and pull."""
    from ledger.sharing import keys

    s = _open(store)
    keys.set_signatures_required(s, on)
    return Done({"require_signatures": on}, warnings=_warnings(s))


# --- the image ------------------------------------------------------------------------------------
@dataclass(frozen=True)
class ImageStatus(Result):
    status: Mapping   # the keeper's status ({"running": false} when no image serves the store)

    def to_json(self):
        return self.status


def serve(options: ServeOptions = ServeOptions(), *, detach: bool = False,
          ready: Callable[[Mapping], None] | None = None,
          store: StoreLike = None) -> ImageStatus:
    """Serve HEAD on .ledger/run/image.sock: act, record every turn, follow HEAD, pause for cycles.
    In this process until stopped (`ready(status)` is called once serving), or with `detach` in
    the background, returning once it serves. The detached keeper gets `options` as JSON."""
    from ledger.image import client

    s = _open(store)
    if detach:
        return ImageStatus(client.start_detached(s.root, options))
    from ledger.image import keeper

    keeper.serve(s, options, ready=(lambda k: ready(k.status())) if ready else None)
    return ImageStatus({"running": False, "stopped": True}, warnings=_warnings(s))


@dataclass(frozen=True)
class Acted(Result):
    reply: Mapping   # the image's reply: id, turn (action, outcome, kind, latency_ms, ...), turn_id, duplicate

    def to_json(self):
        return self.reply


def act(situation: str, *, action: str | None = None, request_id: str | None = None, max_new: int | None = None,
        wait_recorded: bool = True, timeout: float = 120.0, store: StoreLike = None) -> Acted:
    """Ask the running image to act on a situation (or execute and record `action`); `request_id`
    makes a retry idempotent; `wait_recorded`: wait for the journal's turn id."""
    from ledger.image import protocol

    reply = protocol.act(_root(store), situation, action=action, request_id=request_id, max_new=max_new,
                         wait_recorded=wait_recorded, timeout=timeout)
    return Acted(reply)


@dataclass(frozen=True)
class Outcome(Result):
    turn: str
    outcome: str
    seq: int


def outcome(turn: str, value: str, *, timeout: float = 10.0, wait: float = 0.0, store: StoreLike = None) -> Outcome:
    """Attach the ground-truth outcome to a recorded turn (tN, or the request id of an image turn,
    waited for up to `timeout` s): one `outcome` record; the latest wins."""
    from ledger import experience
    from ledger.image import context, protocol

    s = _open(store)
    tid, rid = turn, None
    if not experience.TURN_ID_RE.match(turn):
        rid = protocol.check_id(turn)
        deadline = time.monotonic() + timeout
        while (tid := context.find_request(s, rid)) is None:
            if time.monotonic() >= deadline:
                raise UnknownRef(f"no recorded turn for request {rid!r}",
                                 "check the id; a turn still in the image's buffer is recorded within a second")
            time.sleep(0.1)
    r = experience.attach_outcome(s, tid, value, wait=wait, request=rid)
    return Outcome(r["turn"], r["outcome"], r["seq"], warnings=_warnings(s))


def image_status(*, store: StoreLike = None) -> ImageStatus:
    """Whether an image serves this store, which generation, and its context."""
    from ledger.image import client

    return ImageStatus(client.status(_root(store)))


def image_stop(*, store: StoreLike = None) -> ImageStatus:
    """Stop the image: it finishes the request in flight, its turns are committed, it exits."""
    from ledger.image import client

    root = _root(store)
    if not client.status(root).get("running"):
        raise ImageUnavailable(f"no image is serving {root}", "nothing to stop")
    return ImageStatus(client.stop(root))


# --- the CLI's conduct ----------------------------------------------------------------------------
def last_record(*, store: StoreLike = None) -> Mapping | None:
    """The store's last committed journal record (what an interrupted command kept), read from the
    journal's end; None for an empty journal."""
    from ledger.store.journal import Journal

    tail = Journal(_root(store)).tail(1)
    return tail[-1] if tail else None


def version() -> str:
    """The installed ledger's version."""
    from importlib.metadata import PackageNotFoundError
    from importlib.metadata import version as dist_version

    try:
        return dist_version("ledger")
    except PackageNotFoundError:
        raise BadInput("the ledger package is not installed, so it has no version", "pip install -e .") from None


def sparkline(values: Sequence[float], width: int = 16) -> str:
    """`▇▅▃▂▁`: a series in `width` block glyphs (the loss curves of `log`, `gens` and `show`)."""
    from ledger.report.sparkline import sparkline as spark

    return spark(values, width)
