"""`[train] nodes = N`: node agents meeting at one torchrun c10d rendezvous (ledger.train.nodes),
checked on the CPU as two node agents on loopback (gloo), each rank confined by the sandbox in a
network namespace of loopback alone. docs/gpu.md, "Several nodes"."""

from __future__ import annotations

import errno
import re
import sys
import textwrap

import pytest

from ledger.errors import CompileRejected, SpecError
from ledger.plan import compile as comp
from ledger.plan import spec, targets

CPU = targets.get("cpu")
H200 = targets.get("h200")


def test_nodes_must_be_positive_and_the_line_is_named():
    text = "[data]\nsteps = 2\n[train]\ndevices = 1\nnodes = 0\n"
    with pytest.raises(SpecError) as e:
        spec.parse(text)
    assert e.value.message == "spec field `train.nodes` (line 5): must be > 0"


def test_a_world_larger_than_supported_is_refused_on_its_line():
    text = "[train]\nnodes = 64\ndevices = 32\n"
    with pytest.raises(SpecError) as e:
        spec.parse(text)
    assert e.value.message == ("spec field `train.nodes` (line 2): 64 nodes x 32 devices = 2048 ranks; "
                               f"at most {spec.MAX_WORLD} are supported")


def test_a_global_micro_batch_larger_than_the_dataset_is_rejected_with_the_line(store):
    # the built-in dataset has 4000 turns: 8 nodes x 2 devices x 256 rows = 4096 > 4000
    text = "[data]\nsteps = 2\nmicro_batch = 256\n[train]\ndevices = 2\nnodes = 8\n"
    seq = store.state.seq
    with pytest.raises(CompileRejected) as e:
        comp.compile_spec(store, spec.parse(text), CPU)
    assert e.value.message == ("spec field `train.nodes` (line 6): 8 node(s) x 2 device(s) x micro_batch 256 = "
                               "4096 rows per global micro-batch, more than the dataset's 4000 rows")
    assert store.state.seq == seq        # nothing written


def test_a_multi_node_plan_records_nodes_world_and_the_rendezvous(store):
    p = comp.compile_spec(store, spec.parse("[data]\nsteps = 2\nmicro_batch = 4\n[train]\nnodes = 2\ndevices = 3\n"),
                          CPU).plan
    b = p.body
    assert b["runtime"]["launcher"] == "ddp" and b["runtime"]["nodes"] == 2 and b["runtime"]["rendezvous"] == "c10d"
    assert b["shapes"]["nodes"] == 2 and b["shapes"]["tokens_per_step"] == 4 * 96 * 2 * 3
    assert b["fit"]["nodes"] == 2 and b["fit"]["per_device"] is True
    assert p.view.world == 6 and p.view.nodes == 2 and p.view.devices == 3
    one = comp.compile_spec(store, spec.parse("[data]\nsteps = 2\n"), CPU).plan.body
    assert one["runtime"]["rendezvous"] == "static" and one["runtime"]["launcher"] == "python"


def test_node_agents_meet_at_one_c10d_rendezvous():
    from ledger.train import nodes

    a0 = nodes.agent_argv(nodes=2, nproc=4, endpoint="127.0.0.1:1234", run_id="r", host=True, argv=["x"])
    a1 = nodes.agent_argv(nodes=2, nproc=4, endpoint="127.0.0.1:1234", run_id="r", host=False, argv=["x"])
    for a in (a0, a1):
        assert {"--nnodes=2", "--nproc-per-node=4", "--rdzv-backend=c10d", "--rdzv-endpoint=127.0.0.1:1234",
                "--rdzv-id=r", "--local-addr=127.0.0.1", "--max-restarts=0", "--no-python"} <= set(a)
        assert a[-1] == "x"
    assert "--rdzv-conf=is_host=true,join_timeout=120" in a0 and "--rdzv-conf=is_host=false,join_timeout=120" in a1


PROBE = textwrap.dedent("""
    import errno, socket
    names = [n for _, n in socket.if_nameindex()]
    s = socket.socket(); s.settimeout(2)
    try:
        s.connect(("10.255.255.1", 80)); out = "connected"
    except OSError as e:
        out = errno.errorcode.get(e.errno, str(e.errno))
    srv = socket.socket(); srv.bind(("127.0.0.1", 0)); srv.listen()
    socket.create_connection(srv.getsockname()).close()
    print(",".join(names), out, "loopback-ok")
""")


def test_loopback_namespace_reaches_loopback_and_nothing_else(tmp_path):
    """Two processes started by a launcher in net="loopback": each sees only `lo`, a connection to
    any other address fails at once (no route), loopback TCP works, and the confinement says so."""
    from ledger.sandbox import SandboxPolicy, run_sandboxed

    probe = tmp_path / "probe.py"
    probe.write_text(PROBE)
    pol = SandboxPolicy(read_only=(str(probe),), network=True)
    r = run_sandboxed([sys.executable, str(probe)], pol, launcher=["/bin/sh", "-c", '"$@" & "$@"; wait', "sh"],
                      processes=2, net="loopback", timeout=60)
    assert r.returncode == 0, r.stderr_tail
    lines = r.stdout_tail.split()
    assert lines == ["lo", errno.errorcode[errno.ENETUNREACH], "loopback-ok"] * 2
    assert r.confinement.net == "loopback" and r.processes == 2


def test_loopback_namespace_needs_a_launcher(tmp_path):
    from ledger.errors import BadInput
    from ledger.sandbox import SandboxPolicy, run_sandboxed

    with pytest.raises(BadInput):
        run_sandboxed([sys.executable, "-c", "pass"], SandboxPolicy(), net="loopback")


@pytest.mark.slow
def test_two_node_agents_on_loopback_train_into_one_receipt(store):
    """nodes = 2 on a CPU target: two torchrun agents meet at a c10d rendezvous on loopback, each
    starts one gloo rank confining itself; rank 0 writes every output and ONE receipt names the
    nodes, every rank's node, and the rendezvous endpoint and id."""
    from ledger.train import run as trainlib

    plan = comp.compile_spec(store, spec.parse("[data]\nsteps = 3\nmicro_batch = 4\n[train]\nnodes = 2\n"
                                               "checkpoint_every = 2\n"), CPU).plan
    seq = store.state.seq
    res = trainlib.train(store, plan.id)
    r = res.receipt
    d = r["device"]["distributed"]
    assert d["world_size"] == 2 and d["backend"] == "gloo" and d["launcher"] == "torchrun" and d["nodes"] == 2
    assert d["ranks"] == [{"rank": 0, "node": 0, "local_rank": 0}, {"rank": 1, "node": 1, "local_rank": 0}] or \
        d["ranks"] == [{"rank": 0, "node": 1, "local_rank": 0}, {"rank": 1, "node": 0, "local_rank": 0}]
    assert sorted(x["node"] for x in d["ranks"]) == [0, 1]
    rdzv = d["rendezvous"]
    assert rdzv["backend"] == "c10d" and re.fullmatch(r"127\.0\.0\.1:\d+", rdzv["endpoint"])
    assert rdzv["id"].startswith("ledger-train-") and rdzv["network"] == "loopback namespace"
    assert r["sandbox"]["processes"] == 2 and r["sandbox"]["confinement"]["net"] == "loopback"
    assert len(r["losses"]) == 3 and r["counters"]["optimizer_steps"] == 3
    recs = list(store.journal.records())[seq:]
    assert [x["kind"] for x in recs] == ["checkpoint", "train"]
    assert recs[-1]["payload"]["receipt"] == res.receipt_id


@pytest.mark.slow
def test_a_node_that_dies_stops_the_other_node(store, monkeypatch):
    """Rank 1 (on the second node) is SIGKILLed at step 4: its agent fails, the launcher stops the
    other agent, the error names the failure, and only the step-2 checkpoint is committed."""
    import time

    from ledger.errors import InternalError
    from ledger.train import run as trainlib

    plan = comp.compile_spec(store, spec.parse("[data]\nsteps = 40\nmicro_batch = 4\n[train]\nnodes = 2\n"
                                               "checkpoint_every = 2\n"), CPU).plan
    seq = store.state.seq
    monkeypatch.setenv("LEDGER_FAULT_RANK", "1:4")
    t0 = time.monotonic()
    with pytest.raises(InternalError) as e:
        trainlib.train(store, plan.id)
    assert time.monotonic() - t0 < 150
    assert "exit status" in e.value.message or "exited with" in e.value.message
    recs = list(store.journal.records())[seq:]
    assert [x["kind"] for x in recs] == ["checkpoint"] and recs[0]["payload"]["step"] == 2
    assert not list(store.tmp.glob("train-*"))


def test_a_cuda_multi_node_plan_needs_every_nodes_gpus_here(store, monkeypatch):
    """All node agents run on this host: a CUDA plan of 2 nodes x 2 devices needs 4 GPUs here."""
    import torch

    from ledger.errors import RealizationUnavailable
    from ledger.train import run as trainlib

    plan = comp.compile_spec(store, spec.parse('[precision]\ndtype = "bf16"\n[data]\nsteps = 2\n[train]\nnodes = 2\n'
                                               "devices = 2\n"), H200).plan
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    with pytest.raises(RealizationUnavailable) as e:
        trainlib.check_runnable_here(plan.view)
    assert e.value.message == "the plan runs on 2 nodes x 2 devices; 2 CUDA device(s) are visible here"


def test_a_rank_refuses_loopback_mode_outside_a_loopback_namespace(tmp_path):
    """net="loopback" rules without the launcher's namespace: the bootstrap refuses before the
    command runs (the check is the rank's own, not the launcher's word)."""
    import json
    import os
    import subprocess

    from ledger.sandbox import SandboxPolicy
    from ledger.sandbox import run as sbrun
    from ledger.sandbox.__main__ import BOOTSTRAP_FAILED

    pol = SandboxPolicy(read_only=(str(tmp_path),), network=True)
    rules, _ = sbrun.bootstrap_rules(pol.grants(), pol, net="loopback")
    status_r, status_w = os.pipe()
    p = subprocess.run([*sbrun.bootstrap_command(), "--rules", json.dumps(rules), "--status-fd", str(status_w),
                        "--", "/bin/echo", "RAN"], pass_fds=(status_w,), capture_output=True, text=True, timeout=60)
    os.close(status_w)
    with os.fdopen(status_r) as f:
        status = f.read()
    assert p.returncode == BOOTSTRAP_FAILED and "RAN" not in p.stdout
    assert "network namespace of loopback alone" in status
