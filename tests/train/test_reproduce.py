"""reproduce: all four answers, each stored as a comparison object in a reproduce record."""

import shutil

import pytest

from ledger.store import Store
from ledger.train import reproduce as rep


def _record_ok(store, res):
    rec = res.record
    assert rec["kind"] == "reproduce" and rec["payload"]["comparison"] == res.comparison_id
    assert store.get_json(res.comparison_id)["outcome"] == res.outcome
    assert rec["payload"]["of"] == res.comparison["receipt"]


def test_reproduced_bit_exact(trained):
    store, orig = trained["store"], trained["result"]
    res = rep.reproduce(store, orig.receipt_id)
    assert res.outcome == "Reproduced", res.comparison
    assert all(res.comparison["checks"].values())
    new = store.get_json(res.rerun_receipt)
    assert new["adapter"] == orig.adapter and new["losses"] == orig.receipt["losses"]
    _record_ok(store, res)
    cols, rows = store.query(f"SELECT rung FROM receipts WHERE id = '{res.rerun_receipt}'")
    assert rows == [("Learned",)]


@pytest.mark.slow
def test_diverged_names_first_step_and_field(trained):
    store, orig = trained["store"], trained["result"]
    res = rep.reproduce(store, orig.receipt_id, overrides={"seeds.data": 7})
    assert res.outcome == "Diverged"
    first = res.comparison["first_difference"]
    assert first["field"] == "loss" and first["step"] == 1  # another data order: step 1 sees other rows
    assert res.comparison["overrides"] == {"seeds.data": 7}
    assert store.get_json(res.rerun_receipt)["plan"] != orig.receipt["plan"]
    _record_ok(store, res)


@pytest.mark.slow
def test_within_tolerance_reports_largest_deviation(trained):
    """A change the result should barely feel (AdamW eps 1e-8 -> 1.0001e-8) is not bit-exact,
    but within tolerance, and the largest deviation is named."""
    store, orig = trained["store"], trained["result"]
    res = rep.reproduce(store, orig.receipt_id, overrides={"optimizer.eps": 1.0001e-8})
    assert res.outcome == "WithinTolerance", res.comparison
    dev = res.comparison["largest_deviation"]
    assert dev["field"] and 0 < dev["value"] <= 1e-4
    assert not res.comparison["checks"]["final_adapter_identical"]
    _record_ok(store, res)
    # the same re-run judged with a tolerance below its deviation diverges
    tight = rep.compare(store, orig.receipt, store.get_json(res.rerun_receipt),
                        {"loss_abs": dev["value"] / 10, "weight_abs": dev["value"] / 10})
    assert tight["outcome"] == "Diverged"


def test_missing_inputs_names_the_ids(trained, tmp_path):
    src = trained["store"].root
    dst = tmp_path / ".ledger"
    shutil.copytree(src, dst)
    store = Store.open(dst)
    r = trained["result"].receipt
    gone = [r["dataset"], store.get_json(r["base"])["files"]]
    for oid in gone:
        p = store.object_path(oid)
        p.chmod(0o644)
        p.unlink()
    seq = store.state.seq
    res = rep.reproduce(store, trained["result"].receipt_id)
    assert res.outcome == "MissingInputs"
    assert set(gone) <= set(res.comparison["missing"]) and res.rerun_receipt is None
    assert store.state.seq == seq + 1  # only the comparison was recorded; nothing ran
    _record_ok(store, res)


def test_malformed_receipt_is_refused_by_name(store):
    from ledger.errors import BadInput

    with store.transaction("add") as tx:
        oid = tx.put_json({"kind": "receipt", "plan": "b3:" + "0" * 64, "losses": ["x"]})
        tx.outputs.append(oid)
    with pytest.raises(BadInput) as e:
        rep.reproduce(store, oid)
    assert "malformed" in e.value.message and "losses" in e.value.message
