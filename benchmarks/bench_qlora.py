#!/usr/bin/env python3
"""LoRA on a 4-bit base (QLoRA with ledger's q4b32 format) at 7.2B parameters on one GPU.

    python benchmarks/bench_qlora.py [--fmt q4b32|int8|none] [--steps 12] [--micro-batch 8] [--seq 2048]

The base is a Llama-3-shaped model (hidden 4096, 32 layers, 32 heads / 8 KV heads, MLP 14336,
vocab 32000: 7.24B parameters), random-initialised at 0.02 and built in process: constructed on
the meta device, then materialised ONE decoder layer at a time on the GPU (bf16, normal(0, 0.02)),
each layer's seven projections quantized at once (ledger.kernels.qlinear.quantize_layer_), so
the dense base never exists whole. LoRA r16 on all seven projections (peft; fp32 adapter), and
the loop is ledger's `torch-compiled` realization (ledger.train.sft.compile_layers: each decoder
layer torch.compile'd, bf16 autocast, fused AdamW) or, with `--loop eager`, its `torch-eager`
one (no compile, no autocast: peft runs the LoRA math in the fp32 masters, memory.lines), on
unpadded rows of a synthetic corpus a model can learn (a random sparse bigram chain over 512
tokens: 4 successors per token); `--warmup N` warms the lr up linearly as ledger's schedule does.

Prints, and writes to --out/bench_qlora.json: the memory plan (ledger.plan.memory.lines_compiled
with base_quant) line by line against torch.cuda.max_memory_allocated, tokens/s (steady: without
the first two steps, which compile and allocate the optimizer state), MFU against the dense bf16
peak (989 TFLOP/s; FLOP formula below) and the loss curve.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

SHAPE = {"vocab_size": 32000, "hidden_size": 4096, "intermediate_size": 14336, "num_hidden_layers": 32,
         "num_attention_heads": 32, "num_key_value_heads": 8, "max_position_embeddings": 4096}
TINY = {"vocab_size": 1000, "hidden_size": 128, "intermediate_size": 256, "num_hidden_layers": 2,
        "num_attention_heads": 4, "num_key_value_heads": 2, "max_position_embeddings": 256}   # --tiny: a CPU dry run
PEAK_BF16 = 989e12   # H200 dense bf16 tensor-core peak


def flops_per_token(cfg, r: int, seq: int) -> dict:
    """4 N_mm + 6 N_lora + 6 L T d_q (the formula of benchmarks/bench_train_gpu_ledger.py: forward
    and activation gradients of the frozen projections and lm_head, all of LoRA, causal attention)."""
    d, L, inter, V = cfg.hidden_size, cfg.num_hidden_layers, cfg.intermediate_size, cfg.vocab_size
    hd = d // cfg.num_attention_heads
    dq, dkv = cfg.num_attention_heads * hd, cfg.num_key_value_heads * hd
    shapes = [(d, dq), (d, dkv), (d, dkv), (dq, d), (d, inter), (d, inter), (inter, d)]
    n_mm = L * sum(i * o for i, o in shapes) + d * V
    n_lora = L * sum(r * (i + o) for i, o in shapes)
    return {"per_token": 4 * n_mm + 6 * n_lora + 6 * L * seq * dq, "formula": "4*N_mm + 6*N_lora + 6*L*T*d_q"}


def corpus(rows: int, seq: int, vocab: int, seed: int = 0):
    """Rows of a random sparse bigram chain: 512 tokens, each followed by one of 4 (entropy 2 bits
    a token once learnt; ln 32000 = 10.37 nats at the start)."""
    import torch

    g = torch.Generator().manual_seed(seed)
    tokens = torch.randperm(vocab - 10, generator=g)[:512] + 10
    succ = torch.randint(0, 512, (512, 4), generator=g)
    state = torch.randint(0, 512, (rows,), generator=g)
    out = torch.empty(rows, seq, dtype=torch.long)
    for t in range(seq):
        out[:, t] = tokens[state]
        state = succ[state, torch.randint(0, 4, (rows,), generator=g)]
    return out


def build(fmt: str, r: int, shape: dict, dev):
    """The 7.2B base, materialised layer by layer and quantized as it goes, with LoRA on top."""
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import LlamaConfig, LlamaForCausalLM
    from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding

    from ledger.kernels import qlinear

    cfg = LlamaConfig(**shape, initializer_range=0.02, tie_word_embeddings=False, attn_implementation="sdpa")
    torch.set_default_dtype(torch.bfloat16)
    with torch.device("meta"):
        model = LlamaForCausalLM(cfg)
    torch.set_default_dtype(torch.float32)
    g = torch.Generator(device=dev).manual_seed(0)

    def materialise(mod):
        mod.to_empty(device=dev, recurse=True)
        for sub in mod.modules():
            for p in sub.parameters(recurse=False):
                with torch.no_grad():
                    if "RMSNorm" in type(sub).__name__:   # norm weights start at 1, as transformers inits them
                        p.fill_(1.0)
                    else:
                        p.normal_(0.0, 0.02, generator=g)

    t0 = time.perf_counter()
    for mod in (model.model.embed_tokens, model.model.norm, model.lm_head):
        materialise(mod)
    peak_dense = 0
    for layer in model.model.layers:
        materialise(layer)
        if dev.type == "cuda":
            peak_dense = max(peak_dense, torch.cuda.memory_allocated())
        if fmt != "none":
            qlinear.quantize_layer_(layer, fmt, torch.bfloat16)
    with dev:    # its inv_freq buffer was made on meta: make it again where the model is
        model.model.rotary_emb = LlamaRotaryEmbedding(config=cfg)
    build_s = time.perf_counter() - t0
    n_params = sum(p.numel() for p in model.parameters()) + sum(
        m.in_features * m.out_features for m in model.modules() if isinstance(m, qlinear.QuantLinear))
    torch.manual_seed(0)
    model = get_peft_model(model, LoraConfig(r=r, lora_alpha=2 * r, lora_dropout=0.0, bias="none",
                                             target_modules=list(qlinear.LINEARS), task_type="CAUSAL_LM"))
    for p in model.parameters():
        if p.requires_grad:
            p.data = p.data.float()   # LoRA masters in fp32, as ledger.train.sft.build keeps them
    after = torch.cuda.memory_allocated() if dev.type == "cuda" else 0
    return cfg, model, {"build_s": build_s, "params": n_params, "after_build_bytes": after, "peak_dense_layer": peak_dense}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--fmt", default="q4b32", choices=("q4b32", "int8", "none"))
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--micro-batch", type=int, default=8)
    ap.add_argument("--seq", type=int, default=2048)
    ap.add_argument("--r", type=int, default=16)
    ap.add_argument("--lr", type=float, default=2e-3)
    ap.add_argument("--warmup", type=int, default=0, help="linear lr warm-up over this many steps (ledger's schedule)")
    ap.add_argument("--loop", default="compiled", choices=("compiled", "eager"),
                    help="compiled: ledger's torch-compiled realization (per-layer torch.compile, bf16 autocast); "
                         "eager: ledger's torch-eager realization (no compile, no autocast: the LoRA math in its "
                         "fp32 masters, as ledger.train.sft runs it)")
    ap.add_argument("--tiny", action="store_true", help="a 2-layer model on the CPU, eager: checks the script")
    ap.add_argument("--out", default=os.environ.get("OUT") or str(ROOT / "benchmarks" / "_work"))
    a = ap.parse_args()
    import torch

    from ledger.artefacts.model import MODULE_SHAPES, arch_of
    from ledger.plan import memory
    from ledger.train.sft import compile_layers

    cuda = not a.tiny
    dev = torch.device("cuda" if cuda else "cpu")
    if cuda:
        torch.cuda.reset_peak_memory_stats()
    cfg, model, info = build(a.fmt, a.r, TINY if a.tiny else SHAPE, dev)
    arch = arch_of(cfg.to_dict())
    B, T = a.micro_batch, a.seq
    kw = dict(r=a.r, modules=list(MODULE_SHAPES), dropout=0.0, dtype="bf16", micro_batch=B, seq_len=T,
              base_quant=a.fmt)
    # the memory model of the loop that runs: the compiled layers' (torch-compiled), or eager
    # autograd's (torch-eager; the encoded dataset is not on the device here: 0 rows)
    plan = (memory.lines_compiled(arch, padded=False, **kw) if a.loop == "compiled"
            else memory.lines(arch, dataset_rows=0, padded=False, device=dev.type, **kw))
    predicted = memory.total(plan)
    print(f"base: {info['params'] / 1e9:.2f}B params in {a.fmt}, built in {info['build_s']:.1f} s; "
          f"after build {info['after_build_bytes'] / 2**30:.2f} GiB", flush=True)
    print(f"memory plan ({a.loop} loop): " + ", ".join(f"{x.name} {x.bytes / 2**30:.2f}" for x in plan) + f" = {predicted / 2**30:.2f} GiB",
          flush=True)
    if cuda and a.loop == "compiled":
        compile_layers(model.base_model.model.model.layers)
    model.train()
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=a.lr, fused=cuda)
    peak_of = torch.cuda.max_memory_allocated if cuda else (lambda: 0)
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    data = corpus(B * a.steps, T, cfg.vocab_size)
    losses, times = [], []
    print(f"[{time.strftime('%H:%M:%S')}] first step (compiles {cfg.num_hidden_layers} layers)" if cuda and
          a.loop == "compiled" else "first step", flush=True)
    for step in range(a.steps):
        ids = data[step * B:(step + 1) * B].to(dev, non_blocking=True)
        sync()
        t0 = time.perf_counter()
        lr = a.lr * min(1.0, (step + 1) / a.warmup) if a.warmup else a.lr   # ledger.train.sft.lr_at
        for g in opt.param_groups:
            g["lr"] = lr
        with torch.autocast(dev.type, dtype=torch.bfloat16, enabled=a.loop == "compiled"):
            loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        lv = float(loss.detach())
        sync()
        times.append(time.perf_counter() - t0)
        losses.append(lv)
        print(f"step {step + 1}: loss {lv:.4f}  {times[-1]:.2f} s  peak {peak_of() / 2**30:.2f} GiB",
              flush=True)
    peak = peak_of() or 1
    steady = times[2:] or times
    tok_s = B * T * len(steady) / sum(steady)
    fl = flops_per_token(cfg, a.r, T)
    res = {"loop": a.loop, "fmt": a.fmt, "shape": TINY if a.tiny else SHAPE, "params": info["params"], "micro_batch": B, "seq_len": T, "r": a.r,
           "lr": a.lr, "warmup": a.warmup, "autocast": a.loop == "compiled", "build_s": info["build_s"], "losses": losses, "step_s": times,
           "first_step_s": times[0], "steady_tokens_per_s": tok_s, "flops": fl,
           "mfu": tok_s * fl["per_token"] / PEAK_BF16, "peak_allocated_bytes": peak,
           "predicted_bytes": predicted, "prediction_error": predicted / peak - 1,
           "plan_lines": [x.to_json() for x in plan], "torch": torch.__version__,
           "device": torch.cuda.get_device_name() if cuda else "cpu (--tiny dry run)",
           "build": info}
    print(f"\n{a.fmt} 7B-shape LoRA r{a.r}, {B}x{T}: {tok_s:,.0f} tokens/s steady, MFU {res['mfu']:.1%} "
          f"({fl['formula']}); peak {peak / 2**30:.2f} GiB vs plan {predicted / 2**30:.2f} GiB "
          f"({res['prediction_error']:+.1%}; target within 10 %: {'met' if abs(res['prediction_error']) <= 0.10 else 'MISSED'}); "
          f"loss {losses[0]:.3f} -> {losses[-1]:.3f}", flush=True)
    Path(a.out).mkdir(parents=True, exist_ok=True)
    (Path(a.out) / f"bench_qlora_{a.fmt}.json").write_text(json.dumps(res, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
