"""The GPU side of compile and train, checked on the CPU: which realization a plan selects for a
CUDA target (the GPU probe is monkeypatched), the rejections, the compiled memory model, the
fused LoRA's backward, and data-parallel training (two sandboxed ranks, gloo on the CPU)."""

from __future__ import annotations

import importlib.util
import re

import pytest

from ledger.errors import CompileRejected, RealizationUnavailable
from ledger.plan import compile as comp
from ledger.plan import memory, spec, targets
from ledger.store import Store

H200 = targets.get("h200")
CPU = targets.get("cpu")
# decode-shaped: 1 x 8 rows per LoRA linear, bf16, every in_features a multiple of 32
DECODE = ('[model]\nintermediate = 192\n[precision]\ndtype = "bf16"\n[data]\nmicro_batch = 1\nseq_len = 8\nsteps = 2\n'
          '[lora]\nr = 8\n')
HAS_CUPY = importlib.util.find_spec("cupy") is not None


def gate_for(store, monkeypatch, target="h200"):
    """Record a build, test, bench and an Accepted gate of the fused kernel in `store`, with the
    harness stand-ins of tests/kernels/test_cli_store.py (shaped exactly like the real records)."""
    from ledger.kernels import harness
    from ledger.kernels import store_records as sr
    from tests.kernels.test_cli_store import Fakes

    f = Fakes()
    monkeypatch.setattr(harness, "build", f.build)
    monkeypatch.setattr(harness, "test", f.test)
    monkeypatch.setattr(harness, "bench", f.bench)
    monkeypatch.setattr(sr, "probe_device", lambda: {"name": "FakeGPU", "cc": [9, 0]})
    sr.record_build(store, comp.FUSED_KERNEL, target)
    sr.record_test(store, comp.FUSED_KERNEL, target)
    sr.record_bench(store, comp.FUSED_KERNEL, target, launches=20)
    return sr.record_gate(store, comp.FUSED_KERNEL, target)


@pytest.fixture
def gpu_here(monkeypatch):
    """Pretend cupy and a GPU are present where compiling."""
    monkeypatch.setattr(comp, "_cupy_here", lambda: None)


def test_cpu_target_selects_torch_eager_and_refuses_gpu_realizations(store):
    real = comp.select_realizations(spec.parse(""), CPU, store)
    assert {r["name"] for r in real.values()} == {"torch-eager"}
    for want in ("cupy-fused", "torch-compiled"):
        with pytest.raises(CompileRejected) as e:
            comp.select_realizations(spec.parse(f'[compile]\nrealization = "{want}"\n'), CPU, store)
        assert e.value.exit_code == 3 and e.value.details["requirement"] == f"realization.{want}.device"


def test_cuda_auto_is_fused_lora_in_bf16_and_says_why_not_cupy_fused(store, monkeypatch):
    monkeypatch.setattr(comp, "_cupy_here", lambda: "cupy is not installed")
    real = comp.select_realizations(spec.parse(DECODE), H200, store)
    assert real["linear_lora"]["name"] == "fused-lora" and real["attention"]["name"] == "cudnn-sdpa"
    assert real["cross_entropy"]["name"] == real["lm_head"]["name"] == "chunked-linear-ce"
    assert {real[op]["name"] for op in ("rmsnorm", "rope", "mlp_act")} == {"torch-compiled"}
    assert real["linear_lora"]["not_selected"]["cupy-fused"] == "cupy is not installed"
    monkeypatch.setattr(comp, "_cupy_here", lambda: None)   # GPU present, but nothing gated here
    real = comp.select_realizations(spec.parse(DECODE), H200, store)
    assert real["linear_lora"]["name"] == "fused-lora"
    assert "not built and gated for target h200" in real["linear_lora"]["not_selected"]["cupy-fused"]


@pytest.mark.parametrize("extra, why", [
    ('[precision]\ndtype = "fp32"\n', "runs bf16"),
    ('[precision]\ndtype = "bf16"\n[lora]\ndropout = 0.1\n', "no dropout"),
])
def test_cuda_auto_is_torch_compiled_where_fused_lora_cannot_run_and_says_why(store, extra, why):
    real = comp.select_realizations(spec.parse(extra), H200, store)
    assert {r["name"] for r in real.values()} == {"torch-compiled"}
    assert why in real["linear_lora"]["not_selected"]["fused-lora"]
    with pytest.raises(CompileRejected) as e:   # asked for explicitly: a rejection, never a fallback
        comp.select_realizations(spec.parse(extra + '[compile]\nrealization = "fused-lora"\n'), H200, store)
    assert e.value.exit_code == 3 and e.value.details["requirement"].startswith("realization.fused-lora.")
    assert why in e.value.message


def test_fused_lora_is_refused_on_a_cpu_target_and_runs_the_fused_loop_on_cuda(store):
    with pytest.raises(CompileRejected) as e:
        comp.select_realizations(spec.parse('[compile]\nrealization = "fused-lora"\n'), CPU, store)
    assert e.value.details["requirement"] == "realization.fused-lora.device"
    s = spec.parse('[precision]\ndtype = "bf16"\n[data]\nsteps = 2\n')
    plan = comp.compile_spec(store, s, H200).plan
    assert plan.view.runtime.loop_kind == "fused" and plan.view.runtime.autocast is None
    assert plan.body["fit"]["memory_model"] == "fused"


def test_auto_selects_cupy_fused_only_when_gated_here_and_decode_shaped(store, monkeypatch, gpu_here):
    g = gate_for(store, monkeypatch)
    real = comp.select_realizations(spec.parse(DECODE), H200, store)
    fused = real["linear_lora"]
    assert fused["name"] == "cupy-fused" and fused["gate"] == g.record_id
    assert fused["build"] == store.state.refs[f"kernel-build/{comp.FUSED_KERNEL}/h200"]
    assert fused["code_object"] == store.get_json(fused["build"])["cubin"]
    assert all(r["name"] == "torch-eager" for op, r in real.items() if op != "linear_lora")
    # training shapes (16 x 96 rows per linear): torch's GEMM, and the plan says why
    real = comp.select_realizations(spec.parse('[precision]\ndtype = "bf16"\n'), H200, store)
    assert real["linear_lora"]["name"] == "fused-lora"
    assert "at most 8 rows" in real["linear_lora"]["not_selected"]["cupy-fused"]
    # fp32, or a gate for another target, does not count
    fp32 = comp.select_realizations(spec.parse(DECODE.replace("bf16", "fp32")), H200, store)
    assert fp32["linear_lora"]["name"] == "torch-compiled"
    a100 = comp.select_realizations(spec.parse(DECODE), targets.get("a100-40gb"), store)
    assert a100["linear_lora"]["name"] == "fused-lora"
    # without the probe (no GPU where compiling) it is never selected
    monkeypatch.setattr(comp, "_cupy_here", lambda: "no CUDA device is visible")
    assert comp.select_realizations(spec.parse(DECODE), H200, store)["linear_lora"]["name"] == "fused-lora"


def test_explicit_cupy_fused_names_the_unmet_requirement(store, monkeypatch):
    fused = DECODE + '[compile]\nrealization = "cupy-fused"\n'
    monkeypatch.setattr(comp, "_cupy_here", lambda: "cupy is not installed")
    with pytest.raises(CompileRejected) as e:
        comp.select_realizations(spec.parse(fused), H200, store)
    assert e.value.details["requirement"] == "realization.cupy-fused.available"
    assert "cupy is not installed" in e.value.message
    monkeypatch.setattr(comp, "_cupy_here", lambda: None)
    with pytest.raises(CompileRejected) as e:
        comp.select_realizations(spec.parse(fused), H200, store)
    assert e.value.details["requirement"] == "realization.cupy-fused.gated"
    gate_for(store, monkeypatch)
    assert comp.select_realizations(spec.parse(fused), H200, store)["linear_lora"]["name"] == "cupy-fused"
    with pytest.raises(CompileRejected) as e:
        comp.select_realizations(spec.parse(fused.replace("micro_batch = 1", "micro_batch = 2")), H200, store)
    assert e.value.details["requirement"] == "realization.cupy-fused.shapes" and "16 rows" in e.value.message
    with pytest.raises(CompileRejected) as e:
        comp.select_realizations(spec.parse(fused), targets.get("rtx3070-8gb"), store)
    assert e.value.details["requirement"] == "realization.cupy-fused.gated"   # gated for h200 only


@pytest.mark.skipif(HAS_CUPY, reason="cupy is installed here")
def test_explicit_cupy_fused_without_cupy_is_a_cli_rejection(tmp_path):
    from tests.conftest import ledger_cmd

    ledger_cmd("init", cwd=tmp_path, check=True)
    (tmp_path / "s.toml").write_text(DECODE + '[compile]\nrealization = "cupy-fused"\n')
    p = ledger_cmd("compile", "s.toml", "--target", "h200", cwd=tmp_path)
    assert p.returncode == 3 and "cupy-fused cannot be selected: cupy is not installed" in p.stderr


def _tiny_turn_dataset(store) -> str:
    from ledger.artefacts import dataset as datalib

    class T:
        def __init__(self, s, a):
            self.situation, self.action, self.outcome, self.refusal = s, a, "", False

    table = datalib.turns_table([T("ab", "cd"), T("x", "yz"), T("q", "r"), T("hi", "ok")])
    with store.transaction("add") as tx:
        oid = tx.put_bytes(datalib.parquet_bytes(table), "dataset")
        tx.outputs.append(oid)
    return oid


def test_a_plan_that_selected_cupy_fused_fails_loudly_without_a_gpu(store, monkeypatch, gpu_here):
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    from ledger.train import run as trainlib
    from ledger.train import sft

    gate_for(store, monkeypatch)
    data = _tiny_turn_dataset(store)
    s = spec.parse(DECODE.replace("[data]\n", f'[data]\ndataset = "{data}"\n'))
    plan = comp.compile_spec(store, s, H200).plan
    assert plan.body["realizations"]["linear_lora"]["name"] == "cupy-fused"
    assert plan.body["runtime"]["loop"] == "eager"
    seq = store.state.seq
    with pytest.raises(RealizationUnavailable) as e:
        trainlib.train(store, plan.id)
    assert e.value.exit_code == 3 and "cupy-fused" in e.value.message and "no CUDA device" in e.value.message
    assert store.state.seq == seq                       # nothing ran, nothing recorded
    with pytest.raises(RealizationUnavailable):        # and the child refuses on its own
        sft.check_realizations(plan.view)


def test_compiled_memory_model_is_per_device_and_scales(store):
    arch = comp.model.arch_of(comp.model.builtin_config(spec.parse("").config["model"]))
    kw = dict(r=8, modules=spec.LLAMA_MODULES, dropout=0.0, dtype="bf16", seq_len=64)
    one = {x.name: x.bytes for x in memory.lines_compiled(arch, micro_batch=1, padded=False, **kw)}
    four = {x.name: x.bytes for x in memory.lines_compiled(arch, micro_batch=4, padded=False, **kw)}
    assert four["activations"] == 4 * one["activations"] and four["data"] == 4 * one["data"]
    assert four["weights"] == one["weights"] and four["optimizer_state"] == one["optimizer_state"]
    padded = {x.name: x.bytes for x in memory.lines_compiled(arch, micro_batch=4, padded=True, **kw)}
    assert padded["activations"] - four["activations"] == 4 * 64 * 64 * (1 + arch.layers * 2)
    eager = {x.name: x.bytes for x in memory.lines(arch, micro_batch=4, dataset_rows=0, **kw)}
    assert four["activations"] < eager["activations"]   # compiled layers keep less than eager autograd
    s1 = spec.parse('[precision]\ndtype = "bf16"\n[compile]\nrealization = "torch-compiled"\n')
    s2 = s1.with_overrides({"train.devices": 2})
    p1 = comp.body_for(s1, H200, arch, {}, 100, None, store, True)
    p2 = comp.body_for(s2, H200, arch, {}, 100, None, store, True)
    assert p1["memory"]["total_bytes"] == p2["memory"]["total_bytes"]        # per device
    assert p2["shapes"]["tokens_per_step"] == 2 * p1["shapes"]["tokens_per_step"]
    assert p2["runtime"]["launcher"] == "ddp" and p2["fit"]["devices"] == 2 and p2["fit"]["memory_model"] == "compiled"
    assert p1["runtime"]["autocast"] == "bf16" and not p1["runtime"]["deterministic"]


def test_cuda_plan_for_two_devices_fails_before_anything_without_gpus(store):
    import torch

    if torch.cuda.device_count() >= 2:
        pytest.skip("this machine has GPUs")
    from ledger.train import run as trainlib

    plan = comp.compile_spec(store, spec.parse("[data]\nsteps = 2\n[train]\ndevices = 2\n"), H200).plan
    seq = store.state.seq
    with pytest.raises(RealizationUnavailable):
        trainlib.train(store, plan.id)
    assert store.state.seq == seq


def test_fused_lora_backward_matches_float64_autograd():
    """The cupy-fused realization's backward (torch), with the torch reference in place of the
    kernel: gradients of x, A and B against float64 autograd of y = x W^T + s (x A^T) B^T."""
    import torch

    from ledger.kernels import lora_train, reference

    g = torch.Generator().manual_seed(0)
    M, N, K, r, s = 5, 48, 64, 8, 2.0
    x = torch.randn(M, K, generator=g).bfloat16()
    w = (torch.randn(N, K, generator=g) / K ** 0.5).bfloat16()
    a = torch.randn(r, K, generator=g) / K ** 0.5
    b = torch.randn(N, r, generator=g) / r ** 0.5
    gy = torch.randn(M, N, generator=g).bfloat16()
    xs, as_, bs = x.clone().requires_grad_(), a.clone().requires_grad_(), b.clone().requires_grad_()
    y = lora_train.fused_lora(xs, w, as_, bs, s, reference.lora_linear_bf16)
    y.backward(gy)
    x64, a64, b64 = (t.double().requires_grad_() for t in (x, a.bfloat16().float(), b.bfloat16().float()))
    y64 = x64 @ w.double().t() + s * (x64 @ a64.t()) @ b64.t()
    y64.backward(gy.double())

    def rel(u, v):
        return float((u.double() - v).norm() / v.norm())

    assert rel(y.detach(), y64.detach()) < 1e-2
    assert rel(xs.grad, x64.grad) < 2e-2 and rel(as_.grad, a64.grad) < 2e-2 and rel(bs.grad, b64.grad) < 2e-2
    assert as_.grad.dtype == torch.float32 and bs.grad.dtype == torch.float32


def test_install_routes_every_lora_linear_and_refuses_non_decode_rows(tmp_path):
    import torch

    from ledger.artefacts import model
    from ledger.kernels import lora_train, reference
    from ledger.plan.plan import Config
    from ledger.train import sft

    s = spec.parse('[model]\nhidden = 64\nlayers = 2\nintermediate = 96\n[precision]\ndtype = "bf16"\n[lora]\nr = 8\n')
    model.build_builtin_files(s.config["model"], tmp_path)
    m, named = sft.build(Config.from_json(s.config), tmp_path)
    calls = []

    def op(x, w, a, b, s):
        if x.shape[0] > 8:
            raise RealizationUnavailable(f"kernel lora-linear-bf16 cannot run M={x.shape[0]}")
        calls.append(x.shape)
        return reference.lora_linear_bf16(x, w, a, b, s)

    assert lora_train.install(m, op) == 2 * 7
    ids = torch.randint(0, 256, (1, 6))
    loss = m(input_ids=ids, labels=ids).loss
    loss.backward()
    assert len(calls) == 14 and all(c[0] == 6 for c in calls)
    assert all(p.grad is not None and torch.isfinite(p.grad).all() for _, p in named)
    with pytest.raises(RealizationUnavailable):
        m(input_ids=torch.randint(0, 256, (2, 6)))        # 12 rows: loud, no torch path


@pytest.mark.slow
def test_two_process_ddp_writes_one_receipt(store):
    """devices = 2 on a CPU target: torchrun starts two gloo ranks, each confining itself; rank 0 writes every
    output, the losses are the all-reduced means, and one train record names one receipt."""
    from ledger.train import run as trainlib

    s = spec.parse("[data]\nsteps = 3\nmicro_batch = 4\n[train]\ndevices = 2\ncheckpoint_every = 2\n")
    plan = comp.compile_spec(store, s, CPU).plan
    assert plan.body["runtime"]["launcher"] == "ddp"
    seq = store.state.seq
    res = trainlib.train(store, plan.id)
    r = res.receipt
    assert r["device"]["distributed"] == {"world_size": 2, "backend": "gloo", "launcher": "torchrun",
                                          "loss": "mean over processes (all-reduced)"}
    assert r["sandbox"]["processes"] == 2       # both ranks confined themselves and reported
    assert len(r["losses"]) == 3 and r["counters"]["optimizer_steps"] == 3
    assert r["sandbox"]["policy"]["network"] is True and r["sandbox"]["sandboxed"]
    recs = list(store.journal.records())[seq:]
    assert [x["kind"] for x in recs] == ["checkpoint", "train"]     # one checkpoint (step 2), one receipt
    assert recs[-1]["payload"]["receipt"] == res.receipt_id and store.has(res.adapter)
    # both processes trained on distinct rows: 2 x 4 rows per step
    assert r["counters"]["tokens"] > 0


@pytest.mark.slow
def test_a_rank_that_dies_stops_the_run_and_is_named(store, monkeypatch):
    """Rank 1 is SIGKILLed at step 4 (no error file, no abort marker): torchrun stops rank 0,
    the error names the rank, nothing after the last checkpoint is committed, no rank lives on."""
    _lose_rank_one(store, monkeypatch, CPU, "")


@pytest.mark.gpu
def test_a_rank_lost_on_the_gpu_stops_the_nccl_run(store, monkeypatch):
    """The same on two GPUs, where rank 0 waits inside an NCCL collective when its peer dies."""
    import torch

    if torch.cuda.device_count() < 2:
        pytest.skip(f"{torch.cuda.device_count()} GPU(s) here; this needs 2")
    _lose_rank_one(store, monkeypatch, H200, '[precision]\ndtype = "bf16"\n')


def _lose_rank_one(store, monkeypatch, target, extra: str) -> None:
    import time

    from ledger.errors import InternalError
    from ledger.train import run as trainlib

    s = spec.parse(extra + "[data]\nsteps = 40\nmicro_batch = 4\n[train]\ndevices = 2\ncheckpoint_every = 2\n")
    plan = comp.compile_spec(store, s, target).plan
    seq = store.state.seq
    # step 4, not 3: rank 1 cannot start step 4 before rank 0 has written the step-2 checkpoint
    # and joined step 3's all-reduce, so which checkpoint exists does not depend on timing
    monkeypatch.setenv("LEDGER_FAULT_RANK", "1:4")
    t0 = time.monotonic()
    with pytest.raises(InternalError) as e:
        trainlib.train(store, plan.id)
    assert time.monotonic() - t0 < 120
    # rank 1 is named with its SIGKILL, whether torchrun saw it fall first or rank 0 with it
    assert re.search(r"\(rank (1 failed first|0 failed first, exit status -?\d+; then rank 1), exit status -9",
                     e.value.message)
    recs = list(store.journal.records())[seq:]
    assert [x["kind"] for x in recs] == ["checkpoint"] and recs[0]["payload"]["step"] == 2
    assert "resume with --resume " + recs[0]["payload"]["checkpoint"] in e.value.message
    assert not list(store.tmp.glob("train-*"))
    assert not _children_of(store), "a rank outlived the run"


def _children_of(store) -> list[int]:
    """Training children still running for this store (their argv names its tmp folder)."""
    import os

    pids = []
    for d in filter(str.isdigit, os.listdir("/proc")):
        try:
            argv = open(f"/proc/{d}/cmdline", "rb").read().split(b"\0")
        except (OSError, ValueError):
            continue
        if b"ledger.train.child" in argv and any(a.startswith(str(store.tmp).encode()) for a in argv):
            pids.append(int(d))
    return pids


@pytest.mark.gpu
def test_two_gpus_train_through_torchrun_into_one_receipt(store):
    """devices = 2 on a CUDA target, on a machine with two GPUs: NCCL, torchrun, both ranks
    confined, the memory of each device measured against the per-device plan."""
    import torch

    from ledger.train import run as trainlib

    if torch.cuda.device_count() < 2:
        pytest.skip(f"{torch.cuda.device_count()} GPU(s) here; this needs 2")
    s = spec.parse('[precision]\ndtype = "bf16"\n[data]\nsteps = 3\nmicro_batch = 4\n'
                   '[train]\ndevices = 2\ncheckpoint_every = 2\n')
    plan = comp.compile_spec(store, s, H200).plan
    seq = store.state.seq
    r = trainlib.train(store, plan.id).receipt
    assert r["device"]["distributed"] == {"world_size": 2, "backend": "nccl", "launcher": "torchrun",
                                          "loss": "mean over processes (all-reduced)"}
    assert r["sandbox"]["sandboxed"] and r["sandbox"]["processes"] == 2
    assert set(r["realizations"].values()) == {"torch-compiled"} and len(r["losses"]) == 3
    cm = r["memory"]["observed"]["cuda"]
    assert [d["device"] for d in cm["per_device"]] == [0, 1]
    assert cm["predicted_bytes"] == plan.body["memory"]["total_bytes"]
    assert [x["kind"] for x in list(store.journal.records())[seq:]] == ["checkpoint", "train"]


@pytest.mark.gpu
def test_fused_lora_on_the_gpu_matches_the_torch_reference():
    """The real kernel through KernelOp (DLPack views, torch's stream): forward against torch's
    eager LoRA and gradients against the same backward fed by the torch forward."""
    import torch

    from ledger import kernels as K
    from ledger.kernels import lora_train, reference

    op = lora_train.KernelOp(K.build(lora_train.KERNEL, "local"))
    g = torch.Generator(device="cuda").manual_seed(0)
    M, N, K_, r, s = 8, 1000, 1024, 16, 2.0
    x = torch.randn(M, K_, device="cuda", generator=g).bfloat16()
    w = (torch.randn(N, K_, device="cuda", generator=g) / K_ ** 0.5).bfloat16()
    a = (torch.randn(r, K_, device="cuda", generator=g) / K_ ** 0.5).requires_grad_()
    b = (torch.randn(N, r, device="cuda", generator=g) / r ** 0.5).requires_grad_()
    y = lora_train.fused_lora(x, w, a, b, s, op)
    ref = reference.lora_linear_bf16(x.float(), w.float(), a.bfloat16().float(), b.bfloat16().float(), s)
    assert float((y.float() - ref).norm() / ref.norm()) < 5e-3 and op.calls == 1
    y.float().square().sum().backward()
    ga, gb = a.grad.clone(), b.grad.clone()
    a.grad = b.grad = None
    y2 = lora_train.fused_lora(x, w, a, b, s, reference.lora_linear_bf16)
    y2.float().square().sum().backward()
    assert float((ga - a.grad).norm() / a.grad.norm()) < 2e-2 and float((gb - b.grad).norm() / b.grad.norm()) < 2e-2
    with pytest.raises(RealizationUnavailable):
        lora_train.fused_lora(torch.cat([x, x]), w, a, b, s, op)     # 16 rows: loud, never torch


def test_compiled_layers_never_fall_back_to_eager_past_the_recompile_limit(monkeypatch, tmp_path):
    """dynamo runs layers past its recompile limit eagerly, silently: the limit must cover every
    layer and hitting it must raise (a 22-layer plan ran 14 layers eagerly on an H200 before)."""
    import torch._dynamo as dynamo
    import torch.nn as nn

    from ledger.train import run as trainlib
    from ledger.train import sft

    for name in ("recompile_limit", "fail_on_recompile_limit_hit"):
        monkeypatch.setattr(dynamo.config, name, getattr(dynamo.config, name))
    layers = nn.ModuleList([nn.Linear(4, 4) for _ in range(30)])
    sft.compile_layers(layers)
    assert dynamo.config.recompile_limit >= 30 and dynamo.config.fail_on_recompile_limit_hit is True
    assert all(getattr(layer, "_compiled_call_impl", None) is not None for layer in layers)
    plan = comp.compile_spec(Store.init(tmp_path), spec.parse("[data]\nsteps = 2\n[train]\ndevices = 2\n"), H200).plan
    assert plan.view.runtime.loop == "compiled"
    env = trainlib.child_env(tmp_path, plan.view)
    assert env["TORCHINDUCTOR_COMPILE_THREADS"] == "1" and env["NCCL_NVLS_ENABLE"] == "0"
    assert env["NCCL_CUMEM_ENABLE"] == "0"     # no abstract unix sockets between sandboxes


def test_the_fused_loop_plans_no_mask_and_no_full_logits(store):
    """fused-lora's memory model (memory.lines_compiled with ce_chunk): causal attention without a
    mask, and one chunk of logits instead of the [rows, vocab] log-softmax and its gradient."""
    from ledger.kernels import train_ops

    assert comp.CE_CHUNK_ROWS == train_ops.CE_CHUNK_ROWS   # plan/ cannot import the torch side
    arch = comp.model.arch_of(dict(comp.model.builtin_config(spec.parse("").config["model"]), vocab_size=49152))
    kw = dict(r=8, modules=spec.LLAMA_MODULES, dropout=0.0, dtype="bf16", seq_len=512, micro_batch=16, padded=True)
    compiled = {x.name: x.bytes for x in memory.lines_compiled(arch, **kw)}
    fused = {x.name: x.bytes for x in memory.lines_compiled(arch, ce_chunk=comp.CE_CHUNK_ROWS, **kw)}
    rows, V = 16 * 512, 49152
    assert compiled["workspace"] - fused["workspace"] == 2 * rows * V * 4 - 4096 * V * 10
    mask = 16 * 512 * 512 + arch.layers * 16 * 512 * 512 * 2
    assert compiled["activations"] - fused["activations"] == mask + rows * (V * 4 - 64 * 2)
    assert fused["weights"] == compiled["weights"]


def test_only_a_cpu_child_gets_a_fixed_cublas_workspace(tmp_path):
    """CUBLAS_WORKSPACE_CONFIG is what deterministic algorithms need for cuBLAS: a CPU plan (the
    bit-exact one) keeps it; a CUDA child runs the non-deterministic kernels with torch's default
    workspace (the setting was measured against it: issue 20, session 7)."""
    from ledger.train import run as trainlib

    store = Store.init(tmp_path / "s")
    gpu = comp.compile_spec(store, spec.parse("[data]\nsteps = 2\n"), H200).plan
    cpu = comp.compile_spec(store, spec.parse("[data]\nsteps = 2\n"), CPU).plan
    assert "CUBLAS_WORKSPACE_CONFIG" not in trainlib.child_env(tmp_path, gpu.view)
    assert trainlib.child_env(tmp_path, cpu.view)["CUBLAS_WORKSPACE_CONFIG"] == ":4096:8"
