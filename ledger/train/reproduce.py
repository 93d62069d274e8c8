"""Reproduce: re-execute a receipt from its pinned inputs in a fresh process and compare.

The answer is a comparison object of its own, stored with the re-run's receipt in one
`reproduce` transaction:

  Reproduced       bit-exact: same adapter, optimizer and RNG state, same loss at every step
  WithinTolerance  not bit-exact, but every loss and adapter weight is within tolerance;
                   names the largest deviation
  Diverged         names the first step and field that differ beyond tolerance
  MissingInputs    some pinned input is not in the store (names the ids, and for each one a
                   retention policy removed, the policy and its `prune` record); nothing was run

`overrides` deliberately change the re-run (e.g. `train.threads`, `seeds.data`) to probe how
sensitive a result is; the re-run is then compiled as its own plan and the comparison records
what was changed.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from ledger import records
from ledger.artefacts import checkpoint as ck
from ledger.errors import BadInput
from ledger.plan import compile as comp
from ledger.plan import spec as speclib
from ledger.plan import targets as targetlib
from ledger.store.ids import is_id
from ledger.train import receipt as rcpt
from ledger.train import run as trainlib

OUTCOMES = ("Reproduced", "WithinTolerance", "Diverged", "MissingInputs")
DEFAULT_TOLERANCE = {"loss_abs": 1e-4, "weight_abs": 1e-4}


@dataclass(frozen=True)
class ReproduceResult:
    comparison_id: str
    comparison: dict
    rerun_receipt: str | None
    record: dict

    @property
    def outcome(self) -> str:
        return self.comparison["outcome"]

    def to_json(self) -> dict:
        return {"comparison": self.comparison_id, "outcome": self.outcome, "receipt": self.comparison["receipt"],
                "rerun_receipt": self.rerun_receipt, "first_difference": self.comparison.get("first_difference"),
                "largest_deviation": self.comparison.get("largest_deviation"),
                "missing": self.comparison.get("missing", []), "pruned": self.comparison.get("pruned", [])}


def pinned_inputs(store, r: dict) -> list[str]:
    """Every object the re-run needs, in the order it would need them (missing ones too)."""
    need = [r["plan"], r["spec"], r["base"], r["tokenizer"], *([r["template"]] if r.get("template") else []),
            r["dataset"]]
    if r.get("resumed_from"):
        need.append(r["resumed_from"])
    init = store.get_json(r["plan"])["inputs"].get("init_adapter") if store.has(r["plan"]) else None
    if init:
        # the adapter a cycle's run started from, and its files
        need.append(init)
        if store.has(init):
            need.extend(e["id"] for e in store.get_json(init)["entries"])
    seen, out = set(), []
    stack = list(need)
    while stack:
        oid = stack.pop(0)
        if not is_id(oid) or oid in seen:
            continue
        seen.add(oid)
        out.append(oid)
        if not store.has(oid):
            continue
        obj = store.get_json(oid) if oid in (r["base"], r.get("resumed_from")) else None
        if isinstance(obj, dict) and obj.get("kind") == "base":
            stack.append(obj["files"])
            if store.has(obj["files"]):
                stack.extend(e["id"] for e in store.get_json(obj["files"])["entries"])
        elif isinstance(obj, dict) and obj.get("kind") == "checkpoint":
            stack.extend(obj[k] for k in ck.FILES)
    return out


def _tensors(store, blob: str) -> dict:
    from safetensors.torch import load

    return load(store.get_bytes(blob))


def compare(store, orig: dict, new: dict, tol: dict) -> dict:
    """The comparison of two receipts' outputs (pure but for reading their tensors)."""
    lo, ln = orig["losses"], new["losses"]
    checks = {"losses_identical": lo == ln, "adapter_identical": orig["adapter"] == new["adapter"],
              "final_adapter_identical": None, "optimizer_identical": orig["optimizer_state"] == new["optimizer_state"],
              "rng_identical": orig["rng_state"] == new["rng_state"],
              "steps_identical": orig["cursor"] == new["cursor"]}
    fo, fn = store.get_json(orig["final_checkpoint"]), store.get_json(new["final_checkpoint"])
    checks["final_adapter_identical"] = fo["adapter"] == fn["adapter"]
    if all(checks.values()):
        return {"outcome": "Reproduced", "checks": checks, "first_difference": None, "largest_deviation": None}

    first = None
    largest = {"field": None, "step": None, "value": 0.0}
    start = orig["cursor"]["start_step"]
    for i in range(max(len(lo), len(ln))):
        step = i + 1
        if i >= len(lo) or i >= len(ln):
            first = first or {"step": step, "field": "loss", "original": lo[i] if i < len(lo) else None,
                              "rerun": ln[i] if i < len(ln) else None, "reason": "one run stopped earlier"}
            break
        dev = abs(lo[i] - ln[i]) if math.isfinite(lo[i]) and math.isfinite(ln[i]) else math.inf
        if dev > largest["value"]:
            largest = {"field": "loss", "step": step, "value": dev}
        if dev > tol["loss_abs"] and first is None:
            first = {"step": step, "field": "loss", "original": lo[i], "rerun": ln[i], "deviation": dev}
    if (orig["stopped"] is None) != (new["stopped"] is None) and first is None:
        first = {"step": orig["cursor"]["end_step"], "field": "stopped", "original": orig["stopped"],
                 "rerun": new["stopped"]}
    if not checks["final_adapter_identical"]:
        a, b = _tensors(store, fo["adapter"]), _tensors(store, fn["adapter"])
        end = orig["cursor"]["end_step"]
        for name in sorted(set(a) | set(b)):
            if name not in a or name not in b or a[name].shape != b[name].shape:
                first = first or {"step": end, "field": f"adapter:{name}", "reason": "tensor missing or reshaped"}
                continue
            dev = float((a[name].double() - b[name].double()).abs().max())
            if not math.isfinite(dev):
                dev = math.inf
            if dev > largest["value"]:
                largest = {"field": f"adapter:{name}", "step": end, "value": dev}
            if dev > tol["weight_abs"] and first is None:
                first = {"step": end, "field": f"adapter:{name}", "deviation": dev}
    if first is None and start != new["cursor"]["start_step"]:
        first = {"step": start, "field": "cursor.start_step", "original": start, "rerun": new["cursor"]["start_step"]}
    if first is None:
        return {"outcome": "WithinTolerance", "checks": checks, "first_difference": None, "largest_deviation": largest}
    return {"outcome": "Diverged", "checks": checks, "first_difference": first, "largest_deviation": largest}


def _rerun_plan(store, plan: comp.Plan, overrides: dict) -> comp.Plan:
    if not overrides:
        return plan
    s = speclib.normalise(plan.config).with_overrides(overrides)
    t = targetlib.from_body(store.get_json(plan.view.target.id))
    return comp.compile_spec(store, s, t).plan


def reproduce(store, receipt_ref: str, *, overrides: dict | None = None, tolerance: dict | None = None,
              unsandboxed: bool = False, progress=None) -> ReproduceResult:
    rid, orig = rcpt.load(store, receipt_ref)
    tol = {**DEFAULT_TOLERANCE, **(tolerance or {})}
    overrides = dict(overrides or {})
    base = {"kind": "comparison", "receipt": rid, "overrides": overrides, "tolerance": tol,
            "source": {"original_hash": orig["source"]["hash"], "rerun_hash": rcpt.source_identity()["hash"]},
            "versions": {"original": orig["versions"]}}
    missing = [oid for oid in pinned_inputs(store, orig) if not store.has(oid)]
    if missing:
        # what a retention policy removed says so (`gc --prune`: ledger/store/retention.py),
        # so the answer names the policy and the record, not just an absent id
        pruned = store.pruned()
        body = {**base, "outcome": "MissingInputs", "missing": missing, "rerun_receipt": None,
                "pruned": [{"id": oid, **pruned[oid]} for oid in missing if oid in pruned]}
        with store.transaction("reproduce", wait=60) as tx:
            cid = tx.put_json(body)
            tx.inputs.append(rid)
            tx.outputs.append(cid)
            records.write(tx, records.Reproduce(comparison=cid, of=rid, outcome="MissingInputs"))
        return ReproduceResult(cid, body, None, tx.record)

    plan = comp.load(store, orig["plan"])
    if overrides and orig.get("resumed_from"):
        raise BadInput("overrides cannot be applied to a resumed run: its checkpoint belongs to the original plan",
                       "reproduce without --override, or reproduce the run it resumed")
    plan = _rerun_plan(store, plan, overrides)
    run = trainlib.execute(store, plan, resume=orig.get("resumed_from"), unsandboxed=unsandboxed, progress=progress)
    try:
        with store.transaction("reproduce", wait=60) as tx:
            new_id, new = trainlib.commit(tx, plan, run, orig.get("resumed_from"))
            verdict = compare(store, orig, new, tol)
            body = {**base, **verdict, "rerun_receipt": new_id, "missing": [],
                    "versions": {"original": orig["versions"], "rerun": new["versions"]}}
            cid = tx.put_json(body)
            tx.inputs.append(rid)
            tx.outputs.append(cid)
            records.write(tx, records.Reproduce(comparison=cid, of=rid, receipt=new_id, outcome=body["outcome"]))
    finally:
        store.discard_work_folder(run.work)
    return ReproduceResult(cid, body, new_id, tx.record)
