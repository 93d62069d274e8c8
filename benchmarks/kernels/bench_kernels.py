#!/usr/bin/env python3
"""Decode-kernel benchmark (H200): ledger's kernels beside torch's realizations, one run.

    python benchmarks/kernels/bench_kernels.py [--sweep] [--launches 100] [--out DIR]

Prints, for 4096x4096, 8192x8192 and 14336x4096 at batch 1 (and batch 8 with --batch8):
the measured device-to-device copy bandwidth (read + write); torch F.linear bf16 matvec as a
fraction of it; torch eager LoRA (r 16) time and its cost over F.linear; ledger's base matvec,
LoRA-fused matvec (fraction + cost over the base), int8 and q4b32 matvecs (fractions of the
bytes of weights read); then the issue's targets, met or missed. Every figure is a median of
per-launch CUDA-event times after warm-up, over rotated weight copies (>= 4x L2), in this run.

--sweep first times every compiled launch configuration and benches each kernel with the
fastest one (and shows what the library's own choice, from the occupancy rule, would have
cost); without it the library's choice is used. Full records (JSON) go to --out (default: $OUT if set, else benchmarks/_work).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import traceback
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from ledger import kernels as K  # noqa: E402
from ledger.kernels import harness as H  # noqa: E402
from ledger.kernels import runtime as R  # noqa: E402
from ledger.kernels import specs as S  # noqa: E402

SHAPES = [(4096, 4096), (8192, 8192), (14336, 4096)]
NAMES = ["linear-bf16", "lora-linear-bf16", "linear-int8", "linear-q4b32"]
VARIANTS = [()]  # (-DLEDGER_NO_L2_256B was 1-4% slower everywhere in the first H200 sweep)


READ_CEILING_SRC = r"""
// A pure streaming read (16-byte loads, 4 in flight per thread, grid-stride): what reading
// alone can reach on this device, beside the copy bandwidth the targets are stated against.
extern "C" __global__ void read_ceiling(const uint4* __restrict__ p, long long n16, unsigned* out) {
  unsigned acc = 0;
  const long long stride = (long long)gridDim.x * blockDim.x;
  long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
  for (; i + 3 * stride < n16; i += 4 * stride) {
    const uint4 a = __ldg(p + i), b = __ldg(p + i + stride), c = __ldg(p + i + 2 * stride),
                d = __ldg(p + i + 3 * stride);
    acc ^= a.x ^ a.y ^ a.z ^ a.w ^ b.x ^ b.y ^ b.z ^ b.w ^ c.x ^ c.y ^ c.z ^ c.w ^ d.x ^ d.y ^ d.z ^ d.w;
  }
  for (; i < n16; i += stride) { const uint4 a = __ldg(p + i); acc ^= a.x ^ a.y ^ a.z ^ a.w; }
  if (acc == 0x9E3779B9u) out[0] = acc;  // keeps the loads alive
}
"""


def probes(builds, info):
    """Read ceiling (bytes read per second of a plain streaming read, 1 GiB) and the fixed cost
    of one launch (a 1x8192x256 problem: 4 MiB of weights) for ledger and torch."""
    import cupy as cp
    import numpy as np
    import torch
    import torch.nn.functional as Fn

    br = builds[("linear-bf16", ())]
    mod = R.load(br)
    spin = R.spin_function(mod)
    copy_bw, _ = R.copy_bandwidth(spin)
    k = cp.RawKernel(READ_CEILING_SRC, "read_ceiling", options=("-std=c++17",))
    nbytes = 1 << 30
    buf = cp.random.randint(0, 2**31 - 1, size=nbytes // 4, dtype=cp.int32)
    out = cp.zeros(1, dtype=cp.uint32)
    grid = (info["sms"] * 4,)
    t = R.time_calls([lambda: k(grid, (512,), (buf, np.int64(nbytes // 16), out))], 20, 3, spin)
    read_bw = nbytes / t.median
    buf = None  # free the buffer (the timed lambda holds the name)
    spec = S.get("linear-bf16")
    sh = S.Shape(1, 8192, 256)
    sets = [R.random_device_inputs(spec, sh, 7 + c) for c in range(2)]
    ops = [R.DecodeLinear(mod, spec, sh, d) for d in sets]
    ours = R.time_calls(ops, 100, 10, spin)
    ts = [R.torch_views(d) for d in sets]
    theirs = R.time_calls([(lambda t=t: Fn.linear(t["x"], t["w"])) for t in ts], 100, 10, spin)
    res = {"copy_bytes_per_s": copy_bw, "read_bytes_per_s": read_bw, "read_over_copy": read_bw / copy_bw,
           "fixed_cost_s": {"ledger": ours.median, "torch": theirs.median, "shape": str(sh)}}
    print(f"\nprobes: copy {copy_bw / 1e12:.2f} TB/s (read+write); streaming read {read_bw / 1e12:.2f} TB/s "
          f"({read_bw / copy_bw:.1%} of copy); one launch of {sh} (4 MiB): ledger {ours.median * 1e6:.2f} us, "
          f"torch F.linear {theirs.median * 1e6:.2f} us")
    del torch
    return res


def back_to_back(builds, info, launches: int) -> dict:
    """The same kernels queued back-to-back between one pair of events: per-call throughput
    without the per-launch event overhead (a figure beside the records, not instead of them)."""

    from ledger.kernels import reference

    out = {}
    print("\nback-to-back (one event pair around %d queued calls; us per call, fraction of copy):" % launches)
    for (n, k) in SHAPES:
        row = {}
        for name in NAMES:
            spec = S.get(name)
            sh = shape_of(name, 1, n, k)
            mod = R.load(builds[(name, ())])
            spin = R.spin_function(mod)
            copy_bw, _ = R.copy_bandwidth(spin)
            copies = H.rotation_copies(spec.weight_bytes(sh), info["l2_bytes"])
            sets = [R.random_device_inputs(spec, sh, 300 + c) for c in range(copies)]
            ops = [R.DecodeLinear(mod, spec, sh, d) for d in sets]
            row[name] = R.time_back_to_back(ops, launches, 10, spin)
            row[name + ":fraction"] = spec.weight_bytes(sh) / row[name] / copy_bw
            if spec.weight_format == "bf16":
                ts = [R.torch_views(d) for d in sets]
                ref = reference.get(spec.baseline)
                key = "torch:" + spec.baseline
                row[key] = R.time_back_to_back([(lambda t=t: ref(**t)) for t in ts], launches, 10, spin)
                row[key + ":fraction"] = 2 * n * k / row[key] / copy_bw
            del sets, ops
        out[f"1x{n}x{k}"] = row
        print(f"  1x{n}x{k}: torch F.linear {row['torch:linear_bf16'] * 1e6:.2f} ({row['torch:linear_bf16:fraction']:.1%})"
              f" | ledger bf16 {row['linear-bf16'] * 1e6:.2f} ({row['linear-bf16:fraction']:.1%})"
              f" | torch LoRA {row['torch:lora_linear_bf16'] * 1e6:.2f} | ledger LoRA {row['lora-linear-bf16'] * 1e6:.2f}"
              f" ({row['lora-linear-bf16'] / row['linear-bf16']:.3f}x base)"
              f" | int8 {row['linear-int8'] * 1e6:.2f} ({row['linear-int8:fraction']:.1%})"
              f" | q4b32 {row['linear-q4b32'] * 1e6:.2f} ({row['linear-q4b32:fraction']:.1%})")
    return out


def shape_of(name: str, m: int, n: int, k: int) -> S.Shape:
    return S.Shape(m, n, k, 16 if S.get(name).lora else 0)


def sweep(builds, arch, m, launches, log):
    """Time every (variant, config) of every kernel, candidate only. Returns best per (name, shape)."""
    info = R.device_info()
    best = {}
    rows = []
    print("\nlibrary's choice (occupancy rule) vs the fastest configuration:")
    for (n, k) in SHAPES:
        for name in NAMES:
            spec = S.get(name)
            sh = shape_of(name, m, n, k)
            copies = H.rotation_copies(spec.weight_bytes(sh), info["l2_bytes"])
            sets = [R.random_device_inputs(spec, sh, 100 + c) for c in range(copies)]
            for dv in VARIANTS:
                br = builds[(name, dv)]
                mod = R.load(br)
                spin = R.spin_function(mod)
                times = {}
                for cfg in spec.configs:
                    ops = [R.DecodeLinear(mod, spec, sh, d, cfg) for d in sets]
                    t = R.time_calls(ops, launches, 10, spin)
                    times[cfg] = t.median
                    frac = spec.weight_bytes(sh) / t.median
                    rows.append((str(sh), name, "+".join(dv) or "-", cfg, t.median, frac))
                    key = (name, str(sh))
                    if key not in best or t.median < best[key][2]:
                        best[key] = (dv, cfg, t.median)
                auto = R.auto_config(mod, spec, sh)
                bcfg, btime = min(times.items(), key=lambda kv: kv[1])
                print(f"  {str(sh):>16} {name:<17} auto {auto} {times[auto] * 1e6:7.2f} us; "
                      f"best {bcfg} {btime * 1e6:7.2f} us ({times[auto] / btime:.3f}x)")
                log.append({"auto_vs_best": {"shape": str(sh), "kernel": name, "auto": list(auto),
                                             "auto_s": times[auto], "best": list(bcfg), "best_s": btime,
                                             "blocks_per_sm": {str(k): v for k, v in R.blocks_per_sm(mod, spec).items()}}})
            del sets
    log.append({"sweep": [{"shape": r[0], "kernel": r[1], "defines": r[2], "config": list(r[3]),
                           "median_s": r[4], "weight_bytes_per_s": r[5]} for r in rows]})
    print("configuration sweep (median us, weight GB/s):")
    for r in rows:
        print(f"  {r[0]:>16} {r[1]:<17} {r[2]:<15} cfg={r[3]}  {r[4] * 1e6:8.2f} us  {r[5] / 1e9:7.0f} GB/s")
    return best


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--launches", type=int, default=100)
    ap.add_argument("--warmup", type=int, default=20)
    ap.add_argument("--sweep", action="store_true")
    ap.add_argument("--batch8", action="store_true", help="also bench batch 8")
    ap.add_argument("--out", default=os.environ.get("OUT") or str(ROOT / "benchmarks" / "_work"))
    a = ap.parse_args()
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)

    info = R.device_info()
    arch = f"sm_{info['cc'][0]}{info['cc'][1]}"
    print(f"device: {info['name']} cc {info['cc']} sms {info['sms']} L2 {info['l2_bytes'] >> 20} MiB "
          f"driver {info['driver']} runtime {info['runtime']} cupy {info['cupy']} nvrtc {R.nvrtc_version()}")
    t0 = time.time()
    variants = VARIANTS if a.sweep else [()]
    with ThreadPoolExecutor(8) as ex:  # NVRTC releases the GIL: build everything at once
        futs = {(name, dv): ex.submit(H.build, name, arch, defines=dv) for name in NAMES for dv in variants}
        builds = {k: f.result() for k, f in futs.items()}
    print(f"built {len(builds)} modules in {time.time() - t0:.1f} s")
    for (name, dv), br in builds.items():
        regs = [ln.strip() for ln in br.log.splitlines() if "Used" in ln or ("spill" in ln and " 0 bytes spill stores" not in ln)]
        print(f"  {name} {'+'.join(dv) or '-'} {br.code_object[:19]} " + " | ".join(regs)[:400])

    log: list = [{"device": info}]
    try:
        log.append({"probes": probes(builds, info)})
    except Exception:
        traceback.print_exc()
    best = {}
    if a.sweep:
        try:
            best = sweep(builds, arch, 1, 50, log)
        except Exception:  # keep going with the defaults: the rest of the run still measures
            traceback.print_exc()

    batches = [1, 8] if a.batch8 else [1]
    records = {}
    for m in batches:
        for (n, k) in SHAPES:
            for name in NAMES:
                sh = shape_of(name, m, n, k)
                dv, cfg, _ = best.get((name, str(sh)), ((), None, None))
                try:
                    rec = K.bench(name, sh, launches=a.launches, warmup=a.warmup,
                                  build_record=builds[(name, dv)], config=cfg)
                except Exception:
                    traceback.print_exc()
                    continue
                records[(m, n, k, name)] = rec
                log.append({"bench": rec.body(), "defines": list(dv), "id": rec.id})

    # correctness of the benched code objects, on the same process/device (full sweep in pytest)
    tests = {}
    for name in NAMES:
        dv = best.get((name, str(shape_of(name, 1, 8192, 8192))), ((), None, None))[0]
        try:
            tr = K.test(name, build_record=builds[(name, dv)])
        except Exception:
            traceback.print_exc()
            continue
        tests[name] = tr
        log.append({"test": tr.body(), "id": tr.id})
    try:
        log.append({"back_to_back": back_to_back(builds, info, a.launches)})
    except Exception:
        traceback.print_exc()
    (out / "bench_kernels.json").write_text(json.dumps(log, indent=1, default=str))

    print("\n=== decode matvec on", info["name"], f"(fractions: bytes of weights read per second / "
          f"measured device copy bandwidth, read+write; median of {a.launches} launches) ===")
    ok_all = True
    for m in batches:
        for (n, k) in SHAPES:
            if not all((m, n, k, name) in records for name in NAMES):
                print(f"\nM={m} N={n} K={k}: incomplete (see the errors above)")
                ok_all = False
                continue
            r = {name: records[(m, n, k, name)] for name in NAMES}
            lo = r["lora-linear-bf16"]
            copy_bw = r["linear-bf16"].copy_bytes_per_s
            tl = lo.extra["torch_linear"]
            print(f"\nM={m} N={n} K={k}: copy bandwidth {copy_bw / 1e12:.2f} TB/s")
            print(f"  torch F.linear bf16        {tl['median_s'] * 1e6:8.2f} us  {tl['fraction']:6.1%}")
            print(f"  torch eager LoRA r16       {lo.baseline.median_s * 1e6:8.2f} us  "
                  f"({lo.extra['torch_lora_cost_over_linear']:.2f}x F.linear)")
            print(f"  ledger linear-bf16         {r['linear-bf16'].candidate.median_s * 1e6:8.2f} us  "
                  f"{r['linear-bf16'].candidate_fraction:6.1%}  cfg {r['linear-bf16'].extra['config']}")
            print(f"  ledger lora-linear-bf16    {lo.candidate.median_s * 1e6:8.2f} us  {lo.candidate_fraction:6.1%}  "
                  f"({lo.extra['lora_cost_over_ours_base']:.3f}x ledger base with the same config; "
                  f"{lo.candidate.median_s / r['linear-bf16'].candidate.median_s:.3f}x the fastest base)")
            for q in ("linear-int8", "linear-q4b32"):
                rq = r[q]
                print(f"  ledger {q:<19} {rq.candidate.median_s * 1e6:8.2f} us  {rq.candidate_fraction:6.1%}  "
                      f"(torch dequant+F.linear {rq.baseline.median_s * 1e6:.1f} us; "
                      f"{rq.extra['speedup_over_torch_linear_bf16']:.2f}x torch bf16 F.linear)")
            if m != 1:
                continue
            checks = []
            if n == 4096 and k == 4096:
                for name in NAMES:
                    checks.append((f"{name} fraction >= 2x torch F.linear's ({2 * tl['fraction']:.1%})",
                                   r[name].candidate_fraction >= 2 * tl["fraction"], f"{r[name].candidate_fraction:.1%}"))
            else:
                for name in NAMES:
                    checks.append((f"{name} >= 85% of copy bandwidth", r[name].candidate_fraction >= 0.85,
                                   f"{r[name].candidate_fraction:.1%}"))
            checks.append(("fused LoRA <= 1.10x base matvec", lo.extra["lora_cost_over_ours_base"] <= 1.10,
                           f"{lo.extra['lora_cost_over_ours_base']:.3f}x"))
            for what, ok, fig in checks:
                ok_all &= ok
                print(f"    [{'MET ' if ok else 'MISS'}] {what}: {fig}")
    print("\ncorrectness (worst rel_l2 vs float64 oracle over the default sweep; gate tolerance 5e-3):")
    for name, tr in tests.items():
        if (1, 8192, 8192, name) not in records:
            continue
        g = K.gate(tr, records[(1, 8192, 8192, name)])
        print(f"  {name:<17} worst rel_l2 {tr.worst_rel_l2} unwritten {tr.unwritten} "
              f"deterministic {all(c['deterministic'] for c in tr.cases)}  gate@8192^2: {g.verdict} ({g.code}: {g.reason})")
    print(f"\nall targets met: {ok_all}; records in {out / 'bench_kernels.json'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
