"""DPO: preference tuning on top of the cycle's SFT adapter, with that SFT policy as reference.

Input: preference pairs (situation, chosen response, rejected response) and an SFT adapter.
Output: a new adapter of the same shape (the SFT adapter's LoRA weights, tuned further), a
`dpo-receipt`, and ONE `train` transaction naming both -- so the gate finds the adapter's
receipt, its pairs (for the contamination check) and its SFT parent like any other run.

The loss is the DPO objective (Rafailov et al. 2023) with the SFT policy as the reference
(docs/gate-ops.md, "DPO": the reference must be the SFT policy, not the bare base):

    L = -log sigmoid( beta * [ (log pi(y_w|x) - log ref(y_w|x)) - (log pi(y_l|x) - log ref(y_l|x)) ] )

log pi(y|x) is the sum over the response's action span -- its tokens and the end-of-turn token --
of the turn encoding training uses: the base's tokenizer and chat template (template.Chat), the
plain `<bos> situation <sep> response <eos>` for the built-in model. The reference log-probabilities
are computed once, before the first step, from the same weights the policy starts from (the SFT
adapter), so no second model is held in memory. Dropout is off for policy and reference alike:
the two must be the same function at step 0 (every margin starts at exactly 0).

The receipt records what docs/gate-ops.md ("DPO") asks of DPO: the implied rewards r = beta * (log pi - log ref)
of chosen and rejected responses over all pairs after training -- reward margin (mean, min),
accuracy (the share of pairs whose chosen reward exceeds the rejected one) and a chosen-reward
summary -- plus per-step loss, margin and accuracy.

The work happens in a child (`python -m ledger.train.dpo WORK`) confined by ledger.sandbox to
its inputs (read) and output folder (write), exactly like SFT training: the store and the sealed
suite are never granted, and any attempt on them is recorded in the receipt.
"""

from __future__ import annotations

import io
import json
import math
import os
import sys
import time
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass
from pathlib import Path

from ledger import records
from ledger.artefacts import model as modellib
from ledger.artefacts import template as templatelib
from ledger.artefacts.dataset import read_parquet
from ledger.errors import BadInput
from ledger.store import trees
from ledger.store.ids import hash_bytes
from ledger.train import job, recipe, runtime
from ledger.train.receipt import rung_of, source_identity

RECEIPT_KIND = "dpo-receipt"
RECEIPT_VERSION = 1


# --- configuration --------------------------------------------------------------------------------
@dataclass(frozen=True)
class DpoConfig:
    beta: float = 0.1  # docs/gate-ops.md, "DPO"
    lr: float = 1e-4
    steps: int = 50
    batch: int = 8
    seed: int = 0
    threads: int = 1
    weight_decay: float = 0.0

    def __post_init__(self):
        for name, lo in (("beta", 0.0), ("lr", 0.0)):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v <= lo:
                raise BadInput(f"dpo {name} must be a finite number > 0, got {v!r}")
            object.__setattr__(self, name, float(v))
        for name, lo in (("steps", 1), ("batch", 1), ("seed", 0), ("threads", 1)):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < lo:
                raise BadInput(f"dpo {name} must be an integer >= {lo}, got {v!r}")
        wd = self.weight_decay
        if isinstance(wd, bool) or not isinstance(wd, (int, float)) or not math.isfinite(wd) or wd < 0:
            raise BadInput(f"dpo weight_decay must be a finite number >= 0, got {wd!r}")
        object.__setattr__(self, "weight_decay", float(wd))

    def to_json(self) -> dict:
        return asdict(self)


# --- pairs ------------------------------------------------------------------------------------------
PAIR_FIELDS = ("situation", "chosen", "rejected")


def _check_pairs(rows: list[tuple[str, str, str]], where: str) -> list[tuple[str, str, str]]:
    if not rows:
        raise BadInput(f"{where} holds no preference pairs")
    for i, r in enumerate(rows):
        if any(not isinstance(x, str) or not x for x in r):
            raise BadInput(f"{where}: pair {i} needs non-empty strings situation, chosen and rejected")
        if r[1] == r[2]:
            raise BadInput(f"{where}: pair {i} prefers a response over itself (chosen == rejected)")
    return rows


def pairs_table_bytes(rows: Iterable[tuple[str, str, str]]) -> bytes:
    """Canonical Parquet bytes of the pairs (the stored dataset object)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    rows = list(rows)
    tbl = pa.table({f: [r[i] for r in rows] for i, f in enumerate(PAIR_FIELDS)})
    buf = io.BytesIO()
    pq.write_table(tbl, buf, compression="zstd", write_statistics=False, use_dictionary=False)
    return buf.getvalue()


def read_pairs_bytes(data: bytes, where: str) -> list[tuple[str, str, str]]:
    import pyarrow as pa


    try:
        tbl = read_parquet(data)
    except (pa.ArrowException, OSError) as e:
        raise BadInput(f"{where} is not a Parquet table of pairs: {e}") from None
    missing = [f for f in PAIR_FIELDS if f not in tbl.column_names]
    if missing:
        raise BadInput(f"{where} lacks column(s) {', '.join(missing)}", "pairs have situation, chosen, rejected")
    cols = [tbl.column(f).to_pylist() for f in PAIR_FIELDS]
    return _check_pairs(list(zip(*cols)), where)


def load_pairs(store, source: str) -> tuple[bytes, list[tuple[str, str, str]]]:
    """Pairs from a .jsonl file ({"situation", "chosen", "rejected"} per line), a .parquet file, or
    a stored Parquet object (id, prefix or name). Returns the canonical Parquet bytes and rows."""
    p = Path(source)
    if p.is_file():
        if p.suffix == ".jsonl":
            rows = []
            for n, line in enumerate(p.read_text(encoding="utf-8").splitlines(), 1):
                if not line.strip():
                    continue
                try:
                    obj = json.loads(line)
                except ValueError as e:
                    raise BadInput(f"{p} line {n}: not JSON ({e})") from None
                if not isinstance(obj, dict) or set(obj) - set(PAIR_FIELDS) or any(f not in obj for f in PAIR_FIELDS):
                    raise BadInput(f"{p} line {n}: a pair is "
                                   "{\"situation\", \"chosen\", \"rejected\"} and nothing else")
                rows.append(tuple(obj[f] for f in PAIR_FIELDS))
            rows = _check_pairs(rows, str(p))
        else:
            rows = read_pairs_bytes(p.read_bytes(), str(p))
    else:
        oid = store.resolve(source)
        rows = read_pairs_bytes(store.get_bytes(oid), oid)
    return pairs_table_bytes(rows), rows


# --- the parent -------------------------------------------------------------------------------------
@dataclass(frozen=True)
class DpoResult:
    receipt_id: str
    receipt: dict
    record: dict

    @property
    def adapter(self) -> str | None:
        return self.receipt["adapter"]

    def to_json(self) -> dict:
        r = self.receipt
        return {"receipt": self.receipt_id, "adapter": r["adapter"], "rung": r["rung"], "sft_adapter": r["sft_adapter"],
                "pairs": r["dataset"], "stopped": r["stopped"], "dpo": r["dpo"],
                "final_loss": (r["losses"] or [None])[-1], "sandboxed": r["sandbox"].get("sandboxed"),
                "protected_attempts": len(r["sandbox"].get("protected_attempts") or [])}


def _prepare(store, work: Path, base_id: str, sft_id: str, pairs_data: bytes, cfg: DpoConfig,
             max_len: int | None) -> None:
    """Fill work/inputs/: the base, its chat template, the SFT adapter, the pairs, job.json."""
    from ledger.gate.score import ADAPTER_FILES, _tree_files

    man = modellib.load_manifest(store, base_id)
    trees.materialise_tree(store, man["files"], work / "inputs" / "base")
    templatelib.write_folder(templatelib.for_base(store, man), work / "inputs" / "chat")
    files = _tree_files(store, sft_id)
    (work / "inputs" / "sft").mkdir()
    for name in ADAPTER_FILES:
        store.export_file(files[name], work / "inputs" / "sft" / name)
    (work / "inputs" / "pairs.parquet").write_bytes(pairs_data)
    spec = {"config": cfg.to_json(), "base": base_id, "base_dir": "inputs/base", "sft_dir": "inputs/sft",
            "pairs": "inputs/pairs.parquet", "max_len": max_len, "chat": "inputs/chat",
            "tokenizer": man["tokenizer"], "template": man.get("template")}
    (work / "inputs" / "job.json").write_text(json.dumps(spec, sort_keys=True))


def _child_argv(work: Path) -> list[str]:
    """The child's command line (one place, so a test can wrap it)."""
    return job.module_argv("ledger.train.dpo", work)


def _child_job(store, work: Path, cfg: DpoConfig, *, unsandboxed: bool) -> job.ChildJob:
    """A CPU-only child with what the SFT child gets (ledger.train.job), tuning an adapter of the
    SFT adapter's shape: its output may be as large as that adapter, plus headers."""
    sft_bytes = (work / "inputs" / "sft" / "adapter_model.safetensors").stat().st_size  # written by us, above
    lim = job.Limits(steps=cfg.steps, adapter_bytes=job.tensor_file_bound(sft_bytes, 0))
    return job.ChildJob(trainer="dpo", work=work, argv=tuple(_child_argv(work)), env=job.child_env(work, cfg.threads),
                        policy=job.policy_for(store, work), limits=lim, unsandboxed=unsandboxed)


def _collect(outputs: job.ChildOutputs, result: dict) -> dict | None:
    """The adapter folder of a finished run: exactly its two files, within bounds."""
    from ledger.gate.score import ADAPTER_FILES

    if result.get("stopped") is not None:
        job.check_result(result, RESULT_TYPES)
        return None
    files = outputs.read_folder("adapter", {name: (outputs.limits.adapter_bytes if name.endswith(".safetensors")
                                                   else outputs.limits.config_bytes) for name in ADAPTER_FILES})
    if files is None:
        raise job.Refusal(job.Violation("adapter", "missing from a run that finished"))
    job.check_result(result, RESULT_TYPES)
    return files


# what the DPO receipt reads from out/result.json (checked before it is read: job.check_result)
RESULT_TYPES = {"steps_done": int, "losses": list, "stopped": (type(None), dict), "dpo": dict, "metrics": dict,
                "counters": dict, "timings": dict, "versions": dict, "device": dict, "determinism": dict}


def train_dpo(store, pairs: str, sft: str, *, config: DpoConfig | None = None, unsandboxed: bool = False,
              progress: Callable[[dict], None] | None = None) -> DpoResult:
    """Train a DPO adapter on `pairs` on top of the SFT adapter `sft` (its policy is the reference)."""
    from ledger.gate.score import resolve_model

    cfg = config or DpoConfig()
    sft_model = resolve_model(store, sft)
    if sft_model.adapter is None:
        raise BadInput(f"{sft} has no adapter: DPO trains on top of an SFT adapter",
                       "pass --sft an adapter (tree id, receipt, or a generation that has one)")
    pairs_data, rows = load_pairs(store, pairs)
    pairs_id = hash_bytes(pairs_data)
    man = modellib.load_manifest(store, sft_model.base)
    max_len = int(man["config"].get("max_position_embeddings") or 0) or None
    chat = templatelib.for_base(store, man)
    for s, c, r in rows:  # refuse before starting a child: nothing is truncated, ever
        chat.encode_turn(s, c, max_len)
        chat.encode_turn(s, r, max_len)
    sft_receipt = None
    from ledger.gate.judge import receipt_of

    found = receipt_of(store, sft_model.adapter)
    if found is not None:
        sft_receipt = found[0]
    t0 = time.time()
    work = job.new_work(store, "dpo")
    try:
        _prepare(store, work, sft_model.base, sft_model.adapter, pairs_data, cfg, max_len)
        fin = job.run_job(store, _child_job(store, work, cfg, unsandboxed=unsandboxed), progress=progress,
                          collect=_collect)
        result, sandbox = fin.result, fin.sandbox
        with store.transaction("train", wait=60) as tx:
            pid = tx.put_bytes(pairs_data, "dataset")
            assert pid == pairs_id
            adapter = job.put_tree_bytes(tx, fin.collected) if fin.collected is not None else None
            # A finished run always has its adapter (_collect refuses one without); a stopped run has
            # none, and its receipt (adapter null, `stopped` set) is what it emitted: Ran when it took
            # a step, Emitted when it stopped on the first (as an SFT run stopped by a non-finite loss).
            rung, evidence = rung_of(result, {"adapter": adapter} if adapter or result["stopped"] else None,
                                     result["steps_done"])
            body = {"kind": RECEIPT_KIND, "version": RECEIPT_VERSION, "trainer": "dpo", "rung": rung,
                    "evidence": evidence, "base": sft_model.base, "tokenizer": man["tokenizer"],
                    "template": chat.template_id,
                    "sft_adapter": sft_model.adapter, "sft_receipt": sft_receipt, "dataset": pid,
                    "config": cfg.to_json(), "dpo": result["dpo"], "adapter": adapter, "stopped": result["stopped"],
                    "losses": result["losses"], "metrics": result["metrics"], "counters": result["counters"],
                    "timings": result["timings"], "source": source_identity(), "versions": result["versions"],
                    "device": result["device"], "determinism": result["determinism"], "sandbox": sandbox}
            rid = tx.put_json(body)
            tx.inputs.extend(x for x in (sft_model.base, sft_model.adapter, pid, sft_receipt) if x)
            tx.outputs.extend([rid] + ([adapter] if adapter else []))
            records.write(tx, records.Train(receipt=rid, adapter=adapter, rung=rung, trainer="dpo",
                                            sft_adapter=sft_model.adapter, dataset=pid, unsandboxed=unsandboxed,
                                            wall_s=round(time.time() - t0, 3)))
    finally:
        store.discard_work_folder(work)
    return DpoResult(rid, body, tx.record)


# --- the child --------------------------------------------------------------------------------------
def _encode(rows, which: int, max_len, chat):
    """Padded ids, attention mask and the response-target mask (the response's action span:
    its tokens and the end-of-turn token)."""
    import torch

    enc = [chat.encode_turn(r[0], r[which], max_len) for r in rows]
    T = max(len(e.ids) for e in enc)
    ids = torch.full((len(enc), T), chat.tokenizer.pad_id, dtype=torch.long)
    att = torch.zeros((len(enc), T), dtype=torch.long)
    span = torch.zeros((len(enc), T), dtype=torch.bool)
    for i, e in enumerate(enc):
        ids[i, :len(e.ids)] = torch.tensor(e.ids, dtype=torch.long)
        att[i, :len(e.ids)] = 1
        span[i, e.action_start:e.action_end] = True  # ends with end-of-turn: ending the response is part of it
    return ids, att, span[:, 1:]


def sequence_logps(model, ids, att, span):
    """Sum of log-probabilities of the response targets of each row."""
    import torch

    logits = model(input_ids=ids, attention_mask=att).logits[:, :-1, :].float()
    lp = -torch.nn.functional.cross_entropy(logits.transpose(1, 2), ids[:, 1:], reduction="none")
    return (lp * span).sum(dim=1)


def _summary(xs: list[float]) -> dict:
    s = sorted(xs)
    n = len(s)
    return {"mean": sum(s) / n, "min": s[0], "max": s[-1], "median": (s[(n - 1) // 2] + s[n // 2]) / 2}


class DpoRecipe:
    """setup -> train -> save (ledger.train.recipe.Recipe): DPO on the SFT adapter in inputs/sft."""

    def __init__(self, work: Path):
        self.t_start = time.perf_counter()
        self.work, self.out = work, work / "out"
        self.job = json.loads((work / "inputs" / "job.json").read_text())
        self.cfg = DpoConfig(**self.job["config"])

    def setup(self) -> None:
        import torch
        import transformers
        from peft import PeftModel
        from transformers import LlamaForCausalLM

        cfg, job, work = self.cfg, self.job, self.work
        torch.set_num_threads(cfg.threads)
        torch.use_deterministic_algorithms(True)
        transformers.utils.logging.set_verbosity_error()
        transformers.utils.logging.disable_progress_bar()
        rows = read_pairs_bytes((work / job["pairs"]).read_bytes(), "pairs")
        chat = templatelib.read_folder(work / job["chat"], job["tokenizer"], job["template"])
        self.chosen = _encode(rows, 1, job["max_len"], chat)
        self.rejected = _encode(rows, 2, job["max_len"], chat)
        self.n = len(rows)
        base = LlamaForCausalLM.from_pretrained(str(work / job["base_dir"]), dtype=torch.float32, local_files_only=True)
        self.model = PeftModel.from_pretrained(base, str(work / job["sft_dir"]), is_trainable=True)
        self.model.eval()  # no dropout: policy and reference are the same function at step 0
        self.params = [p for _, p in sorted(self.model.named_parameters()) if p.requires_grad]
        for p in self.params:
            p.data = p.data.float()
        self.ref_c, self.ref_r = self._all_logps()  # the SFT policy: the weights before the first step
        self.t_ready = time.perf_counter()

    def _all_logps(self):
        import torch

        with torch.no_grad():
            out_c, out_r = [], []
            for lo in range(0, self.n, 64):
                sl = slice(lo, min(self.n, lo + 64))
                out_c.append(sequence_logps(self.model, *(x[sl] for x in self.chosen)))
                out_r.append(sequence_logps(self.model, *(x[sl] for x in self.rejected)))
            return torch.cat(out_c), torch.cat(out_r)

    def train(self) -> None:
        import torch

        cfg, n, model = self.cfg, self.n, self.model
        opt = torch.optim.AdamW(self.params, lr=cfg.lr, weight_decay=cfg.weight_decay, foreach=False)
        gen = torch.Generator().manual_seed(cfg.seed)
        order = torch.randperm(n, generator=gen)
        pos = 0
        self.losses, self.margins, self.accs = [], [], []
        self.stopped = None
        prog = open(self.out / "progress.jsonl", "a", buffering=1)
        step = 0
        for step in range(1, cfg.steps + 1):
            idx = []
            while len(idx) < cfg.batch:  # consecutive slices of seeded per-epoch permutations
                if pos == n:
                    order, pos = torch.randperm(n, generator=gen), 0
                take = min(cfg.batch - len(idx), n - pos)
                idx.extend(order[pos:pos + take].tolist())
                pos += take
            b = torch.tensor(idx)
            pc = sequence_logps(model, *(x[b] for x in self.chosen))
            pr = sequence_logps(model, *(x[b] for x in self.rejected))
            margin = cfg.beta * ((pc - self.ref_c[b]) - (pr - self.ref_r[b]))
            loss = -torch.nn.functional.logsigmoid(margin).mean()
            if not math.isfinite(loss.item()):
                self.stopped = {"reason": "non-finite loss", "step": step, "loss": repr(loss.item())}
                step -= 1
                break
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
            self.losses.append(loss.item())
            self.margins.append(margin.mean().item())
            self.accs.append((margin > 0).float().mean().item())
            prog.write(json.dumps({"step": step, "steps": cfg.steps, "loss": self.losses[-1],
                                   "margin": self.margins[-1], "accuracy": self.accs[-1]}) + "\n")
        prog.close()
        self.steps_done = step
        self.t_loop = time.perf_counter()

    def save(self) -> dict:
        import torch
        from peft import get_peft_model_state_dict
        from safetensors.torch import save_file

        from ledger.train import sft  # torch: the child only

        cfg, n, out, step = self.cfg, self.n, self.out, self.steps_done
        pc, pr = self._all_logps()
        rc = (cfg.beta * (pc - self.ref_c)).tolist()
        rr = (cfg.beta * (pr - self.ref_r)).tolist()
        margin_all = [a - b for a, b in zip(rc, rr)]
        dpo = {"beta": cfg.beta, "reference": "sft", "pairs": n,
               "reward_margin": _summary(margin_all), "accuracy": sum(m > 0 for m in margin_all) / n,
               "chosen_reward": _summary(rc), "rejected_reward": _summary(rr)}
        if self.stopped is None:
            (out / "adapter").mkdir()
            sd = {k: v.detach().contiguous() for k, v in sorted(get_peft_model_state_dict(self.model).items())}
            save_file(sd, str(out / "adapter" / "adapter_model.safetensors"), metadata={"format": "pt"})
            (out / "adapter" / "adapter_config.json").write_text(
                json.dumps(sft.adapter_config(self.model, self.job["base"]), sort_keys=True, indent=2) + "\n")
        result = {"steps_done": step, "losses": self.losses, "stopped": self.stopped, "dpo": dpo,
                  "metrics": {"reward_margin": self.margins, "accuracy": self.accs},
                  "counters": {"optimizer_steps": step, "pairs_seen": step * cfg.batch},
                  "timings": {"total_s": time.perf_counter() - self.t_start, "setup_s": self.t_ready - self.t_start,
                              "train_s": self.t_loop - self.t_ready},
                  "versions": runtime.versions(), "device": runtime.device_info(),
                  "determinism": {"threads": cfg.threads,
                                  "deterministic_algorithms": torch.are_deterministic_algorithms_enabled(),
                                  "pythonhashseed": os.environ.get("PYTHONHASHSEED")}}
        (out / "result.json").write_text(json.dumps(result, sort_keys=True))
        return result


def main(argv: list[str]) -> int:
    return recipe.child_main(argv, "ledger.train.dpo", DpoRecipe)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
