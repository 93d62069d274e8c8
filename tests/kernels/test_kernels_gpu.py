"""GPU tests: build, run against the float64 oracle, and gate, on a real device.
Skipped (tests/kernels/conftest.py) where cupy sees no GPU."""

from __future__ import annotations

import pytest

from ledger import kernels as K
from ledger.kernels import specs as S

pytestmark = pytest.mark.gpu


def _sweep(name):
    # the default sweep without its largest shapes (the bench script tests the full sweep)
    return [s for s in S.default_sweep(S.get(name)) if s.n * s.k <= 4096 * 4096 or s.m == 8]


@pytest.mark.parametrize("name", sorted(S.KERNELS))
def test_build_for_this_device(name):
    from ledger.kernels import runtime

    info = runtime.device_info()
    b = K.build(name, "local")
    assert b.arch == f"sm_{info['cc'][0]}{info['cc'][1]}"
    assert b.cubin and b.ptx.lstrip().startswith(b"//") and b".target" in b.ptx
    assert set(b.entry_points) == set(S.get(name).entries())
    assert isinstance(b.log, str)  # NVRTC's log (with ptxas -v, where NVRTC returns it)


@pytest.mark.parametrize("name", sorted(S.KERNELS))
def test_kernel_matches_oracle(name):
    t = K.test(name, _sweep(name), seed=7)
    assert t.unwritten == 0
    assert t.worst_rel_l2 is not None and t.worst_rel_l2 <= t.tolerance, t.body()
    assert t.worst_rel_l2 < 3e-3  # fp32 accumulation: close to bf16 output rounding
    assert all(c["deterministic"] for c in t.cases)
    if S.get(name).lora:  # the forward-progress path gives the same bits
        assert all(c.get("bitwise_equal_to_fused", True) for c in t.cases)


@pytest.mark.parametrize("name", sorted(S.KERNELS))
def test_every_compiled_config_is_correct(name):
    spec = S.get(name)
    r = 24 if spec.lora else 0
    # an odd tile count and a K no step count divides (the guarded path), and a shape every tile
    # and every warp covers in full, with an even number of steps (the x16 kernels' FULL path)
    shapes = [S.Shape(3, 1040, 4 * spec.requirements.k_multiple * 9, r),
              S.Shape(2, 512, 64 * spec.requirements.k_multiple, r)]
    for cfg in spec.configs:
        t = K.test(name, shapes, seed=11, config=cfg)
        assert t.unwritten == 0 and t.worst_rel_l2 is not None and t.worst_rel_l2 <= t.tolerance, (cfg, t.body())


@pytest.mark.parametrize("name", sorted(S.KERNELS))
def test_gate_on_device(name):
    shape = "1x8192x8192" + ("r16" if S.get(name).lora else "")
    t = K.test(name, [shape], seed=3)
    b = K.bench(name, shape, launches=20, warmup=5, side_by_side=False)
    assert b.candidate.code_object == t.code_object != b.baseline.code_object
    d = K.gate(t, b)
    if S.get(name).weight_format == "bf16" and not S.get(name).lora:
        # the plain bf16 matvec ties cuBLAS at 8192^2 on an H200: the gate must follow the clock
        assert d.accepted == (b.candidate.median_s < b.baseline.median_s), d.reason
        assert d.accepted or d.code == "NotFaster"
    else:  # LoRA-fused and quantized kernels beat torch's realization by a wide margin
        assert d.accepted, d.reason


def test_gate_refuses_a_broken_kernel_on_device():
    """A kernel compiled to skip every other chunk of K is fast and wrong: the gate says Wrong."""
    import dataclasses

    from ledger.kernels import harness

    good = K.build("linear-bf16", "local")
    t_good = K.test("linear-bf16", ["1x4096x4096"], seed=5, config=(8, 2, 1, 0))
    assert t_good.worst_rel_l2 <= t_good.tolerance
    broken_src = good.source.replace("base += NW * U) {", "base += 2 * NW * U) {", 1)
    assert broken_src != good.source
    from ledger.kernels import runtime

    cubin, lowered, _ = runtime.compile_source(broken_src, S.get("linear-bf16").entries(), good.options, "broken.cu")
    broken = dataclasses.replace(good, source=broken_src, cubin=cubin, entry_points=lowered)
    cfg = (8, 2, 1, 0)  # a register-pipeline configuration: the one the edit breaks
    t = K.test("linear-bf16", ["1x4096x4096"], seed=5, build_record=broken, config=cfg)
    b = harness.bench("linear-bf16", "1x4096x4096", launches=20, warmup=5, build_record=broken,
                      side_by_side=False, config=cfg)
    d = K.gate(t, b)
    assert not d.accepted and d.code == "Wrong", d.reason


@pytest.mark.parametrize("name", ["linear-int8-x16", "linear-q4b32-x16", "linear-q4b32p-x16"])
@pytest.mark.parametrize("scale", [1e-30, 1e-6, 1e6, 1e30])
def test_x16_kernels_at_any_range_of_x(name, scale):
    """x far outside fp16's range (both ways) still gives the oracle: the kernel stages x * 2^-p."""
    import numpy as np

    from ledger.kernels import formats as F
    from ledger.kernels import oracles, runtime

    spec = S.get(name)
    mod = runtime.load(K.build(spec.name, "local"))
    for sh in (S.Shape(1, 4096, 4096), S.Shape(3, 1000, 2048)):
        inp = spec.make_inputs(sh, np.random.default_rng(13))
        inp["x"] = F.f32_to_bf16_bits(F.bf16_bits_to_f32(inp["x"]) * np.float32(scale))
        ref = spec.oracle(inp)
        y = runtime.DecodeLinear(mod, spec, sh, runtime.to_device(inp))(poison=True).get()
        rel_l2, _ = oracles.relative_errors(F.bf16_bits_to_f64(y), ref)
        assert rel_l2 < 3e-3, (sh, scale, rel_l2)


def test_time_graph_times_kernels_torch_ops_and_the_copy_alike():
    """runtime.time_graph: ledger's kernel (a cupy launch) and torch's F.linear captured back to
    back in one CUDA graph each, and the copy: positive per-call times, one sample a replay, and
    no more than the per-launch event harness charges the same calls (it excludes a fixed cost,
    it adds none)."""
    import torch
    import torch.nn.functional as Fn

    from ledger.kernels import harness as H
    from ledger.kernels import runtime as R

    spec = S.get("linear-bf16")
    sh = S.Shape(1, 4096, 4096)
    mod = R.load(H.build("linear-bf16", "local"))
    spin = R.spin_function(mod)
    sets = [R.random_device_inputs(spec, sh, 11 + c) for c in range(4)]
    ours = [R.DecodeLinear(mod, spec, sh, d) for d in sets]
    views = [R.torch_views(d) for d in sets]
    theirs = [lambda t=t: Fn.linear(t["x"], t["w"]) for t in views]
    for fns in (ours, theirs):
        g = R.time_graph(fns, 40, 5, reps=6)
        e = R.time_calls(fns, 40, 5, spin)
        assert len(g.seconds) == 6 and all(0 < s < 1e-3 for s in g.seconds)
        assert g.median <= 1.1 * e.median
    torch.cuda.synchronize()
    bw, t = R.copy_bandwidth(spin, nbytes=1 << 28, launches=5, graph=True)
    assert 1e11 < bw < 1e13 and len(t.seconds) == 10
