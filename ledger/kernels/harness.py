"""build / test / bench: the three things `ledger kernel ...` records.

Each returns a frozen record (ledger.kernels.records); nothing here touches the store.
"""

from __future__ import annotations

import math

import numpy as np

from ledger.errors import BadInput, RealizationUnavailable
from ledger.kernels import devices as T
from ledger.kernels import formats as F
from ledger.kernels import oracles, reference
from ledger.kernels import specs as S
from ledger.kernels.records import BenchRecord, BuildRecord, TestRecord, Timing, b3, canonical, finite_or_none

MIN_LAUNCHES = 20
_BUILDS: dict[tuple, BuildRecord] = {}


def build(name: str, target, *, defines: tuple[str, ...] = ()) -> BuildRecord:
    """Compile kernel `name` for `target` with NVRTC: the cubin (what runs) and the PTX.

    The target's compute capability is checked against the kernel's requirement BEFORE
    anything is imported, so an unsuitable target is refused even on a machine without cupy.
    """
    spec = S.get(name)
    tgt = T.resolve(target)
    spec.requirements.check_cc(name, tgt.cc, f"target {tgt.name}")
    key = (name, tgt.arch, tuple(defines))
    if key in _BUILDS:
        return _BUILDS[key]
    from ledger.kernels import runtime

    src = spec.source()
    dflags = tuple(f"-D{d}" for d in defines)
    options = (*S.NVRTC_BASE_OPTIONS, f"-arch={tgt.arch}", *dflags)
    ptx_options = ("-std=c++17", f"-arch={tgt.virtual_arch}", *dflags)
    cubin, lowered, log = runtime.compile_source(src, spec.entries(), options, S.SOURCE_FILE)
    ptx, _, _ = runtime.compile_source(src, spec.entries(), ptx_options, S.SOURCE_FILE)
    inv = {v: k for k, v in lowered.items()}
    for mangled, expr in inv.items():  # make the ptxas report readable
        log = log.replace(mangled, expr)
    rec = BuildRecord(kernel=name, arch=tgt.arch, source=src, source_file=S.SOURCE_FILE,
                      options=options, ptx_options=ptx_options, nvrtc_version=runtime.nvrtc_version(),
                      entry_points=lowered, ptx=ptx, cubin=cubin, log=log)
    _BUILDS[key] = rec
    return rec


def _local_build(spec: S.KernelSpec, build_rec: BuildRecord | None, info: dict) -> BuildRecord:
    spec.requirements.check_cc(spec.name, tuple(info["cc"]), f"device {info['name']}")
    if build_rec is None:
        return build(spec.name, f"sm_{info['cc'][0]}{info['cc'][1]}")
    if build_rec.kernel != spec.name:
        raise BadInput(f"build record is for kernel {build_rec.kernel}, not {spec.name}")
    if build_rec.arch != f"sm_{info['cc'][0]}{info['cc'][1]}":
        raise RealizationUnavailable(f"build is for {build_rec.arch}; this device is {info['name']} "
                                     f"(sm_{info['cc'][0]}{info['cc'][1]})", "build for this device's target")
    return build_rec


def test(name: str, shapes=None, *, seed: int = 0, build_record: BuildRecord | None = None,
         config: tuple[int, int, int] | None = None) -> TestRecord:
    """Run the kernel on fresh random inputs over a shape sweep; record the worst relative error
    against the float64 oracle, unwritten outputs (the output is poisoned with NaN first) and
    whether repeated launches agree bit for bit. LoRA kernels are also run on their
    forward-progress path (consumers compute t themselves), which must match bit for bit."""
    from ledger.kernels import runtime

    spec = S.get(name)
    info = runtime.device_info()
    br = _local_build(spec, build_record, info)
    mod = runtime.load(br)
    sweep = [S.Shape.coerce(s) for s in (shapes if shapes is not None else S.default_sweep(spec))]
    for sh in sweep:
        spec.requirements.check_shape(name, sh)
    cases = []
    for i, sh in enumerate(sweep):
        rng = np.random.default_rng([seed, i, sh.m, sh.n, sh.k, sh.r])
        inp = spec.make_inputs(sh, rng)
        ref = spec.oracle(inp)
        op = runtime.DecodeLinear(mod, spec, sh, runtime.to_device(inp), config)
        first = None
        for path, mode in (("fused", 0), ("fallback", 1)) if spec.lora else (("direct", 0),):
            y = op(lora_mode=mode, poison=True).get()
            again = op(lora_mode=mode, poison=True).get()
            rel_l2, rel_max = oracles.relative_errors(F.bf16_bits_to_f64(y), ref)
            case = {"shape": sh.body(), "path": path, "entry": op.entry,
                    "rel_l2": finite_or_none(rel_l2), "rel_max": finite_or_none(rel_max),
                    "unwritten": int(np.count_nonzero(y == 0xFFFF)),
                    "deterministic": bool(np.array_equal(y, again))}
            if first is None:
                first = y
            else:
                case["bitwise_equal_to_fused"] = bool(np.array_equal(first, y))
            cases.append(case)
    return TestRecord(kernel=name, code_object=br.code_object, device=info, tolerance=spec.tolerance,
                      cases=tuple(cases), seed=seed)


def _timing(code_object: str, entry: str, t) -> Timing:
    return Timing(code_object=code_object, entry=entry, median_s=t.median, p10_s=t.quantile(0.1),
                  p90_s=t.quantile(0.9), launches=len(t.seconds))


def rotation_copies(weight_bytes: int, l2_bytes: int) -> int:
    """Enough distinct weight copies that consecutive launches never find their weights in L2
    (the copies together span >= 4x the L2)."""
    return max(2, min(16, math.ceil(4 * max(l2_bytes, 1) / max(weight_bytes, 1))))


def bench(name: str, shape, *, launches: int = 50, warmup: int = 10, seed: int = 0,
          build_record: BuildRecord | None = None, config: tuple[int, int, int] | None = None,
          side_by_side: bool = True) -> BenchRecord:
    """Median of per-launch CUDA-event times for the candidate and its torch baseline, timed in
    the same process, on the same rotated weight copies, after the same warm-up, beside a
    device-to-device copy that gives the bandwidth ceiling of this run."""
    from ledger.kernels import runtime

    if launches < MIN_LAUNCHES:
        raise BadInput(f"launches={launches}: a bench needs at least {MIN_LAUNCHES} timed launches")
    if warmup < 1:
        raise BadInput("warmup must be at least 1")
    spec = S.get(name)
    sh = S.Shape.coerce(shape)
    spec.requirements.check_shape(name, sh)
    info = runtime.device_info()
    br = _local_build(spec, build_record, info)
    mod = runtime.load(br)
    spin = runtime.spin_function(mod)

    copy_bw, copy_t = runtime.copy_bandwidth(spin)
    wbytes = spec.weight_bytes(sh)
    n_copies = rotation_copies(wbytes, info["l2_bytes"])
    sets = [runtime.random_device_inputs(spec, sh, seed + c) for c in range(n_copies)]
    if spec.lora:  # LoRA weights are per-layer too, but tiny: one copy shared keeps them honest
        for d in sets[1:]:
            d["a"], d["b"] = sets[0]["a"], sets[0]["b"]
    ops = [runtime.DecodeLinear(mod, spec, sh, d, config) for d in sets]
    cand = runtime.time_calls(ops, launches, warmup, spin)

    ref_fn = reference.get(spec.baseline)
    tsets = [runtime.torch_views(d) for d in sets]
    base = runtime.time_calls([(lambda t=t: ref_fn(**t)) for t in tsets], launches, warmup, spin)
    desc = reference.description(spec.baseline)
    base_id = b3(canonical(desc))

    extra: dict = {"copies": n_copies, "config": list(ops[0].config),
                   "copy_times_s": {"median": copy_t.median, "launches": len(copy_t.seconds)},
                   "queued": {"candidate": cand.queued, "baseline": base.queued}}
    if side_by_side:
        import torch.nn.functional as Fn

        if spec.lora:  # the same weights without the LoRA term: our base matvec and torch's F.linear
            base_spec = S.get("linear-bf16")
            bbr = build("linear-bf16", br.arch, defines=_defines_of(br))
            bmod = runtime.load(bbr)
            bops = [runtime.DecodeLinear(bmod, base_spec, S.Shape(sh.m, sh.n, sh.k), d, ops[0].config) for d in sets]
            ours_base = runtime.time_calls(bops, launches, warmup, spin)
            fl = runtime.time_calls([(lambda t=t: Fn.linear(t["x"], t["w"])) for t in tsets], launches, warmup, spin)
            extra["ours_base"] = {"code_object": bbr.code_object, "entry": bops[0].entry, "median_s": ours_base.median,
                                  "fraction": 2 * sh.n * sh.k / ours_base.median / copy_bw}
            extra["lora_cost_over_ours_base"] = cand.median / ours_base.median
            extra["torch_linear"] = {"median_s": fl.median, "fraction": 2 * sh.n * sh.k / fl.median / copy_bw}
            extra["torch_lora_cost_over_linear"] = base.median / fl.median
        elif spec.weight_format != "bf16":  # what the same layer costs in bf16 through torch
            import torch

            wb = [
                torch.randn(sh.n, sh.k, device="cuda", dtype=torch.bfloat16)
                for _ in range(rotation_copies(2 * sh.n * sh.k, info["l2_bytes"]))
            ]
            x = tsets[0]["x"]
            fl = runtime.time_calls([(lambda w=w: Fn.linear(x, w)) for w in wb], launches, warmup, spin)
            extra["torch_linear_bf16"] = {"median_s": fl.median, "fraction": 2 * sh.n * sh.k / fl.median / copy_bw}
            extra["speedup_over_torch_linear_bf16"] = fl.median / cand.median
            del wb
    return BenchRecord(kernel=name, shape=sh.body(), device=info, warmup=warmup, launches=launches,
                       weight_bytes=wbytes, copy_bytes_per_s=copy_bw,
                       candidate=_timing(br.code_object, ops[0].entry, cand),
                       baseline=_timing(base_id, desc["realization"], base),
                       baseline_description=desc, extra=extra)


def _defines_of(br: BuildRecord) -> tuple[str, ...]:
    return tuple(o[2:] for o in br.options if o.startswith("-D"))
