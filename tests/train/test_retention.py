"""Retention (ledger/store/retention.py; docs/store-format.md P1–P4): `gc --prune` removes
superseded checkpoints and optimizer states under a recorded policy, keeps what `reproduce`
needs, and `reproduce` names what a policy removed when it cannot run."""

import shutil

import pytest

from ledger.errors import MissingObject
from ledger.store import Store, gc, retention
from ledger.store.verify import verify
from ledger.train import reproduce as rep
from ledger.train import run as trainlib


def _copy(trained, tmp_path) -> Store:
    dst = tmp_path / ".ledger"
    shutil.copytree(trained["store"].root, dst)
    return Store.open(dst)


def _files(store, ck):
    m = store.get_json(ck)
    return {k: m[k] for k in ("adapter", "optimizer", "rng")}


def test_default_policy_prunes_superseded_state_records_it_and_reproduce_still_works(trained, tmp_path):
    store = _copy(trained, tmp_path)
    r = trained["result"].receipt
    assert len(r["checkpoints"]) >= 2, r["checkpoints"]   # intermediate checkpoints exist to supersede
    final = _files(store, r["final_checkpoint"])
    inter = [_files(store, c) for c in r["checkpoints"] if c != r["final_checkpoint"]]
    p = gc.plan(store)
    gone = {o for o, *_ in p.retained}
    # what goes: every optimizer and rng state, and the adapters of non-final checkpoints
    assert {final["optimizer"], final["rng"]} <= gone
    assert all({f["optimizer"], f["rng"]} <= gone for f in inter)
    assert all(f["adapter"] in gone or f["adapter"] == final["adapter"] for f in inter)
    # what stays: the final adapter, the plan, dataset, base, tokenizer, the manifests
    kept = {final["adapter"], r["plan"], r["dataset"], r["base"], r["tokenizer"], r["final_checkpoint"],
            *r["checkpoints"], trained["result"].receipt_id}
    assert not kept & gone
    assert all(store.has(o) for o in gone)                 # a dry run removes nothing

    seq = store.state.seq
    done = gc.prune(store)
    rec = store.journal.records()[seq]                       # the prune record comes first (P1)
    assert rec["kind"] == "prune" and done.record == rec["seq"]
    pol = rec["payload"]["policy"]
    assert pol["name"] == retention.DEFAULT.name and pol["keep_resumed"] is True
    removed = {"b3:" + e[0]: e[2] for e in rec["payload"]["removed"]}
    assert set(removed) == gone and removed[final["optimizer"]] == "checkpoint optimizer"
    assert rec["payload"]["bytes_removed"] == sum(s for _, s, *_ in done.retained) > 0
    assert not any(store.has(o) for o in gone) and all(store.has(o) for o in kept)
    assert verify(store, read_data=True).ok                  # pruned is not missing (P3)
    with pytest.raises(MissingObject) as e:
        store.resolve(final["optimizer"])
    assert "retention policy" in e.value.message and str(rec["seq"]) in e.value.message
    assert gc.plan(store).retained == ()                     # nothing more to prune

    res = rep.reproduce(store, trained["result"].receipt_id)  # from scratch: still possible (P2)
    assert res.outcome == "Reproduced", res.comparison


def test_final_adapters_policy_makes_a_resumed_run_unreproducible_and_reproduce_says_why(trained, tmp_path):
    store = _copy(trained, tmp_path)
    r = trained["result"].receipt
    ck = r["checkpoints"][0]
    resumed = trainlib.train(store, r["plan"], resume=ck)
    assert resumed.receipt["resumed_from"] == ck
    # the default policy keeps a checkpoint a run resumed from whole
    p = gc.plan(store)
    assert not set(_files(store, ck).values()) & {o for o, *_ in p.retained}

    done = gc.prune(store, retention.FINAL_ADAPTERS)
    opt = _files(store, ck)["optimizer"]
    assert opt in {o for o, *_ in done.retained} and not store.has(opt)
    seq = store.state.seq
    res = rep.reproduce(store, resumed.receipt_id)
    assert res.outcome == "MissingInputs" and res.rerun_receipt is None
    assert opt in res.comparison["missing"]
    named = {x["id"]: x for x in res.comparison["pruned"]}
    assert named[opt]["policy"] == "final-adapters" and named[opt]["seq"] == done.record
    assert named[opt]["role"] == "checkpoint optimizer"
    assert store.state.seq == seq + 1                        # only the comparison was recorded
    assert res.to_json()["pruned"] == res.comparison["pruned"]


def test_unfinished_runs_keep_their_latest_checkpoint(trained, tmp_path):
    """A run killed after two checkpoints (checkpoint records, no receipt) can resume: the
    default policy keeps its latest checkpoint whole and prunes the earlier one's state."""
    store = _copy(trained, tmp_path)
    r = trained["result"].receipt
    cks = r["checkpoints"][:2]
    # the same manifests, recorded as another (unfinished) run's: only checkpoint records name them
    plans = {store.get_json(c)["plan"] for c in cks}
    assert len(plans) == 1
    fake = []
    for c in cks:
        m = dict(store.get_json(c), state={**store.get_json(c)["state"], "run": "unfinished"})
        with store.transaction("checkpoint") as tx:
            oid = tx.put_json(m)
            tx.payload.update({"checkpoint": oid, "plan": m["plan"], "step": m["step"]})
        fake.append((m["step"], oid))
    (_, early), (_, late) = sorted(fake)
    gone = {o for o, *_ in gc.plan(store).retained}
    # the latest of the unfinished run keeps its files, even though the finished run's
    # checkpoint with the same bytes would have lost them
    assert not set(_files(store, late).values()) & gone
    assert _files(store, early)["optimizer"] in gone


def test_unknown_policy_is_bad_input():
    from ledger.errors import BadInput

    with pytest.raises(BadInput) as e:
        retention.policy("keep-nothing")
    assert "superseded-training-state" in e.value.hint


def test_the_cli_shows_the_policy_prunes_and_refuses_an_unknown_one(trained, tmp_path):
    import json

    from tests.conftest import ledger_cmd

    store = _copy(trained, tmp_path)
    cwd = store.root.parent
    dry = json.loads(ledger_cmd("gc", "--json", cwd=cwd, check=True).stdout)
    assert dry["policy"] == "superseded-training-state" and not dry["pruned"] and dry["prune_record"] is None
    assert dry["superseded"] and dry["superseded_bytes"] == sum(x[1] for x in dry["superseded"])
    none = json.loads(ledger_cmd("gc", "--policy", "none", "--json", cwd=cwd, check=True).stdout)
    assert none["policy"] == "none" and none["superseded"] == []
    bad = ledger_cmd("gc", "--policy", "keep-nothing", cwd=cwd)
    assert bad.returncode == 2 and "unknown retention policy" in bad.stderr
    done = ledger_cmd("gc", "--prune", cwd=cwd, check=True)
    assert "superseded training object(s)" in done.stdout and "prune record" in done.stdout
    assert Store.open(store.root).journal.records()[-1]["kind"] in ("prune", "gc")
    assert all(not Store.open(store.root).has(x[0]) for x in dry["superseded"])
