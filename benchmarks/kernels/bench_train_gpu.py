#!/usr/bin/env python3
"""LoRA training throughput on one GPU: a plain transformers + peft loop vs an optimised loop,
same model, same batch, same sequence length, measured in one run.

    python benchmarks/kernels/bench_train_gpu.py [--steps 8] [--warmup 3] [--out DIR]

Model: a ~1.1B-parameter Llama built in process with random init (22 layers, hidden 2048,
intermediate 5632, 32 heads, 4 kv heads, vocab 32000; no downloads), bf16 weights, sdpa
attention, batch 8 x sequence 2048 of random tokens, LoRA r 16 (alpha 32, dropout 0) on all
seven linear projections, AdamW lr 1e-4.

plain : what the peft README does: get_peft_model (adapter weights kept in fp32, peft's
        default), model(input_ids, labels).loss.backward(), torch.optim.AdamW (foreach).
fast  : the same model and adapter, with only what torch itself provides:
        * bf16 autocast: the LoRA matmuls run on bf16 tensor cores instead of in fp32 (the
          fp32 adapter weights stay the optimizer's master copy);
        * torch.compile of each decoder layer (one compiled graph reused by all 22 layers):
          fuses RMSNorm, RoPE, SiLU*up, the LoRA adds and the casts;
        * fused AdamW (one kernel for all adapter tensors);
        * grads set to None, no KV cache.
Each loop: `warmup` steps (compilation happens there), then `steps` timed steps (CUDA events);
tokens/s = batch * seq / median step time. Peak memory = torch.cuda.max_memory_allocated over
the timed steps, beside the prediction of the simple plan below.

Memory plan (bytes; e = 2 for bf16 activations, P = base params, p = adapter params, BT =
batch * seq tokens, H hidden, I intermediate, q = H, kv = kv_heads * head_dim, V vocab, L layers):
  static      = 2 P (bf16 base) + 4 p (fp32 adapter) + 4 p (grads) + 8 p (Adam m, v)
  per layer   = BT * [ e (2H + q + 2 kv + q + 2H + 4I)        norms' in/out, q k v, attn out, MLP
                     + 4 nh + 8                               flash-attn logsumexp, 2 rstd (fp32)
                     + 7 r a_r                                LoRA A outputs
                     + a_x (3H + q + 2H + I) ]                LoRA inputs cast for the adapter
              with a_r = a_x = 4 (plain: adapter math in fp32) or 2 (fast: autocast copies in bf16)
  head        = BT * (2 H e + V e + 2 * 4 V)                  final norm, bf16 logits, fp32 logits
                                                               and log-softmax in the loss
  transient   = BT * 4 V                                      the logits' fp32 gradient in backward
  peak        = static + L * per layer + head + transient
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
MODULES = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
FULL = dict(vocab_size=32000, hidden_size=2048, intermediate_size=5632, num_hidden_layers=22,
            num_attention_heads=32, num_key_value_heads=4, max_position_embeddings=2048)
TINY = dict(vocab_size=512, hidden_size=128, intermediate_size=352, num_hidden_layers=2,
            num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128)


def plan(cfg: dict, batch: int, seq: int, r: int, fast: bool, n_params: int, n_adapter: int) -> dict:
    H, I, V, L = cfg["hidden_size"], cfg["intermediate_size"], cfg["vocab_size"], cfg["num_hidden_layers"]
    nh = cfg["num_attention_heads"]
    kv = cfg["num_key_value_heads"] * (H // nh)
    q, e, BT = H, 2, batch * seq
    a = 2 if fast else 4
    static = 2 * n_params + 16 * n_adapter
    per_layer = BT * (e * (2 * H + q + 2 * kv + q + 2 * H + 4 * I) + 4 * nh + 8 + 7 * r * a
                      + a * (3 * H + q + 2 * H + I))
    head = BT * (2 * H * e + V * e + 2 * 4 * V)
    transient = BT * 4 * V
    lines = {"static": static, "activations": L * per_layer, "head": head, "transient": transient}
    return {**lines, "peak": sum(lines.values())}


def run_loop(kind: str, a, cfg: dict) -> dict:
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import LlamaConfig, LlamaForCausalLM

    dev = torch.device(a.device)
    torch.manual_seed(0)
    conf = LlamaConfig(**cfg, attn_implementation="sdpa", use_cache=False, tie_word_embeddings=False)
    with dev:
        model = LlamaForCausalLM(conf).to(torch.bfloat16)
    n_params = sum(p.numel() for p in model.parameters())
    lcfg = LoraConfig(r=a.rank, lora_alpha=2 * a.rank, lora_dropout=0.0, target_modules=MODULES, task_type="CAUSAL_LM")
    model = get_peft_model(model, lcfg)
    model.train()
    params = [p for p in model.parameters() if p.requires_grad]
    n_adapter = sum(p.numel() for p in params)
    fast = kind == "fast"
    if fast:
        opt = torch.optim.AdamW(params, lr=1e-4, fused=(dev.type == "cuda"))
        if not a.no_compile:
            for layer in model.base_model.model.model.layers:
                layer.compile()
    else:
        opt = torch.optim.AdamW(params, lr=1e-4)
    g = torch.Generator(device="cpu").manual_seed(1)
    batches = [torch.randint(0, cfg["vocab_size"], (a.batch, a.seq), generator=g).to(dev) for _ in range(2)]

    def step(i):
        ids = batches[i % 2]
        if fast:
            with torch.autocast(dev.type, dtype=torch.bfloat16):
                loss = model(input_ids=ids, labels=ids).loss
        else:
            loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        return loss

    cuda = dev.type == "cuda"
    t0 = time.time()
    losses = []
    for i in range(a.warmup):
        losses.append(float(step(i).detach()))
    if cuda:
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
    warm_s = time.time() - t0
    times = []
    for i in range(a.steps):
        if cuda:
            s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            s.record()
            loss = step(i)
            e.record()
            e.synchronize()
            times.append(s.elapsed_time(e) / 1e3)
        else:
            t = time.perf_counter()
            loss = step(i)
            times.append(time.perf_counter() - t)
        losses.append(float(loss.detach()))
    med = statistics.median(times)
    peak = torch.cuda.max_memory_allocated() if cuda else None
    pl = plan(cfg, a.batch, a.seq, a.rank, fast, n_params, n_adapter)
    res = {"loop": kind, "tokens_per_s": a.batch * a.seq / med, "step_s_median": med, "step_s": times,
           "warmup_s": warm_s, "peak_bytes": peak, "plan": pl,
           "plan_error": (pl["peak"] / peak - 1) if peak else None, "losses": losses,
           "params": n_params, "adapter_params": n_adapter, "finite": all(map(lambda v: v == v, losses))}
    model = opt = batches = None  # free the GPU memory (step() above holds these names)
    if cuda:
        torch.cuda.empty_cache()
    return res


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--seq", type=int, default=2048)
    ap.add_argument("--rank", type=int, default=16)
    ap.add_argument("--loops", default="plain,fast")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--tiny", action="store_true", help="a 2-layer model (checks the script on a CPU)")
    ap.add_argument("--no-compile", action="store_true")
    ap.add_argument("--out", default=os.environ.get("OUT") or str(ROOT / "benchmarks" / "_work"))
    a = ap.parse_args()
    import peft
    import torch
    import transformers

    cfg = TINY if a.tiny else FULL
    if a.device == "cuda":
        print(f"device: {torch.cuda.get_device_name()}  torch {torch.__version__}  transformers "
              f"{transformers.__version__}  peft {peft.__version__}")
    results = []
    for kind in a.loops.split(","):
        r = run_loop(kind, a, cfg)
        results.append(r)
        pk = f"{r['peak_bytes'] / 2**30:.1f} GiB" if r["peak_bytes"] else "-"
        err = f"{r['plan_error']:+.1%}" if r["plan_error"] is not None else "-"
        print(f"{kind:>6}: {r['tokens_per_s']:10.0f} tokens/s  step {r['step_s_median'] * 1e3:7.1f} ms  "
              f"peak {pk} (plan {r['plan']['peak'] / 2**30:.1f} GiB, {err})  warm-up {r['warmup_s']:.1f} s  "
              f"losses {r['losses'][0]:.3f} -> {r['losses'][-1]:.3f}")
    if len(results) == 2:
        print(f"speed-up fast/plain: {results[1]['tokens_per_s'] / results[0]['tokens_per_s']:.2f}x "
              f"(target >= 1.5x)")
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "bench_train_gpu.json").write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
