"""A numerics gate: a realization that changes the arithmetic (fp8-base) trains only after it
computed, on the run's own first batch, the same loss and LoRA gradients as its reference
(fused-lora's bf16 forward) within the plan's stated tolerances, for a few steps.

Each gate step evaluates reference and candidate from the SAME adapter state on the same batch
and compares the loss (relative difference) and every LoRA gradient (relative L2 against the
reference's). A candidate that also changes the FUNCTION -- fp8-base computes with a quantized
base -- is held to two references, each for what it can say: the loss against the original
base's (`base`: the base's change must not move the loss by more than `loss_rel`), the
gradients against the same quantized base computed in the reference's arithmetic
(`reference`: the fp8 arithmetic must not move them by more than the gradient tolerances).
Against the original base the gradients are recorded too (`vs_base`), not judged: a model
whose every weight moved by e4m3's rounding has different gradients at a random init however
exact the arithmetic (benchmarks/RESULTS.md, session 7: 23 % median on the 1B bench model,
12 % from the weights alone on a 6-layer one).

Between steps the adapter moves by one sign-SGD step along the reference's gradient at the
run's learning rate -- what AdamW's first step does (m / sqrt(v) = sign(g)) -- so that later
steps check the states training reaches first, where B is no longer zero (at LoRA's initial
B = 0 every dA is exactly zero in both, and only dB says anything). Afterwards the adapter is put
back exactly as it was: the gate leaves no trace in training.

A gradient whose reference norm is zero is compared by the candidate's norm alone (it must be
zero too). The record goes into the receipt (`device.numerics_gate`); a failed gate stops the run
before anything is trained (RealizationUnavailable, exit 3), never a quiet switch to the
reference.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from typing import Callable

import torch

from ledger.errors import RealizationUnavailable


@dataclass(frozen=True)
class Tolerance:
    steps: int
    loss_rel: float
    grad_rel_l2_median: float
    grad_rel_l2_max: float
    update: float = 1e-3     # the sign-SGD step between gate steps (the child: optimizer.lr)

    @classmethod
    def from_json(cls, d: dict) -> Tolerance:
        return cls(steps=int(d["steps"]), loss_rel=float(d["loss_rel"]),
                   grad_rel_l2_median=float(d["grad_rel_l2_median"]), grad_rel_l2_max=float(d["grad_rel_l2_max"]),
                   update=float(d.get("update", 1e-3)))


LossFn = Callable[[], torch.Tensor]


def _loss_and_grads(fn: LossFn, params) -> tuple[float, list[torch.Tensor]]:
    for _, p in params:
        p.grad = None
    loss = fn()
    loss.backward()
    grads = [p.grad.detach().float().clone() if p.grad is not None else torch.zeros_like(p, dtype=torch.float32)
             for _, p in params]
    for _, p in params:
        p.grad = None
    return float(loss.detach()), grads


def compare_step(names, ref_loss, ref_grads, cand_loss, cand_grads) -> dict:
    """One gate step's figures: loss difference and per-tensor relative L2 of the gradients."""
    rel, zero_bad, worst = [], [], None
    for n, r, c in zip(names, ref_grads, cand_grads):
        rn = float(r.norm())
        if rn == 0.0:
            if float(c.norm()) != 0.0:
                zero_bad.append(n)
            continue
        e = float((c - r).norm()) / rn
        rel.append(e)
        if worst is None or e > worst[1]:
            worst = (n, e)
    loss_rel = abs(cand_loss - ref_loss) / max(abs(ref_loss), 1e-12)
    return {"ref_loss": ref_loss, "loss": cand_loss, "loss_rel": loss_rel, "compared": len(rel),
            "zero_in_reference": len(names) - len(rel), "nonzero_where_reference_zero": zero_bad,
            "grad_rel_l2_median": statistics.median(rel) if rel else None,
            "grad_rel_l2_max": max(rel) if rel else None, "worst": worst[0] if worst else None}


def judge(steps: list[dict], tol: Tolerance) -> tuple[bool, list[str]]:
    """Whether every step is within the tolerance, and what was not."""
    bad = []
    for i, s in enumerate(steps):
        if not (s["loss_rel"] <= tol.loss_rel):   # `not <=`: a NaN fails
            bad.append(f"step {i}: loss {s['loss']:.5g} vs {s['ref_loss']:.5g} (rel {s['loss_rel']:.3g} > "
                       f"{tol.loss_rel:g})")
        if s["compared"] == 0:
            bad.append(f"step {i}: no gradient with a non-zero reference to compare")
            continue
        if not (s["grad_rel_l2_median"] <= tol.grad_rel_l2_median):
            bad.append(f"step {i}: gradient rel. L2 median {s['grad_rel_l2_median']:.3g} > {tol.grad_rel_l2_median:g}")
        if not (s["grad_rel_l2_max"] <= tol.grad_rel_l2_max):
            bad.append(f"step {i}: gradient rel. L2 max {s['grad_rel_l2_max']:.3g} > {tol.grad_rel_l2_max:g} "
                       f"({s['worst']})")
        if s["nonzero_where_reference_zero"]:
            bad.append(f"step {i}: gradients non-zero where the reference's are zero: "
                       f"{s['nonzero_where_reference_zero'][:3]}")
    return not bad, bad


def run(name: str, reference: LossFn, candidate: LossFn, params: list[tuple[str, torch.Tensor]],
        tol: Tolerance, raise_on_fail: bool = True, base: LossFn | None = None) -> dict:
    """Gate `candidate` (realization `name`) against `reference` over `params` (the trainable
    (name, parameter) pairs both read); returns the record, raises RealizationUnavailable if it
    fails (unless raise_on_fail is False: the bench records a failure beside the others)."""
    names = [n for n, _ in params]
    saved = [p.detach().clone() for _, p in params]
    steps = []
    try:
        for _ in range(tol.steps):
            rl, rg = _loss_and_grads(reference, params)
            cl, cg = _loss_and_grads(candidate, params)
            step = compare_step(names, rl, rg, cl, cg)
            if base is not None:
                bl, bg = _loss_and_grads(base, params)
                vs = compare_step(names, bl, bg, cl, cg)
                step["vs_base"] = {k: vs[k] for k in ("ref_loss", "loss_rel", "grad_rel_l2_median", "grad_rel_l2_max",
                                                      "worst")}
                step["vs_reference_loss_rel"] = step["loss_rel"]
                step["ref_loss"], step["loss_rel"] = bl, vs["loss_rel"]   # the loss is judged against the base
            steps.append(step)
            with torch.no_grad():
                for (_, p), g in zip(params, rg):
                    p.sub_(torch.sign(g).to(p.dtype), alpha=tol.update)
    finally:
        with torch.no_grad():
            for (_, p), s in zip(params, saved):
                p.copy_(s)
    ok, bad = judge(steps, tol)
    record = {"realization": name, "passed": ok, "failures": bad, "steps": steps,
              "references": {"loss": "base" if base is not None else "reference", "gradients": "reference"},
              "tolerance": {"steps": tol.steps, "loss_rel": tol.loss_rel, "grad_rel_l2_median": tol.grad_rel_l2_median,
                            "grad_rel_l2_max": tol.grad_rel_l2_max, "update": f"sign-SGD {tol.update:g}"}}
    if not ok and raise_on_fail:
        raise RealizationUnavailable(f"realization {name} failed its numerics gate against its reference: {bad[0]}",
                                     "compile with compile.realization = \"fused-lora\" (bf16 base GEMMs)",
                                     gate=record)
    return record
