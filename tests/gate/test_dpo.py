"""DPO on top of an SFT adapter: configuration, pairs, the receipt, the reference policy; and the
sealed suite seen from a training child: denied, recorded, and without effect on the gate."""

from __future__ import annotations

import json
import math
import sys

import pytest

from ledger.errors import BadInput
from ledger.gate import judge as judgelib
from ledger.gate import seal
from ledger.train import dpo


# --- configuration and pairs (no model) --------------------------------------------------------------
@pytest.mark.parametrize("kw", [{"beta": 0}, {"beta": float("nan")}, {"lr": -1.0}, {"steps": 0}, {"batch": 0},
                                {"seed": -1}, {"threads": 0}, {"steps": 2.5}, {"beta": True}, {"weight_decay": -0.1}])
def test_bad_config_is_refused(kw):
    with pytest.raises(BadInput):
        dpo.DpoConfig(**kw)


def test_default_beta_is_gate_md():
    assert dpo.DpoConfig().beta == 0.1


def _jsonl(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


PAIR = {"situation": "user: add 1 and 2", "chosen": "call adder.add(1, 2)", "rejected": "refuse: no"}


def test_pairs_from_jsonl_parquet_and_the_store(store, tmp_path):
    data, rows = dpo.load_pairs(store, str(_jsonl(tmp_path / "p.jsonl", [PAIR, PAIR])))
    assert rows == [tuple(PAIR.values())] * 2
    (tmp_path / "p.parquet").write_bytes(data)
    assert dpo.load_pairs(store, str(tmp_path / "p.parquet")) == (data, rows)
    with store.transaction("add") as tx:
        oid = tx.put_bytes(data, "dataset")
        tx.outputs.append(oid)
    assert dpo.load_pairs(store, oid) == (data, rows)


@pytest.mark.parametrize("row, msg", [
    ({**PAIR, "rejected": PAIR["chosen"]}, "over itself"),
    ({**PAIR, "chosen": ""}, "non-empty strings"),
    ({**PAIR, "extra": 1}, "nothing else"),
    ({"situation": "s", "chosen": "c"}, "nothing else"),
])
def test_bad_pairs_are_refused(store, tmp_path, row, msg):
    with pytest.raises(BadInput, match=msg):
        dpo.load_pairs(store, str(_jsonl(tmp_path / "p.jsonl", [row])))


def test_empty_or_non_json_pairs(store, tmp_path):
    with pytest.raises(BadInput, match="no preference pairs"):
        dpo.load_pairs(store, str(_jsonl(tmp_path / "e.jsonl", [])))
    (tmp_path / "bad.jsonl").write_text("{not json\n")
    with pytest.raises(BadInput, match="not JSON"):
        dpo.load_pairs(store, str(tmp_path / "bad.jsonl"))
    (tmp_path / "bad.parquet").write_bytes(b"PAR1 nope")
    with pytest.raises(BadInput, match="not a Parquet table"):
        dpo.load_pairs(store, str(tmp_path / "bad.parquet"))


# --- the world's DPO run -------------------------------------------------------------------------------
@pytest.mark.slow
def test_receipt_record_and_reference_policy(world):
    from ledger.store import Store

    st = Store.open(world.root)
    r = st.get_json(world.D_receipt)
    rec = next(x for x in st.journal.records() if x["payload"].get("receipt") == world.D_receipt)
    assert rec["kind"] == "train" and rec["payload"]["trainer"] == "dpo" and rec["payload"]["adapter"] == world.D
    assert {world.D_receipt, world.D} <= set(rec["outputs"]) and world.A in rec["inputs"]
    assert r["rung"] == "Learned" and r["sandbox"]["sandboxed"] and r["sandbox"]["policy"]["network"] is False
    assert r["base"] == world.base and r["sft_adapter"] == world.A and r["config"]["beta"] == 0.1
    # The reference is the SFT policy the run starts from: at step 0 every margin is exactly 0,
    # so the first loss is -log sigmoid(0) = log 2 (a bare-base reference would not give that).
    assert r["losses"][0] == pytest.approx(math.log(2), abs=1e-6)
    assert r["metrics"]["reward_margin"][0] == pytest.approx(0.0, abs=1e-6)
    assert len(r["losses"]) == r["counters"]["optimizer_steps"] == r["config"]["steps"]
    d = r["dpo"]
    assert set(d) >= {"reward_margin", "accuracy", "chosen_reward", "rejected_reward", "beta", "pairs"}
    assert d["pairs"] == 200 and d["reward_margin"]["mean"] == pytest.approx(
        d["chosen_reward"]["mean"] - d["rejected_reward"]["mean"], abs=1e-6)
    # The adapter loads like any other and names its base.
    files = {e["path"]: e["id"] for e in st.get_json(world.D)["entries"]}
    cfg = st.get_json(files["adapter_config.json"])
    assert cfg["base_model_name_or_path"] == world.base and cfg["peft_type"] == "LORA"


@pytest.mark.slow
def test_dpo_needs_an_adapter(world, wstore):
    with pytest.raises(BadInput, match="has no adapter"):
        dpo.train_dpo(wstore, str(world.pairs_file), world.base)


@pytest.mark.slow
def test_contamination_is_found_through_the_sft_parent(world, wstore):
    """D's own pairs are clean; the SFT adapter it was tuned from was trained on an export that
    carries the canary string. The gate follows D's receipt to A's and refuses D."""
    import pyarrow as pa

    from ledger.artefacts import builtin_task as task
    from ledger.artefacts import dataset as datalib

    canary = seal.pinned(wstore).canary_string
    rows = task.turns("train", 12, seed=9)
    table = pa.table({"situation": [t.situation for t in rows],
                      "action": [t.action if i != 5 else f"{t.action} // {canary}" for i, t in enumerate(rows)]})
    with wstore.transaction("train") as tx:  # A's training record, as the trainer writes it
        ds = tx.put_bytes(datalib.parquet_bytes(table), "dataset")
        rid = tx.put_json({"kind": "receipt", "adapter": world.A, "dataset": ds})
        tx.payload.update({"receipt": rid, "adapter": world.A})
    v, vid, rec = judgelib.judge(wstore, world.D, against=world.A)
    assert v.verdict == "GamedTheEvaluator" and v.reason_codes == ("canary_string_in_export",)
    ctx = wstore.get_json(vid)["context"]
    assert [c["adapter"] for c in ctx["training"]["chain"]] == [world.D, world.A]
    assert ctx["export"]["datasets"][1] == ds


# --- the sealed suite from the training side -----------------------------------------------------------
HOSTILE = r"""
import sys, runpy
sealed_doc, work = sys.argv[1], sys.argv[2]
try:
    open(sealed_doc).read()
except PermissionError:
    pass
else:
    sys.exit(97)  # it could read the suite: the run must fail loudly
sys.argv = ["ledger.train.dpo", work]
runpy.run_module("ledger.train.dpo", run_name="__main__")
"""


@pytest.mark.slow
def test_training_child_cannot_read_the_sealed_suite(world, wstore, monkeypatch):
    """A training child (the real DPO child, wrapped) opens a sealed document: Landlock denies
    it, the attempt is in the receipt and in the verdict's record, and the verdict is the one
    the same adapter gets without the attempt."""
    suite = seal.pinned(wstore)
    doc = seal.sealed_dir(wstore, suite.id) / "eval" / "s000.json"
    assert doc.is_file()
    monkeypatch.setattr(dpo, "_child_argv", lambda work: [sys.executable, "-c", HOSTILE, str(doc), str(work)])
    res = dpo.train_dpo(wstore, str(world.pairs_file), world.A, config=dpo.DpoConfig(steps=world_steps()))
    attempts = res.receipt["sandbox"]["protected_attempts"]
    assert any(a["path"] == str(doc.resolve()) and a["access"] == "read" for a in attempts), attempts
    assert res.receipt["sandbox"]["sandboxed"]
    # Same inputs, same deterministic training: the same adapter as the clean run in the world.
    assert res.adapter == world.D
    v_clean, _, _ = judgelib.judge(wstore, world.D, against=world.A)
    v, vid, rec = judgelib.judge(wstore, res.adapter, against=world.A)
    assert (v.verdict, v.reason_codes) == (v_clean.verdict, v_clean.reason_codes)
    assert v.scored.mean == v_clean.scored.mean
    tr = wstore.get_json(vid)["context"]["training"]
    assert tr["receipt"] == res.receipt_id and tr["protected_attempt_count"] >= 1
    assert any(a["path"] == str(doc.resolve()) for a in tr["protected_attempts"])


def world_steps() -> int:
    from tests.gate.world import DPO_STEPS

    return DPO_STEPS
