"""Quantized base linears in torch: ledger's q4b32 and int8 formats (ledger/kernels/formats.py),
for training LoRA on a 4-bit (or 8-bit) base and for serving it.

`quantize_q4b32` / `quantize_int8` are the numpy quantizers of formats.py written in torch (same
rules, computed in float64, so the packed bytes and scales are bit-identical to formats.py's --
tested); they run on the device the weight is on, so a 7B base is quantized layer by layer on
the GPU without ever holding it dense.

`QuantLinear` replaces a frozen `nn.Linear` of the base: it keeps only the packed weight and its
scales (buffers, never parameters: nothing trains them) and its forward is one autograd function,
`y = x Ŵᵀ` with `Ŵ = dequantize(q, s)` formed in the compute dtype for the matmul and dropped at
once. Backward forms `Ŵ` again for `dx = dy Ŵ` instead of keeping it: a dense copy of every
linear held for backward would cost more than the quantized base itself saves. It subclasses
`nn.Linear` (with `weight = None`) so that peft wraps it like any base linear: LoRA on a
quantized base is peft's LoRA on these modules (QLoRA's recipe, with ledger's formats).

Memory (ledger.plan.memory.weight_lines): q4b32 holds K/2 bytes + K/32 bf16 scales per output row
(0.5625 B per weight), int8 K bytes + one fp32 scale per row; the dequantized transient of the
largest linear, twice (backward's Ŵ and its product), is the plan's `dequant` line.
"""

from __future__ import annotations

import torch

from ledger.kernels.formats import Q4_BLOCK

FORMATS = ("q4b32", "int8")
# The seven projections of a Llama decoder layer: every one of them is quantized (the LoRA
# targets and the others alike); embeddings, norms and the LM head stay in the base dtype.
LINEARS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
K_MULTIPLE = {"q4b32": Q4_BLOCK, "int8": 1}
# nibble i of 32-bit word j holds element 8j + ELEMENT_OF_NIBBLE[i] (formats.py's interleave)
_SHIFTS = (0, 16, 4, 20, 8, 24, 12, 28)


# --- formats in torch ---------------------------------------------------------------------------
def quantize_q4b32(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """w [N, K] -> (packed uint8 [N, K/2], scales bf16 [N, K/32]), formats.quantize_q4b32 + pack."""
    n, k = w.shape
    if k % Q4_BLOCK:
        raise ValueError(f"K={k} is not a multiple of {Q4_BLOCK}")
    blocks = w.detach().to(torch.float64).reshape(n, k // Q4_BLOCK, Q4_BLOCK)
    amax = blocks.abs().amax(dim=2)
    scale = torch.where(amax > 0, amax / 7.0, torch.ones_like(amax)).to(torch.float32).to(torch.bfloat16)
    q = (torch.clamp(torch.round(blocks / scale.to(torch.float64)[:, :, None]), -8, 7) + 8).to(torch.int64)
    e = q.reshape(n, k // 8, 8)
    word = torch.zeros((n, k // 8), dtype=torch.int64, device=w.device)
    for i in range(4):
        word |= e[:, :, 2 * i] << (4 * i)
        word |= e[:, :, 2 * i + 1] << (16 + 4 * i)
    # int64 -> int32 keeps the low 32 bits (two's complement); little-endian bytes are the layout
    packed = word.to(torch.int32).contiguous().view(torch.uint8).reshape(n, k // 2)
    return packed, scale


def dequantize_q4b32(packed: torch.Tensor, scale: torch.Tensor, dtype=torch.bfloat16) -> torch.Tensor:
    """packed uint8 [N, K/2] + bf16 scales [N, K/32] -> W [N, K] in `dtype` (one rounding: (q-8)*s)."""
    n, kh = packed.shape
    word = packed.contiguous().view(torch.int32).reshape(n, kh // 4, 1)
    shifts = _shifts(packed.device)
    q = ((word >> shifts) & 0xF).reshape(n, -1, Q4_BLOCK).to(torch.float32) - 8.0
    return (q * scale.to(torch.float32)[:, :, None]).reshape(n, 2 * kh).to(dtype)


_SHIFT_TENSORS: dict = {}


def _shifts(device) -> torch.Tensor:
    """The nibble shifts on `device`, made once: a host-to-device copy is not allowed while a
    CUDA graph is being captured (ledger.image.cuda_decode captures dequantizing steps)."""
    key = str(device)
    if key not in _SHIFT_TENSORS:
        _SHIFT_TENSORS[key] = torch.tensor(_SHIFTS, dtype=torch.int32, device=device)
    return _SHIFT_TENSORS[key]


def quantize_int8(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """w [N, K] -> (q int8 [N, K], scale fp32 [N]), formats.quantize_int8."""
    w64 = w.detach().to(torch.float64)
    amax = w64.abs().amax(dim=1)
    scale = torch.where(amax > 0, amax / 127.0, torch.ones_like(amax)).to(torch.float32)
    q = torch.clamp(torch.round(w64 / scale.to(torch.float64)[:, None]), -127, 127).to(torch.int8)
    return q, scale


def dequantize_int8(q: torch.Tensor, scale: torch.Tensor, dtype=torch.bfloat16) -> torch.Tensor:
    return (q.to(torch.float32) * scale[:, None]).to(dtype)


def quantize(w: torch.Tensor, fmt: str) -> tuple[torch.Tensor, torch.Tensor]:
    return quantize_q4b32(w) if fmt == "q4b32" else quantize_int8(w)


def dequantize(q: torch.Tensor, s: torch.Tensor, fmt: str, dtype) -> torch.Tensor:
    return dequantize_q4b32(q, s, dtype) if fmt == "q4b32" else dequantize_int8(q, s, dtype)


def stored_bytes(n: int, k: int, fmt: str) -> int:
    """Bytes one [n, k] linear takes in `fmt` (weights + scales)."""
    if fmt == "q4b32":
        return n * k // 2 + n * (k // Q4_BLOCK) * 2
    return n * k + n * 4


# --- the module -----------------------------------------------------------------------------------
class _QuantMatmul(torch.autograd.Function):
    """y = x Ŵᵀ; Ŵ formed in forward and again in backward, never saved (see the module docstring)."""

    @staticmethod
    def forward(ctx, x, q, s, fmt, dtype):
        ctx.save_for_backward(q, s)
        ctx.fmt, ctx.dtype, ctx.x_dtype = fmt, dtype, x.dtype
        return x.to(dtype) @ dequantize(q, s, fmt, dtype).t()

    @staticmethod
    def backward(ctx, gy):
        q, s = ctx.saved_tensors
        gx = gy.to(ctx.dtype) @ dequantize(q, s, ctx.fmt, ctx.dtype)
        return gx.to(ctx.x_dtype), None, None, None, None


class QuantLinear(torch.nn.Linear):
    """A frozen base linear held in `fmt` (q4b32 or int8): buffers `qweight`, `scales`; no bias."""

    def __init__(self, in_features: int, out_features: int, fmt: str, qweight: torch.Tensor, scales: torch.Tensor,
                 dtype: torch.dtype):
        torch.nn.Module.__init__(self)     # not nn.Linear's: it would allocate the dense weight
        if fmt not in FORMATS:
            raise ValueError(f"unknown format {fmt!r}; known: {', '.join(FORMATS)}")
        self.in_features, self.out_features, self.fmt, self.compute_dtype = in_features, out_features, fmt, dtype
        self.register_parameter("weight", None)
        self.register_parameter("bias", None)
        self.register_buffer("qweight", qweight)
        self.register_buffer("scales", scales)

    @classmethod
    def from_linear(cls, lin: torch.nn.Linear, fmt: str, dtype: torch.dtype | None = None) -> QuantLinear:
        if lin.bias is not None:
            raise ValueError("QuantLinear has no bias; the base linear has one")
        q, s = quantize(lin.weight, fmt)
        return cls(lin.in_features, lin.out_features, fmt, q, s, dtype or lin.weight.dtype)

    def dense(self, dtype=None) -> torch.Tensor:
        return dequantize(self.qweight, self.scales, self.fmt, dtype or self.compute_dtype)

    def forward(self, x):
        return _QuantMatmul.apply(x, self.qweight, self.scales, self.fmt, self.compute_dtype)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, fmt={self.fmt}"


def quantize_layer_(layer: torch.nn.Module, fmt: str, dtype: torch.dtype) -> int:
    """Replace the seven projections of one decoder layer (in place); how many were replaced."""
    n = 0
    for block in ("self_attn", "mlp"):
        parent = getattr(layer, block)
        for name in LINEARS:
            lin = getattr(parent, name, None)
            if isinstance(lin, torch.nn.Linear) and not isinstance(lin, QuantLinear):
                setattr(parent, name, QuantLinear.from_linear(lin, fmt, dtype))
                n += 1
    return n


def quantize_model_(model, fmt: str) -> int:
    """Quantize every decoder layer of a Llama model (before peft wraps it); returns the count.
    The compute dtype is the base's own (the dequantized weight's dtype)."""
    if fmt not in FORMATS:
        raise ValueError(f"unknown format {fmt!r}; known: {', '.join(FORMATS)}")
    dtype = model.get_input_embeddings().weight.dtype
    return sum(quantize_layer_(layer, fmt, dtype) for layer in model.model.layers)
