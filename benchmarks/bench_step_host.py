#!/usr/bin/env python3
"""Where a small model's fused-lora step spends its HOST time (issue 20: SmolLM2 through
`ledger train` at 162 ms a step against 90 ms for the same realization in process).

    python benchmarks/bench_step_host.py --matrix [--out DIR]     # every variant, each a fresh process
    python benchmarks/bench_step_host.py --threads 1 --compile-threads 1 [--cache DIR] [--profile]

One variant = one fresh process: SmolLM2's architecture (bench_train_gpu_ledger.SMOLLM2_SHAPE,
random at 0.02), peft LoRA r16 on all seven projections, ledger's FusedLlama, 16 x 1024 tokens,
AdamW fused; steps 3..N timed. Per step: the wall time (synchronised) and the HOST time, from the
step's start until forward and backward are queued (before the loss is read, the first sync): a
host time near the step time means the GPU waits on Python. Variables: torch's intra-op threads
(the training child runs the plan's `train.threads`, 1 by default), Inductor's compile threads
(the child compiles in process: TORCHINDUCTOR_COMPILE_THREADS=1) and a cold or warm Inductor
cache (a compile-cache hit loads from it). `--profile` adds cProfile over 3 steps (top functions
by own time) and torch.profiler's host-side operators.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent


def one(a) -> dict:
    import torch

    torch.set_num_threads(a.threads)
    sys.path.insert(0, str(HERE))
    from bench_train_gpu_ledger import ALL, SMOLLM2_SHAPE, _peft, smollm2_shaped_base

    from ledger.train.fused import FusedLlama

    d = Path(tempfile.mkdtemp(prefix="smol-shape-"))
    cuda = torch.cuda.is_available()
    if cuda:
        smollm2_shaped_base(d / "base")
    else:   # a smoke test of this script's code paths: tiny model, eager, fp32 on the CPU
        from bench_train_gpu_ledger import random_base

        random_base(d / "base", dict(hidden=64, layers=2, heads=4, kv=2, inter=128, seq=64), 0.02)
        a.seq, a.batch = 64, 2
    dev = "cuda" if cuda else "cpu"
    m = _peft(d / "base", dev, 16, 32.0, ALL)
    if not cuda:
        m = m.float()
    f = FusedLlama(m, 0.0, check=cuda, compile_layers=cuda)
    opt = torch.optim.AdamW([p for p in m.parameters() if p.requires_grad], lr=1e-4, fused=cuda)
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(0, 256, (a.batch, a.seq), generator=g)
    res = {"threads": torch.get_num_threads(), "compile_threads": os.environ.get("TORCHINDUCTOR_COMPILE_THREADS"),
           "cache": a.cache_state, "shape": SMOLLM2_SHAPE}
    times, host, cpu = [], [], []
    gcs = {"s": 0.0, "t0": 0.0}

    def on_gc(phase, info):
        if phase == "start":
            gcs["t0"] = time.perf_counter()
        else:
            gcs["s"] += time.perf_counter() - gcs["t0"]

    def step():
        t0 = time.perf_counter()
        x = ids.to(dev, non_blocking=True)
        loss = f.loss(x, x)
        loss.backward()
        h = time.perf_counter() - t0
        loss.item()
        opt.step()
        opt.zero_grad(set_to_none=True)
        sync()
        return time.perf_counter() - t0, h

    t0 = time.perf_counter()
    step()
    res["first_step_s"] = time.perf_counter() - t0
    gc.callbacks.append(on_gc)
    for i in range(a.steps - 1):
        c0 = time.thread_time()
        if i == 1:
            gcs["s"] = 0.0
        dt, h = step()
        if i >= 1:
            times.append(dt)
            host.append(h)
            cpu.append(time.thread_time() - c0)
    gc.callbacks.remove(on_gc)
    res.update(step_median_s=statistics.median(times), step_min_s=min(times), host_median_s=statistics.median(host),
               step_cpu_median_s=statistics.median(cpu), gc_ms_per_step=round(1e3 * gcs["s"] / max(1, len(times)), 2),
               gc_objects=len(gc.get_objects()), cublas_workspace_config=os.environ.get("CUBLAS_WORKSPACE_CONFIG"),
               tokens_per_s=a.batch * a.seq / statistics.median(times))
    if a.profile:
        import cProfile
        import io
        import pstats

        from torch.profiler import ProfilerActivity, profile

        pr = cProfile.Profile()
        pr.enable()
        for _ in range(3):
            step()
        pr.disable()
        s = io.StringIO()
        pstats.Stats(pr, stream=s).sort_stats("tottime").print_stats(30)
        res["cprofile_tottime"] = s.getvalue()[-9000:]
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            for _ in range(3):
                step()
        rows = sorted(((e.key, e.self_cpu_time_total / 3e3, e.count / 3) for e in prof.key_averages()),
                      key=lambda r: -r[1])
        res["torch_profiler_host_ms_per_step"] = [[k, round(ms, 3), n] for k, ms, n in rows[:30]]
    return res


def matrix(a) -> dict:
    """Each variant in a fresh process; `warm` variants reuse the cache the cold one left."""
    out: dict = {}
    caches = {"pool": tempfile.mkdtemp(prefix="ind-pool-"), "one": tempfile.mkdtemp(prefix="ind-one-")}
    variants = [("threads16 pool cold", 16, None, "pool", "cold"),
                ("threads16 pool warm", 16, None, "pool", "warm"),
                ("threads1 pool warm", 1, None, "pool", "warm"),
                ("threads16 compile1 cold", 16, "1", "one", "cold"),
                ("threads1 compile1 warm", 1, "1", "one", "warm")]   # the child's: one thread, a cache hit
    for name, threads, ct, cache, state in variants:
        env = dict(os.environ, TORCHINDUCTOR_CACHE_DIR=caches[cache], TRITON_CACHE_DIR=caches[cache] + "/triton")
        env.pop("TORCHINDUCTOR_COMPILE_THREADS", None)
        if ct:
            env["TORCHINDUCTOR_COMPILE_THREADS"] = ct
        t0 = time.time()
        p = subprocess.run([sys.executable, __file__, "--threads", str(threads), "--cache-state", state,
                            "--steps", str(a.steps), "--seq", str(a.seq), "--batch", str(a.batch),
                            *(["--profile"] if a.profile else []), "--json"],
                           env=env, capture_output=True, text=True, timeout=600)
        try:
            r = json.loads(p.stdout.strip().splitlines()[-1])
        except (ValueError, IndexError):
            r = {"error": p.stderr[-3000:]}
        r["wall_s"] = round(time.time() - t0, 1)
        out[name] = r
        print(f"{name:26s} step {r.get('step_median_s', float('nan')) * 1e3:7.1f} ms  host "
              f"{r.get('host_median_s', float('nan')) * 1e3:7.1f} ms  first {r.get('first_step_s', float('nan')):6.1f} s"
              f"  threads {r.get('threads')}  {r.get('error', '')[-400:]}", flush=True)
        if a.profile and "cprofile_tottime" in r:
            body = r["cprofile_tottime"]
            at = body.find("ncalls")
            print("\n".join(body[at:].splitlines()[:14]), flush=True)
            for k, ms, n in r["torch_profiler_host_ms_per_step"][:8]:
                print(f"    {ms:8.3f} ms/step {n:7.0f}x  {k[:90]}", flush=True)
    return out


# the training child's environment (ledger.train.run.child_env / job.child_env), cumulatively
CHILD_ENV = {"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1",
             "TORCHINDUCTOR_COMPILE_THREADS": "1", "TOKENIZERS_PARALLELISM": "false", "PYTHONHASHSEED": "0"}


def env_matrix(a) -> dict:
    """Fresh processes at one thread (as the child), the child's environment with and without
    CUBLAS_WORKSPACE_CONFIG=:4096:8 (set for every training child since session 4), alternating
    over `a.env_rounds` rounds; one warm-up process first so every timed one finds a warm cache."""
    out: dict = {}
    cache = tempfile.mkdtemp(prefix="ind-env-")
    variants = [("child env without CUBLAS_WORKSPACE_CONFIG", {}),
                ("child env with CUBLAS_WORKSPACE_CONFIG=:4096:8", {"CUBLAS_WORKSPACE_CONFIG": ":4096:8"})]
    runs = [("warm-up (cache)", {})] + [v for _ in range(a.env_rounds) for v in variants]
    for i, (name, extra) in enumerate(runs):
        env = {k: v for k, v in os.environ.items() if k != "CUBLAS_WORKSPACE_CONFIG"}
        env.update(CHILD_ENV, TORCHINDUCTOR_CACHE_DIR=cache, TRITON_CACHE_DIR=cache + "/triton", **extra)
        p = subprocess.run([sys.executable, __file__, "--threads", "1", "--cache-state", "warm" if i else "cold",
                            "--steps", str(a.steps), "--seq", str(a.seq), "--batch", str(a.batch), "--json"],
                           env=env, capture_output=True, text=True, timeout=600)
        try:
            r = json.loads(p.stdout.strip().splitlines()[-1])
        except (ValueError, IndexError):
            r = {"error": p.stderr[-3000:]}
        out.setdefault(name, []).append(r)
        print(f"{name:48s} step {r.get('step_median_s', float('nan')) * 1e3:7.1f} ms  host "
              f"{r.get('host_median_s', float('nan')) * 1e3:7.1f} ms  main CPU {r.get('step_cpu_median_s', float('nan')) * 1e3:6.1f} ms"
              f"  first {r.get('first_step_s', float('nan')):5.1f} s  gc {r.get('gc_ms_per_step')} ms/step "
              f"{r.get('error', '')[-400:]}", flush=True)
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--matrix", action="store_true")
    ap.add_argument("--env-matrix", action="store_true", help="the child's environment with and without "
                                                               "CUBLAS_WORKSPACE_CONFIG, fresh processes, alternating")
    ap.add_argument("--env-rounds", type=int, default=1)
    ap.add_argument("--threads", type=int, default=16)
    ap.add_argument("--cache-state", default="?")
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--seq", type=int, default=1024)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--profile", action="store_true")
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--out", default=os.environ.get("OUT") or str(HERE / "_work"))
    a = ap.parse_args()
    if a.matrix or a.env_matrix:
        res = env_matrix(a) if a.env_matrix else matrix(a)
        Path(a.out).mkdir(parents=True, exist_ok=True)
        (Path(a.out) / "bench_step_host.json").write_text(json.dumps(res, indent=1, default=str))
        return 0
    print(json.dumps(one(a), default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
