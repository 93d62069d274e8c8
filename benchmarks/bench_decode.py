#!/usr/bin/env python3
"""Decode tokens/s: the image's CUDA decoder (ledger.image.cuda_decode: adapter merged, base in
bf16 / int8 / q4b32 through ledger's decode kernels, one CUDA graph a step) beside HF `generate`
(bf16, KV cache) and HF `generate` with its torch.compile'd decode step (static cache,
CompileConfig mode "reduce-overhead": transformers' documented fast path), same weights, same prompt, greedy, measured in one run, alternating.

    python benchmarks/bench_decode.py [--models smollm2,7b] [--new 128] [--prompt 32] [--reps 3] [--deadline S]

Models (random weights at initializer_range 0.02 -- decode speed depends on the shape alone; the
SmolLM2 GGUF is 98 MB, over what travels to the GPU machine): "smollm2" is SmolLM2-135M's shape
(576 hidden, 30 layers, 9 heads / 3 KV heads, MLP 1536, vocab 49152, tied), "7b" the 7.24B
Llama-3 shape of benchmarks/bench_qlora.py. A random r16 LoRA adapter on all seven projections is
merged into every variant's weights (HEAD's adapter, as the image serves it).

tokens/s = new tokens / wall time of one whole greedy call (prompt included), min / median / max
over --reps calls per variant, variants interleaved. `ledger-cuda-FMT` runs the fused decode step
(ledger/kernels/decode_step.cu), `ledger-cuda-FMT-torch-step` the torch step it replaced, both
one CUDA graph a step. Also reported: the same call for one new token (the prompt's share) and
decode-only tokens/s = (new - 1) / (call - that), except for HF compiled (another length would
recompile its static cache). Also reported: how many of the first 32
tokens each variant shares with HF eager bf16 (quantized variants are allowed to differ).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

SMOLLM2 = {"vocab_size": 49152, "hidden_size": 576, "intermediate_size": 1536, "num_hidden_layers": 30,
           "num_attention_heads": 9, "num_key_value_heads": 3, "max_position_embeddings": 8192,
           "tie_word_embeddings": True, "rope_theta": 100000.0}
L7B = {"vocab_size": 32000, "hidden_size": 4096, "intermediate_size": 14336, "num_hidden_layers": 32,
       "num_attention_heads": 32, "num_key_value_heads": 8, "max_position_embeddings": 4096,
       "tie_word_embeddings": False}
MODULES = {"q_proj": "self_attn", "k_proj": "self_attn", "v_proj": "self_attn", "o_proj": "self_attn",
           "gate_proj": "mlp", "up_proj": "mlp", "down_proj": "mlp"}


def make(shape: dict, seed: int = 0):
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(**shape, initializer_range=0.02, attn_implementation="sdpa")
    torch.manual_seed(seed)
    torch.set_default_dtype(torch.bfloat16)
    with torch.device("cuda"):
        model = LlamaForCausalLM(cfg).eval()
    torch.set_default_dtype(torch.float32)
    # a random r16 adapter (B nonzero), merged into the HF weights as peft's merge_and_unload would
    g = torch.Generator(device="cuda").manual_seed(seed + 1)
    lora, r, alpha = {}, 16, 32
    with torch.no_grad():
        for i, layer in enumerate(model.model.layers):
            for m, blk in MODULES.items():
                lin = getattr(getattr(layer, blk), m)
                n, k = lin.weight.shape
                a = torch.randn(r, k, device="cuda", generator=g) / k ** 0.5
                b = torch.randn(n, r, device="cuda", generator=g) * 0.01
                key = f"base_model.model.model.layers.{i}.{blk}.{m}"
                lora[key + ".lora_A.weight"], lora[key + ".lora_B.weight"] = a, b
    base_sd = {k: v.detach().clone() for k, v in model.state_dict().items()}
    with torch.no_grad():   # HF's copy gets the adapter merged (the ledger decoder merges its own)
        for i, layer in enumerate(model.model.layers):
            for m, blk in MODULES.items():
                key = f"base_model.model.model.layers.{i}.{blk}.{m}"
                lin = getattr(getattr(layer, blk), m)
                lin.weight += ((alpha / r) * (lora[key + ".lora_B.weight"] @ lora[key + ".lora_A.weight"])).to(lin.weight.dtype)
    return cfg, model, base_sd, lora, {"lora_alpha": alpha, "r": r}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", default="smollm2,7b")
    ap.add_argument("--new", type=int, default=128)
    ap.add_argument("--prompt", type=int, default=32)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--deadline", type=float, default=1e9, help="seconds; skip what would start after it")
    ap.add_argument("--no-torch-step", dest="torch_step", action="store_false",
                    help="leave out the ledger-cuda variants with the torch step (before the fused step)")
    ap.add_argument("--out", default=os.environ.get("OUT") or str(ROOT / "benchmarks" / "_work"))
    a = ap.parse_args()
    import torch

    from ledger.image import cuda_decode as cd
    from ledger.image import generate as gen

    t_start = time.monotonic()
    left = lambda: a.deadline - (time.monotonic() - t_start)  # noqa: E731
    res = {"torch": torch.__version__, "device": torch.cuda.get_device_name(), "new": a.new, "prompt": a.prompt,
           "models": {}}
    kern = cd.Kernels()
    res["kernels"] = kern.code_objects
    for name in a.models.split(","):
        shape = SMOLLM2 if name == "smollm2" else L7B
        cfg, model, base_sd, lora, acfg = make(shape)
        g = torch.Generator().manual_seed(7)
        prompt = torch.randint(10, cfg.vocab_size, (1, a.prompt), generator=g)
        ids = prompt[0].tolist()
        variants = {}

        def hf(m):
            def run(n=a.new):
                out = m.generate(prompt.cuda(), max_new_tokens=n, min_new_tokens=n, do_sample=False,
                                 pad_token_id=0)
                return out[0, a.prompt:].tolist()
            return run

        variants["hf-generate-bf16"] = hf(model)
        sh = gen.Shape.of({**cfg.to_dict(), "max_position_embeddings": 4096})
        decoders = {}
        # the fused step (session 7) and, beside it in the same run, the torch step it replaced
        # (both inside one CUDA graph a step): what the fused kernels earn
        older = {"smollm2": ("bf16", "int8", "q4b32"), "7b": ("int8", "q4b32")}.get(name, ()) if a.torch_step else ()
        for fmt, fused in [(f, True) for f in ("bf16", "int8", "q4b32")] + [(f, False) for f in older]:
            d = cd.CudaLlama(base_sd, sh, fmt, device="cuda", context=a.prompt + a.new + 8, kernels=kern,
                             fused_step=fused)
            d.load(lora, acfg)
            key = fmt if fused else f"{fmt}-torch-step"
            decoders[key] = d
            variants[f"ledger-cuda-{key}"] = (lambda n=a.new, d=d: d.decode(ids, n))
        row = {"params": sum(p.numel() for p in model.parameters()), "realizations": {}, "steps": {}}
        for fmt, d in decoders.items():
            counts: dict[str, int] = {}
            for v in d.realizations.values():
                counts[v] = counts.get(v, 0) + 1
            row["realizations"][fmt] = counts
            row["steps"][fmt] = d.step_realization
        t0 = time.monotonic()
        outs = {k: f() for k, f in variants.items()}      # warm-up (captures the graphs)
        row["warmup_s"] = time.monotonic() - t0
        times = {k: [] for k in variants}
        for _ in range(a.reps):
            for k, f in variants.items():
                torch.cuda.synchronize()
                t = time.perf_counter()
                f()
                torch.cuda.synchronize()
                times[k].append(time.perf_counter() - t)
        # the prompt's share: the same calls for ONE new token (prompt + first token), so that
        # decode-only tokens/s = (new - 1) / (call - prompt call). Not for HF compiled: a call of
        # another length sizes its static cache anew (a recompile), which would distort it.
        prompt_times = {k: [] for k in variants}
        for _ in range(a.reps):
            for k, f in variants.items():
                torch.cuda.synchronize()
                t = time.perf_counter()
                f(1)
                torch.cuda.synchronize()
                prompt_times[k].append(time.perf_counter() - t)
        res["models"][name] = row = {**row, "eager_times": times, "prompt_times": prompt_times,
                                     "eager_outs_first_32": {k: v[:32] for k, v in outs.items()}}
        Path(a.out).mkdir(parents=True, exist_ok=True)
        (Path(a.out) / "bench_decode.json").write_text(json.dumps(res, indent=1, default=str))
        if left() > (110 if name == "7b" else 60):
            # transformers' own fast path: with a static cache, generate compiles the decode step
            # itself (torch.compile, mode "reduce-overhead": CUDA graphs) and marks each graph step.
            # Patching model.forward with torch.compile instead (the older recipe) failed on
            # transformers 5.17: "accessing tensor output of CUDAGraphs that has been overwritten
            # by a subsequent run" (benchmarks/gpu_h200/h20t-call2-decode.log).
            from transformers import CompileConfig

            model.generation_config.cache_implementation = "static"
            model.generation_config.compile_config = CompileConfig(fullgraph=True, mode="reduce-overhead")
            t0 = time.monotonic()
            try:
                for _ in range(2):
                    outs["hf-generate-compiled"] = hf(model)()
                row["compile_warmup_s"] = time.monotonic() - t0
                # the compiled call exists only if generate took the compiled path: never a silent eager run
                row["hf_compiled_call_used"] = hasattr(model, "_compiled_call")
                if not row["hf_compiled_call_used"]:
                    raise RuntimeError("generate did not compile the decode step (no _compiled_call)")
                times["hf-generate-compiled"] = []
                for _ in range(a.reps):
                    torch.cuda.synchronize()
                    t = time.perf_counter()
                    hf(model)()
                    torch.cuda.synchronize()
                    times["hf-generate-compiled"].append(time.perf_counter() - t)
            except Exception as e:  # noqa: BLE001 - a baseline that fails here is reported, not hidden
                row["hf-generate-compiled"] = f"failed: {type(e).__name__}: {str(e)[:300]}"
        else:
            row["hf-generate-compiled"] = "not run: too little time left before --deadline"
        ref = outs["hf-generate-bf16"]
        row["variants"] = {}
        for k, ts in times.items():
            tps = sorted(a.new / t for t in ts)
            row["variants"][k] = {"tokens_per_s": {"min": tps[0], "median": statistics.median(tps), "max": tps[-1]},
                                  "call_s": ts, "same_first_32_as_hf_eager": sum(x == y for x, y in zip(outs[k][:32], ref[:32]))}
            if prompt_times.get(k):
                pm = statistics.median(prompt_times[k])
                row["variants"][k]["prompt_call_s"] = pm
                row["variants"][k]["decode_only_tokens_per_s"] = (a.new - 1) / max(1e-9, statistics.median(ts) - pm)
        res["models"][name] = row
        print(f"\n{name} ({row['params'] / 1e9:.2f}B params), {a.prompt}-token prompt + {a.new} new, greedy:")
        for k, v in row["variants"].items():
            t = v["tokens_per_s"]
            extra = (f"; prompt call {1e3 * v['prompt_call_s']:.1f} ms, decode only {v['decode_only_tokens_per_s']:.1f} tok/s"
                     if "prompt_call_s" in v else "")
            print(f"  {k:<22} {t['median']:8.1f} tok/s (min {t['min']:.1f}, max {t['max']:.1f}); "
                  f"first 32 tokens equal to HF eager: {v['same_first_32_as_hf_eager']}{extra}", flush=True)
        print(f"  realizations: {row['realizations']}")
        print(f"  steps: {row['steps']}")
        if isinstance(row.get("hf-generate-compiled"), str):
            print(f"  hf-generate-compiled: {row['hf-generate-compiled']}")
        Path(a.out).mkdir(parents=True, exist_ok=True)
        (Path(a.out) / "bench_decode.json").write_text(json.dumps(res, indent=1, default=str))
        del model, base_sd, decoders, variants, outs
        torch.cuda.empty_cache()
    return 0


if __name__ == "__main__":
    sys.exit(main())
