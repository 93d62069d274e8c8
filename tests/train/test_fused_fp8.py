"""fp8-base, the CPU-testable parts: the plan (explicit only, its requirements, its refusal on a
target without fp8 tensor cores, its memory line, the gate's tolerances in the plan), the
numerics gate's logic (with fake losses and gradients), and the fp8 forward over a tiny peft
Llama in bf16 on the CPU against fused-lora's bf16 one, through the gate itself. The GPU side
(compiled, cuDNN, _scaled_mm on an H200, `ledger train`): tests/train/test_fused_gpu.py."""

from __future__ import annotations

import copy

import pytest
import torch

from ledger.errors import CompileRejected, RealizationUnavailable
from ledger.plan import compile as comp
from ledger.plan import memory, spec, targets
from ledger.plan.plan import Plan
from ledger.train import numerics

FP8 = '[precision]\ndtype = "bf16"\n[data]\nsteps = 2\n[compile]\nrealization = "fp8-base"\n'


# --- the plan ---------------------------------------------------------------------------------
def test_fp8_base_is_selected_only_when_asked_and_named_with_its_gate_in_the_plan(store):
    auto = comp.select_realizations(spec.parse('[precision]\ndtype = "bf16"\n'), targets.get("h200"), store)
    assert auto["linear_lora"]["name"] == "fused-lora"   # auto never changes the arithmetic
    plan = comp.compile_spec(store, spec.parse(FP8), targets.get("h200")).plan
    real = plan.body["realizations"]
    assert real["linear_lora"]["name"] == "fp8-base" and real["linear_lora"]["requires"]["compute_capability"] == ">=9.0"
    assert real["linear_lora"]["numerics_gate"] == comp.FP8_GATE
    assert real["attention"]["name"] == "cudnn-sdpa" and real["cross_entropy"]["name"] == "chunked-linear-ce"
    assert plan.view.runtime.loop_kind == "fused" and plan.body["fit"]["memory_model"] == "fused"
    assert Plan.from_json(plan.body).to_json() == plan.body   # the view keeps the id
    assert plan.view.realizations["linear_lora"].numerics_gate["loss_rel"] == comp.FP8_GATE["loss_rel"]


def test_fp8_base_memory_plan_counts_both_fp8_copies_of_every_projection(store):
    fp8 = comp.compile_spec(store, spec.parse(FP8), targets.get("h200")).plan.body
    bf16 = comp.compile_spec(store, spec.parse(FP8.replace("fp8-base", "fused-lora")), targets.get("h200")).plan.body
    lines = {x["name"]: x["bytes"] for x in fp8["memory"]["lines"]}
    ref = {x["name"]: x["bytes"] for x in bf16["memory"]["lines"]}
    arch = comp.model.arch_of(comp.model.builtin_config(comp.Config.from_json(fp8["config"]).model.to_json()))
    shapes = [memory.MODULE_SHAPES[m](arch) for m in memory.MODULE_SHAPES]
    assert lines["fp8_weights"] == arch.layers * sum(2 * i * o + 4 * (i + o) for i, o in shapes)
    assert lines["numerics_gate"] == arch.layers * sum(i * o for i, o in shapes) * 2   # its bf16 reference base
    assert "fp8_weights" not in ref and lines["weights"] == ref["weights"]   # the bf16 weights stay
    assert lines["activations"] == ref["activations"]
    assert fp8["memory"]["total_bytes"] > bf16["memory"]["total_bytes"]


@pytest.mark.parametrize("target, requirement", [("a100-40gb", "compute_capability"), ("rtx3070-8gb", "compute_capability"),
                                                 ("cpu", "device")])
def test_fp8_base_is_refused_at_compile_time_on_a_target_without_fp8(store, target, requirement):
    with pytest.raises(CompileRejected) as e:
        comp.compile_spec(store, spec.parse(FP8), targets.get(target))
    assert e.value.exit_code == 3 and e.value.details["requirement"] == f"realization.fp8-base.{requirement}"
    assert not store.state.refs.get("plan") and "never falls back" in e.value.hint
    if requirement == "compute_capability":
        assert "no fp8 tensor cores" in e.value.message


def test_fp8_base_keeps_fused_lora_s_requirements(store):
    with pytest.raises(CompileRejected) as e:
        comp.select_realizations(spec.parse(FP8.replace('"bf16"', '"fp32"')), targets.get("h200"), store)
    assert e.value.details["requirement"] == "realization.fp8-base.dtype"


# --- the gate's logic, with fakes -------------------------------------------------------------
TOL = numerics.Tolerance.from_json(comp.FP8_GATE)


class Fake:
    """A 'model' of two parameters whose loss is a fixed quadratic; `err` perturbs it."""

    def __init__(self, err=0.0, zero_b=True):
        self.a = torch.nn.Parameter(torch.tensor([1.0, -2.0]))
        self.b = torch.nn.Parameter(torch.zeros(3) if zero_b else torch.tensor([0.5, 0.1, -0.3]))
        self.err = err

    def params(self):
        return [("a", self.a), ("b", self.b)]

    def ref(self):
        return (self.a ** 2).sum() + (self.b * torch.tensor([1.0, 2.0, 3.0])).sum() + 10.0

    def cand(self):
        return (self.a ** 2 * (1 + self.err)).sum() + (self.b * torch.tensor([1.0, 2.0, 3.0])).sum() + 10.0


def test_the_gate_passes_within_tolerance_and_leaves_the_adapter_as_it_was():
    m = Fake(err=1e-3)
    before = [p.detach().clone() for _, p in m.params()]
    rec = numerics.run("fp8-base", m.ref, m.cand, m.params(), TOL)
    assert rec["passed"] and len(rec["steps"]) == TOL.steps and rec["realization"] == "fp8-base"
    assert rec["steps"][0]["grad_rel_l2_max"] == pytest.approx(1e-3, rel=1e-3)
    assert all(torch.equal(p, q) for (_, p), q in zip(m.params(), before))
    assert all(p.grad is None for _, p in m.params())
    assert rec["tolerance"]["loss_rel"] == TOL.loss_rel


def test_the_gate_fails_loudly_naming_what_was_out_of_tolerance():
    m = Fake(err=0.5)
    with pytest.raises(RealizationUnavailable) as e:
        numerics.run("fp8-base", m.ref, m.cand, m.params(), TOL)
    assert e.value.exit_code == 3 and "fp8-base failed its numerics gate" in e.value.message
    assert "gradient rel. L2" in e.value.message or "loss" in e.value.message
    assert e.value.details["gate"]["passed"] is False
    assert torch.equal(m.a.detach(), torch.tensor([1.0, -2.0]))   # restored even when it fails
    rec = numerics.run("fp8-base", m.ref, m.cand, m.params(), TOL, raise_on_fail=False)
    assert not rec["passed"] and rec["failures"]


def test_a_nan_or_a_gradient_where_the_reference_has_none_fails_the_gate():
    steps = [numerics.compare_step(["a"], 1.0, [torch.ones(2)], float("nan"), [torch.ones(2)])]
    ok, bad = numerics.judge(steps, TOL)
    assert not ok and "loss" in bad[0]
    steps = [numerics.compare_step(["a", "b"], 1.0, [torch.ones(2), torch.zeros(2)], 1.0,
                                   [torch.ones(2), torch.full((2,), 1e-3)])]
    ok, bad = numerics.judge(steps, TOL)
    assert not ok and "non-zero where the reference" in bad[0]
    steps = [numerics.compare_step(["b"], 1.0, [torch.zeros(2)], 1.0, [torch.zeros(2)])]
    assert numerics.judge(steps, TOL)[1] == ["step 0: no gradient with a non-zero reference to compare"]


# --- the fp8 forward, CPU, bf16 ---------------------------------------------------------------
def _tiny_bf16():
    from peft import LoraConfig, get_peft_model
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    cfg = LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                      num_key_value_heads=2, vocab_size=50, max_position_embeddings=64, initializer_range=0.02,
                      attn_implementation="sdpa")
    base = LlamaForCausalLM(cfg).to(torch.bfloat16)
    m = get_peft_model(copy.deepcopy(base), LoraConfig(r=8, lora_alpha=16, target_modules=[
        "q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]))
    for n, p in m.named_parameters():
        if p.requires_grad:
            p.data = p.data.float()
    return m


def test_the_fp8_forward_passes_its_gate_against_the_bf16_one_on_the_cpu():
    from ledger.train.fused import FusedLlama

    m = _tiny_bf16()
    f = FusedLlama(m, 0.0, compile_layers=False, check=False, base_gemm="fp8")
    assert f.name == "fp8-base" and all("w8_qkv" in p for p, _ in f.layers)
    assert all("w8_qkv" not in p for p, _ in f.layers_bf16)
    ids = torch.randint(0, 50, (2, 16), generator=torch.Generator().manual_seed(1))
    named = [(n, p) for n, p in m.named_parameters() if p.requires_grad]
    before = [p.detach().clone() for _, p in named]
    # as the child runs it (ledger.train.sft): gradients against the same fp8 base in bf16
    # arithmetic, the loss against the bf16 base
    rec = numerics.run(f.name, lambda: f.loss(ids, ids, base_gemm="bf16-dequantized"), lambda: f.loss(ids, ids),
                       named, TOL, base=lambda: f.loss(ids, ids, base_gemm="bf16"))
    assert rec["passed"], rec["failures"]
    assert rec["references"] == {"loss": "base", "gradients": "reference"}
    assert all(torch.equal(p, q) for (_, p), q in zip(named, before))
    first, last = rec["steps"][0], rec["steps"][-1]
    assert first["zero_in_reference"] > 0 and last["zero_in_reference"] == 0   # B moved off 0
    assert 0 < last["grad_rel_l2_median"]   # the fp8 arithmetic is a different computation
    # the base itself moved: against the bf16 base the gradients differ more than against the
    # dequantized one (what the gate's two references separate)
    assert last["vs_base"]["grad_rel_l2_median"] > last["grad_rel_l2_median"]
    assert last["ref_loss"] == last["vs_base"]["ref_loss"] and "vs_reference_loss_rel" in last
    with pytest.raises(RealizationUnavailable, match="no 'fp16' base GEMMs"):
        f.loss(ids, ids, base_gemm="fp16")


def test_fp8_base_refuses_to_run_where_it_cannot():
    from ledger.train.fused import FusedLlama

    with pytest.raises(RealizationUnavailable, match="fp8-base, which cannot run here"):
        FusedLlama(_tiny_bf16(), 0.0, compile_layers=False, base_gemm="fp8")   # CPU
    with pytest.raises(RealizationUnavailable, match="is not one of"):
        FusedLlama(_tiny_bf16(), 0.0, compile_layers=False, check=False, base_gemm="int4")


def test_the_receipt_of_an_fp8_base_run_names_it_and_carries_its_gate(store):
    """What the receipt says of an fp8-base run, built from the child's report the way the
    parent builds it (the run itself needs an H200: test_fused_gpu.py)."""
    from ledger.train import receipt

    plan = comp.compile_spec(store, spec.parse(FP8), targets.get("h200")).plan
    m = Fake(err=1e-3)
    gate = numerics.run("fp8-base", m.ref, m.cand, m.params(), TOL)
    result = {"counters": {"optimizer_steps": 2}, "steps_done": 2, "start_step": 0, "stopped": None,
              "losses": [2.0, 1.0], "memory": {}, "timings": {}, "versions": {}, "determinism": {},
              "device": {"fused_lora": {"realization": "fp8-base", "base_gemm": "fp8"}, "numerics_gate": gate}}
    manifest = {"state": {"cursor": {"next_step": 3}}, "rng": "b3:rng", "optimizer": "b3:opt"}
    r = receipt.build(plan_id=plan.id, plan=plan.view, result=result, final_checkpoint="b3:ck", final_manifest=manifest,
                      adapter="b3:ad", checkpoints=[], resumed_from=None, sandbox={})
    assert r["realizations"]["linear_lora"] == "fp8-base" and r["realizations"]["attention"] == "cudnn-sdpa"
    assert r["device"]["numerics_gate"]["passed"] and r["device"]["numerics_gate"]["realization"] == "fp8-base"
    assert r["memory"]["predicted_lines"]["fp8_weights"] > 0 and r["rung"] == "Learned"
