"""The `fp8-base` training realization's operator (ledger.train.fused with base_gemm="fp8"): a
LoRA linear whose FROZEN base GEMMs -- the forward y = x W^T and the activation gradient
dx = gy W -- run in float8_e4m3fn on the tensor cores (torch._scaled_mm, rowwise scales), while
everything that trains stays bf16 (t = x A^T, the B term, dA, dB) over fp32 masters.

Why this is sound for LoRA and not for full fine-tuning: the base never takes a weight gradient,
so W is quantized ONCE at setup (`Fp8Weight.of`) and no fp8 copy ever has to follow an update;
the only per-step quantization is of the activations (x rowwise in the forward, gy rowwise in
the backward), which the compiled decoder layer fuses into the pointwise work around it.

Layouts (cuBLASLt's fp8 GEMM takes A row-major and B column-major, "TN" only):

    forward  y [M, N]  = xq [M, K] . q^T         q  [N, K] row-major  -> q.t() is column-major
             scales      sx [M, 1] (per row of x) x sw [1, N] (per output row of W)
    dgrad    dx [M, K] = gq [M, N] . qt^T        qt [K, N] = W^T quantized per row of W^T, i.e.
             scales      sg [M, 1] (per row of gy) x swt [1, K] (per input column of W)

so a projection keeps TWO fp8 copies of its frozen weight (2 B a weight, the bf16 weight's size,
plus 4 B a row and a column for the scales): ledger.plan.memory counts them as `fp8_weights`.

Scales are amax / 448 (e4m3's largest finite value) per row, computed in fp32; a zero row gets
scale 1 (its quantized values are zero either way). Nothing here is approximate in a way the
plan hides: the realization is named `fp8-base` in the plan and the receipt, never selected by
`auto`, refused at compile time on a target below compute capability 9.0 (ledger.plan.compile)
and where it runs when the device is (`fp8_unmet`), and gated numerically against the bf16
fused realization on the run's own first batch before training (ledger.train.numerics).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

E4M3 = torch.float8_e4m3fn
E4M3_MAX = 448.0
FP8_MIN_CC = (9, 0)   # rowwise-scaled fp8 GEMMs measured on Hopper; Ada (8.9) not measured: not claimed


def fp8_unmet(device: torch.device | str) -> str | None:
    """Why fp8 base GEMMs cannot run on `device` (None: they can)."""
    device = torch.device(device)
    if device.type != "cuda":
        return f"the model is on {device.type}, fp8-base runs on CUDA"
    cc = torch.cuda.get_device_capability(device)
    if cc < FP8_MIN_CC:
        return f"compute capability {cc[0]}.{cc[1]} < {FP8_MIN_CC[0]}.{FP8_MIN_CC[1]} (fp8 tensor cores, rowwise scales)"
    if not hasattr(torch, "_scaled_mm"):
        return f"torch {torch.__version__} has no _scaled_mm"
    return None


def quant_rows(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(q, scale) with q = x / scale in e4m3 and scale [rows, 1] fp32 = amax(|row|) / 448.
    Plain torch ops, so inside a compiled layer Inductor fuses them with the op producing x."""
    xf = x.detach().float()
    amax = xf.abs().amax(dim=-1, keepdim=True)
    scale = torch.where(amax > 0, amax / E4M3_MAX, torch.ones_like(amax))
    # row-major whatever x's layout (the fp8 GEMM takes its left operand row-major only)
    q = (xf / scale).clamp(-E4M3_MAX, E4M3_MAX).to(E4M3).contiguous()
    return q, scale


@dataclass(frozen=True)
class Fp8Weight:
    """A frozen [N, K] weight held for fp8 GEMMs: q [N, K] with sw [1, N] (forward) and
    qt [K, N] with swt [1, K] (activation gradient)."""

    q: torch.Tensor
    sw: torch.Tensor
    qt: torch.Tensor
    swt: torch.Tensor

    @classmethod
    def of(cls, w: torch.Tensor) -> Fp8Weight:
        q, sw = quant_rows(w)
        qt, swt = quant_rows(w.t().contiguous())
        return cls(q.contiguous(), sw.reshape(1, -1).contiguous(), qt.contiguous(), swt.reshape(1, -1).contiguous())

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in (self.q, self.sw, self.qt, self.swt))

    @property
    def tensors(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """(q, sw, qt, swt): what a compiled layer takes (a tuple of tensors, not an object)."""
        return self.q, self.sw, self.qt, self.swt

    def dequantized(self) -> torch.Tensor:
        """W as the forward GEMM sees it (fp32)."""
        return dequantize(self.q, self.sw)


def dequantize(q: torch.Tensor, sw: torch.Tensor) -> torch.Tensor:
    """The fp8 [N, K] weight with its [1, N] row scales as fp32: the base the fp8 GEMM computes
    with (the numerics gate's bf16 reference over the same base function)."""
    return q.float() * sw.reshape(-1, 1)


def fp8_bytes(n: int, k: int) -> int:
    """What Fp8Weight.of keeps for an [n, k] weight: two fp8 copies and their fp32 scales."""
    return 2 * n * k + 4 * (n + k)


def scaled_mm(aq, sa, bq_t, sb):
    """aq [M, K] e4m3 row-major, bq_t [K, N] column-major (a transposed row-major [N, K]),
    sa [M, 1], sb [1, N] fp32 -> (aq * sa) @ (bq_t * sb) in bf16, accumulated in fp32."""
    return torch._scaled_mm(aq, bq_t, scale_a=sa, scale_b=sb, out_dtype=torch.bfloat16)


@torch.library.custom_op("ledger::lora_linear_fp8", mutates_args=())
def lora_linear_fp8(x: torch.Tensor, xq: torch.Tensor, sx: torch.Tensor, q: torch.Tensor, sw: torch.Tensor,
                    qt: torch.Tensor, swt: torch.Tensor, a: torch.Tensor,
                    b: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(y, t): y = dequant(xq) dequant(q)^T + (x a^T) b^T for x [M, K] bf16 with (xq, sx) its
    rowwise quantization, the frozen weight's Fp8Weight fields, a [R, K] and b [N, R] bf16 (the
    LoRA scale folded into b). The low-rank term lands in the fp8 GEMM's bf16 output (beta = 1)."""
    t = x @ a.t()
    y = scaled_mm(xq, sx, q.t(), sw)
    y.addmm_(t, b.t())
    return y, t


@lora_linear_fp8.register_fake
def _(x, xq, sx, q, sw, qt, swt, a, b):
    return x.new_empty((x.shape[0], q.shape[0])), x.new_empty((x.shape[0], a.shape[0]))


def _setup(ctx, inputs, output):
    x, _xq, _sx, _q, _sw, qt, swt, a, b = inputs
    ctx.save_for_backward(x, qt, swt, a, b, output[1])   # not xq: the LoRA gradients read x in bf16


def _backward(ctx, gy, gt):
    x, qt, swt, a, b, t = ctx.saved_tensors
    dt = gy @ b
    if gt is not None:
        dt = dt + gt
    dx = None
    if ctx.needs_input_grad[0]:
        # traced into the compiled layer's backward: the rowwise quantization of gy fuses with
        # the pointwise backward that produced it
        gq, sg = quant_rows(gy)
        dx = torch.addmm(scaled_mm(gq, sg, qt.t(), swt), dt, a)
    da = dt.t() @ x
    db = gy.t() @ t
    return dx, None, None, None, None, None, None, da, db


lora_linear_fp8.register_autograd(_backward, setup_context=_setup)


def lora_group_fp8(x: torch.Tensor, w8: tuple, a: torch.Tensor, b: torch.Tensor, in_gemm: bool = False) -> torch.Tensor:
    """One fp8 LoRA linear for a group of projections reading x (ledger.train.fused._group);
    w8 is Fp8Weight.tensors. fp8-base: the opaque op adds the LoRA term into the fp8 GEMM's
    output with a bf16 rank-R GEMM (beta = 1). in_gemm (the bench's "fp8-in-gemm" comparison):
    the LoRA term rides in the fp8 GEMM as R extra columns of K (`_LoraInGemm`) -- no bf16 pass
    over y or dx, but K + R is off the GEMM's 128-wide K tile and the LoRA term is quantized too:
    measured 2.4 % slower a step on the H200 and further from the bf16 gradients."""
    if in_gemm:
        r = a.shape[0]
        pad = (-r) % 16   # the fp8 GEMM's K must be a multiple of 16: zero LoRA columns pad it
        if pad:
            a = torch.cat([a, a.new_zeros((pad, a.shape[1]))], 0)
            b = torch.cat([b, b.new_zeros((b.shape[0], pad))], 1)
        return _LoraInGemm.apply(x, a, b, *w8)
    xq, sx = quant_rows(x)
    return lora_linear_fp8(x, xq, sx, *w8, a, b)[0]


def extend(q: torch.Tensor, s: torch.Tensor, extra: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """[q | extra / (s c)] in e4m3 and c: the fp8 weight with R extra columns quantized with
    q's own row scales s [1, rows]; c >= 1 is the smallest power of two for which no extra value
    exceeds e4m3's range (the activations' extra columns are multiplied by c instead), so nothing
    is clipped whatever the adapter's size."""
    sc = s.reshape(-1, 1)
    ef = extra.float()
    ratio = (ef.abs() / sc).amax()
    c = torch.exp2(torch.ceil(torch.log2((ratio / E4M3_MAX).clamp(min=1.0))))
    e8 = (ef / (sc * c)).clamp(-E4M3_MAX, E4M3_MAX).to(E4M3)
    return torch.cat([q, e8], 1), c


class _LoraInGemm(torch.autograd.Function):
    """y = x W^T + t B^T as ONE fp8 GEMM over K + R: [x | t c] . [W | B / c]^T, t = x A^T in
    bf16; backward dx = gy W + dt A as ONE fp8 GEMM over N + R: [gy | dt c'] . [W^T | A^T / c']^T,
    dt = gy B; dA = dt^T x and dB = gy^T t in bf16 from the bf16 tensors. Plain torch ops, traced
    into the compiled layer: the concatenations and rowwise quantizations fuse into one kernel
    each, and no bf16 pass over y or dx is left for the low-rank terms."""

    @staticmethod
    def forward(ctx, x, a, b, q, sw, qt, swt):
        t = x @ a.t()
        qe, c = extend(q, sw, b)
        xq, sx = quant_rows(torch.cat([x, t * c.to(t.dtype)], 1))
        # fast accumulation in the forward GEMM only (torchao's float8 recipe does the same);
        # the gradient GEMM accumulates with fp32 promotion
        y = torch._scaled_mm(xq, qe.t(), scale_a=sx, scale_b=sw, out_dtype=torch.bfloat16, use_fast_accum=True)
        ctx.save_for_backward(x, t, a, b, qt, swt)
        return y

    @staticmethod
    def backward(ctx, gy):
        x, t, a, b, qt, swt = ctx.saved_tensors
        dt = gy @ b
        dx = None
        if ctx.needs_input_grad[0]:
            qte, c = extend(qt, swt, a.t())
            gq, sg = quant_rows(torch.cat([gy, dt * c.to(dt.dtype)], 1))
            dx = scaled_mm(gq, sg, qte.t(), swt)
        return dx, dt.t() @ x, gy.t() @ t, None, None, None, None


def base_fp8(x: torch.Tensor, w8: tuple) -> torch.Tensor:
    """A group with no adapted module: only the frozen GEMM (no gradient for W; dx in fp8 too)."""
    return _Base8.apply(x, *w8)


class _Base8(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, q, sw, qt, swt):
        xq, sx = quant_rows(x)
        ctx.save_for_backward(qt, swt)
        return scaled_mm(xq, sx, q.t(), sw)

    @staticmethod
    def backward(ctx, gy):
        qt, swt = ctx.saved_tensors
        gq, sg = quant_rows(gy)
        return scaled_mm(gq, sg, qt.t(), swt), None, None, None, None
