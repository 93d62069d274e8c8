"""The report's model: everything `ledger report` shows, gathered from the store in one pass.

The journal is the source of truth, so the model is a fold over its records plus the objects
they name (generation manifests, receipts, verdicts, turn batches) — not a read of the DuckDB
index, which is a cache that may lag. The model is plain data (frozen dataclasses, no HTML),
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
from dataclasses import asdict, dataclass, field, replace

from ledger import records as recordlib
from ledger import runs
from ledger.records import ABSENT, given
from ledger.store import schema
from ledger.verdicts.summary import verdict_summary

GEN_RE = re.compile(r"^gen-(\d+)$")
RUN_KINDS = ("train", "reproduce", "track-start", "track")
CYCLE_ENDS = ("commit", "refusal")
# the record kinds whose payload fields the report reads
READ_KINDS = frozenset({"export", "record", "outcome", "seal", "judge", "rollback", *RUN_KINDS, *CYCLE_ENDS})
RECENT_TURNS = 8


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


def gather(store) -> Report:
    """Fold the journal into the report's model (reads; takes no lock). The journal is streamed
    (one record at a time): what the model keeps grows with what the report shows (generations,
    cycles, verdicts, receipts), not with the number of turns recorded."""
    gen_of_id: dict[str, int] = {}
    generations: list[Generation] = []
    head_moves: list[HeadMove] = []
    cycles: list[Cycle] = []
    judges: list[Judge] = []
    receipts: dict[str, Receipt] = {}
    run_rows: dict[str, Run] = {}  # run id -> its latest row (a tracked run's end replaces its start)
    comparisons: dict[str, list[tuple[str, str]]] = {}
    suites: list[Suite] = []
    counts: dict[str, int] = {}
    exported: dict[int, int] = {}
    # only the newest batches can hold the report's last RECENT_TURNS turns (a batch has one or more)
    turn_batches: deque[tuple[int, str]] = deque(maxlen=RECENT_TURNS)
    outcomes: dict[str, str] = {}  # turn id -> the latest attached outcome, for turns that may be shown
    judge_reasons: dict[str, tuple] = {}  # verdict id -> its reason codes (a refusal shows them)
    last: dict | None = None
    turns_total = 0
    head_id: str | None = None
    open_cycle: int | None = None  # train/judge records between a cycle's export and its end belong to it
    names: set[str] = set()

    for rec in store.journal.stream():
        last = rec
        # typed (ledger/records.py): an ill-formed record is JournalCorrupt naming it, as verify says.
        # Only the kinds whose fields the report shows are parsed (a parse costs ~10 us, the
        # report's budget is 5 us a record); of the others it reads only the refs the store folds.
        kind = rec["kind"]
        p = recordlib.read(rec) if kind in READ_KINDS else None
        counts[kind] = counts.get(kind, 0) + 1
        if kind == "export" and p.cycle is not ABSENT:
            open_cycle = p.cycle
            exported[p.cycle] = p.last - p.first + 1
        elif kind == "record":
            turn_batches.append((p.first, p.turns))
            turns_total += p.count
            if len(outcomes) > 4 * RECENT_TURNS:
                low = turn_batches[0][0]
                outcomes = {t: o for t, o in outcomes.items() if int(t[1:]) >= low}
        elif kind == "outcome":
            # an outcome of a turn older than every batch kept can never be shown
            if len(turn_batches) < RECENT_TURNS or int(p.turn[1:]) >= turn_batches[0][0]:
                outcomes[p.turn] = p.outcome
        elif kind == "seal":
            suites.append(Suite(rec["seq"], rec["time"], p.suite_hash, p.scored, p.canaries, p.repin, _s(p.reason)))
        elif kind in ("train", "reproduce") and p.receipt:
            receipts[p.receipt] = _receipt(rec, p.receipt, store.get_json(p.receipt),
                                           open_cycle if kind == "train" else None,
                                           p.of if kind == "reproduce" else None)
        elif kind == "track":  # a tracked run (ledger.track): its receipt and curve
            receipts[p.receipt] = _receipt(rec, p.receipt, store.get_json(p.receipt), None)
        if kind in RUN_KINDS:
            for row in runs.rows_for(rec, p, store.get_json):
                run_rows[row[0]] = _run(row)
        if kind == "reproduce":
            comparisons.setdefault(p.of, []).append((p.comparison, p.outcome))
        if kind == "judge":
            judges.append(_judge(rec, p.verdict, store.get_json(p.verdict), open_cycle))
            judge_reasons.setdefault(p.verdict, tuple(code for code, _ in judges[-1].reasons))

        refs = given(p.refs, {}) if p is not None else schema.refs_of(rec)
        for name, target in sorted(refs.items()):
            m = GEN_RE.match(name)
            if m and target:
                g = store.get_json(target)
                n = int(m.group(1))
                gen_of_id[target] = n
                generations.append(Generation(
                    n=n, id=target, seq=rec["seq"], time=rec["time"], kind=kind,
                    parent=gen_of_id.get(g.get("parent")) if g.get("parent") else None,
                    base=g.get("base"), adapter=g.get("adapter"), receipt=g.get("receipt"), verdict=g.get("verdict"),
                    note=_s(g.get("note")), capabilities=tuple(sorted(_d(g.get("capabilities"))))))
            elif name != "HEAD" and not m:
                (names.add if target else names.discard)(name)
        if "HEAD" in refs:
            new = refs["HEAD"]
            head_moves.append(HeadMove(rec["seq"], rec["time"], kind, gen_of_id.get(new) if new else None,
                                       gen_of_id.get(head_id) if head_id else None,
                                       _s(given(p.reason)) if kind == "rollback" else ""))
            head_id = new

        if kind in CYCLE_ENDS and p.cycle is not ABSENT:
            c = p.cycle
            if kind == "commit":
                # the commit's inputs are [receipt, verdict] (ledger.cycle.run_cycle)
                rid = next((i for i in rec["inputs"] if i in receipts), None)
                vid = next((i for i in rec["inputs"] if i not in receipts), None)
                cycles.append(Cycle(c, rec["seq"], rec["time"], kind, given(p.verdict_name) or "Accept", (),
                                    p.generation, rid, vid, exported.get(c)))
            else:
                reasons = tuple(_s(x) for x in given(p.reasons, []))
                if not reasons and given(p.verdict):
                    # A gate refusal: its reasons are in the verdict object, not in the journal the
                    # learner side reads (ledger.cycle._refuse); the operator's report shows them.
                    reasons = judge_reasons.get(p.verdict, ())
                cycles.append(Cycle(c, rec["seq"], rec["time"], kind, p.verdict_name,
                                    reasons, gen_of_id.get(head_id),
                                    given(p.receipt), given(p.verdict), exported.get(c)))
            open_cycle = None

    # a generation object may be named twice (a ref re-set); keep the first creation of each number
    seen: set[int] = set()
    gens = []
    for g in generations:
        if g.n not in seen:
            seen.add(g.n)
            gens.append(g)
    rs = tuple(r if r.id not in comparisons else _with(r, comparisons=tuple(comparisons[r.id]))
               for r in receipts.values())
    return Report(
        store=str(store.root), seq=last["seq"] if last else 0, journal_head=last["id"] if last else None,
        as_of=last["time"] if last else "", head=gen_of_id.get(head_id) if head_id else None, counts=counts,
        generations=tuple(sorted(gens, key=lambda g: g.n)), head_moves=tuple(head_moves), cycles=tuple(cycles),
        judges=tuple(judges), receipts=rs, runs=_live_status(store, run_rows),
        suites=tuple(suites), turns_total=turns_total,
        recent_turns=_recent_turns(store, turn_batches, outcomes), ref_names=tuple(sorted(names)))


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
