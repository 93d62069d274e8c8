#!/usr/bin/env python3
"""What `SftRecipe.setup` leaves behind in a process that slows a small model's fused step
(issue 20: SmolLM2's architecture through `ledger train`, 118-163 ms a step, against 80-88 ms for
the same realization in a fresh process; the in-process loop became slow once the recipe ran).

    OMP_NUM_THREADS=1 python benchmarks/bench_childgap_state.py [--steps 8] [--train-after] [--out DIR]

One process, in the training child's environment (OMP/MKL threads 1, CUBLAS_WORKSPACE_CONFIG
:4096:8, TORCHINDUCTOR_COMPILE_THREADS 1, TOKENIZERS_PARALLELISM false: set before torch loads):

  1. the bench's fused loop -- FusedLlama over its own peft model of SmolLM2's shape
     (bench_train_gpu_ledger.SMOLLM2_SHAPE, 16 x 1024, LoRA r16 on all seven, fused AdamW) -- timed;
  2. every piece of process-global state `global_state()` reads (below), then SftRecipe(work).setup()
     on a compiled plan of the same shape (the child's own code, in process), the state again, and
     the difference printed;
  3. the loop timed again; then each setting that differs put back to its value before setup, one at
     a time and cumulatively, the loop timed after each: the setting whose restoration brings the
     step back is the cause;
  4. then process actions no setting shows: the recipe dropped (del + gc), gc.freeze, dynamo reset +
     a fresh compile of the loop; then (--train-after) recipe.train() itself and the loop after it.
Each timing: median of `steps` steps after 2 warm ones, the host share (until forward and backward
are queued), the main thread's CPU, the process's CPU, and every OS thread's CPU over the timed
steps (a thread that burns CPU beside the compute thread shows there).
"""

from __future__ import annotations

import os

for _k, _v in (("OMP_NUM_THREADS", "1"), ("MKL_NUM_THREADS", "1"), ("OPENBLAS_NUM_THREADS", "1"),
               ("CUBLAS_WORKSPACE_CONFIG", ":4096:8"), ("TORCHINDUCTOR_COMPILE_THREADS", "1"),
               ("TOKENIZERS_PARALLELISM", "false")):
    os.environ.setdefault(_k, _v)

import argparse  # noqa: E402
import gc  # noqa: E402
import json  # noqa: E402
import statistics  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
import threading  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(ROOT))


# --- process-global state ---------------------------------------------------------------------
def _thread_cpu() -> dict:
    """{tid: (name, cpu seconds)} of every OS thread of this process."""
    out = {}
    tick = os.sysconf("SC_CLK_TCK")
    for tid in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{tid}/stat") as f:
                st = f.read()
            with open(f"/proc/self/task/{tid}/comm") as f:
                name = f.read().strip()
        except OSError:
            continue
        fields = st[st.rfind(")") + 2:].split()
        out[tid] = (name, (int(fields[11]) + int(fields[12])) / tick)
    return out


def global_state() -> dict:
    """Every piece of process-global state the recipe could leave behind that we can read."""
    import torch
    import torch._dynamo.config as dc
    import torch._inductor.config as ic

    st: dict = {
        "torch.num_threads": torch.get_num_threads(),
        "torch.num_interop_threads": torch.get_num_interop_threads(),
        "torch.deterministic_algorithms": torch.are_deterministic_algorithms_enabled(),
        "torch.deterministic_warn_only": torch.is_deterministic_algorithms_warn_only_enabled(),
        "torch.fill_uninitialized_memory": bool(torch.utils.deterministic.fill_uninitialized_memory),
        "cudnn.enabled": torch.backends.cudnn.enabled, "cudnn.benchmark": torch.backends.cudnn.benchmark,
        "cudnn.deterministic": torch.backends.cudnn.deterministic, "cudnn.allow_tf32": torch.backends.cudnn.allow_tf32,
        "matmul.allow_tf32": torch.backends.cuda.matmul.allow_tf32,
        "matmul.bf16_reduced": torch.backends.cuda.matmul.allow_bf16_reduced_precision_reduction,
        "matmul.fp16_reduced": torch.backends.cuda.matmul.allow_fp16_reduced_precision_reduction,
        "float32_matmul_precision": torch.get_float32_matmul_precision(),
        "default_dtype": str(torch.get_default_dtype()),
        "grad_enabled": torch.is_grad_enabled(), "inference_mode": torch.is_inference_mode_enabled(),
        "anomaly": torch.is_anomaly_enabled(), "autocast.cuda": torch.is_autocast_enabled("cuda"),
        "sdp.flash": torch.backends.cuda.flash_sdp_enabled(), "sdp.mem_efficient": torch.backends.cuda.mem_efficient_sdp_enabled(),
        "sdp.math": torch.backends.cuda.math_sdp_enabled(), "sdp.cudnn": torch.backends.cuda.cudnn_sdp_enabled(),
        "cuda.current_device": torch.cuda.current_device() if torch.cuda.is_available() else None,
        "cuda.sync_debug_mode": torch.cuda.get_sync_debug_mode() if torch.cuda.is_available() else None,
        "profiler_enabled": bool(torch.autograd.profiler._is_profiler_enabled),
        "torch_function_modes": torch._C._len_torch_function_stack(),
        "dispatch_modes": torch._C._len_torch_dispatch_stack(),
        "sys.trace": repr(sys.gettrace()), "sys.profile": repr(sys.getprofile()),
        "sys.switchinterval": sys.getswitchinterval(),
        "gc.enabled": gc.isenabled(), "gc.threshold": gc.get_threshold(), "gc.freeze_count": gc.get_freeze_count(),
        "python_threads": sorted(t.name for t in threading.enumerate()),
        "os_threads": sorted(n for n, _ in _thread_cpu().values()),
        "env": {k: v for k, v in sorted(os.environ.items())
                if k.startswith(("TORCH", "CUDA", "CUBLAS", "PYTORCH", "NCCL", "OMP", "MKL", "MALLOC", "TRITON",
                                 "TOKENIZERS", "HF_", "TRANSFORMERS", "PYTHON"))},
    }
    for prefix, cfg in (("dynamo.", dc), ("inductor.", ic)):
        for k, v in cfg.get_config_copy().items():
            st[prefix + k] = repr(v)[:200]
    st["gc.objects (info)"] = len(gc.get_objects())
    return st


def diff(a: dict, b: dict) -> dict:
    return {k: (a.get(k), b.get(k)) for k in sorted(set(a) | set(b)) if a.get(k) != b.get(k)}


def restorer(key: str, value):
    """A function that puts `key` back to `value` (None: nothing to put back by a setting)."""
    import torch
    import torch._dynamo.config as dc
    import torch._inductor.config as ic

    simple = {
        "torch.num_threads": lambda: torch.set_num_threads(value),
        "torch.deterministic_algorithms": lambda: torch.use_deterministic_algorithms(value),
        "torch.fill_uninitialized_memory": lambda: setattr(torch.utils.deterministic, "fill_uninitialized_memory", value),
        "cudnn.enabled": lambda: setattr(torch.backends.cudnn, "enabled", value),
        "cudnn.benchmark": lambda: setattr(torch.backends.cudnn, "benchmark", value),
        "cudnn.deterministic": lambda: setattr(torch.backends.cudnn, "deterministic", value),
        "cudnn.allow_tf32": lambda: setattr(torch.backends.cudnn, "allow_tf32", value),
        "matmul.allow_tf32": lambda: setattr(torch.backends.cuda.matmul, "allow_tf32", value),
        "float32_matmul_precision": lambda: torch.set_float32_matmul_precision(value),
        "default_dtype": lambda: torch.set_default_dtype(getattr(torch, value.split(".")[-1])),
        "grad_enabled": lambda: torch.set_grad_enabled(value),
        "anomaly": lambda: torch.autograd.set_detect_anomaly(value),
        "cuda.sync_debug_mode": lambda: torch.cuda.set_sync_debug_mode(value),
        "sys.switchinterval": lambda: sys.setswitchinterval(value),
        "gc.enabled": lambda: gc.enable() if value else gc.disable(),
        "gc.threshold": lambda: gc.set_threshold(*value),
        "sdp.flash": lambda: torch.backends.cuda.enable_flash_sdp(value),
        "sdp.mem_efficient": lambda: torch.backends.cuda.enable_mem_efficient_sdp(value),
        "sdp.math": lambda: torch.backends.cuda.enable_math_sdp(value),
        "sdp.cudnn": lambda: torch.backends.cuda.enable_cudnn_sdp(value),
    }
    if key in simple:
        return simple[key]
    if key.startswith(("dynamo.", "inductor.")):
        cfg, name = (dc, key[7:]) if key.startswith("dynamo.") else (ic, key[9:])
        real = cfg.get_config_copy()
        return lambda: None if name not in real else _set_from_repr(cfg, name, value)
    if key == "env":
        def env():
            for k in [k for k in os.environ if k.startswith(tuple(value_prefixes))]:
                if k not in value:
                    del os.environ[k]
            os.environ.update(value)
        return env
    return None


value_prefixes = ("TORCH", "CUDA", "CUBLAS", "PYTORCH", "NCCL", "OMP", "MKL", "MALLOC", "TRITON", "TOKENIZERS", "HF_",
                  "TRANSFORMERS", "PYTHON")


def _set_from_repr(cfg, name, text):
    import ast

    try:
        setattr(cfg, name, ast.literal_eval(text))
    except (ValueError, SyntaxError):
        pass   # not a literal (a callable, a path object): reported as not restorable


def _describe(t):
    import torch

    if isinstance(t, torch.Tensor):
        return {"shape": tuple(t.shape), "stride": t.stride(), "dtype": str(t.dtype), "device": str(t.device),
                "align16": t.data_ptr() % 16, "offset": t.storage_offset(), "contiguous": t.is_contiguous(),
                "requires_grad": t.requires_grad, "leaf": t.is_leaf, "storage_bytes": t.untyped_storage().nbytes(),
                "class": type(t).__name__}
    if isinstance(t, (tuple, list)):
        return [_describe(x) for x in t]
    if isinstance(t, dict):
        return {k: _describe(v) for k, v in t.items()}
    return repr(t)


def tensor_diff(f_a, f_b) -> dict:
    """Where layer 0's tensors (and static shape) differ between two FusedLlama objects."""
    out = {}
    (pa, sa), (pb, sb) = f_a.layers[0], f_b.layers[0]
    if sa != sb:
        out["shape"] = (sa, sb)
    da, db = _describe(pa), _describe(pb)
    for k in sorted(set(da) | set(db)):
        if da.get(k) != db.get(k):
            out[k] = (da.get(k), db.get(k))
    for name in ("embed_tokens", "norm"):
        wa, wb = _describe(getattr(f_a.lm.model, name).weight), _describe(getattr(f_b.lm.model, name).weight)
        if wa != wb:
            out[name] = (wa, wb)
    return out


def profile_step(loop, tiny: bool) -> dict:
    """One step under torch.profiler with CUDA activity: the kernels' device time against the
    step's wall time tells a GPU-bound step from a host-bound one."""
    from torch.profiler import ProfilerActivity, profile

    loop.step()
    with profile(activities=[ProfilerActivity.CPU] + ([] if tiny else [ProfilerActivity.CUDA])) as prof:
        wall, host = loop.step()
    ev = prof.key_averages()
    dev = sorted(((e.self_device_time_total, e.count, e.key) for e in ev if e.self_device_time_total > 0), reverse=True)
    return {"device_ms": sum(x[0] for x in dev) / 1e3, "kernels": sum(x[1] for x in dev), "wall_ms": 1e3 * wall,
            "top_device": [[round(t / 1e3, 3), n, k[:80]] for t, n, k in dev[:12]],
            "top_host": [[round(e.self_cpu_time_total / 1e3, 3), e.count, e.key[:80]] for e in
                         sorted(ev, key=lambda e: -e.self_cpu_time_total)[:12]]}


# --- the loop ----------------------------------------------------------------------------------
class Loop:
    def __init__(self, base_dir: Path, batch: int, seq: int, dev: str = "cuda"):
        import torch
        from bench_train_gpu_ledger import ALL, _peft

        from ledger.train.fused import FusedLlama

        self.torch, self.dev = torch, dev
        self.base_dir = base_dir
        self.m = _peft(base_dir, dev, 16, 32.0, ALL)
        cuda = dev == "cuda"
        if not cuda:   # --tiny: the script's code paths on the CPU (fp32, eager)
            self.m = self.m.float()
        self.make = lambda: FusedLlama(self.m, 0.0, check=cuda, compile_layers=cuda)  # noqa: E731
        self.f = self.make()
        self.opt = torch.optim.AdamW([p for p in self.m.parameters() if p.requires_grad], lr=1e-4, fused=cuda)
        g = torch.Generator().manual_seed(0)
        self.ids = torch.randint(0, 256, (batch, seq), generator=g)

    def step(self):
        torch = self.torch
        t0 = time.perf_counter()
        x = self.ids.to(self.dev, non_blocking=True)
        loss = self.f.loss(x, x)
        loss.backward()
        h = time.perf_counter() - t0
        loss.item()
        self.opt.step()
        self.opt.zero_grad(set_to_none=True)
        if self.dev == "cuda":
            torch.cuda.synchronize()
        return time.perf_counter() - t0, h

    def time(self, steps: int) -> dict:
        first = time.perf_counter()
        self.step()
        first = time.perf_counter() - first
        self.step()
        main = threading.get_native_id()
        gcs = {"n": [0, 0, 0], "s": [0.0, 0.0, 0.0], "t0": 0.0}

        def on_gc(phase, info):   # time spent in each generation's collections over the timed steps
            if phase == "start":
                gcs["t0"] = time.perf_counter()
            else:
                gcs["n"][info["generation"]] += 1
                gcs["s"][info["generation"]] += time.perf_counter() - gcs["t0"]

        gc.callbacks.append(on_gc)
        c0, p0, th0 = time.thread_time(), time.process_time(), _thread_cpu()
        ts, hs = [], []
        try:
            for _ in range(steps):
                t, h = self.step()
                ts.append(t)
                hs.append(h)
        finally:
            gc.callbacks.remove(on_gc)
        c1, p1, th1 = time.thread_time(), time.process_time(), _thread_cpu()
        busy = sorted(((th1[t][1] - th0.get(t, ("", 0.0))[1]) / steps, th1[t][0], t) for t in th1)[::-1][:4]
        return {"step_ms": 1e3 * statistics.median(ts), "step_min_ms": 1e3 * min(ts), "host_ms": 1e3 * statistics.median(hs),
                "main_cpu_ms": 1e3 * (c1 - c0) / steps, "process_cpu_ms": 1e3 * (p1 - p0) / steps,
                "first_s": round(first, 2), "busiest_threads_ms": [[round(1e3 * c, 1), n, int(t) == main] for c, n, t in busy],
                "gc_per_step": {"collections": [round(x / steps, 2) for x in gcs["n"]],
                                "ms": [round(1e3 * x / steps, 2) for x in gcs["s"]]},
                "gc_objects": len(gc.get_objects())}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--seq", type=int, default=1024)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--train-after", action="store_true")
    ap.add_argument("--tiny", action="store_true", help="a smoke test of this script on the CPU (tiny model, eager)")
    ap.add_argument("--out", default=os.environ.get("OUT") or str(HERE / "_work"))
    a = ap.parse_args()
    import torch
    from bench_train_gpu_ledger import SMOLLM2_SHAPE, dataset, ledger, new_store, smollm2_shaped_base, spec_text

    from ledger.plan import compile as comp
    from ledger.store import Store
    from ledger.train import job as joblib
    from ledger.train import run as trainlib
    from ledger.train import sft

    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    res: dict = {"torch": torch.__version__, "env_at_start": {k: os.environ[k] for k in sorted(os.environ)
                                                              if k.startswith(value_prefixes)}, "timings": {}}

    def save():
        (out / "childgap_state.json").write_text(json.dumps(res, indent=1, default=str))

    def timed(label, loop):
        r = loop.time(a.steps)
        res["timings"][label] = r
        print(f"  {label:58s} step {r['step_ms']:7.1f} ms (min {r['step_min_ms']:.1f})  host {r['host_ms']:6.1f}  "
              f"main CPU {r['main_cpu_ms']:6.1f}  process CPU {r['process_cpu_ms']:6.1f}  first {r['first_s']} s  "
              f"threads {r['busiest_threads_ms'][:2]}  gc/step {r['gc_per_step']}  objects {r['gc_objects']}", flush=True)
        save()
        return r

    work = Path(tempfile.mkdtemp(prefix="childgap-state-"))
    if a.tiny:
        from bench_train_gpu_ledger import random_base

        sh = dict(hidden=64, layers=2, heads=4, kv=2, inter=128)
        base = random_base(work / "base", dict(sh, seq=64), 0.02)
        a.seq, a.batch, a.steps = 64, 2, 2
    else:
        base = smollm2_shaped_base(work / "base")
        sh = SMOLLM2_SHAPE
    store = new_store()
    rc, _, err = ledger(store, "import-base", base, "--name", "smol-shape", timeout=900)
    assert rc == 0, err
    data = dataset(store, 64, int(a.seq * 0.8), padded=True)
    text = spec_text(hidden=sh["hidden"], layers=sh["layers"], heads=sh["heads"], kv=sh["kv"], inter=sh["inter"],
                     seq=a.seq, batch=a.batch, r=16, steps=a.steps + 2, data=data)
    text = text.replace("[model]\n", "[model]\nbase = \"smol-shape\"\n", 1).replace("[train]\n", "[train]\nthreads = 1\n", 1)
    f = work / "spec.toml"
    f.write_text(text)
    rc, c, err = ledger(store, "compile", f, "--target", "cpu" if a.tiny else "h200")
    assert rc == 0, err
    held = Store.open(store)
    pl = comp.load(held, c["plan"])
    w = joblib.new_work(held, "train")
    trainlib.prepare(held, pl, None, w, None)
    res["plan_realizations"] = held.get_json(c["plan"]).get("realizations")

    print("SmolLM2 shape, fused loop, one process:", flush=True)
    loop = Loop(base, a.batch, a.seq, "cpu" if a.tiny else "cuda")
    timed("1 before setup", loop)
    res["profile_before_setup"] = profile_step(loop, a.tiny)
    print(f"  profile: {res['profile_before_setup']['device_ms']:.1f} ms of kernels a step in "
          f"{res['profile_before_setup']['kernels']} launches; top {res['profile_before_setup']['top_device'][:3]}", flush=True)
    timed("1b before setup, after the profiler ran", loop)
    s0 = global_state()
    rec = sft.SftRecipe(w)
    t0 = time.perf_counter()
    rec.setup()
    res["setup_s"] = time.perf_counter() - t0
    s1 = global_state()
    d = diff(s0, s1)
    res["state_diff"] = d
    print(f"  setup took {res['setup_s']:.1f} s; global state it changed ({len(d)}):", flush=True)
    for k, (x, y) in d.items():
        print(f"    {k}: {str(x)[:120]} -> {str(y)[:120]}", flush=True)
    save()
    timed("2 after setup", loop)
    gc.collect()
    gc.freeze()
    timed("2c gc.collect + gc.freeze after setup", loop)
    gc.disable()
    timed("2d gc disabled", loop)
    gc.enable()
    gc.unfreeze()
    # the recipe's own model, optimizer and batch size in the same harness (its first call
    # compiles, or reuses the loop's graph where dynamo's guards pass)
    if rec.fused is not None:
        # the two models' layer tensors as the compiled layer sees them: any difference in
        # layout (strides, alignment, storage, dtype, grad) between the recipe's and the loop's
        res["layer_tensor_diff"] = tensor_diff(loop.f, rec.fused)
        print(f"  layer-0 tensors, loop vs recipe: {str(res['layer_tensor_diff'])[:1500] or 'no difference'}", flush=True)
        other = Loop.__new__(Loop)
        other.torch, other.f, other.opt, other.ids, other.dev = torch, rec.fused, rec.opt, loop.ids, loop.dev
        timed("2b the recipe's model (rec.fused, rec.opt) in the same harness", other)
        del other
    else:
        res["timings"]["2b"] = f"the plan's loop is {rec.loop_kind}, not fused"
    for k, (before, _) in d.items():
        if k.endswith("(info)"):
            continue
        fn = restorer(k, before)
        if fn is None:
            res["timings"][f"restore {k}"] = "not restorable by a setting"
            continue
        fn()
        timed(f"3 + restored {k}", loop)
    timed("3 all restored, again", loop)
    # actions no setting shows
    del rec
    gc.collect()
    if not a.tiny:
        torch.cuda.empty_cache()
    timed("4a recipe dropped (del, gc.collect, empty_cache)", loop)
    gc.freeze()
    timed("4b gc.freeze()", loop)
    import torch._dynamo

    torch._dynamo.reset()
    loop.f = loop.make()
    timed("4c dynamo reset + the loop compiled again", loop)
    if a.train_after:
        w2 = joblib.new_work(held, "train")
        trainlib.prepare(held, pl, None, w2, None)
        rec = sft.SftRecipe(w2)
        rec.setup()
        rec.train()
        st = rec.step_times[2:] or rec.step_times
        res["recipe_train"] = {"step_ms": 1e3 * statistics.median(st), "host_ms": 1e3 * statistics.median(rec.step_host[2:] or rec.step_host),
                               "cpu_ms": 1e3 * statistics.median(rec.step_cpu[2:] or rec.step_cpu)}
        print(f"  5 recipe.train() itself: {res['recipe_train']}", flush=True)
        timed("5 after recipe.train()", loop)
    res["profile_last_state"] = profile_step(loop, a.tiny)
    print(f"  profile (last state): {res['profile_last_state']['device_ms']:.1f} ms of kernels a step", flush=True)
    save()
    return 0


if __name__ == "__main__":
    sys.exit(main())
