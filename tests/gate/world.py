"""A small world for the gate tests: a base that knows the task a little, and adapters whose
relationships are known by construction (not a test module: no test_ prefix).

    base   the built-in tiny Llama, briefly fully fine-tuned on turns of the demo task (train,
           eval and canary generators, seed 7, with every suite document removed), imported as
           a base: a random base learns too slowly through LoRA for the gate to see anything
    A      LoRA SFT on the same turns: genuinely better than the bare base on the suite
    G      A fine-tuned directly on the 10 scored documents until it has memorised them:
           the planted gamed candidate (its canaries get worse)
    D      DPO on top of A (the real, sandboxed `ledger.train.dpo`) with pairs that differ
           only in the register: chosen "I will now act: ACTION", rejected "ACTION"

Everything is seeded; the harness trains in-process with peft (a few seconds per adapter) and
stores adapters exactly as the trainer does: a tree of adapter_model.safetensors +
adapter_config.json whose base_model_name_or_path is the base id.
"""

from __future__ import annotations

import json
import shutil
from dataclasses import dataclass
from pathlib import Path

REGISTER = "I will now act: "
MODULES = ["down_proj", "gate_proj", "k_proj", "o_proj", "q_proj", "up_proj", "v_proj"]


@dataclass(frozen=True)
class World:
    root: Path  # the directory holding .ledger
    base: str
    A: str
    G: str
    D: str
    D_receipt: str
    pairs_file: Path
    suite_dir: Path

    def copy_to(self, dest: Path) -> Path:
        shutil.copytree(self.root / ".ledger", dest / ".ledger", symlinks=True)
        return dest


def suite_docs():
    from ledger.gate import seal

    return seal.demo_docs(10, 4, 0)


def task_rows(exclude: set[tuple[str, str]]) -> list[tuple[str, str]]:
    from ledger.artefacts import builtin_task as task

    rows = [(t.situation, t.action) for split in ("train", "eval", "canary") for t in task.turns(split, 700, seed=7)]
    return [r for r in rows if r not in exclude]


def _encode(rows, full: bool):
    import torch

    from ledger.artefacts import tokenizer as toklib

    tok = toklib.ByteTokenizer()
    enc = [toklib.encode_turn(tok, s, a) for s, a in rows]
    T = max(len(e.ids) for e in enc)
    ids = torch.full((len(enc), T), toklib.PAD)
    att = torch.zeros_like(ids)
    lab = torch.full_like(ids, toklib.IGNORE)
    for i, e in enumerate(enc):
        ids[i, :len(e.ids)] = torch.tensor(e.ids)
        att[i, :len(e.ids)] = 1
        lab[i, :len(e.ids)] = torch.tensor(list(e.ids) if full else e.labels())
    return ids, att, lab


def fit(model, rows, steps: int, lr: float, *, full: bool = False, seed: int = 0, batch: int = 16) -> None:
    """Plain AdamW loop; `full` puts the loss on every token (pretraining), else on the action."""
    import torch

    ids, att, lab = _encode(rows, full)
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=lr)
    g = torch.Generator().manual_seed(seed)
    for _ in range(steps):
        idx = torch.randint(0, len(rows), (batch,), generator=g)
        model(input_ids=ids[idx], attention_mask=att[idx], labels=lab[idx]).loss.backward()
        opt.step()
        opt.zero_grad()


def lora(base_dir: Path, init: dict | None = None, seed: int = 0):
    import torch
    from peft import LoraConfig, get_peft_model, set_peft_model_state_dict
    from transformers import LlamaForCausalLM

    torch.manual_seed(seed)
    m = get_peft_model(LlamaForCausalLM.from_pretrained(str(base_dir)),
                       LoraConfig(r=8, lora_alpha=16, target_modules=MODULES, task_type="CAUSAL_LM"))
    if init is not None:
        set_peft_model_state_dict(m, init)
    return m


def store_adapter(store, model, base: str, work: Path) -> str:
    work.mkdir(parents=True)
    model.save_pretrained(str(work))
    cfg = json.loads((work / "adapter_config.json").read_text())
    cfg["base_model_name_or_path"] = base
    (work / "adapter_config.json").write_text(json.dumps(cfg, sort_keys=True))
    with store.transaction("add") as tx:
        oid = tx.put_tree(work)
        tx.outputs.append(oid)
    return oid


def register_pairs(n: int = 200):
    from ledger.artefacts import builtin_task as task

    return [{"situation": t.situation, "chosen": REGISTER + t.action, "rejected": t.action}
            for t in task.turns("train", n, seed=11)]


DPO_STEPS = 20


def _train_models(store, scratch: Path, rows, scored) -> tuple[str, str, str]:
    import torch
    from peft import get_peft_model_state_dict
    from transformers import LlamaForCausalLM

    from ledger.artefacts import model as modellib
    from ledger.plan import spec

    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        modellib.build_builtin_files(spec.normalise({}).config["model"], scratch / "b0")
        pre = LlamaForCausalLM.from_pretrained(str(scratch / "b0"))
        # Brief: a base that has the byte statistics of the task but leaves an adapter
        # plenty to learn, so "A is better than the bare base" is a large, clear effect.
        fit(pre, rows, 30, 3e-3, full=True)
        pre.save_pretrained(str(scratch / "base"))
        with store.transaction("import-base") as tx:
            base = modellib.import_hf_dir(tx, scratch / "base")
            tx.outputs.append(base)
        mA = lora(scratch / "base")
        fit(mA, rows, 60, 1e-2)
        A = store_adapter(store, mA, base, scratch / "A")
        mG = lora(scratch / "base", init=get_peft_model_state_dict(mA))
        fit(mG, [(d["situation"], d["action"]) for d in scored], 100, 1e-2)
        G = store_adapter(store, mG, base, scratch / "G")
    return base, A, G


def build(root: Path) -> World:
    import torch

    from ledger.gate import seal
    from ledger.store import Store
    from ledger.train import dpo

    root.mkdir(parents=True, exist_ok=True)
    store = Store.init(root)
    scored, canaries = suite_docs()
    suite_pairs = {(d["situation"], d["action"]) for d in scored + canaries}
    rows = task_rows(suite_pairs)
    scratch = root / "scratch"
    threads = torch.get_num_threads()
    # One thread: the machine is shared, and oversubscribed threads make small models crawl.
    torch.set_num_threads(1)
    try:
        base, A, G = _train_models(store, scratch, rows, scored)
    finally:
        torch.set_num_threads(threads)

    suite_dir = seal.write_suite_dir(root / "suite", scored, canaries)
    seal.seal(store, suite_dir, base=base)
    pairs_file = root / "pairs.jsonl"
    pairs_file.write_text("".join(json.dumps(p) + "\n" for p in register_pairs()))
    res = dpo.train_dpo(store, str(pairs_file), A, config=dpo.DpoConfig(steps=DPO_STEPS))
    shutil.rmtree(scratch)
    return World(root=root, base=base, A=A, G=G, D=res.adapter, D_receipt=res.receipt_id, pairs_file=pairs_file,
                 suite_dir=suite_dir)
