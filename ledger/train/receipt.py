"""Receipts: what a run was, bound by identity, with the evidence rung it reached.

A receipt names every identity that could change the result (docs/compile-train.md,
"Receipt"): the source (hash of the ledger package files), library versions, device, the spec,
plan and target, base weights and tokenizer, dataset and data cursor, seeds and RNG state,
optimizer state, the realizations used, memory predicted vs observed, per-step losses and
counters, timings, the sandbox it ran under, and the rung:

  Checked  the plan compiled and fits its target          (evidence: plan id, fit)
  Emitted  the child built the model and wrote artefacts   (evidence: final checkpoint id)
  Ran      optimizer steps executed, counters advanced      (evidence: step counts)
  Learned  the loss fell: mean of the last 10% of steps below the mean of the first 10%
  Judged   added later by the gate, never here

A rung is claimed only with its evidence. A run stopped by a non-finite loss stays at Ran (at
most) and has no adapter, so nothing from it can be offered for judging.
"""

from __future__ import annotations

import functools
from pathlib import Path

import blake3

import ledger
from ledger.errors import BadInput, Refused
from ledger.plan.plan import Plan
from ledger.store.ids import PREFIX, is_id

RUNGS = ("Checked", "Emitted", "Ran", "Learned", "Judged")
RECEIPT_VERSION = 1


@functools.lru_cache(maxsize=1)
def source_identity() -> dict:
    """Hash of the ledger package's files (path + content), so a code change changes it."""

    root = Path(ledger.__file__).resolve().parent
    h = blake3.blake3()
    n = 0
    for p in sorted(root.rglob("*")):
        if p.is_file() and p.suffix in (".py", ".toml", ".json", ".wat", ".c", ".cu") and "__pycache__" not in p.parts:
            rel = p.relative_to(root).as_posix().encode()
            h.update(len(rel).to_bytes(4, "little") + rel)
            data = p.read_bytes()
            h.update(len(data).to_bytes(8, "little") + data)
            n += 1
    return {"hash": PREFIX + h.hexdigest(), "files": n, "package_version": getattr(ledger, "__version__", None)}


def learned_evidence(losses: list[float]) -> dict | None:
    if len(losses) < 2:
        return None
    k = max(1, len(losses) // 10)
    first, last = sum(losses[:k]) / k, sum(losses[-k:]) / k
    return {"window": k, "first_mean": first, "last_mean": last, "fell": last < first}


def rung_of(result: dict, emitted: dict | None, steps: int, **ran) -> tuple[str, dict]:
    """The highest rung a run's evidence supports past Checked, with that evidence (SFT and DPO):
    Emitted with `emitted` (what the run left: {"final_checkpoint": id}, {"adapter": id}), Ran when
    it also took `steps` >= 1 optimizer steps (`ran`: more evidence for it), Learned when it was
    not stopped and its loss fell (learned_evidence). A rung is never claimed without the one below."""
    evidence: dict = {}
    rung = "Checked"
    if emitted:
        evidence["Emitted"] = emitted
        rung = "Emitted"
    if rung == "Emitted" and steps >= 1:
        evidence["Ran"] = {"optimizer_steps": steps, **ran, "all_losses_finite": result["stopped"] is None}
        rung = "Ran"
    le = learned_evidence(result["losses"])
    if rung == "Ran" and result["stopped"] is None and le and le["fell"]:
        evidence["Learned"] = le
        rung = "Learned"
    return rung, evidence


def build(*, plan_id: str, plan: Plan, result: dict, final_checkpoint: str, final_manifest: dict,
          adapter: str | None, checkpoints: list[str], resumed_from: str | None, sandbox: dict) -> dict:
    """The receipt of one run of `plan` (its typed view) from what the child reported (`result`,
    checked by ledger.train.job) and what the parent committed."""
    rung, evidence = rung_of(result, {"final_checkpoint": final_checkpoint} if final_checkpoint else None,
                             result["counters"]["optimizer_steps"], steps_done=result["steps_done"])
    evidence = {"Checked": {"plan": plan_id, "fits": plan.fit.fits}, **evidence}
    inputs = plan.inputs
    return {
        "kind": "receipt", "version": RECEIPT_VERSION, "rung": rung, "evidence": evidence,
        "plan": plan_id, "spec": plan.spec, "target": plan.target.to_json(),
        "base": inputs.base, "tokenizer": inputs.tokenizer,
        "template": inputs.template or None, "dataset": inputs.dataset,
        "cursor": {"start_step": result["start_step"], "end_step": result["steps_done"],
                   **final_manifest["state"]["cursor"]},
        "seeds": plan.config.seeds.to_json(), "rng_state": final_manifest["rng"],
        "optimizer_state": final_manifest["optimizer"],
        "final_checkpoint": final_checkpoint, "checkpoints": checkpoints, "resumed_from": resumed_from,
        "adapter": adapter, "stopped": result["stopped"],
        "realizations": {op: r.name for op, r in sorted(plan.realizations.items())},
        "memory": {"predicted_bytes": plan.memory.total_bytes,
                   "predicted_lines": {x.name: x.bytes for x in plan.memory.lines}, "observed": result["memory"]},
        "losses": result["losses"], "counters": result["counters"], "timings": result["timings"],
        "source": source_identity(), "versions": result["versions"], "device": result["device"],
        "determinism": result["determinism"], "sandbox": sandbox,
    }


def load(store, ref: str) -> tuple[str, dict]:
    oid = store.resolve(ref)
    r = store.get_json(oid)
    if not isinstance(r, dict) or r.get("kind") != "receipt":
        raise BadInput(f"{oid} is not a receipt", "pass a receipt id from `ledger train` or `ledger log`")
    if r.get("trainer") == "tracked":
        # a tracked run (ledger.track) bound what it could see, but no plan was compiled for it:
        # there is no program here for ledger to re-execute, and it must not pretend otherwise
        raise Refused(f"{oid} is the receipt of a tracked run ({r.get('name')!r}): it has no compiled plan to re-run",
                      "re-run your own script (the receipt names its source and params); "
                      "`ledger diff` compares two runs")
    check(oid, r)
    return oid, r


_ID_FIELDS = ("plan", "spec", "base", "tokenizer", "dataset", "final_checkpoint", "optimizer_state", "rng_state")


def check(oid: str, r: dict) -> None:
    """A receipt read back is an input too: refuse one that lacks what reproduce relies on."""

    bad = [k for k in _ID_FIELDS if not is_id(r.get(k))]
    if r.get("resumed_from") is not None and not is_id(r["resumed_from"]):
        bad.append("resumed_from")
    if r.get("adapter") is not None and not is_id(r["adapter"]):
        bad.append("adapter")
    losses = r.get("losses")
    if not isinstance(losses, list) or not all(isinstance(x, (int, float)) and not isinstance(x, bool) for x in losses):
        bad.append("losses")
    cur = r.get("cursor")
    steps = ("start_step", "end_step", "next_step")
    if not isinstance(cur, dict) or not all(isinstance(cur.get(k), int) for k in steps):
        bad.append("cursor")
    for k in ("source", "versions", "target", "seeds"):
        if not isinstance(r.get(k), dict):
            bad.append(k)
    if bad:
        raise BadInput(f"receipt {oid} is malformed: bad or missing {', '.join(bad)}",
                       "receipts are written by `ledger train`; this one was not, or was damaged")

