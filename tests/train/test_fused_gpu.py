"""fused-lora on a GPU (marked `gpu`, skipped without one): the realization's gradients against
the autocast + per-layer torch.compile loop it replaces, then `ledger train` of a fused plan
twice -- the second run of the same plan shape uses the first one's compile cache, its receipt
names it, and its first step stays within 10 s."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.gpu

SPEC = ('[model]\nhidden = 256\nlayers = 4\nheads = 8\nkv_heads = 2\nintermediate = 704\nmax_positions = 256\n'
        '[lora]\nr = 16\nalpha = 32\n[precision]\ndtype = "bf16"\n[data]\nseq_len = 256\nmicro_batch = 4\n'
        'steps = {steps}\n[train]\ncheckpoint_every = 1000\n')


def _reference_and_mine():
    """One 0.02-initialised 4-layer Llama in bf16 as two peft models with equal fp32 adapters
    (B non-zero, so every LoRA gradient is), and one batch: the reference loop's and ledger's."""
    import copy

    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    cfg = LlamaConfig(hidden_size=512, intermediate_size=1408, num_hidden_layers=4, num_attention_heads=8,
                      num_key_value_heads=2, vocab_size=300, initializer_range=0.02)
    base = LlamaForCausalLM(cfg).to("cuda", torch.bfloat16)
    mods = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]

    def peft():
        m = get_peft_model(copy.deepcopy(base), LoraConfig(r=16, lora_alpha=32, target_modules=mods))
        for n, p in m.named_parameters():
            if p.requires_grad:
                p.data = p.data.float()
        return m
    ref = peft()
    for n, p in ref.named_parameters():
        if "lora_B" in n:
            p.data.normal_(0, 0.02)
    mine = peft()
    mine.load_state_dict(ref.state_dict())
    ids = torch.randint(0, 300, (4, 512), device="cuda")
    return ref, mine, ids


def test_fused_lora_gradients_match_the_autocast_compiled_loop():
    import torch

    from ledger.train.fused import FusedLlama
    from ledger.train.sft import compile_layers

    ref, mine, ids = _reference_and_mine()
    compile_layers(ref.base_model.model.model.layers)
    with torch.autocast("cuda", dtype=torch.bfloat16):
        want = ref(input_ids=ids, labels=ids).loss
    want.backward()
    got = FusedLlama(mine, 0.0).loss(ids, ids)
    got.backward()
    assert abs(float(got) - float(want)) < 2e-2 * float(want)
    gr = {n: p.grad.float() for n, p in ref.named_parameters() if p.requires_grad}
    gm = {n: p.grad.float() for n, p in mine.named_parameters() if p.requires_grad}
    rel = sorted(float((gm[n] - gr[n]).norm() / gr[n].norm()) for n in gr)
    assert rel[len(rel) // 2] < 3e-2 and rel[-1] < 1e-1, rel[-5:]   # bf16 operands on both sides


def test_a_repeated_fused_cycle_reuses_its_compile_cache(store, tmp_path):
    from ledger.plan import compile as comp
    from ledger.plan import spec, targets
    from ledger.train import run as trainlib

    first = comp.compile_spec(store, spec.parse(SPEC.format(steps=3)), targets.get("h200")).plan
    assert first.view.realizations["linear_lora"].name == "fused-lora"
    r1 = trainlib.train(store, first.id).receipt
    assert r1["compile_cache"]["built"] and not r1["compile_cache"]["hit"] and r1["rung"] == "Learned"
    second = comp.compile_spec(store, spec.parse(SPEC.format(steps=4)), targets.get("h200")).plan
    r2 = trainlib.train(store, second.id).receipt
    assert r2["compile_cache"]["hit"] and r2["compile_cache"]["id"] == r1["compile_cache"]["id"]
    assert r2["timings"]["first_step_s"] <= 10.0, r2["timings"]
    assert r2["losses"][-1] < r2["losses"][0]


@pytest.mark.xfail(strict=True, raises=AssertionError, reason="H200, session 7 (lead's final GPU run): the gradients' rel-L2 median is "
                   "0.104 against the gate's 0.10 on this 0.02-initialised model; still failing in session 9, when the "
                   "gate also refused the bench's 1B and SmolLM2-shaped bases: fp8-base's gate is not yet shown "
                   "passing on a GPU (issue 20 open, benchmarks/RESULTS.md)")
def test_fp8_base_gradients_are_within_its_gate_of_the_autocast_compiled_loop():
    """fp8-base (fp8 frozen-base GEMMs) against the baseline loop it is to beat, on one batch
    from a state with non-zero B, held to the plan's own numerics-gate tolerances."""
    import torch

    from ledger.kernels import fp8_ops
    from ledger.plan.compile import FP8_GATE
    from ledger.train.fused import FusedLlama
    from ledger.train.sft import compile_layers

    ref, mine, ids = _reference_and_mine()
    # the reference computes with the fp8 base dequantized (the same base function in bf16: the
    # gate's gradient reference); the loss is held against the bf16 base's
    with torch.no_grad():
        bf16_loss = float(ref(input_ids=ids, labels=ids).loss)
        for mod in ref.modules():
            if hasattr(mod, "base_layer") and hasattr(mod.base_layer, "weight"):
                w = mod.base_layer.weight
                w.copy_(fp8_ops.Fp8Weight.of(w).dequantized().to(w.dtype))
    compile_layers(ref.base_model.model.model.layers)
    with torch.autocast("cuda", dtype=torch.bfloat16):
        want = ref(input_ids=ids, labels=ids).loss
    want.backward()
    f = FusedLlama(mine, 0.0, base_gemm="fp8")
    assert f.name == "fp8-base"
    got = f.loss(ids, ids)
    got.backward()
    assert abs(float(got) - bf16_loss) <= FP8_GATE["loss_rel"] * bf16_loss
    gr = {n: p.grad.float() for n, p in ref.named_parameters() if p.requires_grad}
    gm = {n: p.grad.float() for n, p in mine.named_parameters() if p.requires_grad}
    rel = sorted(float((gm[n] - gr[n]).norm() / gr[n].norm()) for n in gr)
    assert rel[len(rel) // 2] <= FP8_GATE["grad_rel_l2_median"] and rel[-1] <= FP8_GATE["grad_rel_l2_max"], rel[-5:]


def test_ledger_train_refuses_fp8_base_at_its_numerics_gate_before_anything_trains(store):
    """The built-in base's initializer_range 0.2 makes this model chaotic: fp8's rounding moves its
    step-0 loss by ~3 % (H200, session 7: 10.535 against 10.213), beyond the gate's 1 %. The gate
    says so with a typed error before the first step, and no train record is written."""
    from ledger.errors import RealizationUnavailable
    from ledger.plan import compile as comp
    from ledger.plan import spec, targets
    from ledger.train import run as trainlib

    text = SPEC.format(steps=6) + '[compile]\nrealization = "fp8-base"\n'
    plan = comp.compile_spec(store, spec.parse(text), targets.get("h200")).plan
    assert plan.view.realizations["linear_lora"].name == "fp8-base"
    with pytest.raises(RealizationUnavailable, match="failed its numerics gate"):
        trainlib.train(store, plan.id)
    assert not [r for r in store.journal.records() if r["kind"] in ("train", "checkpoint")]
