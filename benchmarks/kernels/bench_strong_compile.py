#!/usr/bin/env python3
"""The tuned torch.compile formulations beside ledger's decode kernels (issue 20's caveat).

    python benchmarks/kernels/bench_strong_compile.py [--launches 100] [--out DIR]

bench_vs_torch.py compiles ledger.kernels.reference's plain expressions in default mode. This
adds what a user who tunes decode would write (gpt-fast's recipe): Inductor's coordinate-descent
tuning on, and int8 weight-only as `F.linear(x, W.to(bf16)) * scale` (the scale after the
matmul, so the int8 -> bf16 conversion can fuse into the reduction). Same harness, same shapes
(8192x8192, 14336x4096, batch 1), ledger's kernels timed again in the same run. Rows are
written to --out/bench_strong_compile.json as each finishes.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from ledger.kernels import harness as H  # noqa: E402
from ledger.kernels import runtime as R  # noqa: E402
from ledger.kernels import specs as S  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--launches", type=int, default=100)
    ap.add_argument("--out", default=os.environ.get("OUT") or str(ROOT / "benchmarks" / "_work"))
    a = ap.parse_args()
    import torch
    import torch._inductor.config as ic
    import torch.nn.functional as Fn

    ic.coordinate_descent_tuning = True
    info = R.device_info()
    arch = f"sm_{info['cc'][0]}{info['cc'][1]}"
    names = ["lora-linear-bf16", "linear-int8"]
    mods = {n: R.load(H.build(n, arch)) for n in names}
    spin = R.spin_function(mods["linear-int8"])

    def lora(x, w, a_, b_, s):
        return Fn.linear(x, w) + Fn.linear(Fn.linear(x, a_), b_) * s

    def int8_gptfast(x, w, scale):
        return Fn.linear(x, w.to(dtype=x.dtype)) * scale

    lora_c = torch.compile(lora, dynamic=False)
    int8_c = torch.compile(int8_gptfast, dynamic=False)
    out = {"torch": torch.__version__, "inductor": {"coordinate_descent_tuning": True}, "shapes": {}}
    for n, k in [(8192, 8192), (14336, 4096)]:
        copy_bw, _ = R.copy_bandwidth(spin)
        row = {"copy_bytes_per_s": copy_bw}
        for name in names:
            spec = S.get(name)
            sh = S.Shape(1, n, k, 16 if spec.lora else 0)
            nbytes = spec.weight_bytes(sh)
            sets = [R.random_device_inputs(spec, sh, 900 + c) for c in range(H.rotation_copies(nbytes, info["l2_bytes"]))]
            ops = [R.DecodeLinear(mods[name], spec, sh, d) for d in sets]
            ts = [R.torch_views(d) for d in sets]
            if spec.lora:
                theirs = [lambda t=t: lora_c(t["x"], t["w"], t["a"], t["b"], t["s"]) for t in ts]
                label = "torch.compile LoRA (coordinate descent)"
            else:
                sc = [t["wscale"].to(torch.bfloat16) for t in ts]
                theirs = [lambda t=t, s=s: int8_c(t["x"], t["w"], s) for t, s in zip(ts, sc)]
                label = "torch.compile int8 gpt-fast form (coordinate descent)"
            for lab, fns in ((f"ledger {name}", ops), (label, theirs)):
                t = R.time_calls(fns, a.launches, 20, spin)
                row[lab] = {"median_s": t.median, "min_s": min(t.seconds), "max_s": max(t.seconds),
                            "fraction": nbytes / t.median / copy_bw}
                print(f"1x{n}x{k} {lab:<52} {t.median * 1e6:8.2f} us {row[lab]['fraction']:6.1%}", flush=True)
            ours, other = row[f"ledger {name}"]["median_s"], row[label]["median_s"]
            row[f"{name}:ledger_speedup"] = other / ours
            print(f"1x{n}x{k} {name}: ledger {other / ours:.2f}x the tuned compile", flush=True)
            del sets, ops, ts
            out["shapes"][f"1x{n}x{k}"] = row
            Path(a.out).mkdir(parents=True, exist_ok=True)
            (Path(a.out) / "bench_strong_compile.json").write_text(json.dumps(out, indent=1, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
