"""Fused training operators of the `fused-lora` realization (ledger.train.fused): torch custom
ops whose forward and backward are a fixed, short sequence of cuBLAS GEMMs, opaque to Inductor.

`lora_linear(x, w, a, b)` -- a LoRA linear with the scale folded into b (W frozen):

    t = x a^T              [rows, R]   computed ONCE and kept for the backward
    y = x w^T ; y += t b^T             the low-rank term lands in the base GEMM's output
                                       (cuBLAS beta = 1: no separate add, no t b^T tensor)
backward (gy):
    dt = gy b ; dx = gy w ; dx += dt a ;  da = dt^T x ;  db = gy^T t

Several projections that read the same input (q, k, v; gate, up) are ONE call: w is their
stacked weights, a their stacked A matrices and b the block diagonal of their B matrices, so x
is read once for all of them and the base GEMM is one wide GEMM instead of three narrow ones.

Without the op, peft's linear under torch.compile writes t b^T, scales it and adds it to the
base output in separate passes, and reads x once per projection (per adapted module, forward
and backward). The op is gated against that path: tests/kernels/test_train_ops.py checks the
same function and gradients on the CPU; the GPU bench (benchmarks/bench_train_gpu_ledger.py)
checks the gradients of a whole model against the autocast + per-layer compile loop, then speed.

`linear_cross_entropy(h, w, labels)` -- the LM head and the mean cross-entropy over the labelled
rows, in chunks of rows, never materialising the [rows, vocab] logits (nor their fp32 copy or
gradient): each chunk's logits are computed, reduced to its loss and its gradient w.r.t. h in
the forward, and dropped. The head's weight is frozen (LoRA never adapts lm_head here).
"""

from __future__ import annotations

import torch

IGNORE = -100
CE_CHUNK_ROWS = 4096


@torch.library.custom_op("ledger::lora_linear", mutates_args=())
def lora_linear(x: torch.Tensor, w: torch.Tensor, a: torch.Tensor, b: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(y, t) for 2-D x [rows, K], w [N, K], a [R, K], b [N, R] (scale folded in), all one dtype."""
    t = x @ a.t()
    y = x @ w.t()
    y.addmm_(t, b.t())
    return y, t


@lora_linear.register_fake
def _(x, w, a, b):
    return x.new_empty((x.shape[0], w.shape[0])), x.new_empty((x.shape[0], a.shape[0]))


def _setup(ctx, inputs, output):
    x, w, a, b = inputs
    ctx.save_for_backward(x, w, a, b, output[1])


def _backward(ctx, gy, gt):
    x, w, a, b, t = ctx.saved_tensors
    dt = gy @ b
    if gt is not None:  # t is an output only for the backward; nothing downstream uses it
        dt = dt + gt
    dx = None
    if ctx.needs_input_grad[0]:   # the first layer's input is the frozen embedding's: no dx
        dx = gy @ w
        dx.addmm_(dt, a)
    da = dt.t() @ x
    db = gy.t() @ t
    return dx, None, da, db   # w is the frozen base weight


lora_linear.register_autograd(_backward, setup_context=_setup)


def block_diagonal(bs: list[torch.Tensor], rows: list[int]) -> torch.Tensor:
    """The [sum rows, sum R] block diagonal of per-module B matrices (a module without LoRA is a
    zero-width block of its rows); differentiable, so each B gets exactly its own block's grad."""
    dtype = next((b.dtype for b in bs if b is not None), torch.bfloat16)
    device = next((b.device for b in bs if b is not None), None)
    parts = [b if b is not None else torch.zeros((n, 0), dtype=dtype, device=device) for b, n in zip(bs, rows)]
    return torch.block_diag(*parts)


class _LinearCE(torch.autograd.Function):
    @staticmethod
    def forward(ctx, h, w, labels, chunk):
        rows = h.shape[0]
        acc = torch.promote_types(h.dtype, torch.float32)   # bf16 logits are reduced in fp32
        n = (labels != IGNORE).sum()
        total = torch.zeros((), dtype=acc, device=h.device)
        dh = torch.empty_like(h) if h.requires_grad else None
        inv = 1.0 / n.clamp(min=1).to(acc)
        for s in range(0, rows, chunk):
            hc, yc = h[s:s + chunk], labels[s:s + chunk]
            logits = (hc @ w.t()).to(acc)
            lse = torch.logsumexp(logits, dim=-1)
            vc = yc != IGNORE
            safe = torch.where(vc, yc, 0)
            picked = logits.gather(1, safe[:, None])[:, 0]
            total += torch.where(vc, lse - picked, 0.0).sum()
            if dh is not None:
                g = torch.softmax(logits, dim=-1)
                g.scatter_add_(1, safe[:, None], torch.full_like(picked[:, None], -1.0))
                g *= (vc.to(acc) * inv)[:, None]
                dh[s:s + chunk] = (g.to(h.dtype) @ w)
        ctx.save_for_backward(dh)
        return total * inv

    @staticmethod
    def backward(ctx, gout):
        (dh,) = ctx.saved_tensors
        return dh * gout.to(dh.dtype), None, None, None


def linear_cross_entropy(h: torch.Tensor, w: torch.Tensor, labels: torch.Tensor, chunk: int = CE_CHUNK_ROWS):
    """Mean cross-entropy of softmax(h w^T) against labels over rows whose label is not IGNORE;
    h [rows, d], w [vocab, d] frozen, labels [rows] int64."""
    return _LinearCE.apply(h, w, labels, chunk)
