"""CPU-side kernel logic, run in CI: formats, oracles, requirements, records, the gate, and the
no-GPU refusal. Nothing here needs cupy or a device."""

from __future__ import annotations

import dataclasses
import sys

import numpy as np
import pytest
import torch

from ledger import kernels as K
from ledger.errors import BadInput, RealizationUnavailable, UnknownRef
from ledger.kernels import formats as F
from ledger.kernels import oracles as O
from ledger.kernels import reference as R
from ledger.kernels import specs as S
from ledger.kernels.records import BenchRecord, TestRecord, Timing, b3, canonical


def to_torch(inp: dict) -> dict:
    out = {}
    for k, v in inp.items():
        if isinstance(v, np.ndarray):
            out[k] = torch.from_numpy(v.view(np.int16)).view(torch.bfloat16) if v.dtype == np.uint16 else torch.from_numpy(v)
        else:
            out[k] = v
    return out


# --- formats ------------------------------------------------------------------------------
def test_bf16_round_trip_and_rounding():
    x = np.array([1.0, -2.5, 3.14159, 1e-30, 65504.0, -0.0], dtype=np.float32)
    bits = F.f32_to_bf16_bits(x)
    ref = torch.from_numpy(x).to(torch.bfloat16).view(torch.int16).numpy().view(np.uint16)
    assert np.array_equal(bits, ref)  # round-to-nearest-even, same as torch
    assert np.array_equal(F.f32_to_bf16_bits(F.bf16_bits_to_f32(bits)), bits)


def test_q4_pack_unpack_round_trip():
    rng = np.random.default_rng(0)
    q = rng.integers(0, 16, (7, 256)).astype(np.uint8)
    packed = F.pack_q4b32(q)
    assert packed.shape == (7, 128)
    assert np.array_equal(F.unpack_q4b32(packed), q)


def test_q4_layout_is_the_documented_interleave():
    q = np.arange(8, dtype=np.uint8).reshape(1, 8)  # elements 0..7 of one word
    word = int(F.pack_q4b32(q).view("<u4")[0, 0])
    for i in range(4):
        assert (word >> (4 * i)) & 0xF == 2 * i
        assert (word >> (16 + 4 * i)) & 0xF == 2 * i + 1


@pytest.mark.parametrize("scale", [1e-3, 1.0, 300.0])
def test_int8_round_trip_error_bound(scale):
    rng = np.random.default_rng(1)
    w = rng.standard_normal((33, 200)) * scale
    w[3] = 0.0  # an all-zero row must not divide by zero
    q, s = F.quantize_int8(w)
    assert q.dtype == np.int8 and s.dtype == np.float32 and np.abs(q).max() <= 127
    err = np.abs(w - F.dequantize_int8(q, s))
    assert np.all(err <= s.astype(np.float64)[:, None] / 2 * (1 + 1e-6) + 1e-300)
    assert np.all(F.dequantize_int8(q, s)[3] == 0)


@pytest.mark.parametrize("scale", [1e-3, 1.0, 300.0])
def test_q4b32_round_trip_error_bound(scale):
    rng = np.random.default_rng(2)
    w = rng.standard_normal((9, 256)) * scale
    w[0, :32] = 0.0
    q, sb = F.quantize_q4b32(w)
    assert q.max() <= 15 and q.min() >= 1  # symmetric grid: -7..7
    s = F.bf16_bits_to_f64(sb)
    err = np.abs(w - F.dequantize_q4b32(q, sb)).reshape(9, 8, 32)
    assert np.all(err <= s[:, :, None] / 2 * (1 + 1e-6))
    # the bound is about as tight as it says: the typical error is a quarter step
    assert 0.15 < float((err / s[:, :, None]).mean()) < 0.35


# --- oracles ------------------------------------------------------------------------------
@pytest.mark.parametrize("name", sorted(S.KERNELS))
@pytest.mark.parametrize("shape", [(1, 64, 256), (3, 40, 512), (8, 17, 384)])
def test_oracle_agrees_with_torch_reference_on_cpu(name, shape):
    spec = S.get(name)
    km = spec.requirements.k_multiple
    m, n, k = shape
    k = max(km, k // km * km)
    sh = S.Shape(m, n, k, 16 if spec.lora else 0)
    inp = spec.make_inputs(sh, np.random.default_rng([m, n, k]))
    ref = spec.oracle(inp)
    assert ref.shape == (m, n) and ref.dtype == np.float64
    y = R.get(spec.reference)(**to_torch(inp)).float().numpy()
    rel_l2, rel_max = O.relative_errors(y, ref)
    assert rel_l2 < 8e-3 and rel_max < 2e-2  # torch rounds its intermediates to bf16


def test_oracle_is_exact_on_a_hand_example():
    w = F.f32_to_bf16_bits(np.array([[1.0, 2.0], [3.0, -4.0]], dtype=np.float32))
    x = F.f32_to_bf16_bits(np.array([[0.5, 0.25]], dtype=np.float32))
    a = F.f32_to_bf16_bits(np.array([[1.0, 1.0]], dtype=np.float32))
    b = F.f32_to_bf16_bits(np.array([[2.0], [-1.0]], dtype=np.float32))
    y = O.lora_linear_bf16({"w": w, "x": x, "a": a, "b": b, "s": 0.5})
    # W x = [1, 0.5]; A x = 0.75; s * B (A x) = [0.75, -0.375]
    assert np.array_equal(y, np.array([[1.75, 0.125]]))


def test_q4_oracle_uses_the_packed_layout():
    q = np.tile(np.arange(16, dtype=np.uint8), 2).reshape(1, 32)
    scale = F.f32_to_bf16_bits(np.array([[0.5]], dtype=np.float32))
    x = F.f32_to_bf16_bits(np.eye(32, dtype=np.float32)[:8])  # picks elements 0..7
    y = O.linear_q4b32({"w": F.pack_q4b32(q), "wscale": scale, "x": x})
    assert np.array_equal(y[:, 0], (np.arange(8) - 8) * 0.5)


def test_relative_errors_flags_non_finite():
    assert O.relative_errors(np.array([[np.nan, 1.0]]), np.array([[1.0, 1.0]])) == (float("inf"), float("inf"))
    assert O.relative_errors(np.array([[1.0, 2.0]]), np.array([[1.0, 2.0]])) == (0.0, 0.0)


# --- requirements, shapes, targets -----------------------------------------------------------
def test_shape_parsing():
    assert S.Shape.parse("1x4096x4096r16") == S.Shape(1, 4096, 4096, 16)
    assert S.Shape.coerce({"m": 2, "n": 3, "k": 32}) == S.Shape(2, 3, 32, 0)
    assert S.Shape.coerce((8, 14336, 4096)) == S.Shape(8, 14336, 4096)
    with pytest.raises(BadInput):
        S.Shape.parse("4096 by 4096")


@pytest.mark.parametrize("name,shape,needle", [
    ("linear-bf16", S.Shape(9, 64, 64), "M=9"),
    ("linear-bf16", S.Shape(1, 64, 48), "multiple of 32"),
    ("linear-int8", S.Shape(1, 64, 96), "multiple of 64"),
    ("linear-q4b32", S.Shape(1, 64, 192), "multiple of 128"),
    ("lora-linear-bf16", S.Shape(1, 64, 64, 12), "multiple of 8"),
    ("lora-linear-bf16", S.Shape(1, 64, 64, 128), "between 8 and 64"),
    ("linear-bf16", S.Shape(1, 64, 64, 16), "no LoRA"),
])
def test_shape_requirements_refuse_with_the_exact_reason(name, shape, needle):
    with pytest.raises(RealizationUnavailable) as e:
        S.get(name).requirements.check_shape(name, shape)
    assert needle in e.value.message and e.value.exit_code == 3


def test_targets_resolve():
    assert K.resolve_target("h200").arch == "sm_90"
    assert K.resolve_target("sm_86").cc == (8, 6)
    assert K.resolve_target("8.9").arch == "sm_89"
    assert K.resolve_target({"name": "x", "device": "cuda", "compute_capability": "8.0"}).arch == "sm_80"
    with pytest.raises(RealizationUnavailable):
        K.resolve_target("cpu")
    with pytest.raises(RealizationUnavailable):
        K.resolve_target({"name": "cpu", "device": "cpu", "compute_capability": ""})
    with pytest.raises(BadInput):
        K.resolve_target("nonesuch-gpu")


def test_runner_target_profiles_are_accepted():
    targets = pytest.importorskip("ledger.plan.targets")
    t = targets.get("h200")
    assert K.resolve_target(t).arch == "sm_90"
    with pytest.raises(RealizationUnavailable):
        K.resolve_target(targets.get("cpu"))


def test_build_refuses_a_target_below_the_requirement_without_touching_cupy(monkeypatch):
    monkeypatch.setitem(sys.modules, "cupy", None)  # even with cupy unimportable
    with pytest.raises(RealizationUnavailable) as e:
        K.build("lora-linear-bf16", "sm_75")
    assert "7.5" in e.value.message and "8.0" in e.value.message


def test_config_rule_reproduces_the_h200_sweep():
    """Blocks per SM as the occupancy API reports them on an H200 for the register-pipeline
    configurations (from their ptxas register counts); the rule must pick the configuration
    that measured fastest at each decode shape of the first H200 sweep."""
    spec = dataclasses.replace(S.get("linear-bf16"), configs=((8, 1, 1, 0), (8, 2, 1, 0), (4, 2, 1, 0), (8, 2, 2, 0), (4, 2, 2, 0)))
    bps = {(8, 1, 1, 0): 5, (8, 2, 1, 0): 3, (4, 2, 1, 0): 6, (8, 2, 2, 0): 2, (4, 2, 2, 0): 4}
    assert spec.choose_config(S.Shape(1, 4096, 4096), 132, bps) == (8, 2, 1, 0)
    assert spec.choose_config(S.Shape(1, 8192, 8192), 132, bps) == (8, 2, 2, 0)
    assert spec.choose_config(S.Shape(1, 14336, 4096), 132, bps) == (4, 2, 2, 0)
    q4 = dataclasses.replace(S.get("linear-q4b32"), configs=((8, 1, 1, 0), (4, 1, 1, 0), (4, 1, 2, 0), (8, 1, 2, 0)))
    qbps = {(8, 1, 1, 0): 2, (4, 1, 1, 0): 5, (4, 1, 2, 0): 4, (8, 1, 2, 0): 2}
    assert q4.choose_config(S.Shape(1, 8192, 8192), 132, qbps) == (8, 1, 2, 0)
    assert q4.choose_config(S.Shape(1, 14336, 4096), 132, qbps) == (4, 1, 2, 0)
    lora = dataclasses.replace(S.get("lora-linear-bf16"), configs=spec.configs)
    lbps = {(8, 1, 1, 0): 2, (8, 2, 1, 0): 2, (4, 2, 1, 0): 5, (8, 2, 2, 0): 2, (4, 2, 2, 0): 4}
    assert lora.choose_config(S.Shape(1, 4096, 4096, 16), 132, lbps) == (8, 2, 1, 0)
    assert lora.choose_config(S.Shape(1, 8192, 8192, 16), 132, lbps) == (8, 2, 2, 0)
    assert lora.choose_config(S.Shape(1, 14336, 4096, 16), 132, lbps) == (4, 2, 2, 0)
    # cp.async-ring configurations are compiled but never auto-chosen
    both = dataclasses.replace(spec, configs=spec.configs + ((8, 1, 1, 4),))
    assert both.choose_config(S.Shape(1, 4096, 4096), 132, {**bps, (8, 1, 1, 4): 8})[3] == 0
    # a configuration that cannot be resident at all is never chosen
    assert spec.choose_config(S.Shape(1, 8192, 8192), 132, {**bps, (8, 2, 2, 0): 0}) != (8, 2, 2, 0)


def test_unknown_kernel():
    with pytest.raises(UnknownRef):
        K.get("nonesuch")


# --- no cupy / no GPU: typed refusal, never a fallback --------------------------------------
def test_no_cupy_is_a_typed_refusal(monkeypatch):
    monkeypatch.setitem(sys.modules, "cupy", None)  # import cupy -> ImportError
    with pytest.raises(RealizationUnavailable):
        K.build("linear-bf16", "h200")
    with pytest.raises(RealizationUnavailable):
        K.test("linear-bf16")
    with pytest.raises(RealizationUnavailable):
        K.bench("linear-bf16", "1x4096x4096")


def test_no_device_is_a_typed_refusal(monkeypatch):
    class FakeRuntime:
        @staticmethod
        def getDeviceCount():
            return 0

    class FakeCupy:
        class cuda:
            runtime = FakeRuntime

    monkeypatch.setitem(sys.modules, "cupy", FakeCupy)
    with pytest.raises(RealizationUnavailable) as e:
        K.test("linear-q4b32")
    assert "no CUDA device" in e.value.message
    with pytest.raises(RealizationUnavailable):
        K.bench("lora-linear-bf16", "1x4096x4096r16")


def test_bench_needs_twenty_launches():
    with pytest.raises(BadInput):
        K.bench("linear-bf16", "1x4096x4096", launches=19)


# --- records ---------------------------------------------------------------------------------
def test_ids_and_canonical_json_match_the_store():
    ids = pytest.importorskip("ledger.store.ids")
    can = pytest.importorskip("ledger.store.canonical")
    obj = {"b": [1, 2.5, "é"], "a": None}
    assert canonical(obj) == can.dumps(obj)
    assert b3(b"kernel") == ids.hash_bytes(b"kernel")


def test_build_record_references_its_artefacts():
    br = K.BuildRecord(kernel="linear-bf16", arch="sm_90", source="src", source_file="decode_linear.cu",
                       options=("-arch=sm_90",), ptx_options=("-arch=compute_90",), nvrtc_version="13.0",
                       entry_points={"e": "_Z1e"}, ptx=b"PTX-BYTES", cubin=b"CUBIN-BYTES")
    body = br.body()
    arts = br.artefacts()
    assert body["cubin"] == br.code_object == b3(b"CUBIN-BYTES") and body["ptx"] in arts and body["source_id"] in arts
    assert b"CUBIN-BYTES" not in canonical(body) and b"PTX-BYTES" not in canonical(body)  # bytes travel as objects, the body names them
    assert br.id == b3(canonical(body))


# --- the gate --------------------------------------------------------------------------------
CUBIN = b3(b"candidate cubin")
TORCH = b3(canonical(R.description("linear_bf16")))


def _test_record(rel=1.5e-3, unwritten=0, code=CUBIN, cases=None) -> TestRecord:
    if cases is None:
        cases = ({"shape": {"m": 1, "n": 4096, "k": 4096, "r": 0}, "path": "direct", "rel_l2": rel,
                  "rel_max": rel, "unwritten": unwritten, "deterministic": True},)
    return TestRecord(kernel="linear-bf16", code_object=code, device={"name": "test"}, tolerance=5e-3,
                      cases=tuple(cases), seed=0)


def _bench_record(cand_s=10e-6, base_s=30e-6, cand_id=CUBIN, base_id=TORCH, launches=50) -> BenchRecord:
    return BenchRecord(kernel="linear-bf16", shape={"m": 1, "n": 4096, "k": 4096, "r": 0}, device={"name": "test"},
                       warmup=10, launches=launches, weight_bytes=2 * 4096 * 4096, copy_bytes_per_s=4.2e12,
                       candidate=Timing(cand_id, "decode_linear<0,8,2,1,false>", cand_s, cand_s, cand_s, launches),
                       baseline=Timing(base_id, "torch-eager:linear_bf16", base_s, base_s, base_s, launches),
                       baseline_description=R.description("linear_bf16"))


def test_gate_accepts_a_right_and_faster_kernel():
    d = K.gate(_test_record(), _bench_record())
    assert d.accepted and d.code == "Accepted" and d.verdict == "accepted"
    assert "3.00x faster" in d.reason
    assert d.body()["test"] == _test_record().id


def test_gate_refuses_a_wrong_kernel():
    d = K.gate(_test_record(rel=2e-2), _bench_record())
    assert not d.accepted and d.code == "Wrong" and "exceeds tolerance" in d.reason


def test_gate_refuses_a_kernel_that_produced_nan():
    d = K.gate(_test_record(rel=None), _bench_record())
    assert not d.accepted and d.code == "Wrong" and "non-finite" in d.reason


def test_gate_refuses_unwritten_outputs():
    d = K.gate(_test_record(unwritten=5), _bench_record())
    assert not d.accepted and d.code == "Wrong" and "never written" in d.reason


def test_gate_refuses_an_empty_sweep():
    d = K.gate(_test_record(cases=()), _bench_record())
    assert not d.accepted and d.code == "Wrong"


def test_gate_refuses_a_slow_kernel():
    d = K.gate(_test_record(), _bench_record(cand_s=31e-6, base_s=30e-6))
    assert not d.accepted and d.code == "NotFaster"
    d = K.gate(_test_record(), _bench_record(cand_s=30e-6, base_s=30e-6))  # a tie is not faster
    assert not d.accepted and d.code == "NotFaster"


def test_gate_refuses_timing_the_same_code_object_twice():
    d = K.gate(_test_record(), _bench_record(base_id=CUBIN))
    assert not d.accepted and d.code == "Unproven" and "same code object" in d.reason


def test_gate_refuses_a_bench_of_another_code_object():
    d = K.gate(_test_record(code=b3(b"other cubin")), _bench_record())
    assert not d.accepted and d.code == "Unproven"


def test_gate_refuses_too_few_launches_and_mismatched_kernels():
    assert K.gate(_test_record(), _bench_record(launches=10)).code == "Unproven"
    other = dataclasses.replace(_bench_record(), kernel="linear-int8")
    assert K.gate(_test_record(), other).code == "Unproven"
    bad = _bench_record(cand_s=float("nan"))
    assert K.gate(_test_record(), bad).code == "Unproven"


def test_bench_record_fractions():
    b = _bench_record(cand_s=10e-6, base_s=40e-6)
    assert b.speedup == pytest.approx(4.0)
    assert b.candidate_fraction == pytest.approx(2 * 4096 * 4096 / 10e-6 / 4.2e12)
    assert canonical(b.body())  # finite, canonical


def test_weight_bytes_count_everything_read():
    sh = S.Shape(1, 8192, 8192, 16)
    assert S.get("linear-bf16").weight_bytes(S.Shape(1, 8192, 8192)) == 2 * 8192 * 8192
    assert S.get("lora-linear-bf16").weight_bytes(sh) == 2 * 8192 * 8192 + 2 * 16 * 8192 * 2
    assert S.get("linear-int8").weight_bytes(S.Shape(1, 8192, 8192)) == 8192 * 8192 + 4 * 8192
    assert S.get("linear-q4b32").weight_bytes(S.Shape(1, 8192, 8192)) == 8192 * 4096 + 2 * 8192 * 256


def test_registry_describes_every_kernel():
    bodies = K.available()
    assert {b["name"] for b in bodies} == set(S.KERNELS)
    for b in bodies:
        assert b["requirements"]["min_compute_capability"] == "8.0"
        assert b["entry_points"] and b["oracle"].startswith("ledger.kernels.oracles.")
        canonical(b)


def test_source_is_packaged_and_has_every_entry():
    spec = S.get("lora-linear-bf16")
    src = spec.source()
    assert "decode_linear" in src and "ledger_spin" in src
    assert all(e.startswith("decode_linear<0,") and ",true," in e for e in spec.entries())


# --- the int8 x16 path: its bit tricks and x staging, emulated in numpy ------------------------
def test_x16_int8_dequant_is_exact_for_every_byte():
    """dequant_i8_f16 (byte_perm into fp16 1024 + (q + 128), then - 1152) gives q exactly, in the
    element order the fragment layout assumes (pair 0 = elements 0, 1; pair 1 = elements 2, 3)."""
    q = np.arange(-128, 128, dtype=np.int8)
    for i in range(0, 256, 4):
        word = int(q[i:i + 4].view("<u4")[0])
        p0, p1 = F.int8_word_to_f16_pairs(word)
        assert p0.tolist() == [float(q[i]), float(q[i + 1])]
        assert p1.tolist() == [float(q[i + 2]), float(q[i + 3])]


def test_byte_perm_matches_cuda_semantics():
    assert F.byte_perm(0x33221100, 0x77665544, 0x3210) == 0x33221100
    assert F.byte_perm(0x33221100, 0x77665544, 0x7654) == 0x77665544
    assert F.byte_perm(0x000000AB, 0x64646464, 0x4140) == 0x640064AB


@pytest.mark.parametrize("scale", [1e-30, 1e-6, 1.0, 3e4, 1e6, 1e30])
def test_x16_staging_is_exact_and_in_range(scale):
    rng = np.random.default_rng(5)
    x = F.f32_to_bf16_bits((rng.standard_normal((3, 512)) * scale).astype(np.float32))
    staged, p = F.x16_stage(x)
    xf = F.bf16_bits_to_f64(x)
    assert np.all(np.isfinite(staged.astype(np.float64)))
    top = float(np.abs(staged.astype(np.float64)).max())
    assert 2.0 ** 14 <= top < 2.0 ** 15  # the largest element lands in [2^14, 2^15): no overflow
    back = staged.astype(np.float64) * 2.0 ** p
    big = np.abs(xf) >= np.abs(xf).max() * 2.0 ** -28
    assert np.array_equal(back[big], xf[big])  # bf16's 8 significant bits are exact in fp16


def test_x16_staging_of_zeros_and_the_clamp():
    assert F.x16_exponent(np.zeros(64, dtype=np.uint16)) == F.X16_P_MIN
    staged, p = F.x16_stage(np.zeros(64, dtype=np.uint16))
    assert p == F.X16_P_MIN and not staged.any()
    tiny = F.f32_to_bf16_bits(np.full(8, 1e-38, dtype=np.float32))
    staged, p = F.x16_stage(tiny)  # below the clamp's reach: still finite, just not rescaled fully
    assert p == F.X16_P_MIN and np.all(np.isfinite(staged.astype(np.float64)))


@pytest.mark.parametrize("scale", [1e-20, 1.0, 1e20])
def test_x16_emulated_kernel_matches_the_oracle(scale):
    """y = 2^p * s[n] * sum_k q[n,k] * x16[k] (products exact, float64 sum standing in for fp32)
    is the int8 oracle to 1e-6 at any bf16 range of x -- the staging loses nothing measurable."""
    spec = S.get("linear-int8-x16")
    rng = np.random.default_rng(9)
    inp = spec.make_inputs(S.Shape(2, 40, 256), rng)
    inp["x"] = F.f32_to_bf16_bits(F.bf16_bits_to_f32(inp["x"]) * np.float32(scale))
    staged, p = F.x16_stage(inp["x"])
    y = (staged.astype(np.float64) @ inp["w"].astype(np.float64).T) * inp["wscale"].astype(np.float64) * 2.0 ** p
    rel_l2, _ = O.relative_errors(y, spec.oracle(inp))
    assert rel_l2 < 1e-6


def test_x16_requirement_refuses_an_x_that_does_not_fit():
    spec = S.get("linear-int8-x16")
    spec.requirements.check_shape(spec.name, S.Shape(1, 64, 16384 - 64))
    with pytest.raises(RealizationUnavailable, match="do not fit"):
        spec.requirements.check_shape(spec.name, S.Shape(2, 64, 8192 + 64))
    assert spec.requirements.body()["max_m_times_k_plus_8"] == S.X16_MAX
    assert all(e.startswith("decode_linear_x16<1,") for e in spec.entries())


def test_measured_best_configs_override_the_rule_only_where_stored():
    """The configurations measured fastest offline (specs.MEASURED_BEST) are returned for their
    exact (kernel, SMs, M, N, K); any other shape, or a device with other SMs, gets the rule."""
    spec = S.get("linear-int8-x16")
    bps = dict.fromkeys(spec.configs, 2)
    key = ("linear-int8-x16", 132, 1, 8192, 8192)
    assert S.MEASURED_BEST[key] in spec.configs
    assert spec.choose_config(S.Shape(1, 8192, 8192), 132, bps) == S.MEASURED_BEST[key]
    rule = dataclasses.replace(spec, name="not-stored")
    assert spec.choose_config(S.Shape(1, 8192, 8192), 114, bps) == rule.choose_config(S.Shape(1, 8192, 8192), 114, bps)
    assert spec.choose_config(S.Shape(2, 8192, 8192), 132, bps) == rule.choose_config(S.Shape(2, 8192, 8192), 132, bps)
    # a stored configuration the device cannot make resident is not returned
    no_room = {**bps, S.MEASURED_BEST[key]: 0}
    assert spec.choose_config(S.Shape(1, 8192, 8192), 132, no_room) != S.MEASURED_BEST[key]
    for (name, _sms, m, n, k), cfg in S.MEASURED_BEST.items():
        assert cfg in S.get(name).configs and cfg[3] == 0
        S.get(name).requirements.check_shape(name, S.Shape(m, n, k))


def test_x16_q4_dequant_is_exact_on_the_interleave():
    """dequant_q4_f16 (Marlin's fp16 trick on ledger's interleave, formats.py) gives q - 8 for
    every element of a word, in element order, for every nibble value."""
    rng = np.random.default_rng(4)
    for _ in range(64):
        q = rng.integers(0, 16, (1, 8)).astype(np.uint8)
        word = int(F.pack_q4b32(q).view("<u4")[0, 0])
        pairs = F.q4_word_to_f16_pairs(word)
        got = np.concatenate(pairs).astype(np.int64)
        assert got.tolist() == (q[0].astype(np.int64) - 8).tolist()
    for v in range(16):  # every nibble value in every position
        q = np.full((1, 8), v, dtype=np.uint8)
        got = np.concatenate(F.q4_word_to_f16_pairs(int(F.pack_q4b32(q).view("<u4")[0, 0])))
        assert np.all(got == v - 8)


def test_x16_fp16_constants_of_the_source():
    """The fp16 bit patterns decode_linear.cu uses are the values the emulation above assumes."""
    src = S.get("linear-q4b32-x16").source()
    f16 = lambda bits: float(np.array([bits], dtype=np.uint16).view(np.float16)[0])  # noqa: E731
    for bits, value in ((0x6400, 1024.0), (0xE408, -1032.0), (0x2C00, 1 / 16), (0xD480, -72.0), (0xE480, -1152.0)):
        assert f16(bits) == value
        assert f"0x{bits:04X}{bits:04X}u" in src


def test_q4b32p_round_trip_and_the_kernel_fragment_mapping():
    """q4b32p packs and unpacks losslessly; and the x16 kernel's fragment reads (emulated here:
    pair P of lane t's 16 bytes is stored element 32t + 2P + e; its x pair is read at
    32(P//4) + 16((P%4)//2) + 4t + 2(P%2) + e) meet on the same logical k, and each mma
    (pairs 2j, 2j+1 of all four lanes) covers 16 elements of one scale block, block j // 2."""
    rng = np.random.default_rng(8)
    q = rng.integers(0, 16, (5, 384)).astype(np.uint8)
    packed = F.pack_q4b32p(q)
    assert packed.shape == (5, 192) and np.array_equal(F.unpack_q4b32p(packed), q)
    assert not np.array_equal(packed, F.pack_q4b32(q))
    logical = F.q4p_logical_of_stored()
    for j in range(8):
        ks = []
        for t in range(4):
            for P in (2 * j, 2 * j + 1):
                for e in range(2):
                    k_w = int(logical[32 * t + 2 * P + e])
                    k_x = 32 * (P // 4) + 16 * ((P % 4) // 2) + 4 * t + 2 * (P % 2) + e
                    assert k_w == k_x
                    ks.append(k_w)
        assert sorted(ks) == list(range(32 * (j // 2) + 16 * (j % 2), 32 * (j // 2) + 16 * (j % 2) + 16))


def test_q4b32p_torch_reference_dequantizes_like_numpy():
    spec = S.get("linear-q4b32p-x16")
    inp = spec.make_inputs(S.Shape(1, 24, 512), np.random.default_rng(2))
    t = to_torch(inp)
    w_torch = R.dequant_q4b32p(t["w"], t["wscale"]).float().numpy().astype(np.float64)
    w_np = F.dequantize_q4b32(F.unpack_q4b32p(inp["w"]), inp["wscale"])
    assert np.allclose(w_torch, w_np, rtol=2 ** -8, atol=0)
