"""Quantized bases in plans (`precision.base_quant`): the memory plan's lines, the compile-time
rejections with their exact lines, and LoRA trained on a q4b32 / int8 base through `ledger train`."""

from __future__ import annotations

import pytest

from ledger.artefacts import model
from ledger.errors import CompileRejected, SpecError
from ledger.plan import compile as comp
from ledger.plan import memory, spec, targets
from ledger.plan.plan import Config

CPU = targets.get("cpu")
# A 7.2B-parameter Llama-3-shaped base (vocab 32000): what benchmarks/bench_qlora.py trains on an H200
BIG = ('[model]\nhidden = 4096\nlayers = 32\nheads = 32\nkv_heads = 8\nintermediate = 14336\nmax_positions = 4096\n'
       '[precision]\ndtype = "bf16"\n')


def _arch(s):
    c = Config.from_json(s.config)
    cfg = model.builtin_config(c.model.to_json())
    cfg["vocab_size"] = 32000
    return c, model.arch_of(cfg)


def test_unknown_base_format_is_refused_on_its_line():
    with pytest.raises(SpecError) as e:
        spec.parse('[precision]\nbase_quant = "nf3"\n')
    assert e.value.message == "spec field `precision.base_quant` (line 2): must be one of none, q4b32, int8; got 'nf3'"


def test_q4b32_needs_in_features_a_multiple_of_32_and_says_which(store):
    # the built-in model's intermediate size 176 is not a multiple of 32: down_proj cannot be blocked
    text = '[data]\nsteps = 2\n[precision]\nbase_quant = "q4b32"\n'
    seq = store.state.seq
    with pytest.raises(CompileRejected) as e:
        comp.compile_spec(store, spec.parse(text), CPU)
    assert e.value.message == ("spec field `precision.base_quant` (line 4): q4b32 quantizes blocks of 32 weights "
                               "along in_features; down_proj has in_features 176")
    assert store.state.seq == seq
    comp.compile_spec(store, spec.parse(text.replace("q4b32", "int8")), CPU)     # int8 has no block


def test_a_7b_base_in_4_bits_fits_8_gb_where_bf16_cannot_and_the_lines_say_why():
    c, arch = _arch(spec.parse(BIG + '[data]\nmicro_batch = 1\nseq_len = 128\n'))
    assert sum(arch.params().values()) > 7e9
    t = targets.get("rtx3070-8gb")
    with pytest.raises(CompileRejected) as e:
        comp.fit_check(arch, c, t, 4000, "compiled", True)
    assert e.value.message == ("memory: the plan needs 14.46 GiB (weights 13.49 GiB at micro-batch 1 x 128 tokens); "
                               "target rtx3070-8gb has 8.00 GiB (7.20 GiB usable at memory_fraction 0.9); nothing "
                               "fits: weights alone need 13.49 GiB")
    c4, _ = _arch(spec.parse(BIG.replace('"bf16"\n', '"bf16"\nbase_quant = "q4b32"\n')
                             + '[data]\nmicro_batch = 1\nseq_len = 128\n'))
    ls, fit = comp.fit_check(arch, c4, t, 4000, "compiled", True)
    by = {x.name: x.bytes for x in ls}
    # 6.98e9 projection weights at 0.5625 B + 262M embedding/LM-head weights at 2 B
    assert by["weights"] == 6_979_321_856 * 9 // 16 + (2 * 32000 * 4096 + 65 * 4096) * 2
    assert by["dequant"] == 2 * 14336 * 4096 * 2 and fit["fits"]


def test_a_quantized_7b_plan_too_large_for_its_target_is_rejected_with_the_exact_line():
    c, arch = _arch(spec.parse(BIG.replace('"bf16"\n', '"bf16"\nbase_quant = "q4b32"\n')
                               + '[data]\nmicro_batch = 16\nseq_len = 2048\n'))
    with pytest.raises(CompileRejected) as e:
        comp.fit_check(arch, c, targets.get("rtx3070-8gb"), 4000, "compiled", True)
    assert e.value.message == ("memory: the plan needs 168.98 GiB (activations 156.46 GiB at micro-batch 16 x 2048 "
                               "tokens); target rtx3070-8gb has 8.00 GiB (7.20 GiB usable at memory_fraction 0.9); no "
                               "micro-batch fits at seq_len 2048; at micro-batch 1 the longest sequence that fits is 506")


def test_quantized_base_is_never_routed_through_the_bf16_fused_kernel():
    s = spec.parse('[model]\nintermediate = 192\n[precision]\ndtype = "bf16"\nbase_quant = "q4b32"\n'
                   '[data]\nmicro_batch = 1\nseq_len = 8\n[lora]\nr = 8\n')
    c = Config.from_json(s.config)
    arch = model.arch_of(model.builtin_config(c.model.to_json()))
    assert "reads a bf16 base weight; the base is held in q4b32" in comp.fused_unmet(c, arch)
    with pytest.raises(CompileRejected) as e:
        comp.quant_check(s.with_overrides({"compile.realization": "cupy-fused"}),
                         Config.from_json(s.with_overrides({"compile.realization": "cupy-fused"}).config), arch)
    assert "realization cupy-fused reads a bf16 base weight; the base is q4b32" in e.value.message


def test_plan_lines_of_dense_and_quantized_bases_differ_only_in_the_weights():
    kw = dict(r=8, modules=list(model.MODULE_SHAPES), dropout=0.0, dtype="bf16", micro_batch=2, seq_len=64)
    _, arch = _arch(spec.parse(BIG))
    dense = {x.name: x.bytes for x in memory.lines_compiled(arch, **kw)}
    q = {x.name: x.bytes for x in memory.lines_compiled(arch, base_quant="int8", **kw)}
    assert set(q) - set(dense) == {"dequant"}
    assert {k for k in dense if dense[k] != q[k]} == {"weights"}
    assert q["weights"] < dense["weights"] * 0.55


@pytest.mark.slow
@pytest.mark.parametrize("fmt", ["q4b32", "int8"])
def test_ledger_train_learns_lora_on_a_quantized_base(store, fmt):
    from ledger.train import run as trainlib

    s = spec.parse(f'[model]\nintermediate = 192\n[precision]\nbase_quant = "{fmt}"\n[data]\nsteps = 20\n'
                   'micro_batch = 8\n')
    plan = comp.compile_spec(store, s, CPU).plan
    assert {x["name"] for x in plan.body["memory"]["lines"]} >= {"weights", "dequant"}
    r = trainlib.train(store, plan.id).receipt
    assert r["rung"] and len(r["losses"]) == 20
    assert r["losses"][-1] < r["losses"][0] - 2.0, r["losses"]
