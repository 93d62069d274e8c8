"""Memory plan accuracy on CPU: predicted peak (the plan's named byte lines) vs observed.

Each config is compiled for `cpu` and trained for a few steps by `ledger train` (sandboxed
child). Observed = the child's peak RSS (VmHWM, reset through /proc/self/clear_refs) minus its
RSS right before it encodes the data and builds the model, as the receipt records it. RSS also
holds what the plan does not model -- allocator slack, oneDNN/OpenMP buffers, transformers'
loading machinery -- so small configs read high; the ratio column shows how far apart they are.

    .venv/bin/python benchmarks/bench_memory_plan.py [--steps 3]
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

CONFIGS = [
    ("demo (h64 L2, b16 x 96)", "[data]\nmicro_batch = 16\nseq_len = 96\n"),
    ("h128 L2, b64 x 128", "[model]\nhidden = 128\nintermediate = 352\n[data]\nmicro_batch = 64\nseq_len = 128\n"),
    ("h256 L4, b16 x 128", "[model]\nhidden = 256\nlayers = 4\nheads = 8\nkv_heads = 8\nintermediate = 688\n"
                           "[data]\nmicro_batch = 16\nseq_len = 128\n"),
    ("h256 L4, b48 x 128", "[model]\nhidden = 256\nlayers = 4\nheads = 8\nkv_heads = 8\nintermediate = 688\n"
                           "[data]\nmicro_batch = 48\nseq_len = 128\n"),
    ("h512 L4 r32, b16 x 128", "[model]\nhidden = 512\nlayers = 4\nheads = 8\nkv_heads = 8\nintermediate = 1376\n"
                               "[lora]\nr = 32\n[data]\nmicro_batch = 16\nseq_len = 128\n"),
    ("h512 L6, b32 x 96, dropout 0.1", "[model]\nhidden = 512\nlayers = 6\nheads = 8\nkv_heads = 8\nintermediate = 1376\n"
                                       "[lora]\ndropout = 0.1\n[data]\nmicro_batch = 32\nseq_len = 96\n"),
]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--knobs", default="default,65536",
                    help="MALLOC_MMAP_THRESHOLD_ values to run the child with ('default' = the child's own setting)")
    ap.add_argument("--configs", default="", help="comma-separated indices into CONFIGS (default: all)")
    args = ap.parse_args()
    knobs = args.knobs.split(",")
    chosen = [CONFIGS[int(i)] for i in args.configs.split(",")] if args.configs else CONFIGS

    from ledger.plan import compile as comp
    from ledger.plan import spec, targets
    from ledger.store import Store
    from ledger.train import run as trainlib

    store = Store.init(Path(tempfile.mkdtemp(prefix="bench-mem-")))
    mib = 1 << 20
    heads = "".join(f" observed ({k if k == 'default' else 'MALLOC_MMAP_THRESHOLD_=' + k}) | ratio |" for k in knobs)
    print(f"| config | predicted | activations+workspace |{heads}")
    print("|---|---|---|" + "---|---|" * len(knobs))
    for name, text in chosen:
        s = spec.parse(text + "[train]\ncheckpoint_every = 1000000\n")
        s = s.with_overrides({"data.steps": args.steps, "model.max_positions": 128})
        plan = comp.compile_spec(store, s, targets.get("cpu")).plan
        obs = []
        for knob in knobs:
            # With a fixed mmap threshold glibc hands every large freed block back to the kernel,
            # so RSS follows the live tensors; with a dynamic one it keeps freed forward temporaries.
            if knob != "default":
                os.environ["MALLOC_MMAP_THRESHOLD_"] = knob
            else:
                os.environ.pop("MALLOC_MMAP_THRESHOLD_", None)
            r = trainlib.train(store, plan.id)
            obs.append(r.receipt["memory"]["observed"]["peak_growth_bytes"])
        os.environ.pop("MALLOC_MMAP_THRESHOLD_", None)
        m = r.receipt["memory"]
        pred = m["predicted_bytes"]
        act = m["predicted_lines"]["activations"] + m["predicted_lines"]["workspace"]
        cells = "".join(f" {o / mib:.1f} MiB | {o / pred:.2f} |" for o in obs)
        print(f"| {name} | {pred / mib:.1f} MiB | {act / mib:.1f} MiB |{cells}", flush=True)


if __name__ == "__main__":
    main()
