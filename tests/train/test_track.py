"""ledger.track: a training loop of the user's own logs into the ledger (docs/tracking.md)."""

import os
import signal
import subprocess
import sys
import textwrap

import pytest

import ledger
from ledger import runs as runslib
from ledger.errors import BadInput
from ledger.store import Store
from ledger.train import track as tracklib
from tests.conftest import ledger_cmd


def _records(store, kind):
    return [r for r in store.journal.scan().records if r["kind"] == kind]


def test_a_loop_is_bound_into_a_receipt(store, tmp_path):
    data = tmp_path / "train.jsonl"
    data.write_text('{"x": 1}\n')
    out = tmp_path / "adapter"
    out.mkdir()
    (out / "weights.bin").write_bytes(b"\x00" * 100)
    with ledger.track("lr-sweep", params={"lr": 3e-4, "r": 16, "targets": ["q", "v"]}, seeds={"torch": 7},
                      data={"train": data}, store=store) as run:
        for step in range(40):
            run.log(step, loss=2.0 / (step + 1), acc=step / 40)
        art = run.artifact(out)
    rec = run.receipt
    assert rec.status == "finished" and rec.rung == "Learned"
    body = store.get_json(rec.receipt)
    assert body["trainer"] == "tracked" and body["kind"] == "receipt"
    assert body["params"] == {"lr": 3e-4, "r": 16, "targets": ["q", "v"]} and body["seeds"] == {"torch": 7}
    assert store.get_bytes(body["data"]["train"]) == data.read_bytes()
    assert body["artifacts"] == {"adapter": art} and store.has(art)
    assert body["metrics"]["final"] == {"acc": 39 / 40, "loss": 2.0 / 40}
    assert body["evidence"]["Learned"]["fell"] is True and "Checked" not in body["evidence"]
    rows = [r for c in body["metrics"]["chunks"] for r in store.get_json(c)["rows"]]
    assert len(rows) == 80 and rows[0] == [0, "loss", 2.0]
    assert body["source"]["ledger_hash"].startswith("b3:")
    [end] = _records(store, "track")
    assert end["payload"]["receipt"] == rec.receipt and end["payload"]["run"] == run.id
    assert not runslib.is_live(store, run.id)


def test_rungs_are_honest(store):
    with ledger.track("flat", store=store) as run:
        for step in range(20):
            run.log(step, loss=1.0)
    assert run.receipt.rung == "Ran"  # ran, but the declared loss did not fall
    with ledger.track("nan", store=store) as run:
        for step in range(20):
            run.log(step, loss=1.0 / (step + 1) if step != 10 else float("nan"))
    body = store.get_json(run.receipt.receipt)
    assert body["rung"] == "Ran" and body["evidence"]["Ran"]["all_losses_finite"] is False
    with ledger.track("nothing", store=store) as run:
        pass
    assert run.receipt.rung is None  # nothing logged: no rung at all, never Checked
    with ledger.track("other-loss", loss="val_loss", store=store) as run:
        for step in range(20):
            run.log(step, loss=1.0, val_loss=1.0 / (step + 1))
    assert run.receipt.rung == "Learned"


def test_an_exception_in_the_block_is_a_failed_run(store):
    with pytest.raises(ZeroDivisionError):
        with ledger.track("boom", store=store) as run:
            run.log(0, loss=1.0)
            1 / 0
    assert run.receipt.status == "failed"
    body = store.get_json(run.receipt.receipt)
    assert body["error"].startswith("ZeroDivisionError")


def test_bad_params_and_use_outside_the_block_are_typed_errors(store):
    with pytest.raises(BadInput, match="param 'lr'"):
        ledger.track("x", params={"lr": float("inf")}, store=store)
    with pytest.raises(BadInput, match="type object"):
        ledger.track("x", params={"f": object()}, store=store)
    with pytest.raises(BadInput, match="name"):
        ledger.track("", store=store)
    run = ledger.track("x", store=store)
    with pytest.raises(BadInput, match="outside"):
        run.log(0, loss=1.0)
    before = store.journal.scan().records
    assert [r["kind"] for r in before] == ["init"]  # nothing was written by the refusals


def test_metrics_flush_in_transactions_while_running(store, monkeypatch):
    monkeypatch.setattr(tracklib, "FLUSH_ROWS", 10)
    with ledger.track("flush", store=store) as run:
        for step in range(25):
            run.log(step, loss=1.0)
        flushed = _records(store, "track-metrics")
        assert [r["payload"]["rows"] for r in flushed] == [10, 10]
    assert [r["payload"]["rows"] for r in _records(store, "track-metrics")] == [10, 10, 5]


def test_a_flush_is_put_off_while_another_writer_holds_the_lock(store, monkeypatch):
    monkeypatch.setattr(tracklib, "FLUSH_ROWS", 5)
    with ledger.track("busy", store=store) as run:
        other = Store.open(store.root)
        with other.locked():
            for step in range(12):
                run.log(step, loss=1.0)  # due twice, put off both times: no wait, no error
            assert _records(store, "track-metrics") == []
    rows = [r for c in store.get_json(run.receipt.receipt)["metrics"]["chunks"] for r in store.get_json(c)["rows"]]
    assert [r[0] for r in rows] == list(range(12))  # every row, in order


KILLED = textwrap.dedent("""
    import os, sys, time
    import ledger
    with ledger.track("killed", params={"lr": 0.1}, store=sys.argv[1]) as run:
        for step in range(3):
            run.log(step, loss=1.0)
        run.flush()
        print(run.id, flush=True)
        time.sleep(60)
""")


def test_a_killed_process_leaves_an_interrupted_run_never_a_half_record(tmp_path):
    store = Store.init(tmp_path)
    script = tmp_path / "train.py"
    script.write_text(KILLED)
    p = subprocess.Popen([sys.executable, str(script), str(store.root)], stdout=subprocess.PIPE, text=True,
                         env={**os.environ, "OMP_NUM_THREADS": "1"})
    run_id = p.stdout.readline().strip()
    assert runslib.is_live(Store.open(store.root), run_id)
    os.kill(p.pid, signal.SIGKILL)
    p.wait(timeout=30)
    p.stdout.close()
    reopened = Store.open(store.root)
    assert not runslib.is_live(reopened, run_id)
    kinds = [r["kind"] for r in reopened.journal.scan().records]
    assert kinds == ["init", "track-start", "track-metrics"]
    v = ledger_cmd("--store", store.root, "verify")
    assert v.returncode == 0, v.stdout + v.stderr
    start = reopened.journal.scan().records[1]
    assert runslib.run_id(start["id"]) == run_id and start["payload"]["params"] == {"lr": 0.1}
    assert start["payload"]["source"]["script"]["id"]  # the script that ran is bound


def test_log_buffers(store):
    """log writes nothing per call (what it costs is measured in benchmarks/bench_track.py)."""
    with ledger.track("cheap", store=store) as run:
        for step in range(2000):
            run.log(step, loss=1.0)
        assert _records(store, "track-metrics") == []
    assert [r["payload"]["rows"] for r in _records(store, "track-metrics")] == [2000]


def test_reproduce_refuses_a_tracked_receipt(tmp_path):
    store = Store.init(tmp_path)
    with ledger.track("mine", store=store) as run:
        run.log(0, loss=1.0)
    p = ledger_cmd("--store", store.root, "reproduce", run.receipt.receipt)
    assert p.returncode == 3, p.stderr
    assert "tracked run" in p.stderr and "no compiled plan" in p.stderr
