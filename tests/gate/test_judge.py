"""`judge` end to end on real (tiny) models: every verdict docs/gate.md names, reached for the reason
it names, with the record written as one transaction. The world is tests/gate/world.py."""

from __future__ import annotations

import json

import pytest

from ledger.errors import Refused
from ledger.gate import judge as judgelib
from ledger.gate import score as scorelib
from ledger.gate import seal
from ledger.verdicts import GateSettings

pytestmark = pytest.mark.slow  # shares a session world that takes ~1 min to build on one core


def _no_scoring(monkeypatch):
    """Make any call of the scorer fail the test: proves a verdict was reached without scoring."""
    def boom(*a, **k):
        raise AssertionError("the scorer was called")

    monkeypatch.setattr(scorelib, "score_models", boom)


def _sealed(store, vid):
    return store.get_json(vid)["sealed"]


# --- the verdicts --------------------------------------------------------------------------------------
def test_genuinely_better_adapter_is_accepted(world, wstore):
    seq = wstore.state.seq
    v, vid, rec = judgelib.judge(wstore, world.A, against=world.base)
    assert v.verdict == "Accept", v.summary
    assert v.reason_codes == ("significant_improvement",)
    # ONE judge transaction: the verdict object and the learner view, named in the payload.
    assert wstore.state.seq == seq + 1 and rec["kind"] == "judge"
    p = rec["payload"]
    assert p["verdict"] == vid and p["verdict_name"] == "Accept" and p["candidate"] == world.A
    assert p["incumbent"] == world.base and p["suite_ref"] == wstore.state.refs["suite"]
    assert p["scored"] and p["best_score"] == v.learner_view()["best_score"] and p["budget_key"]
    # the journal (what the image reads) carries no reason codes, budget counts or statistics
    assert not {"reason_codes", "budget", "budget_counted", "statistics"} & set(p)
    assert set(rec["outputs"]) == {vid, p["learner_view"]}
    body = wstore.get_json(vid)
    assert body["kind"] == "verdict" and body["candidate"] == world.A
    # Everything docs/gate.md lists: rule + parameters, suite hashes, budget, statistics, sealed losses.
    assert body["rule"]["version"] == "gate/2" and body["rule"]["parameters"]["alpha"] == 0.05
    assert body["suite"]["matches"] and body["budget"] == {"used": 1, "of": 20, "counted": True}
    st = body["statistics"]["scored"]
    assert st["n"] == 10 and st["wins"] == 10 and st["mean"] < -st["eta"] and st["p_better"] <= 0.05
    assert body["statistics"]["canary"]["k"] == 4
    assert set(_sealed(wstore, vid)["scored"]) == {f"s{i:03d}" for i in range(10)}
    assert set(_sealed(wstore, vid)["canary"]) == {f"k{i:03d}" for i in range(4)}
    # The learner view is its own small object: the verdict and a rounded score, nothing more.
    view = wstore.get_json(p["learner_view"])
    assert view == {"kind": "learner-view", **v.learner_view()}
    assert set(view) == {"kind", "verdict", "best_score"}
    # The DuckDB projection reads the verdict object's real keys.
    cols, rows = wstore.query("SELECT verdict, reasons, candidate, incumbent, suite, mean_delta, p_value FROM verdicts")
    assert rows == [("Accept", ["significant_improvement"], world.A, world.base, body["suite"]["pinned_hash"],
                     st["mean"], st["p_better"])]
    # Every id the records name is in the store, every object hashes to its name.
    from ledger.store.verify import verify

    rep = verify(wstore, read_data=True)
    assert rep.ok, rep.errors


def test_worse_adapter_is_regressed(world, wstore):
    v, vid, rec = judgelib.judge(wstore, world.base, against=world.A)
    assert v.verdict == "Regressed", v.summary
    assert "significantly_worse" in v.reason_codes


def test_candidate_identical_to_incumbent_is_no_improvement(world, wstore):
    v, vid, rec = judgelib.judge(wstore, world.A, against=world.A)
    assert v.verdict == "NoImprovement", v.summary
    assert "action_score_unchanged" in v.reason_codes
    assert all(row["delta"] == 0.0 for row in _sealed(wstore, vid)["scored"].values())


def test_planted_gamed_candidate_is_gamed_the_evaluator(world, wstore):
    # G was fine-tuned by the harness directly on the 10 scored documents: they improve a lot,
    # the canaries (held out, never trained on) get worse.
    v, vid, rec = judgelib.judge(wstore, world.G, against=world.A)
    assert v.verdict == "GamedTheEvaluator", v.summary
    assert v.reason_codes == ("canary_divergence",)
    c = wstore.get_json(vid)["statistics"]["canary"]
    assert c["worse"] >= c["worse_needed"] and c["mean_delta"] >= c["divergence_threshold"]


def test_export_with_the_canary_string_is_gamed_before_scoring(world, wstore, monkeypatch):
    from ledger.artefacts import builtin_task as task
    from ledger.artefacts import dataset as datalib

    canary = seal.pinned(wstore).canary_string
    turns = task.turns("train", 30, seed=3)
    rows = [(t.situation, t.action) for t in turns]
    rows[17] = (rows[17][0], f"{rows[17][1]} {canary}")  # one row carries the canary string
    import pyarrow as pa

    table = pa.table({"situation": [r[0] for r in rows], "action": [r[1] for r in rows]})
    with wstore.transaction("add") as tx:
        export = tx.put_bytes(datalib.parquet_bytes(table), "dataset")
        tx.outputs.append(export)
    _no_scoring(monkeypatch)
    v, vid, rec = judgelib.judge(wstore, world.A, against=world.base, export_dataset=export)
    assert v.verdict == "GamedTheEvaluator", v.summary
    assert v.reason_codes == ("canary_string_in_export",)
    body = wstore.get_json(vid)
    assert body["contamination"]["canary_string"]["row_count"] == 1
    assert body["contamination"]["canary_string"]["rows"] == [f"{export[3:15]}:17"]
    assert not rec["payload"]["scored"] and wstore.get_json(rec["payload"]["verdict"])["budget"] is None
    assert judgelib.runs_used(wstore, rec["payload"]["suite_hash"]) == 0  # revealed nothing, costs nothing


def test_clean_export_is_checked_and_recorded(world, wstore):
    from ledger.artefacts import builtin_task as task
    from ledger.artefacts import dataset as datalib

    with wstore.transaction("add") as tx:
        export = tx.put_bytes(datalib.parquet_bytes(datalib.turns_table(task.turns("train", 20, seed=5))), "dataset")
        tx.outputs.append(export)
    v, vid, rec = judgelib.judge(wstore, world.A, against=world.base, export_dataset=export)
    assert v.verdict == "Accept"
    c = wstore.get_json(vid)["contamination"]
    assert c["training_rows"] == 20 and not c["contaminated"] and c["canary_string"]["checked"]


def test_candidate_receipt_names_the_export(world, wstore, monkeypatch):
    """Without --export the gate finds the export through the candidate's training record."""
    from ledger.artefacts import builtin_task as task
    from ledger.artefacts import dataset as datalib

    canary = seal.pinned(wstore).canary_string
    turns = task.turns("train", 10, seed=4)
    table = datalib.turns_table(turns)
    import pyarrow as pa

    outcomes = table.column("outcome").to_pylist()
    outcomes[3] = f"done ({canary})"
    table = table.set_column(2, "outcome", pa.array(outcomes))
    with wstore.transaction("train") as tx:  # the shape of the trainer's record and receipt
        ds = tx.put_bytes(datalib.parquet_bytes(table), "dataset")
        rid = tx.put_json({"kind": "receipt", "adapter": world.A, "dataset": ds, "rung": "Learned"})
        tx.payload.update({"receipt": rid, "adapter": world.A})
    _no_scoring(monkeypatch)
    v, vid, rec = judgelib.judge(wstore, world.A, against=world.base)
    assert v.verdict == "GamedTheEvaluator" and v.reason_codes == ("canary_string_in_export",)
    ctx = wstore.get_json(vid)["context"]
    assert ctx["export"]["datasets"] == [ds] and ctx["training"]["receipt"] == rid


def test_changed_suite_file_is_suite_changed_with_no_scoring(world, wstore, monkeypatch):
    suite = seal.pinned(wstore)
    f = seal.sealed_dir(wstore, suite.id) / "eval" / "s004.json"
    doc = json.loads(f.read_text())
    doc["action"] = doc["action"] + " "
    f.write_text(json.dumps(doc, sort_keys=True))
    _no_scoring(monkeypatch)
    v, vid, rec = judgelib.judge(wstore, world.A, against=world.base)
    assert v.verdict == "SuiteChanged" and v.reason_codes == ("suite_hash_mismatch",)
    assert "decided_before_scoring" in [n.code for n in v.notes]
    body = wstore.get_json(vid)
    assert body["statistics"] is None and body["sealed"]["scored"] is None
    assert body["context"]["suite"]["changes"] == {"scored": {"added": [], "removed": [], "changed": ["s004"]}}
    assert not rec["payload"]["scored"] and wstore.get_json(rec["payload"]["verdict"])["budget"] is None


def test_new_scorer_version_is_suite_changed_with_no_scoring(world, wstore, monkeypatch):
    monkeypatch.setattr(scorelib, "SCORER_VERSION", scorelib.SCORER_VERSION + " (changed)")
    _no_scoring(monkeypatch)
    v, vid, rec = judgelib.judge(wstore, world.A, against=world.base)
    assert v.verdict == "SuiteChanged"
    assert set(wstore.get_json(vid)["context"]["suite"]["changes"]) == {"scorer_version"}


def test_incumbent_drift_is_suite_changed(world, wstore, monkeypatch):
    v1, _, _ = judgelib.judge(wstore, world.A, against=world.base)
    assert v1.verdict == "Accept"
    # Same models, same suite; the incumbent's fresh scores now differ from the recorded ones
    # (as if a library upgrade changed the numerics): the gate must not compare across that.
    real = scorelib.score_models

    def drifted(*a, **k):
        out = real(*a, **k)
        return {**out, "incumbent": out["incumbent"] + 2e-4}

    monkeypatch.setattr(scorelib, "score_models", drifted)
    v2, vid, rec = judgelib.judge(wstore, world.G, against=world.base)
    assert v2.verdict == "SuiteChanged" and v2.reason_codes == ("incumbent_drift",)
    assert wstore.get_json(vid)["drift"]["max_abs_diff"] == pytest.approx(2e-4, rel=1e-6)
    monkeypatch.setattr(scorelib, "score_models", real)
    v3, vid3, _ = judgelib.judge(wstore, world.A, against=world.base)
    assert v3.verdict == "Accept" and wstore.get_json(vid3)["drift"]["max_abs_diff"] == 0.0


def test_budget_is_counted_per_suite_hash_and_refuses_when_spent(world, wstore, tmp_path):
    scored, canaries = seal.demo_docs(2, 1, 0)
    d = seal.write_suite_dir(tmp_path / "small", scored, canaries, settings={"budget_multiplier": 1})
    seal.seal(wstore, d, base=world.base, repin=True, reason="a small suite with a budget of 2")
    h = seal.pinned(wstore).suite_hash
    for k in (1, 2):
        v, _, rec = judgelib.judge(wstore, world.A, against=world.base)
        assert wstore.get_json(rec["payload"]["verdict"])["budget"] == {"used": k, "of": 2, "counted": True}
    assert judgelib.runs_used(wstore, rec["payload"]["budget_key"]) == 2 and rec["payload"]["suite_hash"] == h
    seq = wstore.state.seq
    with pytest.raises(Refused, match="budget is spent") as e:
        judgelib.judge(wstore, world.A, against=world.base)
    assert e.value.exit_code == 3 and wstore.state.seq == seq  # a refusal to judge writes nothing


def test_dpo_register_adapter_is_refused_with_unchanged_action_score(world, wstore):
    # D learned only the register: DPO pairs "I will now act: X" over "X", on top of A, with
    # A's policy as reference. Its receipt shows the preference was learned...
    r = wstore.get_json(world.D_receipt)
    assert r["kind"] == "dpo-receipt" and r["sft_adapter"] == world.A and r["dpo"]["reference"] == "sft"
    assert r["dpo"]["accuracy"] == 1.0 and r["dpo"]["reward_margin"]["min"] > 0
    assert r["dpo"]["chosen_reward"]["mean"] > 0
    # ...and with the suite's own (default) settings the gate refuses it because the action
    # score did not move: any LoRA update leaks a few thousandths of a nat per token into the
    # untouched action tokens of this byte model (measured +0.004), below the default
    # unchanged_tolerance = eta_min, "less than the smallest effect the gate would ever credit".
    v, vid, rec = judgelib.judge(wstore, world.D, against=world.A)
    assert v.verdict in ("NoImprovement", "Regressed"), v.summary
    assert v.reason_codes[0] == "action_score_unchanged", v.reason_codes
    assert abs(v.scored.mean) < GateSettings().eta_min
    body = wstore.get_json(vid)
    assert body["dpo"]["accuracy"] == 1.0 and body["dpo"]["reward_margin"]["mean"] > 0
    assert body["context"]["training"]["trainer"] == "dpo"


def test_default_incumbent_is_head_or_the_bare_base(world, wstore):
    cand, inc = judgelib.resolve_pair(wstore, world.A, None)
    assert inc.bare and inc.base == world.base  # nothing committed yet
    from ledger import generations

    with wstore.transaction("commit") as tx:
        generations.new_generation(tx, wstore, base=world.base, adapter=world.A, note="test")
    cand, inc = judgelib.resolve_pair(wstore, world.G, None)
    assert inc.adapter == world.A and inc.generation == wstore.state.refs["HEAD"]
    v, vid, rec = judgelib.judge(wstore, world.G)  # against HEAD
    assert v.verdict == "GamedTheEvaluator" and rec["payload"]["incumbent"] == world.A


def test_contamination_follows_the_init_adapter_of_a_plan(world, wstore, monkeypatch):
    """An SFT run that continued from another adapter (plan input init_adapter) inherits that
    adapter's training data: the gate checks it too."""
    import pyarrow as pa

    from ledger.artefacts import dataset as datalib

    canary = seal.pinned(wstore).canary_string
    table = pa.table({"situation": ["user: hello", "user: bye"], "action": ["call greet()", f"call bye() {canary}"]})
    clean = pa.table({"situation": ["user: add 1 and 2"], "action": ["call adder.add(1, 2)"]})
    with wstore.transaction("train") as tx:  # A was trained on the contaminated export
        ds_a = tx.put_bytes(datalib.parquet_bytes(table), "dataset")
        r_a = tx.put_json({"kind": "receipt", "adapter": world.A, "dataset": ds_a})
        tx.payload.update({"receipt": r_a, "adapter": world.A})
    with wstore.transaction("train") as tx:  # G continued from A on a clean export
        ds_g = tx.put_bytes(datalib.parquet_bytes(clean), "dataset")
        plan = tx.put_json({"kind": "plan", "inputs": {"init_adapter": world.A, "dataset": ds_g}})
        r_g = tx.put_json({"kind": "receipt", "adapter": world.G, "dataset": ds_g, "plan": plan})
        tx.payload.update({"receipt": r_g, "adapter": world.G})
    _no_scoring(monkeypatch)
    v, vid, rec = judgelib.judge(wstore, world.G, against=world.base)
    assert v.verdict == "GamedTheEvaluator" and v.reason_codes == ("canary_string_in_export",)
    ctx = wstore.get_json(vid)["context"]
    assert [c["adapter"] for c in ctx["training"]["chain"]] == [world.G, world.A]
    assert ctx["export"]["datasets"] == [ds_g, ds_a]


def test_a_real_training_run_is_traced_to_its_export(tmp_path, monkeypatch):
    """End to end with `ledger train`'s own records: a dataset with one row carrying the canary
    string, compiled and trained (2 steps) in the sandboxed child; the gate finds the export
    through the train record and the receipt, and refuses before scoring."""
    import pyarrow as pa

    from ledger.artefacts import builtin_task as task
    from ledger.artefacts import dataset as datalib
    from ledger.plan import compile as comp
    from ledger.plan import spec, targets
    from ledger.store import Store
    from ledger.train import run as trainlib

    store = Store.init(tmp_path)
    table = datalib.turns_table(task.turns("train", 24, seed=2))
    with store.transaction("add") as tx:
        clean = tx.put_bytes(datalib.parquet_bytes(table), "dataset")
        tx.outputs.append(clean)
    s = spec.parse(f'[data]\ndataset = "{clean}"\nsteps = 2\nmicro_batch = 4\n')
    base = comp.compile_spec(store, s, targets.get("cpu")).plan.body["inputs"]["base"]  # builds the base
    scored, canaries = seal.demo_docs(3, 1, 0)
    canary = seal.seal(store, seal.write_suite_dir(tmp_path / "suite", scored, canaries), base=base).suite.canary_string
    outcomes = table.column("outcome").to_pylist()
    outcomes[7] = f"ok {canary}"  # one recorded turn carries the canary string
    with store.transaction("add") as tx:
        ds = tx.put_bytes(datalib.parquet_bytes(table.set_column(2, "outcome", pa.array(outcomes))), "dataset")
        tx.outputs.append(ds)
    plan = comp.compile_spec(store, s.with_overrides({"data.dataset": ds}), targets.get("cpu")).plan
    tr = trainlib.train(store, plan.id)
    assert tr.adapter
    _no_scoring(monkeypatch)
    v, vid, rec = judgelib.judge(store, tr.adapter)
    assert v.verdict == "GamedTheEvaluator" and v.reason_codes == ("canary_string_in_export",)
    ctx = store.get_json(vid)["context"]
    assert ctx["training"]["receipt"] == tr.receipt_id and ctx["export"]["datasets"] == [ds]
    assert ctx["training"]["sandboxed"] is True and ctx["training"]["protected_attempt_count"] == 0


def test_a_concurrent_run_that_spends_the_budget_refuses_the_slower_one(world, wstore, tmp_path, monkeypatch):
    """Scoring runs without the lock. If another gate run is recorded meanwhile and spends the
    last run of the budget, the slower one is refused when it takes the lock to record."""
    scored, canaries = seal.demo_docs(1, 1, 0)
    d = seal.write_suite_dir(tmp_path / "one", scored, canaries, settings={"budget_multiplier": 1})
    seal.seal(wstore, d, base=world.base, repin=True, reason="budget of one run")
    real = scorelib.score_models
    calls = []

    def racing(*a, **k):
        calls.append(1)
        if len(calls) == 1:  # the outer run is scoring: another process records its run now
            monkeypatch.setattr(scorelib, "score_models", real)
            judgelib.judge(wstore, world.G, against=world.base)
        return real(*a, **k)

    monkeypatch.setattr(scorelib, "score_models", racing)
    seq = wstore.state.seq
    with pytest.raises(Refused, match="budget is spent"):
        judgelib.judge(wstore, world.A, against=world.base)
    recs = [r for r in wstore.journal.records() if r["seq"] > seq]
    assert [r["payload"]["candidate"] for r in recs] == [world.G]  # only the run that got there first
    assert wstore.get_json(recs[0]["payload"]["verdict"])["budget"] == {"used": 1, "of": 1, "counted": True}
