"""A hostile training child's outputs (issue 16, the parent side): links, hard links, FIFOs, huge
files and directories where ledger reads what the child wrote. Each is refused without being
followed or read, fails the run with SandboxViolation, is recorded as a sandbox-violation record,
copies nothing from the store into objects, and is never resumed from.

The child is replaced through `ledger.train.run.child_argv` (the test hook): a small Python
program that runs in the real sandbox and fakes the child protocol (docs/compile-train.md)."""

from __future__ import annotations

import json
import os
import sys
import time

import pytest

from ledger.errors import Refused, SandboxViolation
from ledger.plan import compile as comp
from ledger.plan import spec, targets
from ledger.store import Store
from ledger.train import job
from ledger.train import run as trainlib

HOSTILE = r'''
import json, os, sys, time
work, mode, store = sys.argv[1], sys.argv[2], sys.argv[3]
plan = json.load(open(os.path.join(work, "inputs", "job.json")))["plan_id"]
out = os.path.join(work, "out")
SECRET = os.path.join(store, "sealed", "suite", "eval", "s000.json")
FILES = ("adapter_model.safetensors", "optimizer.safetensors", "rng.safetensors")

def checkpoint(path, step, mutate=None):
    """A complete-looking checkpoint folder, written as .tmp and renamed (the real protocol)."""
    tmp = path + ".tmp"
    os.makedirs(tmp)
    for n in FILES:
        with open(os.path.join(tmp, n), "wb") as f:
            f.write(b"\0" * 64)
    with open(os.path.join(tmp, "state.json"), "w") as f:
        json.dump({"plan": plan, "step": step, "losses": [1.0] * step,
                   "cursor": {"next_step": step + 1, "micro_batch": step}}, f)
    if mutate:
        mutate(tmp)
    os.rename(tmp, path)

def replace(folder, name, target):
    os.unlink(os.path.join(folder, name))
    os.symlink(target, os.path.join(folder, name))

def finish(final_mutate=None, adapter_mutate=None):
    """final/, adapter/ and result.json as a finished run leaves them."""
    checkpoint(os.path.join(out, "final"), 12, final_mutate)
    a = os.path.join(out, "adapter")
    os.makedirs(a)
    for n in ("adapter_model.safetensors", "adapter_config.json"):
        with open(os.path.join(a, n), "wb") as f:
            f.write(b"{}")
    if adapter_mutate:
        adapter_mutate(a)
    result(os.path.join(out, "result.json"))

def result(path):
    with open(path, "w") as f:
        json.dump({"steps_done": 12, "start_step": 0, "losses": [1.0] * 12, "stopped": None,
                   "counters": {"optimizer_steps": 12, "micro_batches": 12, "tokens": 1}, "timings": {},
                   "memory": {}, "versions": {}, "device": {}, "determinism": {}}, f)

ck = os.path.join(out, "checkpoints")
os.makedirs(ck)
step4 = os.path.join(ck, "step-00000004")
if mode == "checkpoint-file-links-the-journal":
    checkpoint(step4, 4, lambda d: replace(d, "adapter_model.safetensors", os.path.join(store, "journal")))
elif mode == "checkpoint-state-links-the-refs":
    checkpoint(step4, 4, lambda d: replace(d, "state.json", os.path.join(store, "refs.json")))
elif mode == "checkpoint-folder-links-the-sealed-suite":
    os.symlink(os.path.join(store, "sealed", "suite", "eval"), step4)
elif mode == "checkpoint-hard-link":
    # a second name outside the folder: the folder's entries look right, the file has two names
    checkpoint(step4, 4, lambda d: os.link(os.path.join(d, "rng.safetensors"), os.path.join(out, "rng.second-name")))
elif mode == "checkpoint-hard-link-to-the-store":  # only possible unsandboxed: the parent must still refuse
    checkpoint(step4, 4, lambda d: (os.unlink(os.path.join(d, "optimizer.safetensors")),
                                    os.link(os.path.join(store, "refs.json"),
                                            os.path.join(d, "optimizer.safetensors"))))
elif mode == "out-replaced-by-a-link":  # only possible unsandboxed
    os.rmdir(ck)
    os.rename(out, out + ".gone")
    os.symlink(store, out)
elif mode == "checkpoint-fifo":
    checkpoint(step4, 4, lambda d: (os.unlink(os.path.join(d, "rng.safetensors")),
                                    os.mkfifo(os.path.join(d, "rng.safetensors"))))
elif mode == "checkpoint-extra-link":
    checkpoint(step4, 4, lambda d: os.symlink(os.path.join(store, "journal"), os.path.join(d, "notes")))
elif mode == "checkpoint-huge-file":
    checkpoint(step4, 4, lambda d: os.truncate(os.path.join(d, "adapter_model.safetensors"), 64 << 20))
elif mode == "final-state-links-the-refs":
    finish(final_mutate=lambda d: replace(d, "state.json", os.path.join(store, "refs.json")))
elif mode == "final-state-lacks-its-cursor":  # the receipt's cursor comes from it
    def no_cursor(d):
        with open(os.path.join(d, "state.json"), "w") as f:
            json.dump({"plan": plan, "step": 12, "losses": [1.0] * 12}, f)
    finish(final_mutate=no_cursor)
elif mode == "final-folder-links-the-store":
    os.symlink(store, os.path.join(out, "final"))
    result(os.path.join(out, "result.json"))
elif mode == "adapter-links-the-sealed-suite":
    finish(adapter_mutate=lambda d: replace(d, "adapter_model.safetensors", SECRET))
elif mode == "result-links-the-refs":
    finish()
    replace(out, "result.json", os.path.join(store, "refs.json"))
elif mode == "result-fifo":
    finish()
    os.unlink(os.path.join(out, "result.json"))
    os.mkfifo(os.path.join(out, "result.json"))
elif mode == "result-huge":
    finish()
    os.truncate(os.path.join(out, "result.json"), 64 << 20)
elif mode == "result-lacks-fields":  # the parent builds the receipt from it: it must not crash on it
    finish()
    with open(os.path.join(out, "result.json"), "w") as f:
        json.dump({"steps_done": 12, "losses": ["low"]}, f)
elif mode == "checkpoints-flood":
    for i in range(200):
        os.mkdir(os.path.join(ck, f"step-{i:08d}.tmp"))
    finish()
elif mode == "result-directory":
    finish()
    os.unlink(os.path.join(out, "result.json"))
    os.mkdir(os.path.join(out, "result.json"))
elif mode == "progress-fifo":
    os.mkfifo(os.path.join(out, "progress.jsonl"))
    time.sleep(1.0)
    finish()
elif mode == "progress-huge":
    with open(os.path.join(out, "progress.jsonl"), "w") as f:
        f.write(json.dumps({"step": 1, "loss": 1.0}) + "\n")
    os.truncate(os.path.join(out, "progress.jsonl"), 64 << 20)
    time.sleep(1.0)
    finish()
elif mode == "progress-links-the-journal":
    os.symlink(os.path.join(store, "journal"), os.path.join(out, "progress.jsonl"))
    time.sleep(1.0)
    finish()
elif mode == "error-links-the-refs":
    os.symlink(os.path.join(store, "refs.json"), os.path.join(out, "error.json"))
    sys.exit(3)
elif mode == "link-then-linger":  # breaks the rules, then would keep running for ten minutes
    checkpoint(step4, 4, lambda d: replace(d, "state.json", os.path.join(store, "refs.json")))
    time.sleep(600)
elif mode == "clean-checkpoint-then-a-link":
    checkpoint(step4, 4)
    deadline = time.time() + 60
    with open(os.path.join(out, "progress.jsonl"), "a") as f:
        while time.time() < deadline and not os.path.exists(os.path.join(out, "go")):
            f.write(json.dumps({"step": 4, "steps": 12}) + "\n")  # until the test says step 4 is committed
            f.flush()
            time.sleep(0.1)
    checkpoint(os.path.join(ck, "step-00000008"), 8,
               lambda d: replace(d, "adapter_model.safetensors", os.path.join(store, "journal")))
else:
    sys.exit(f"unknown mode {mode}")
'''

TINY = "[data]\nsteps = 12\nmicro_batch = 8\n[train]\ncheckpoint_every = 4\n"


@pytest.fixture(scope="module")
def hostile_world(tmp_path_factory):
    d = tmp_path_factory.mktemp("hostile")
    store = Store.init(d)
    plan = comp.compile_spec(store, spec.parse(TINY), targets.get("cpu")).plan
    secret = store.root / "sealed" / "suite" / "eval" / "s000.json"
    secret.parent.mkdir(parents=True)
    secret.write_text(json.dumps({"situation": "sealed", "canary": "CANARY-5f1e0c"}))
    return store, plan


def _objects(store) -> set[str]:
    return {p.name for p in (store.root / "objects").rglob("*") if p.is_file()}


def _hostile(monkeypatch, store, mode):
    monkeypatch.setattr(trainlib, "child_argv",
                        lambda work: [sys.executable, "-c", HOSTILE, str(work), mode, str(store.root)])


def _violations(store, since: int) -> list[dict]:
    return [r for r in store.journal.records() if r["seq"] > since and r["kind"] == job.VIOLATION_KIND]


def _seq(store) -> int:
    tail = store.journal.tail(1)
    return tail[-1]["seq"] if tail else 0


CASES = {
    "checkpoint-file-links-the-journal": "checkpoints/step-00000004/adapter_model.safetensors",
    "checkpoint-state-links-the-refs": "checkpoints/step-00000004/state.json",
    "checkpoint-folder-links-the-sealed-suite": "checkpoints/step-00000004",
    "checkpoint-hard-link": "checkpoints/step-00000004/rng.safetensors",
    "checkpoint-fifo": "checkpoints/step-00000004/rng.safetensors",
    "checkpoint-extra-link": "checkpoints/step-00000004/notes",
    "checkpoint-huge-file": "checkpoints/step-00000004/adapter_model.safetensors",
    "final-state-links-the-refs": "final/state.json",
    "final-folder-links-the-store": "final",
    "final-state-lacks-its-cursor": "final/state.json",
    "adapter-links-the-sealed-suite": "adapter/adapter_model.safetensors",
    "result-links-the-refs": "result.json",
    "result-fifo": "result.json",
    "result-huge": "result.json",
    "result-directory": "result.json",
    "result-lacks-fields": "result.json",
    "checkpoints-flood": "checkpoints",
    "progress-fifo": "progress.jsonl",
    "progress-huge": "progress.jsonl",
    "progress-links-the-journal": "progress.jsonl",
    "error-links-the-refs": "error.json",
}


@pytest.mark.timeout(180)
@pytest.mark.parametrize("mode", sorted(CASES))
def test_hostile_output_is_refused_recorded_and_copies_nothing(hostile_world, monkeypatch, mode):
    store, plan = hostile_world
    _hostile(monkeypatch, store, mode)
    before, since = _objects(store), _seq(store)
    seen = []
    with pytest.raises(SandboxViolation) as ei:
        trainlib.train(store, plan.id, progress=seen.append)
    e = ei.value
    assert e.exit_code == 3 and f"out/{CASES[mode]}" in e.message
    recs = _violations(store, since)
    assert len(recs) == 1, recs
    p = recs[0]["payload"]
    assert p["plan"] == plan.id and p["trainer"] == "sft" and p["violations"][0]["path"] == CASES[mode]
    assert p["sandboxed"] is True
    # nothing of the run was committed: no checkpoint, no train record, no object at all
    kinds = [r["kind"] for r in store.journal.records() if r["seq"] > since]
    assert kinds == [job.VIOLATION_KIND], kinds
    assert _objects(store) == before
    assert not list(store.tmp.glob("train-*"))  # the work folder is removed (links in it not followed)
    assert (store.root / "sealed" / "suite" / "eval" / "s000.json").is_file()  # and their targets kept


@pytest.mark.timeout(180)
def test_a_child_that_broke_the_rules_is_stopped_at_once(hostile_world, monkeypatch):
    """The first violation stops the child (its whole process group): the run fails in seconds,
    not when the child chooses to end."""
    store, plan = hostile_world
    _hostile(monkeypatch, store, "link-then-linger")
    since, t0 = _seq(store), time.monotonic()
    with pytest.raises(SandboxViolation):
        trainlib.train(store, plan.id)
    assert time.monotonic() - t0 < 60
    (rec,) = _violations(store, since)
    assert rec["payload"]["violations"][0]["path"] == "checkpoints/step-00000004/state.json"


@pytest.mark.timeout(180)
def test_hard_link_to_a_store_file_is_refused_even_unsandboxed(hostile_world, monkeypatch):
    """Without Landlock a child can hard-link a store file into its output; the parent still
    refuses it (two names for one file), and nothing of the store is copied."""
    store, plan = hostile_world
    _hostile(monkeypatch, store, "checkpoint-hard-link-to-the-store")
    before, since = _objects(store), _seq(store)
    with pytest.raises(SandboxViolation, match="hard link"):
        trainlib.train(store, plan.id, unsandboxed=True)
    (rec,) = _violations(store, since)
    assert rec["payload"]["violations"][0]["path"] == "checkpoints/step-00000004/optimizer.safetensors"
    assert rec["payload"]["sandboxed"] is False
    assert _objects(store) == before


@pytest.mark.timeout(180)
def test_out_replaced_by_a_link_is_refused_unsandboxed(hostile_world, monkeypatch):
    store, plan = hostile_world
    _hostile(monkeypatch, store, "out-replaced-by-a-link")
    before, since = _objects(store), _seq(store)
    with pytest.raises(SandboxViolation, match="out/ itself"):
        trainlib.train(store, plan.id, unsandboxed=True)
    (rec,) = _violations(store, since)
    assert rec["payload"]["violations"][0]["path"] == "."
    assert _objects(store) == before and (store.root / "refs.json").is_file()


@pytest.mark.timeout(180)
def test_no_resume_from_a_run_that_violated(hostile_world, monkeypatch):
    """A run commits a clean-looking checkpoint, then writes a link: the violation names the
    committed checkpoint, the cycle's resume lookup skips it, and an explicit --resume is refused."""
    store, plan = hostile_world
    _hostile(monkeypatch, store, "clean-checkpoint-then-a-link")
    since = _seq(store)

    def progress(line):  # progress is read before checkpoints each poll: a later line sees step 4 committed
        if any(r["kind"] == "checkpoint" for r in store.journal.tail(2) if r["seq"] > since):
            (next(store.tmp.glob("train-*")) / "out" / "go").write_text("")

    with pytest.raises(SandboxViolation):
        trainlib.train(store, plan.id, progress=progress)
    recs = [r for r in store.journal.records() if r["seq"] > since]
    assert [r["kind"] for r in recs] == ["checkpoint", job.VIOLATION_KIND]
    cid = recs[0]["payload"]["checkpoint"]
    assert recs[1]["payload"]["checkpoints"] == [cid]
    assert recs[1]["payload"]["violations"][0]["path"] == "checkpoints/step-00000008/adapter_model.safetensors"
    # the cycle's lookup (ledger.cycle) finds no checkpoint to resume this plan from
    assert job.resumable_checkpoint(store, plan.id) is None
    with pytest.raises(Refused, match="violated its sandbox"):
        trainlib.train(store, plan.id, resume=cid)


def test_the_reader_refuses_what_a_child_can_plant(tmp_path):
    """ChildOutputs on its own: every kind of entry that is not a regular, singly-linked file
    within its bound is a violation, named by its path under out/."""
    out = tmp_path / "out"
    (out / "d").mkdir(parents=True)
    (out / "ok.json").write_text('{"a": 1}')
    (out / "big.json").write_text("x" * 200)
    os.symlink(tmp_path, out / "link.json")
    os.mkfifo(out / "fifo.json")
    os.link(out / "ok.json", out / "d" / "second-name")
    reader = job.ChildOutputs(out, job.Limits(steps=1, adapter_bytes=100))
    with pytest.raises(job.Refusal, match="hard link"):
        reader.read_json("ok.json", 100)
    os.unlink(out / "d" / "second-name")
    assert reader.read_json("ok.json", 100) == {"a": 1}
    assert reader.read_json("absent.json", 100) is None
    for name, what in (("big.json", "more than the 100"), ("link.json", "symbolic link"), ("fifo.json", "FIFO"),
                       ("d", "directory")):
        with pytest.raises(job.Refusal, match=what) as ei:
            reader.read_json(name, 100)
        assert ei.value.violation.path == name
    os.symlink(tmp_path, out / "dirlink")
    with pytest.raises(job.Refusal, match="symbolic link where a folder"):
        reader.read_file("dirlink/ok.json", 100)
    (out / "d" / "x").write_text("")
    with pytest.raises(job.Refusal, match="unexpected entry") as ei:
        reader.read_folder("d", {})
    assert ei.value.violation.path == "d/x"
    with pytest.raises(job.Refusal, match="missing"):
        reader.read_folder("d", {"x": 10, "y": 10})
    # progress: complete lines only, each {name: number} with an integer step
    (out / "progress.jsonl").write_text('{"step": 1, "loss": 2.5}\n{"step": 2')
    assert reader.new_progress() == [{"step": 1, "loss": 2.5}]
    with open(out / "progress.jsonl", "a") as f:
        f.write(', "loss": 2.0}\n{"step": "3", "loss": {"x": 1}}\n')
    with pytest.raises(job.Refusal, match="line 3 is not a progress record"):
        reader.new_progress()


HOSTILE_DPO = r'''
import json, os, sys
work, store = sys.argv[1], sys.argv[2]
a = os.path.join(work, "out", "adapter")
os.makedirs(a)
os.symlink(os.path.join(store, "refs.json"), os.path.join(a, "adapter_model.safetensors"))
with open(os.path.join(a, "adapter_config.json"), "w") as f:
    f.write("{}")
with open(os.path.join(work, "out", "result.json"), "w") as f:
    json.dump({"steps_done": 2, "losses": [0.7, 0.6], "stopped": None, "dpo": {}, "metrics": {}, "counters": {},
               "timings": {}, "versions": {}, "device": {}, "determinism": {}}, f)
'''


@pytest.mark.timeout(180)
def test_a_hostile_dpo_child_is_refused_the_same_way(trained, monkeypatch, tmp_path):
    """DPO goes through the same job protocol: its adapter folder is read no-follow too."""
    from ledger.train import dpo

    store = trained["store"]
    pair = {"situation": "user: add 1 and 2", "chosen": "call adder.add(1, 2)", "rejected": "refuse: no"}
    (tmp_path / "pairs.jsonl").write_text(json.dumps(pair) + "\n")
    monkeypatch.setattr(dpo, "_child_argv",
                        lambda work: [sys.executable, "-c", HOSTILE_DPO, str(work), str(store.root)])
    before, since = _objects(store), _seq(store)
    with pytest.raises(SandboxViolation, match="out/adapter/adapter_model.safetensors"):
        dpo.train_dpo(store, str(tmp_path / "pairs.jsonl"), trained["result"].adapter, config=dpo.DpoConfig(steps=2))
    (rec,) = _violations(store, since)
    assert rec["payload"]["trainer"] == "dpo" and rec["payload"]["checkpoints"] == []
    assert [r["kind"] for r in store.journal.records() if r["seq"] > since] == [job.VIOLATION_KIND]
    assert _objects(store) == before
    assert not list(store.tmp.glob("dpo-*"))


def test_checkpoints_from_before_runs_were_named_are_still_resumed(store):
    """A checkpoint record without `run` (committed before the child-job protocol named runs)
    is still found by the learn cycle's lookup; a violation naming it still taints it."""
    with store.transaction("checkpoint") as tx:
        cid = tx.put_json({"kind": "checkpoint", "note": "stand-in manifest"})
        tx.outputs.append(cid)
        tx.payload.update({"checkpoint": cid, "plan": "b3:" + "0" * 64, "step": 4})
    assert job.resumable_checkpoint(store, "b3:" + "0" * 64) == cid
    assert job.resumable_checkpoint(store, "b3:" + "1" * 64) is None
    with store.transaction(job.VIOLATION_KIND) as tx:
        tx.payload.update({"run": "train-x", "trainer": "sft", "violations": [{"path": "p", "what": "w"}],
                           "checkpoints": [cid], "sandboxed": True, "policy": {}})
    assert job.resumable_checkpoint(store, "b3:" + "0" * 64) is None
    with pytest.raises(Refused, match="violated its sandbox"):
        job.check_resumable(store, cid)
