"""The report's model: everything `ledger report` shows, gathered from the store in one pass.

The journal is the source of truth, so the model is a fold over its records plus the objects
they name (generation manifests, receipts, verdicts, turn batches) — not a read of the DuckDB
index, which is a cache that may lag. The fold is saved in the store's cache (cache/report.json,
keyed by the record it was folded to: docs/store-format.md rule 23), so the next report folds only
the records since. The model is plain data (frozen dataclasses, no HTML),
so the page and any other view render the same facts, and tests can check facts, not markup.

Holdout hygiene (docs/gate.md, "What is sealed and what the learner sees"): a report is a file
people pass around, so it carries only the aggregate statistics of each verdict (means, η, wins,
canary mean) — never the per-document losses under a verdict's `sealed` key, and never suite text.
"""

from __future__ import annotations

import json
import math
import re
from collections import deque
from dataclasses import asdict, dataclass, field, fields, replace

from ledger import records as recordlib
from ledger import runs
from ledger.errors import BadInput, JournalCorrupt
from ledger.records import ABSENT, given
from ledger.store import canonical, fsio, gcstate, schema
from ledger.store import scan as scanner
from ledger.store.ids import hash_bytes
from ledger.verdicts.summary import verdict_summary

GEN_RE = re.compile(r"^gen-(\d+)$")
RUN_KINDS = ("train", "reproduce", "track-start", "track")
CYCLE_ENDS = ("commit", "refusal")
# the record kinds whose payload fields the report reads
READ_KINDS = frozenset({"export", "record", "outcome", "seal", "judge", "rollback", *RUN_KINDS, *CYCLE_ENDS})
RECENT_TURNS = 8
COLLECT_EVERY = 5_000  # records folded between collections of the young generation (the pass runs without the collector)


@dataclass(frozen=True)
class Generation:
    n: int
    id: str
    seq: int                 # the record that created it
    time: str
    kind: str                # that record's kind: genesis, commit, capability-add, …
    parent: int | None
    base: str | None
    adapter: str | None
    receipt: str | None
    verdict: str | None
    note: str
    capabilities: tuple[str, ...] = ()


@dataclass(frozen=True)
class HeadMove:
    """One record that changed HEAD (creating a generation moves HEAD too)."""
    seq: int
    time: str
    kind: str
    to: int | None           # generation number HEAD now names (None: not a known generation)
    frm: int | None
    reason: str = ""


@dataclass(frozen=True)
class Judge:
    """One gate run (a `judge` record) and the aggregate numbers of its verdict."""
    seq: int
    time: str
    verdict_id: str
    verdict: str
    reasons: tuple[tuple[str, str], ...]          # (code, message)
    candidate: str | None
    incumbent: str | None
    scored: bool
    mean_delta: float | None = None
    eta: float | None = None
    p_better: float | None = None
    p: float | None = None            # the p-value the verdict's reason cites (lineage.verdict_summary)
    p_side: str = "better"
    wins: int | None = None
    n: int | None = None
    incumbent_loss: float | None = None
    candidate_loss: float | None = None
    canary_delta: float | None = None
    canary_k: int | None = None
    canary_worse: int | None = None
    divergence_threshold: float | None = None
    budget: str = ""
    cycle: int | None = None


@dataclass(frozen=True)
class Cycle:
    """How one learn cycle ended: a `commit` (Accept) or a `refusal` with its reasons."""
    cycle: int
    seq: int
    time: str
    outcome: str             # "commit" | "refusal"
    verdict: str
    reasons: tuple[str, ...]
    generation: int | None   # the generation it made (commit) or left live (refusal)
    receipt: str | None
    verdict_id: str | None
    turns: int | None = None  # turns exported for it


@dataclass(frozen=True)
class Receipt:
    id: str
    seq: int
    time: str
    record_kind: str         # train | reproduce
    trainer: str             # sft | dpo
    rung: str
    plan: str | None
    spec: str | None
    target: str
    base: str | None
    tokenizer: str | None
    dataset: str | None
    adapter: str | None
    final_checkpoint: str | None
    resumed_from: str | None
    seeds: dict
    versions: dict
    device: str
    source: str | None
    sandboxed: bool | None
    memory_predicted: int | None
    memory_observed: int | None          # peak growth, bytes
    memory_method: str
    memory_lines: dict
    losses: tuple[float, ...]
    steps: int
    tokens_per_s: float | None
    train_s: float | None
    stopped: str | None
    realizations: tuple[str, ...]
    cycle: int | None = None
    rerun_of: str | None = None          # a reproduce record's re-run receipt names the original
    comparisons: tuple[tuple[str, str], ...] = ()   # (comparison id, outcome) of reproductions


@dataclass(frozen=True)
class Run:
    """One training run of any kind (ledger's SFT/DPO/reproduce, or tracked) with its key params."""
    run: str
    seq: int
    time: str
    trainer: str
    name: str
    status: str
    rung: str | None
    lr: float | None
    r: int | None
    steps: int | None
    batch: int | None
    seed: int | None
    final_loss: float | None
    receipt: str | None
    metrics: tuple[tuple[str, float], ...] = ()


@dataclass(frozen=True)
class Turn:
    n: int
    situation: str
    action: str
    outcome: str
    refusal: bool


@dataclass(frozen=True)
class Suite:
    seq: int
    time: str
    suite_hash: str
    scored: int | None
    canaries: int | None
    repin: bool
    reason: str


@dataclass(frozen=True)
class Report:
    store: str
    seq: int                 # the journal record the report is as of
    journal_head: str | None
    as_of: str               # that record's time
    head: int | None         # generation HEAD names
    counts: dict             # journal record kind -> count
    generations: tuple[Generation, ...] = ()
    head_moves: tuple[HeadMove, ...] = ()
    cycles: tuple[Cycle, ...] = ()
    judges: tuple[Judge, ...] = ()
    receipts: tuple[Receipt, ...] = ()
    runs: tuple[Run, ...] = ()
    suites: tuple[Suite, ...] = ()
    turns_total: int = 0
    recent_turns: tuple[Turn, ...] = ()
    ref_names: tuple[str, ...] = field(default_factory=tuple)  # named refs other than HEAD/gen-N

    def to_json(self) -> dict:

        return asdict(self)


def _f(x) -> float | None:
    return float(x) if isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x) else None


def _i(x) -> int | None:
    return int(x) if isinstance(x, int) and not isinstance(x, bool) else None


def _s(x) -> str:
    return x if isinstance(x, str) else ("" if x is None else str(x))


def _d(x) -> dict:
    return x if isinstance(x, dict) else {}


def _judge(rec: dict, vid: str, v: dict, cycle: int | None) -> Judge:
    st = _d(v.get("statistics"))
    sc, can = _d(st.get("scored")), _d(st.get("canary"))
    b = _d(v.get("budget"))
    reasons = tuple((_s(r.get("code")), _s(r.get("message"))) for r in (v.get("reasons") or []) if isinstance(r, dict))
    if not reasons:
        reasons = tuple((_s(c), "") for c in (v.get("reason_codes") or []))
    return Judge(
        seq=rec["seq"], time=rec["time"], verdict_id=vid, verdict=_s(v.get("verdict")),
        reasons=reasons, candidate=v.get("candidate"), incumbent=v.get("incumbent"), scored=bool(sc),
        mean_delta=_f(sc.get("mean")), eta=_f(sc.get("eta")), p_better=_f(sc.get("p_better")),
        p=_f((verdict_summary(v) or {}).get("p")), p_side=_s((verdict_summary(v) or {}).get("p_side")) or "better",
        wins=_i(sc.get("wins")), n=_i(sc.get("n")), incumbent_loss=_f(sc.get("incumbent_mean_loss")),
        candidate_loss=_f(sc.get("candidate_mean_loss")), canary_delta=_f(can.get("mean_delta")),
        canary_k=_i(can.get("k")), canary_worse=_i(can.get("worse")),
        divergence_threshold=_f(can.get("divergence_threshold")),
        budget=f"{b.get('used')} of {b.get('of')}" if b else "", cycle=cycle)


def _receipt(rec: dict, rid: str, r: dict, cycle: int | None, rerun_of: str | None = None) -> Receipt:
    mem = _d(r.get("memory"))
    obs = _d(mem.get("observed"))
    tm = _d(r.get("timings"))
    dev = _d(r.get("device"))
    device = _s(dev.get("cpu"))
    if isinstance(dev.get("cuda"), dict) and dev["cuda"].get("device"):
        device = f"{device}; {dev['cuda']['device']}" if device else _s(dev["cuda"]["device"])
    losses = tuple(v for v in (_f(x) for x in (r.get("losses") or [])) if v is not None)
    stopped = r.get("stopped")
    if isinstance(stopped, dict):
        stopped = f"{stopped.get('reason')} at step {stopped.get('step')}"
    tgt = r.get("target")
    return Receipt(
        id=rid, seq=rec["seq"], time=rec["time"], record_kind=rec["kind"],
        trainer="dpo" if r.get("kind") == "dpo-receipt" else _s(r.get("trainer") or "sft"),
        rung=_s(r.get("rung")), plan=r.get("plan"), spec=r.get("spec"),
        target=_s(tgt.get("name")) if isinstance(tgt, dict) else _s(tgt),
        base=r.get("base"), tokenizer=r.get("tokenizer"), dataset=r.get("dataset"), adapter=r.get("adapter"),
        final_checkpoint=r.get("final_checkpoint"), resumed_from=r.get("resumed_from"),
        seeds=_d(r.get("seeds")), versions={k: v for k, v in _d(r.get("versions")).items() if v},
        device=device, source=_d(r.get("source")).get("hash"),
        sandboxed=_d(r.get("sandbox")).get("sandboxed") if r.get("sandbox") is not None else None,
        memory_predicted=_i(mem.get("predicted_bytes")), memory_observed=_i(obs.get("peak_growth_bytes")),
        memory_method=_s(obs.get("method")), memory_lines=_d(mem.get("predicted_lines")),
        losses=losses, steps=len(losses), tokens_per_s=_f(tm.get("tokens_per_s")), train_s=_f(tm.get("train_s")),
        stopped=_s(stopped) or None,
        realizations=tuple(sorted({_s(x) for x in _d(r.get("realizations")).values()})),
        cycle=cycle, rerun_of=rerun_of)


STATE = ("cache", "report.json")
STATE_FORMAT = 1
STATE_MAX = 256 << 20


def _tuples(v):
    return tuple(_tuples(x) for x in v) if isinstance(v, list) else v


def _load_dc(cls, d: dict):
    """A model dataclass from its saved JSON (lists back to the tuples its fields hold)."""
    kw = {}
    for f in fields(cls):
        v = d[f.name]
        kw[f.name] = _tuples(v) if str(f.type).startswith("tuple") else v
    return cls(**kw)


class _Fold:
    """The report's fold over the journal, record by record: what `gather` keeps between
    records, and what the saved report state (cache/report.json) holds between reports."""

    def __init__(self):
        self.gen_of_id: dict[str, int] = {}
        self.generations: list[Generation] = []
        self.head_moves: list[HeadMove] = []
        self.cycles: list[Cycle] = []
        self.judges: list[Judge] = []
        self.receipts: dict[str, Receipt] = {}
        self.run_rows: dict[str, Run] = {}  # run id -> its latest row (a tracked run's end replaces its start)
        self.comparisons: dict[str, list[tuple[str, str]]] = {}
        self.suites: list[Suite] = []
        self.counts: dict[str, int] = {}
        self.exported: dict[int, int] = {}
        # only the newest batches can hold the report's last RECENT_TURNS turns (a batch has one or more)
        self.turn_batches: deque[tuple[int, str]] = deque(maxlen=RECENT_TURNS)
        self.outcomes: dict[str, str] = {}  # turn id -> the latest attached outcome, for turns that may be shown
        self.judge_reasons: dict[str, tuple] = {}  # verdict id -> its reason codes (a refusal shows them)
        self.last: dict | None = None       # seq, id and time of the last record folded
        self.turns_total = 0
        self.head_id: str | None = None
        self.open_cycle: int | None = None  # train/judge records between a cycle's export and its end belong to it
        self.names: set[str] = set()

    def add(self, store, rec: dict, line: bytes | None = None) -> None:
        """Fold one record. `line`: its checked journal line (a scan's `lines`), for the shape test below."""
        self.last = {"seq": rec["seq"], "id": rec["id"], "time": rec["time"]}
        batch = recordlib.read_batch_line(rec, line) if line is not None else None
        if batch is not None:   # a turn batch in its kind's usual shape: records.read_batch_line says why
            self.counts["record"] = self.counts.get("record", 0) + 1
            self._batch(*batch)
            return
        # typed (ledger/records.py): an ill-formed record is JournalCorrupt naming it, as verify says.
        # Only the kinds whose fields the report shows are parsed (a parse costs ~10 us, the
        # report's budget is 5 us a record); of the others it reads only the refs the store folds.
        kind = rec["kind"]
        p = recordlib.read(rec) if kind in READ_KINDS else None
        self.counts[kind] = self.counts.get(kind, 0) + 1
        if kind == "export" and p.cycle is not ABSENT:
            self.open_cycle = p.cycle
            self.exported[p.cycle] = p.last - p.first + 1
        elif kind == "record":
            self._batch(p.first, p.turns, p.count)
        elif kind == "outcome":
            # an outcome of a turn older than every batch kept can never be shown
            if len(self.turn_batches) < RECENT_TURNS or int(p.turn[1:]) >= self.turn_batches[0][0]:
                self.outcomes[p.turn] = p.outcome
        elif kind == "seal":
            self.suites.append(Suite(rec["seq"], rec["time"], p.suite_hash, p.scored, p.canaries, p.repin,
                                     _s(p.reason)))
        elif kind in ("train", "reproduce") and p.receipt:
            self.receipts[p.receipt] = _receipt(rec, p.receipt, store.get_json(p.receipt),
                                                self.open_cycle if kind == "train" else None,
                                                p.of if kind == "reproduce" else None)
        elif kind == "track":  # a tracked run (ledger.track): its receipt and curve
            self.receipts[p.receipt] = _receipt(rec, p.receipt, store.get_json(p.receipt), None)
        if kind in RUN_KINDS:
            for row in runs.rows_for(rec, p, store.get_json):
                self.run_rows[row[0]] = _run(row)
        if kind == "reproduce":
            self.comparisons.setdefault(p.of, []).append((p.comparison, p.outcome))
        if kind == "judge":
            self.judges.append(_judge(rec, p.verdict, store.get_json(p.verdict), self.open_cycle))
            self.judge_reasons.setdefault(p.verdict, tuple(code for code, _ in self.judges[-1].reasons))

        refs = given(p.refs, {}) if p is not None else schema.refs_of(rec)
        for name, target in sorted(refs.items()):
            m = GEN_RE.match(name)
            if m and target:
                g = store.get_json(target)
                n = int(m.group(1))
                self.gen_of_id[target] = n
                self.generations.append(Generation(
                    n=n, id=target, seq=rec["seq"], time=rec["time"], kind=kind,
                    parent=self.gen_of_id.get(g.get("parent")) if g.get("parent") else None,
                    base=g.get("base"), adapter=g.get("adapter"), receipt=g.get("receipt"), verdict=g.get("verdict"),
                    note=_s(g.get("note")), capabilities=tuple(sorted(_d(g.get("capabilities"))))))
            elif name != "HEAD" and not m:
                (self.names.add if target else self.names.discard)(name)
        if "HEAD" in refs:
            new = refs["HEAD"]
            self.head_moves.append(HeadMove(rec["seq"], rec["time"], kind,
                                            self.gen_of_id.get(new) if new else None,
                                            self.gen_of_id.get(self.head_id) if self.head_id else None,
                                            _s(given(p.reason)) if kind == "rollback" else ""))
            self.head_id = new

        if kind in CYCLE_ENDS and p.cycle is not ABSENT:
            c = p.cycle
            if kind == "commit":
                # the commit's inputs are [receipt, verdict] (ledger.cycle.run_cycle)
                rid = next((i for i in rec["inputs"] if i in self.receipts), None)
                vid = next((i for i in rec["inputs"] if i not in self.receipts), None)
                self.cycles.append(Cycle(c, rec["seq"], rec["time"], kind, given(p.verdict_name) or "Accept", (),
                                         p.generation, rid, vid, self.exported.get(c)))
            else:
                reasons = tuple(_s(x) for x in given(p.reasons, []))
                if not reasons and given(p.verdict):
                    # A gate refusal: its reasons are in the verdict object, not in the journal the
                    # learner side reads (ledger.cycle._refuse); the operator's report shows them.
                    reasons = self.judge_reasons.get(p.verdict, ())
                self.cycles.append(Cycle(c, rec["seq"], rec["time"], kind, p.verdict_name,
                                         reasons, self.gen_of_id.get(self.head_id),
                                         given(p.receipt), given(p.verdict), self.exported.get(c)))
            self.open_cycle = None

    def add_batches(self, run) -> None:
        """Fold a run of turn batches proved in bulk (Journal.scan's `bulk`): what `add` does
        for each of them, without a record per line."""
        firsts, counts, turns = recordlib.read_batch_run(run)
        n = len(run)
        self.last = {"seq": int(run.seq[-1]), "id": run.id(n - 1), "time": run.time(n - 1)}
        self.counts["record"] = self.counts.get("record", 0) + n
        # _batch prunes the outcomes after a batch while they are too many; no outcome comes within
        # the run, so once a batch leaves them few enough the rest only append
        k = 0
        while k < n and len(self.outcomes) > 4 * RECENT_TURNS:
            self._batch(int(firsts[k]), turns(k), int(counts[k]))
            k += 1
        self.turns_total += sum(counts[k:].tolist())   # exact: int64 would wrap past 2**63 (counts go to 10**18)
        self.turn_batches.extend((int(firsts[m]), turns(m)) for m in range(max(k, n - RECENT_TURNS), n))

    def _batch(self, first: int, turns: str, count: int) -> None:
        self.turn_batches.append((first, turns))
        self.turns_total += count
        if len(self.outcomes) > 4 * RECENT_TURNS:
            low = self.turn_batches[0][0]
            self.outcomes = {t: o for t, o in self.outcomes.items() if int(t[1:]) >= low}

    def report(self, store) -> Report:
        # a generation object may be named twice (a ref re-set); keep the first creation of each number
        seen: set[int] = set()
        gens = []
        for g in self.generations:
            if g.n not in seen:
                seen.add(g.n)
                gens.append(g)
        rs = tuple(r if r.id not in self.comparisons else _with(r, comparisons=tuple(self.comparisons[r.id]))
                   for r in self.receipts.values())
        last, head_id = self.last, self.head_id
        return Report(
            store=str(store.root), seq=last["seq"] if last else 0, journal_head=last["id"] if last else None,
            as_of=last["time"] if last else "", head=self.gen_of_id.get(head_id) if head_id else None,
            counts=dict(self.counts), generations=tuple(sorted(gens, key=lambda g: g.n)),
            head_moves=tuple(self.head_moves), cycles=tuple(self.cycles), judges=tuple(self.judges), receipts=rs,
            runs=_live_status(store, self.run_rows), suites=tuple(self.suites), turns_total=self.turns_total,
            recent_turns=_recent_turns(store, self.turn_batches, self.outcomes), ref_names=tuple(sorted(self.names)))

    # --- the saved state (rule 23) -------------------------------------------------------
    def to_json(self) -> dict:
        return {"gen_of_id": self.gen_of_id, "generations": [asdict(g) for g in self.generations],
                "head_moves": [asdict(h) for h in self.head_moves], "cycles": [asdict(c) for c in self.cycles],
                "judges": [asdict(j) for j in self.judges], "receipts": [asdict(r) for r in self.receipts.values()],
                "run_rows": [asdict(r) for r in self.run_rows.values()],
                "comparisons": {k: [list(x) for x in v] for k, v in self.comparisons.items()},
                "suites": [asdict(s) for s in self.suites], "counts": self.counts,
                "exported": [[c, n] for c, n in self.exported.items()],
                "turn_batches": [list(b) for b in self.turn_batches], "outcomes": self.outcomes,
                "judge_reasons": {k: list(v) for k, v in self.judge_reasons.items()}, "last": self.last,
                "turns_total": self.turns_total, "head_id": self.head_id, "open_cycle": self.open_cycle,
                "names": sorted(self.names)}

    @classmethod
    def from_json(cls, d: dict) -> "_Fold":
        """The fold a saved state holds (any error in its shape: ValueError/KeyError/TypeError)."""
        f = cls()
        f.gen_of_id = {str(k): int(v) for k, v in d["gen_of_id"].items()}
        f.generations = [_load_dc(Generation, x) for x in d["generations"]]
        f.head_moves = [_load_dc(HeadMove, x) for x in d["head_moves"]]
        f.cycles = [_load_dc(Cycle, x) for x in d["cycles"]]
        f.judges = [_load_dc(Judge, x) for x in d["judges"]]
        f.receipts = {r.id: r for r in (_load_dc(Receipt, x) for x in d["receipts"])}
        f.run_rows = {r.run: r for r in (_load_dc(Run, x) for x in d["run_rows"])}
        f.comparisons = {str(k): [tuple(x) for x in v] for k, v in d["comparisons"].items()}
        f.suites = [_load_dc(Suite, x) for x in d["suites"]]
        f.counts = {str(k): int(v) for k, v in d["counts"].items()}
        f.exported = {int(c): int(n) for c, n in d["exported"]}
        f.turn_batches = deque(((int(a), str(b)) for a, b in d["turn_batches"]), maxlen=RECENT_TURNS)
        f.outcomes = {str(k): str(v) for k, v in d["outcomes"].items()}
        f.judge_reasons = {str(k): tuple(v) for k, v in d["judge_reasons"].items()}
        last = d["last"]
        if last is not None and not (type(last.get("seq")) is int and isinstance(last.get("id"), str)
                                     and isinstance(last.get("time"), str)):
            raise ValueError("last")
        f.last, f.turns_total, f.head_id = last, int(d["turns_total"]), d["head_id"]
        f.open_cycle, f.names = d["open_cycle"], set(d["names"])
        return f


def _load_state(store) -> tuple[_Fold | None, int, str | None]:
    """(the saved fold, its offset, None), or (None, 0, why it is not used: None if there is none).
    Used only if it is this store's, hashes to its digest, and the journal still holds its
    record at its offset and changed since only by appends (gcstate.position_problem)."""
    path = store.root.joinpath(*STATE)
    try:
        w = json.loads(fsio.read_small(path, STATE_MAX))
        if not isinstance(w, dict) or w.get("format") != STATE_FORMAT or type(w.get("offset")) is not int:
            raise ValueError("format")
    except FileNotFoundError:
        return None, 0, None
    except (OSError, ValueError, RecursionError, fsio.NotRegular):   # nested 3,000 deep: RecursionError
        return None, 0, "it is unreadable"
    if w.get("store") != store.store_id:
        return None, 0, "it belongs to another store"
    if hash_bytes(canonical.dumps(w.get("fold"))) != w.get("digest"):
        return None, 0, "it does not match its digest"
    try:
        f = _Fold.from_json(w["fold"])
    except (ValueError, KeyError, TypeError, AttributeError, RecursionError):
        return None, 0, "it is unreadable"
    if f.last is None or (f.last["seq"], f.last["id"]) != (w.get("seq"), w.get("id")):
        return None, 0, "it does not match its digest"
    why = gcstate.position_problem(store, w["offset"], w["seq"], w["id"])
    if why:
        return None, 0, why
    return f, w["offset"], None


def _save_state(store, f: _Fold, offset: int) -> None:
    fold = f.to_json()
    w = {"format": STATE_FORMAT, "store": store.store_id, "seq": f.last["seq"], "id": f.last["id"],
         "offset": offset, "fold": fold, "digest": hash_bytes(canonical.dumps(fold))}
    path = store.root.joinpath(*STATE)
    try:
        path.parent.mkdir(exist_ok=True)
        fsio.atomic_write(path, canonical.dumps(w), store.tmp, durable=False)
    except (OSError, BadInput) as e:
        store.warnings.append(f"could not save the report's state ({getattr(e, 'strerror', None) or e}): "
                              "the next report folds every record again")


def gather(store) -> Report:
    """Fold the journal into the report's model (reads; takes no lock). The fold starts from the
    saved report state when it is usable (docs/store-format.md, rule 23: only the records after
    it are read) and is saved again; the journal is streamed (one record at a time): what the
    model keeps grows with what the report shows (generations, cycles, verdicts, receipts), not
    with the number of turns recorded."""
    f, offset, why = _load_state(store)
    if why:
        store.warnings.append(f"the report's saved state was not used ({why}): folded every record")
    if f is None:
        f, offset = _Fold(), 0
    start = f.last
    n = [0]

    def each(rec, line):
        f.add(store, rec, line)
        n[0] += 1
        if n[0] % COLLECT_EVERY == 0:
            scanner.collect_young()

    def batches(run):
        f.add_batches(run)
        n[0] += len(run)
        if n[0] // COLLECT_EVERY != (n[0] - len(run)) // COLLECT_EVERY:
            scanner.collect_young()

    with scanner.without_collector():  # a fold over every record (store/scan.py says why)
        scan = store.journal.scan(offset, (start["seq"] if start else 0) + 1, start["id"] if start else None,
                                  keep=False, each=each, lines=True, bulk={recordlib.Record.KIND: batches})
    if scan.broken_at is not None:
        raise JournalCorrupt(f"journal chain is broken at {scan.problem}", "run `ledger verify`")
    if f.last is not None and (start is None or f.last["seq"] != start["seq"]):
        _save_state(store, f, scan.end)
    return f.report(store)


def _live_status(store, rows: dict[str, Run]) -> tuple[Run, ...]:
    """A tracked run still `started` is running while its process holds the live lock, else interrupted."""
    out = []
    for r in sorted(rows.values(), key=lambda r: r.seq):
        if r.status == "started":
            r = _with(r, status="running" if runs.is_live(store, r.run) else "interrupted")
        out.append(r)
    return tuple(out)


def _run(row: tuple) -> Run:
    """A run_rows tuple (ledger/runs.py, in store/index.py's column order) as the report's Run."""
    (run, seq, time, trainer, name, status, rung, receipt, _adapter, _base, lr, r, _alpha, steps, batch, seed,
     final_loss, metrics, _params) = row
    values = json.loads(metrics) if metrics else {}
    return Run(run=run, seq=seq, time=str(time), trainer=trainer, name=_s(name), status=_s(status), rung=rung, lr=lr,
               r=r, steps=steps, batch=batch, seed=seed, final_loss=final_loss, receipt=receipt,
               metrics=tuple(sorted((k, v) for k, v in values.items() if isinstance(v, (int, float)))))


def _with(r, **kw):

    return replace(r, **kw)


def _recent_turns(store, batches: list[tuple[int, str]], outcomes: dict[str, str]) -> tuple[Turn, ...]:
    """The last few recorded turns, with outcomes attached later (the latest wins, as in export):
    reads batch objects from the newest back, only as many as needed."""
    out: list[Turn] = []
    for first, oid in reversed(batches):
        rows = _d(store.get_json(oid)).get("turns") or []
        batch = [Turn(first + i, _s(t.get("situation")), _s(t.get("action")),
                      outcomes.get(f"t{first + i}", _s(t.get("outcome"))), bool(t.get("refusal")))
                 for i, t in enumerate(rows) if isinstance(t, dict)]
        out = batch[-(RECENT_TURNS - len(out)):] + out
        if len(out) >= RECENT_TURNS:
            break
    return tuple(out[-RECENT_TURNS:])
