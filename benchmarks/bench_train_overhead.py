"""Training-step overhead of `ledger train` vs a bare transformers+peft loop (CPU), and the
wall time of compiling the demo spec in a warm process.

Both loops train the same plan: the same base files, LoRA config, optimizer, seeds, thread
count and batches, each in a fresh process. Ledger's figure is the median step time its child
recorded in the receipt (sandboxed, progress and checkpoints included); the peer is a plain
loop (forward, backward, AdamW step, zero_grad) timed the same way. The two alternate `--rounds`
times to spread the shared machine's load over both.

    .venv/bin/python benchmarks/bench_train_overhead.py [--steps 60] [--rounds 3]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

BARE = r'''
import json, sys, time, torch
from pathlib import Path
from peft import LoraConfig, get_peft_model
from transformers import LlamaForCausalLM
import transformers
transformers.utils.logging.set_verbosity_error()
transformers.utils.logging.disable_progress_bar()
job = json.loads(Path(sys.argv[1]).read_text())
c = job["config"]
torch.set_num_threads(c["train"]["threads"])
torch.use_deterministic_algorithms(True)
d = torch.load(job["batches"], weights_only=True)
model = LlamaForCausalLM.from_pretrained(job["base"])
torch.manual_seed(c["seeds"]["lora_init"])
model = get_peft_model(model, LoraConfig(r=c["lora"]["r"], lora_alpha=c["lora"]["alpha"], lora_dropout=c["lora"]["dropout"],
                                         target_modules=c["lora"]["target_modules"], task_type="CAUSAL_LM"))
o = c["optimizer"]
opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=o["lr"], betas=tuple(o["betas"]),
                        eps=o["eps"], weight_decay=o["weight_decay"], foreach=False)
model.train()
times, cpu = [], []
for i in range(len(d["ids"])):
    t0, c0 = time.perf_counter(), time.thread_time()
    loss = model(input_ids=d["ids"][i], attention_mask=d["mask"][i], labels=d["labels"][i]).loss
    loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
    times.append(time.perf_counter() - t0)
    cpu.append(time.thread_time() - c0)
print(json.dumps({"step_median_s": sorted(times)[len(times) // 2], "step_cpu_median_s": sorted(cpu)[len(cpu) // 2]}))
'''


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=60)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--compiles", type=int, default=20)
    args = ap.parse_args()

    import torch

    from ledger.artefacts import template as templatelib
    from ledger.plan import compile as comp
    from ledger.plan import spec, targets
    from ledger.store import Store, trees
    from ledger.train import run as trainlib
    from ledger.train import sft

    tmp = Path(tempfile.mkdtemp(prefix="bench-train-"))
    store = Store.init(tmp)
    text = (ROOT / "examples" / "tiny.toml").read_text().replace("steps = 200", f"steps = {args.steps}")
    s = spec.parse(text)
    cpu = targets.get("cpu")

    # --- compile, warm ------------------------------------------------------------------------
    t0 = time.perf_counter()
    plan = comp.compile_spec(store, s, cpu).plan
    cold = time.perf_counter() - t0
    same, fresh = [], []
    for i in range(args.compiles):
        t0 = time.perf_counter()
        comp.compile_spec(store, spec.parse(text), cpu)  # same inputs: found, nothing written
        same.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        comp.compile_spec(store, spec.parse(text.replace("checkpoint_every = 100", f"checkpoint_every = {101 + i}")), cpu)
        fresh.append(time.perf_counter() - t0)

    # --- the same batches for the bare loop ---------------------------------------------------
    c = plan.config
    base_dir = tmp / "base"
    trees.materialise_tree(store, store.get_json(plan.body["inputs"]["base"])["files"], base_dir)
    store.export_file(plan.body["inputs"]["dataset"], tmp / "data.parquet")
    chat = templatelib.for_base(store, store.get_json(plan.body["inputs"]["base"]))  # what the child encodes with
    ids, mask, labels = sft.encode_rows(sft.read_rows(tmp / "data.parquet"), c["data"]["seq_len"], chat)
    cache: dict = {}
    rows = [sft.batch_indices(i, c["data"]["micro_batch"], ids.shape[0], c["seeds"]["data"], cache) for i in range(args.steps)]
    torch.save({"ids": [ids[r] for r in rows], "mask": [mask[r] for r in rows], "labels": [labels[r] for r in rows]},
               tmp / "batches.pt")
    (tmp / "job.json").write_text(json.dumps({"config": c, "base": str(base_dir), "batches": str(tmp / "batches.pt")}))

    led, bare, led_cpu, bare_cpu = [], [], [], []
    for _ in range(args.rounds):
        r = trainlib.train(store, plan.id)
        led.append(r.receipt["timings"]["step_median_s"])
        led_cpu.append(r.receipt["timings"]["step_cpu_median_s"])
        p = subprocess.run([sys.executable, "-c", BARE, str(tmp / "job.json")], capture_output=True, text=True,
                           env={"OMP_NUM_THREADS": "1", "PATH": "/usr/bin:/bin", "HF_HUB_OFFLINE": "1"})
        if p.returncode:
            raise SystemExit(p.stderr)
        out = json.loads(p.stdout.strip().splitlines()[-1])
        bare.append(out["step_median_s"])
        bare_cpu.append(out["step_cpu_median_s"])

    print(f"config: examples/tiny.toml with steps={args.steps}, micro-batch {c['data']['micro_batch']} x "
          f"{c['data']['seq_len']}, {c['train']['threads']} thread, {args.rounds} alternating rounds")
    print("The figure is the per-step CPU time of the compute thread (thread_time): unlike wall time it")
    print("does not move with other processes' load on shared cores. Wall medians are listed too.")
    print("| what | CPU per step (median of rounds) | CPU per round (ms) | wall per round (ms) |")
    print("|---|---|---|---|")

    def ms(xs):
        return ", ".join(f"{x * 1e3:.1f}" for x in xs)

    print(f"| ledger train (sandboxed child) | {statistics.median(led_cpu) * 1e3:.1f} ms | {ms(led_cpu)} | {ms(led)} |")
    print(f"| bare transformers+peft loop | {statistics.median(bare_cpu) * 1e3:.1f} ms | {ms(bare_cpu)} | {ms(bare)} |")
    print(f"ratio ledger / bare (CPU, median of rounds) = {statistics.median(led_cpu) / statistics.median(bare_cpu):.3f} "
          f"(target <= 1.05); per round: {', '.join(f'{x / y:.3f}' for x, y in zip(led_cpu, bare_cpu))}")
    print()
    print("| compile of the demo spec | median | max |")
    print("|---|---|---|")
    print(f"| cold (first in process: imports torch, builds and stores the base) | {cold:.3f} s | |")
    print(f"| warm, same inputs (plan found) | {statistics.median(same) * 1e3:.1f} ms | {max(same) * 1e3:.1f} ms |")
    print(f"| warm, new plan (one field changed; compile transaction) | {statistics.median(fresh) * 1e3:.1f} ms | "
          f"{max(fresh) * 1e3:.1f} ms |")
    print("target: warm compile <= 500 ms")


if __name__ == "__main__":
    main()
