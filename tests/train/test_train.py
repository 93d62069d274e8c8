"""Training: receipts, rungs, determinism across processes, checkpoints, resume, SIGKILL, NaN."""

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from ledger.artefacts import checkpoint as ck
from ledger.plan import compile as comp
from ledger.plan import spec, targets
from ledger.store import Store, trees
from ledger.train import run as trainlib
from ledger.train.receipt import RUNGS


def test_receipt_binds_every_identity(trained):
    store, plan, res = trained["store"], trained["plan"], trained["result"]
    r = store.get_json(res.receipt_id)
    assert r == res.receipt and r["kind"] == "receipt"
    assert r["plan"] == plan.id and r["spec"] == plan.body["spec"]
    for k in ("base", "tokenizer", "dataset"):
        assert r[k] == plan.body["inputs"][k] and store.has(r[k])
    assert r["target"]["name"] == "cpu" and store.has(r["target"]["id"])
    for k in ("rng_state", "optimizer_state", "final_checkpoint", "adapter"):
        assert store.has(r[k]), k
    assert r["source"]["hash"].startswith("b3:") and r["source"]["files"] > 10
    assert {"python", "torch", "transformers", "peft", "cupy-cuda12x", "wasmtime"} <= set(r["versions"])
    assert r["device"]["cpu"] and r["determinism"]["threads"] == 1 and r["determinism"]["deterministic_algorithms"]
    assert r["cursor"] == {"start_step": 0, "end_step": 12, "next_step": 13, "micro_batch": 12}
    assert len(r["losses"]) == 12 and r["counters"]["optimizer_steps"] == 12
    assert r["timings"]["tokens_per_s"] > 0
    assert r["memory"]["predicted_bytes"] == plan.body["memory"]["total_bytes"]
    assert r["memory"]["observed"]["peak_growth_bytes"] > 0
    assert r["sandbox"]["sandboxed"] is True and r["sandbox"]["landlock_abi"] >= 1
    assert r["realizations"]["linear_lora"] == "torch-eager"
    # evidence for every rung claimed, in order
    assert r["rung"] in RUNGS and set(r["evidence"]) == set(RUNGS[:RUNGS.index(r["rung"]) + 1])
    assert r["rung"] == "Learned" and r["evidence"]["Learned"]["last_mean"] < r["evidence"]["Learned"]["first_mean"]
    # progress was reported step by step
    assert [p["step"] for p in trained["progress"]] == list(range(1, 13))


def test_adapter_is_a_peft_directory_and_indexed(trained, tmp_path):
    store, res = trained["store"], trained["result"]

    trees.materialise_tree(store, res.adapter, tmp_path / "a")
    cfg = json.loads((tmp_path / "a" / "adapter_config.json").read_text())
    assert cfg["target_modules"] == sorted(cfg["target_modules"]) and cfg["r"] == 8
    base = store.get_json(res.receipt["base"])
    trees.materialise_tree(store, base["files"], tmp_path / "b")
    from peft import PeftModel
    from transformers import LlamaForCausalLM

    m = PeftModel.from_pretrained(LlamaForCausalLM.from_pretrained(str(tmp_path / "b")), str(tmp_path / "a"))
    assert any("lora_A" in n for n, _ in m.named_parameters())
    # the record and the index projection
    rec = res.record
    assert rec["kind"] == "train" and rec["payload"]["receipt"] == res.receipt_id
    cols, rows = store.query(f"SELECT rung, steps, adapter FROM receipts WHERE id = '{res.receipt_id}'")
    assert rows == [("Learned", 12, res.adapter)]
    # checkpoints at steps 4 and 8, each its own record before the train record (12 is the end:
    # the final state is in the receipt)
    ck_recs = {}
    for r in store.journal.records():  # identical later runs record the same checkpoint ids again
        if r["kind"] == "checkpoint":
            ck_recs.setdefault(r["payload"]["checkpoint"], r)
    ids = res.receipt["checkpoints"]
    assert [store.get_json(c)["step"] for c in ids] == [4, 8]
    assert all(ck_recs[c]["seq"] < rec["seq"] for c in ids)


def test_two_processes_give_byte_identical_adapters(trained):
    store, plan, first = trained["store"], trained["plan"], trained["result"]
    second = trainlib.train(store, plan.id)
    assert second.adapter == first.adapter
    assert second.receipt["losses"] == first.receipt["losses"]
    assert second.receipt["optimizer_state"] == first.receipt["optimizer_state"]
    assert second.receipt_id != first.receipt_id  # timings differ; the results do not


def test_resume_from_checkpoint_equals_uninterrupted(trained):
    store, plan, first = trained["store"], trained["plan"], trained["result"]
    ckpt = first.receipt["checkpoints"][1]
    assert store.get_json(ckpt)["step"] == 8
    resumed = trainlib.train(store, plan.id, resume=ckpt)
    assert resumed.adapter == first.adapter
    assert resumed.receipt["losses"] == first.receipt["losses"]
    assert resumed.receipt["resumed_from"] == ckpt and resumed.receipt["cursor"]["start_step"] == 8


def test_checkpoints_hold_no_pickle(trained, tmp_path):
    store = trained["store"]
    cid = trained["result"].receipt["checkpoints"][0]
    cid, man = ck.load_manifest(store, cid)
    ck.materialise(store, man, tmp_path / "c")
    a, o, r, state = ck.read_dir(tmp_path / "c")
    assert state["step"] == 4 and len(state["losses"]) == 4
    assert any(k.endswith("::exp_avg") for k in o) and "torch_cpu" in r
    (tmp_path / "c" / "optimizer.safetensors").write_bytes(b"\x80\x04garbage")
    with pytest.raises(Exception) as e:
        ck.read_dir(tmp_path / "c")
    assert type(e.value).__name__ == "BadInput"


@pytest.mark.slow
def test_sigkill_mid_run_then_resume_is_bit_exact(trained, tmp_path, tiny_text):
    """Kill the whole `ledger train` (parent and child) after its first checkpoint commits;
    resuming from that checkpoint reaches the uninterrupted run's adapter."""
    first = trained["result"]
    d = tmp_path / "s"
    s2 = Store.init(d)
    every2 = spec.parse(tiny_text.replace("checkpoint_every = 4", "checkpoint_every = 2"))
    comp.compile_spec(s2, every2, targets.get("cpu"))
    # same spec except checkpoint_every: compile a plan whose adapter we can compare
    p2 = [r for r in s2.journal.records() if r["kind"] == "compile"][-1]["payload"]["plan"]
    env = {k: v for k, v in os.environ.items() if k != "LEDGER_DIR"}
    proc = subprocess.Popen([sys.executable, "-m", "ledger.cli.main", "--store", str(d), "train", p2, "--json"],
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True)
    deadline = time.time() + 240
    ckpt = None
    while time.time() < deadline and proc.poll() is None:
        recs = [r for r in Store.open(d).journal.records() if r["kind"] == "checkpoint"]
        if recs:
            ckpt = recs[0]["payload"]["checkpoint"]
            os.killpg(proc.pid, signal.SIGKILL)
            break
        time.sleep(0.05)
    proc.wait(30)
    assert ckpt is not None, proc.stderr.read().decode()[-2000:]
    s2 = Store.open(d)
    assert not [r for r in s2.journal.records() if r["kind"] == "train"]  # the run never finished
    resumed = trainlib.train(s2, p2, resume=ckpt)
    uninterrupted = trainlib.train(s2, p2)
    assert resumed.adapter == uninterrupted.adapter
    assert resumed.receipt["losses"] == uninterrupted.receipt["losses"]
    # checkpoint frequency is not part of the result: same adapter as the shared fixture's run
    assert uninterrupted.adapter == first.adapter


def test_non_finite_loss_stops_at_ran_with_no_adapter(tmp_path, tiny_text):
    from tests.conftest import ledger_cmd

    ledger_cmd("init", cwd=tmp_path, check=True)
    (tmp_path / "nan.toml").write_text(tiny_text.replace("lr = 1e-2", "lr = 1e30"))
    p = ledger_cmd("train", "nan.toml", "--json", "--unsandboxed", cwd=tmp_path)
    assert p.returncode == 3, p.stderr
    out = json.loads(p.stdout)
    assert out["adapter"] is None and out["stopped"]["reason"] == "non-finite loss"
    assert out["rung"] in ("Ran", "Emitted") and out["rung"] != "Learned"
    assert "non-finite loss" in p.stderr and "no adapter" in p.stderr
    s = Store.open(tmp_path)
    r = s.get_json(out["receipt"])
    assert r["sandbox"]["sandboxed"] is False  # --unsandboxed is recorded
    assert r["stopped"]["step"] >= 2 and r["rung"] == "Ran"
    rec = [x for x in s.journal.records() if x["kind"] == "train"][-1]
    assert rec["payload"]["adapter"] is None and rec["payload"]["unsandboxed"] is True


def test_a_child_failing_after_a_sandbox_denial_names_it(trained, tmp_path, monkeypatch, capsys):
    """The child's own last line, the first denied access in the hint, the child's output and
    every denial in the details (printed by LEDGER_DEBUG=1); nothing is committed."""
    from ledger.cli import main as climain
    from ledger.errors import InternalError

    store, plan = trained["store"], trained["plan"]
    secret = tmp_path / "outside.txt"
    secret.write_text("not granted")
    snippet = ("import sys; print('child starting', flush=True)\n"
               "try:\n    open(sys.argv[1]).read()\n"
               "except PermissionError as e:\n    sys.exit(f'could not read: {e.strerror}')\n")

    monkeypatch.setattr(trainlib, "child_argv", lambda work: [sys.executable, "-c", snippet, str(secret)])
    before = store.journal.tail(1)
    with pytest.raises(InternalError) as ei:
        trainlib.execute(store, plan)
    e = ei.value
    assert "exited with 1" in e.message and "could not read: Permission denied" in e.message
    assert e.hint.startswith("its sandbox denied 1 access(es), e.g. open " + str(secret))
    assert e.details["denied_attempts"][0]["path"] == str(secret)
    assert "child starting" in e.details["stderr"] or "could not read" in e.details["stderr"]
    assert store.journal.tail(1) == before
    assert not list(store.tmp.glob("train-*"))          # the work folder is removed

    climain._print_details(e)
    err = capsys.readouterr().err
    assert "--- stderr ---" in err and "--- denied_attempts ---" in err and str(secret) in err


def test_a_failed_childs_last_words():
    """What the one-line error quotes: torchrun's root cause, not its closing banner."""
    banner = "=" * 60
    torchrun = (f"ChildFailedError:\n{banner}\nledger.sandbox FAILED\nFailures:\n[1]:\n"
                "  rank      : 0 (local_rank: 0)\n"
                f"  exitcode  : -15 (pid: 7)\nRoot Cause (first observed failure):\n[0]:\n"
                "  rank      : 1 (local_rank: 1)\n"
                f"  exitcode  : 9 (pid: 8)\n  traceback : To enable traceback see: https://x\n{banner}\n")
    assert trainlib._last_words(torchrun) == "rank 1 failed first, exit status 9; then rank 0, exit status -15"
    assert trainlib._last_words("Traceback...\nValueError: bad\n\n---\n") == "ValueError: bad"
    assert trainlib._last_words("") is None


def test_the_child_runs_the_parents_ledger_package_wherever_it_lies(tmp_path):
    """MUST (docs/sandbox.md): a training child imports the ledger package its parent runs, by
    its folder (the one the sandbox grants) -- here a copy on no path of the child's, which its
    own sys.path (the editable install) would not find, and which is all the sandbox grants."""
    import shutil
    import subprocess
    import sys
    from pathlib import Path

    import ledger

    copy = tmp_path / "elsewhere"
    shutil.copytree(Path(ledger.__file__).parent, copy / "ledger", ignore=shutil.ignore_patterns("__pycache__"))
    (copy / "ledger" / "_where.py").write_text("import ledger\nprint('LEDGER', ledger.__file__)\n")
    work = tmp_path / "work"
    work.mkdir()
    script = ("import sys\nsys.path.insert(0, sys.argv[1])\nimport ledger\n"
              "from ledger.sandbox import SandboxPolicy, run_sandboxed\nfrom ledger.train import job\n"
              "r = run_sandboxed(job.module_argv('ledger._where', sys.argv[2]), SandboxPolicy())\n"
              "print(r.returncode, r.sandboxed, r.stdout_tail.strip(), r.stderr_tail[-800:])\n")
    p = subprocess.run([sys.executable, "-c", script, str(copy), str(work)], capture_output=True, text=True,
                       timeout=120, cwd=str(tmp_path))
    assert p.returncode == 0, p.stderr[-2000:]
    assert p.stdout.split()[:4] == ["0", "True", "LEDGER", str(copy / "ledger" / "__init__.py")], p.stdout
