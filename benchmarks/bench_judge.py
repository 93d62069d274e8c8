"""Wall time of judging the demo suite (10 scored + 4 canary documents, both models) on CPU.

Ledger's gate run (`ledger.gate.judge.judge`): recompute the suite hash from the sealed copy,
budget, contamination check of a 150-row export, ONE base load with the two adapters attached
by name, batched action-span scoring of both models, the decision, and the `judge` transaction.

Its peer, on the same models and documents in the same process: the obvious script -- load the
base and the adapter for each model separately (transformers + peft), then score one document
at a time with a Python loop over the action tokens. Both must give the same losses (checked).
Also timed: `ledger judge` as a user runs it (fresh process: Python start, imports, the run).

    .venv/bin/python benchmarks/bench_judge.py [--runs 7] [--cli-runs 3]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def naive_scores(base_dir: Path, adapter_dir: Path | None, docs) -> list[float]:
    """The peer: a fresh load per model, one forward per document, a loop over its tokens."""
    import torch
    from peft import PeftModel
    from transformers import LlamaForCausalLM

    from ledger.artefacts import tokenizer as toklib

    model = LlamaForCausalLM.from_pretrained(str(base_dir), dtype=torch.float32)
    if adapter_dir is not None:
        model = PeftModel.from_pretrained(model, str(adapter_dir))
    model.eval()
    tok = toklib.ByteTokenizer()
    out = []
    with torch.no_grad():
        for s, a in docs:
            e = toklib.encode_turn(tok, s, a)
            logp = torch.log_softmax(model(input_ids=torch.tensor([e.ids])).logits[0], dim=-1)
            nll = 0.0
            for t in range(e.action_start, e.action_end):
                nll -= float(logp[t - 1, e.ids[t]])
            out.append(nll / (e.action_end - e.action_start))
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=7)
    ap.add_argument("--cli-runs", type=int, default=3)
    args = ap.parse_args()

    import warnings

    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import LlamaForCausalLM
    from transformers.utils import logging as hf_logging

    from ledger.artefacts import builtin_task as task
    from ledger.artefacts import dataset as datalib
    from ledger.artefacts import model as modellib
    from ledger.gate import judge as judgelib
    from ledger.gate import seal
    from ledger.plan import spec
    from ledger.store import Store
    from tests.gate.world import MODULES, store_adapter

    warnings.simplefilter("ignore", FutureWarning)  # peft's deprecation notice on every load
    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    tmp = Path(tempfile.mkdtemp(prefix="bench-judge-"))
    store = Store.init(tmp)
    cfg = spec.normalise({}).config["model"]
    modellib.build_builtin_files(cfg, tmp / "base")
    with store.transaction("import-base") as tx:
        base = modellib.import_hf_dir(tx, tmp / "base")
        tx.outputs.append(base)
    adapters = []
    for seed in (1, 2):  # two distinct non-zero LoRA adapters (r = 8, all seven projections)
        torch.manual_seed(seed)
        m = get_peft_model(LlamaForCausalLM.from_pretrained(str(tmp / "base")),
                           LoraConfig(r=8, lora_alpha=16, target_modules=MODULES, init_lora_weights=False))
        adapters.append(store_adapter(store, m, base, tmp / f"a{seed}"))
    inc, cand = adapters
    seal.seal(store, seal.write_demo_suite(tmp / "suite"), base=base)
    with store.transaction("add") as tx:
        export = tx.put_bytes(datalib.parquet_bytes(datalib.turns_table(task.turns("train", 150, seed=1))), "dataset")
        tx.outputs.append(export)
    suite = seal.pinned(store)
    disk = seal.read_sealed(store, suite)
    ids = suite.scored_ids + suite.canary_ids
    docs = [(disk.docs[d].situation, disk.docs[d].action) for d in ids]

    # Enough budget for every timed run (a benchmark, not a gate).
    settings = suite.settings.__class__(**{**suite.settings.to_json(), "budget_multiplier": 100})

    cold_t0 = time.perf_counter()
    judgelib.judge(store, cand, inc, settings=settings, export_dataset=export)
    cold = time.perf_counter() - cold_t0

    led, score_only, peer = [], [], []
    for _ in range(args.runs):  # alternate, to spread the shared machine's load over both
        t0 = time.perf_counter()
        v, vid, rec = judgelib.judge(store, cand, inc, settings=settings, export_dataset=export)
        led.append(time.perf_counter() - t0)
        score_only.append(rec["payload"]["score_s"])
        t0 = time.perf_counter()
        ni = naive_scores(tmp / "base", tmp / "a1", docs)
        nc = naive_scores(tmp / "base", tmp / "a2", docs)
        peer.append(time.perf_counter() - t0)
    body = store.get_json(vid)
    mine_i = [body["sealed"]["scored"].get(d, body["sealed"]["canary"].get(d))["incumbent"] for d in ids]
    mine_c = [body["sealed"]["scored"].get(d, body["sealed"]["canary"].get(d))["candidate"] for d in ids]
    diff = max(abs(a - b) for a, b in zip(mine_i + mine_c, ni + nc))

    cli = []
    env = {**os.environ, "LEDGER_DIR": str(tmp / ".ledger")}
    for _ in range(args.cli_runs):
        t0 = time.perf_counter()
        p = subprocess.run([sys.executable, "-m", "ledger.cli.main", "judge", cand, "--against", inc, "--json"],
                           env=env, capture_output=True, text=True, cwd=ROOT)
        cli.append(time.perf_counter() - t0)
        if p.returncode != 0:
            raise SystemExit(p.stderr)

    med = statistics.median
    print(f"demo suite: {len(suite.scored_ids)} scored + {len(suite.canary_ids)} canary documents; built-in tiny "
          f"Llama (hidden {cfg['hidden']}, {cfg['layers']} layers), two LoRA r=8 adapters; torch "
          f"{torch.__version__}, {torch.get_num_threads()} threads; load average {os.getloadavg()[0]:.1f}")
    print("| what | median | min | runs |")
    print("|---|---|---|---|")
    print(f"| ledger judge(), in process (hash, budget, contamination of 150 rows, scoring, decide, record) | "
          f"{med(led) * 1e3:.0f} ms | {min(led) * 1e3:.0f} ms | {len(led)} |")
    print(f"| of which scoring both models (one base load, two adapters, batched) | {med(score_only) * 1e3:.0f} ms | "
          f"{min(score_only) * 1e3:.0f} ms | {len(score_only)} |")
    print(f"| peer: load each model, one document at a time, loop over tokens | {med(peer) * 1e3:.0f} ms | "
          f"{min(peer) * 1e3:.0f} ms | {len(peer)} |")
    print(f"| ledger judge(), first call in the process (imports torch/transformers/peft) | {cold * 1e3:.0f} ms | | 1 |")
    print(f"| `ledger judge --json` CLI, fresh process | {med(cli) * 1e3:.0f} ms | {min(cli) * 1e3:.0f} ms | {len(cli)} |")
    print(f"scoring / peer = {med(score_only) / med(peer):.2f}; whole judge() / peer = {med(led) / med(peer):.2f}; "
          f"largest loss difference ledger vs peer = {diff:.2e} nats/token")


if __name__ == "__main__":
    main()
