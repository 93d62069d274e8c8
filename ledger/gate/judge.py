"""`ledger judge`: score a candidate against the incumbent on the pinned suite, and decide.

One gate run, in this order (docs/gate.md; the decision itself is `ledger.verdicts.decide`, pure):

  1. the suite hash is recomputed from the sealed copy on disk, the scorer version, and the
     tokenizer and base of the models being judged; if it differs from the pin the verdict is
     SuiteChanged and NOTHING is scored (the scorer is never called);
  2. the suite's run budget (B = budget_multiplier x |S| runs per suite hash, counted from the
     journal's `judge` records) is checked; a spent budget is a refusal (exit 3), not a verdict;
  3. the candidate's training export -- the dataset named by its receipt (for DPO: the pairs,
     and the SFT adapter's dataset), or the one the caller names -- is checked for the canary
     string and for 13-grams shared with S u K; contamination is decided before scoring;
  4. both models are scored in one run (`ledger.gate.score`), and the incumbent's fresh
     losses are compared with the ones recorded when it was last judged on this suite;
  5. `decide` applies the rules; the verdict object, a separate learner-view object, and the
     record are written in ONE `judge` transaction.

Runs decided before scoring (1 and 3) do not count against the budget: they revealed nothing.
The budget is keyed on the scored documents' content with the scorer, tokenizer and base
(`ledger.verdicts.budget_key`), not on the suite hash, so a re-pin of the same documents with a
fresh canary string continues it.

What the learner side can read: the image reads the journal (never the verdict object), so a
`judge` record's payload carries only the verdict name, the rounded best score and ids; reason
codes, budget counts and statistics are in the verdict object (its `sealed` part holds the
per-document losses), which only operator views (`ledger cat`, `ledger judge --json`, the
report) read. The learner view ({"verdict", "best_score"} rounded to eta) is its own small
object named in the payload.

`check_before_training` runs the contamination check on an export before anything is trained
on it (the learn cycle calls it), and records a GamedTheEvaluator verdict when it fires.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import NamedTuple

from ledger import records
from ledger.artefacts import model as modellib
from ledger.artefacts import template as templatelib
from ledger.artefacts.dataset import read_parquet
from ledger.errors import BadInput
from ledger.gate import score as scorelib
from ledger.gate import seal as seallib
from ledger.store import lookup
from ledger.verdicts import GateInputs, GateSettings, Scores, Verdict, check_budget, check_export, decide

JUDGE_KIND = "judge"
VERDICT_KIND = "verdict"
LEARNER_VIEW_KIND = "learner-view"


class JudgeOutcome(NamedTuple):
    verdict: Verdict
    verdict_id: str
    record: dict


# --- the models --------------------------------------------------------------------------------------
def resolve_pair(store, candidate_ref: str, against: str | None) -> tuple[scorelib.ModelRef, scorelib.ModelRef]:
    """(candidate, incumbent). Without `against` the incumbent is HEAD, or, when nothing has been
    committed yet, the candidate's bare base."""
    cand = scorelib.resolve_model(store, candidate_ref)
    if against is None:
        if "HEAD" in store.state.refs:
            inc = scorelib.resolve_model(store, "HEAD")
        else:
            inc = scorelib.ModelRef(base=cand.base, adapter=None, ref="(bare base: no HEAD yet)",
                                    tokenizer=cand.tokenizer)
    else:
        inc = scorelib.resolve_model(store, against)
    if inc.base != cand.base:
        raise BadInput(f"candidate and incumbent have different bases ({cand.base[:15]}… vs {inc.base[:15]}…)",
                       "the gate compares models of one base; pass --against a generation of the same base")
    return cand, inc


# --- the journal: budget, receipts, recorded scores ---------------------------------------------------
def runs_used(store, key: str) -> int:
    """Gate runs already counted against budget key `key` (runs decided before scoring are not).

    One index query (ledger/store/lookup.py: the index plus the records after it), never a walk
    of the journal: the count is taken again under the store lock when a verdict is recorded,
    and a walk there would stall every other writer (the image recording turns) for as long as
    history is long. A record written before budgets were keyed on content names only its
    suite; its key is derived from that suite's pinned documents (once per suite)."""
    derived: dict[str, str | None] = {}
    n = 0
    for r in lookup.records(store, JUDGE_KIND):
        p = records.read(r)  # typed: an ill-formed record is JournalCorrupt naming it
        if not records.given(p.budget_counted, p.scored):
            continue
        k = records.given(p.budget_key)
        if k is None:
            ref = p.suite_ref
            if ref not in derived:
                derived[ref] = seallib.SealedSuite(ref, store.get_json(ref)).budget_key(store)
            k = derived[ref]
        n += k == key
    return n


def receipt_of(store, adapter: str | None) -> tuple[str, dict] | None:
    """The receipt of the training run that produced `adapter`, found through its record."""
    if adapter is None:
        return None
    r = lookup.latest(store, "train", {"adapter": adapter})
    if r is None:
        return None
    rid = records.read(r).receipt
    return rid, store.get_json(rid)


def _training_datasets(store, cand: scorelib.ModelRef, export_dataset: str | None) -> tuple[list[str], list[dict]]:
    """Every dataset the candidate was trained from, following DPO back to its SFT adapter."""
    datasets: list[str] = []
    chain: list[dict] = []
    if export_dataset is not None:
        datasets.append(store.resolve(export_dataset))
    adapter, seen = cand.adapter, set()
    while adapter is not None and adapter not in seen:
        seen.add(adapter)
        found = receipt_of(store, adapter)
        if found is None:
            break
        rid, rec = found
        chain.append({"adapter": adapter, "receipt": rid, "trainer": rec.get("trainer", "sft"),
                      "dataset": rec.get("dataset")})
        if rec.get("dataset"):
            datasets.append(rec["dataset"])
        # The weights it started from carry their own training data into the candidate: DPO
        # tunes an SFT adapter; an SFT run may continue from an adapter (plan input init_adapter).
        adapter = rec.get("sft_adapter") or _init_adapter_of(store, rec)
    return list(dict.fromkeys(datasets)), chain


def _init_adapter_of(store, receipt: dict) -> str | None:
    plan = receipt.get("plan")
    if not plan or not store.has(plan):
        return None
    body = store.get_json(plan)
    return (body.get("inputs") or {}).get("init_adapter") if isinstance(body, dict) else None


def export_rows(store, dataset_id: str) -> Iterator[tuple[str, str]]:
    """(row key, text) of a Parquet dataset object: every string column of a row, joined."""
    import pyarrow as pa


    try:
        tbl = read_parquet(store.get_bytes(dataset_id))
    except (pa.ArrowException, OSError) as e:
        raise BadInput(f"training export {dataset_id} is not a Parquet table: {e}",
                       "the contamination check reads the dataset object a receipt names") from None
    cols = [c for c in tbl.column_names if pa.types.is_string(tbl.schema.field(c).type)
            or pa.types.is_large_string(tbl.schema.field(c).type)]
    if not cols:
        raise BadInput(f"training export {dataset_id} has no text columns to check")
    values = [tbl.column(c).to_pylist() for c in cols]
    short = dataset_id[3:15]
    for i in range(tbl.num_rows):
        yield f"{short}:{i}", "\n".join(v[i] for v in values if v[i] is not None)


def _keyed_rows(store, datasets: list[str]) -> Iterator[tuple[str, str]]:
    for d in datasets:
        yield from export_rows(store, d)


def recorded_losses(store, suite_hash: str, model: scorelib.ModelRef) -> tuple[dict | None, str | None]:
    """The model's per-document losses (S and K) from the last scored verdict on this suite in
    which it took part, and that verdict's id; (None, None) if it was never judged on it."""
    key = (model.base, model.adapter)
    for r in lookup.records(store, JUDGE_KIND, {"suite_hash": suite_hash}):
        p = records.read(r)
        # A SuiteChanged run's scores are the ones that drifted: never a reference.
        if p.suite_hash != suite_hash or not p.scored or p.verdict_name == "SuiteChanged":
            continue
        v = store.get_json(p.verdict)
        models = (v.get("context") or {}).get("models") or {}
        sealed = v.get("sealed") or {}
        for role in ("candidate", "incumbent"):
            m = models.get(role) or {}
            if (m.get("base"), m.get("adapter")) == key and sealed.get("scored") is not None:
                out = {doc: row[role] for part in ("scored", "canary") for doc, row in (sealed.get(part) or {}).items()}
                return out, p.verdict
    return None, None


def template_fixed_text(store, base: str) -> tuple[str, ...]:
    """The fixed parts of the base's chat template (system prompt, role headers): every turn
    rendered for training holds them by construction, so they are not evidence of contamination
    (empty for the plain format of the built-in model)."""
    return tuple(templatelib.for_base(store, modellib.load_manifest(store, base)).fixed_text())


# --- the gate run --------------------------------------------------------------------------------------
@dataclass
class _Run:
    t0: float
    score_s: float = 0.0


def judge(store, candidate_ref: str, against: str | None = None, *, settings: GateSettings | None = None,
          export_dataset: str | None = None, batch_size: int = scorelib.DEFAULT_BATCH,
          progress: Callable[[str], None] | None = None, shared_text: tuple[str, ...] = ()) -> JudgeOutcome:
    """Run the gate once and record the verdict (one `judge` transaction).

    `shared_text`: text every training row holds by construction, beyond the base's chat
    template's fixed parts (which are always passed); the contamination check does not count
    it as evidence.

    Raises Refused (exit 3) when the suite's run budget is spent, BadInput when there is no
    pinned suite or the models cannot be compared. Any verdict that was reached is returned,
    refusals included: the verdict is data."""
    run = _Run(time.perf_counter())
    say = progress or (lambda msg: None)
    suite = seallib.require_pinned(store)
    cand, inc = resolve_pair(store, candidate_ref, against)
    s = settings if settings is not None else suite.settings
    if not isinstance(s, GateSettings):
        raise BadInput("judge settings must be GateSettings")
    pinned_hash = suite.suite_hash

    # 1. The suite as it is now, before anything is scored.
    recomputed, changes, disk = seallib.recompute(store, suite, base=cand.base, tokenizer=cand.tokenizer)
    base_inputs = dict(incumbent_id=inc.id, candidate_id=cand.id, pinned_hash=pinned_hash,
                       recomputed_hash=recomputed, settings=s)
    datasets, chain = _training_datasets(store, cand, export_dataset)
    context = {"suite": {"manifest": suite.id, "scored": len(suite.scored_ids), "canaries": len(suite.canary_ids),
                         "scorer_version": scorelib.SCORER_VERSION, "base": cand.base, "tokenizer": cand.tokenizer,
                         "changes": changes},
               "models": {"candidate": cand.to_json(), "incumbent": inc.to_json()},
               "training": _training_context(store, chain), "export": {"datasets": datasets}}
    if recomputed != pinned_hash:
        say("the suite changed since it was pinned: nothing is scored")
        v = decide(GateInputs(**base_inputs))
        return _record(store, v, suite, cand, inc, context, run, scored=False)

    # 2. Budget, keyed on the scored documents' content: refuse before spending anything.
    key = seallib.budget_key_of([disk.docs[d] for d in suite.scored_ids], scorelib.SCORER_VERSION,
                                cand.tokenizer, cand.base)
    context["budget_key"] = key
    used = runs_used(store, key)
    check_budget(used, len(suite.scored_ids), s).require()

    # 3. Contamination of the training export, before scoring.
    report = None
    if datasets:
        say(f"checking {len(datasets)} training export(s) for contamination")
        suite_texts = {d: disk.docs[d].text for d in suite.scored_ids + suite.canary_ids}
        shared = template_fixed_text(store, cand.base) + tuple(shared_text)
        context["export"]["shared_texts"] = len(shared)
        report = check_export(_keyed_rows(store, datasets), suite_texts, suite.canary_string, s,
                              shared_text=shared)
        if report.contaminated:
            v = decide(GateInputs(**base_inputs, contamination=report))
            return _record(store, v, suite, cand, inc, context, run, scored=False, budget_key=key)

    # 4. Score both models in one run; compare the incumbent with its recorded losses.
    ids = suite.scored_ids + suite.canary_ids
    docs = [(disk.docs[d].situation, disk.docs[d].action) for d in ids]
    say(f"scoring incumbent and candidate on {len(suite.scored_ids)} + {len(suite.canary_ids)} documents")
    t = time.perf_counter()
    losses = scorelib.score_models(store, {"incumbent": inc, "candidate": cand}, docs, batch_size=batch_size)
    run.score_s = time.perf_counter() - t
    li = dict(zip(ids, map(float, losses["incumbent"])))
    lc = dict(zip(ids, map(float, losses["candidate"])))
    recorded, recorded_from = recorded_losses(store, pinned_hash, inc)
    context["drift"] = {"recorded_in": recorded_from}
    S, K = suite.scored_ids, suite.canary_ids
    scores = Scores(incumbent_scored={d: li[d] for d in S}, candidate_scored={d: lc[d] for d in S},
                    incumbent_canary={d: li[d] for d in K}, candidate_canary={d: lc[d] for d in K},
                    incumbent_recorded=recorded)
    dpo = _dpo_summary(store, chain)
    inputs = GateInputs(**base_inputs, scores=scores, contamination=report, runs_used=used, dpo=dpo)
    v = decide(inputs)
    return _record(store, v, suite, cand, inc, context, run, scored=True, budget_key=key,
                   recount=(used, lambda n: decide(dataclasses.replace(inputs, runs_used=n))))


def _training_context(store, chain: list[dict]) -> dict:
    """What the candidate's own training run recorded, as far as the gate cares: how it was
    sandboxed, whether it tried to reach protected paths (the sealed suite), DPO statistics."""
    if not chain:
        return {"receipt": None}
    first = chain[0]
    rec = store.get_json(first["receipt"])
    sb = rec.get("sandbox") or {}
    attempts = sb.get("protected_attempts") or []
    return {"receipt": first["receipt"], "trainer": first["trainer"], "chain": [
                {k: c[k] for k in ("adapter", "receipt", "trainer", "dataset")} for c in chain],
            "sandboxed": sb.get("sandboxed"),
            "protected_attempts": [{"op": a.get("op"), "path": a.get("path"), "access": a.get("access")}
                                   for a in attempts[:20]],
            "protected_attempt_count": len(attempts)}


def _dpo_summary(store, chain: list[dict]) -> dict | None:
    """For a DPO candidate, the statistics its receipt recorded (docs/gate.md: reward margin,
    accuracy, chosen-reward summary), carried into the verdict."""
    if not chain or chain[0]["trainer"] != "dpo":
        return None
    d = store.get_json(chain[0]["receipt"]).get("dpo") or {}
    return {k: d.get(k) for k in ("beta", "reference", "reward_margin", "accuracy", "chosen_reward",
                                  "rejected_reward", "pairs")}


def _record(store, v: Verdict, suite: seallib.SealedSuite, cand, inc, context: dict, run: _Run,
            *, scored: bool, budget_key: str | None = None,
            recount: tuple[int, Callable[[int], Verdict]] | None = None) -> JudgeOutcome:
    with store.transaction(JUDGE_KIND) as tx:
        if recount is not None:
            # Scoring ran without the lock; a concurrent gate run may have been recorded since
            # the budget was read. Under the lock the count is exact: decide again with it
            # (pure and cheap), which refuses if that run spent the last of the budget.
            used, redecide = recount
            now = runs_used(store, budget_key)
            if now != used:
                v = redecide(now)
        body = {"kind": VERDICT_KIND, **v.to_json(), "context": context}
        view = {"kind": LEARNER_VIEW_KIND, **v.learner_view()}
        vid = tx.put_json(body)
        lid = tx.put_json(view)
        tx.inputs.extend(dict.fromkeys(x for x in (cand.id, inc.id, suite.id) if x))
        tx.outputs.extend([vid, lid])
        # The journal is what the learner side (the image) reads: the payload carries the
        # learner view and ids, never reason codes, budget counts or statistics (those are in
        # the verdict object, which the image is never granted).
        records.write(tx, learner_payload(v, vid, lid, suite, cand.id, inc.id, scored=scored, budget_key=budget_key,
                                          wall_s=round(time.perf_counter() - run.t0, 3),
                                          score_s=round(run.score_s, 3)))
    return JudgeOutcome(v, vid, tx.record)


# What a `judge` record's payload may hold (tests/gate/test_learner_view.py checks every record).
LEARNER_PAYLOAD_KEYS = frozenset({"verdict", "verdict_name", "best_score", "learner_view", "suite_hash",
                                  "suite_ref", "recomputed_suite_hash", "budget_key", "candidate",
                                  "incumbent", "scored", "before_training", "wall_s", "score_s"})


def learner_payload(v: Verdict, vid: str, lid: str, suite: seallib.SealedSuite, candidate: str,
                    incumbent: str, *, scored: bool, budget_key: str | None, wall_s: float, score_s: float,
                    before_training: bool = False) -> records.Judge:
    view = v.learner_view()
    return records.Judge(verdict=vid, verdict_name=view["verdict"], best_score=view["best_score"], learner_view=lid,
                         suite_hash=v.pinned_hash, suite_ref=suite.id, recomputed_suite_hash=v.recomputed_hash,
                         budget_key=budget_key, candidate=candidate, incumbent=incumbent, scored=scored,
                         before_training=before_training, wall_s=wall_s, score_s=score_s)


# --- before training: the export alone ------------------------------------------------------------------
def check_before_training(store, dataset: str, *, candidate: str, shared_text: tuple[str, ...] = ()) -> JudgeOutcome | None:
    """Check a training export against the pinned suite before anything is trained on it.

    Contaminated: a GamedTheEvaluator verdict is recorded (one `judge` transaction, not scored,
    not counted against the budget, `before_training: true`) and returned; `candidate` names
    what would have been trained (the plan). Clean, or nothing to check against (no suite, or
    the suite on disk no longer matches its pin, which the judge then calls SuiteChanged
    before scoring): None."""
    run = _Run(time.perf_counter())
    suite = seallib.pinned(store)
    if suite is None:
        return None
    inc = (scorelib.resolve_model(store, "HEAD") if "HEAD" in store.state.refs else
           scorelib.ModelRef(base=suite.base, adapter=None, ref="(bare base: no HEAD yet)", tokenizer=suite.tokenizer))
    recomputed, _changes, disk = seallib.recompute(store, suite, base=inc.base, tokenizer=inc.tokenizer)
    if recomputed != suite.suite_hash:
        return None
    s = suite.settings
    suite_texts = {d: disk.docs[d].text for d in suite.scored_ids + suite.canary_ids}
    report = check_export(export_rows(store, store.resolve(dataset)), suite_texts, suite.canary_string, s,
                          shared_text=template_fixed_text(store, inc.base) + tuple(shared_text))
    if not report.contaminated:
        return None
    v = decide(GateInputs(incumbent_id=inc.id, candidate_id=candidate, pinned_hash=suite.suite_hash,
                          recomputed_hash=recomputed, settings=s, contamination=report))
    context = {"suite": {"manifest": suite.id, "scored": len(suite.scored_ids), "canaries": len(suite.canary_ids)},
               "models": {"incumbent": inc.to_json(), "candidate": {"id": candidate, "plan": candidate}},
               "export": {"datasets": [store.resolve(dataset)]}, "before_training": True}
    with store.transaction(JUDGE_KIND) as tx:
        vid = tx.put_json({"kind": VERDICT_KIND, **v.to_json(), "context": context})
        lid = tx.put_json({"kind": LEARNER_VIEW_KIND, **v.learner_view()})
        tx.inputs.extend(dict.fromkeys(x for x in (candidate, inc.id, suite.id) if x and store.has(x)))
        tx.outputs.extend([vid, lid])
        records.write(tx, learner_payload(v, vid, lid, suite, candidate, inc.id, scored=False, budget_key=None,
                                          before_training=True, wall_s=round(time.perf_counter() - run.t0, 3),
                                          score_s=0.0))
    return JudgeOutcome(v, vid, tx.record)
