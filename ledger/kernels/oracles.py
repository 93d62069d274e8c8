"""Float64 oracles: the exact function each kernel must compute, on the exact input values.

Inputs are the numpy dict a spec's ``make_inputs`` returns (bf16 as uint16 bit patterns).
Every oracle returns float64 [M, N]; nothing here rounds, so the oracle is the mathematical
value the kernel approximates (the kernel's only licensed rounding: fp32 accumulation, the
final bf16 store, and for q4b32 the bf16 product (q - 8) * s).
"""

from __future__ import annotations

import numpy as np

from ledger.kernels import formats as F


def linear_bf16(inp: dict) -> np.ndarray:
    w = F.bf16_bits_to_f64(inp["w"])
    x = F.bf16_bits_to_f64(inp["x"])
    return x @ w.T


def lora_linear_bf16(inp: dict) -> np.ndarray:
    x = F.bf16_bits_to_f64(inp["x"])
    a = F.bf16_bits_to_f64(inp["a"])
    b = F.bf16_bits_to_f64(inp["b"])
    return linear_bf16(inp) + float(inp["s"]) * ((x @ a.T) @ b.T)


def linear_int8(inp: dict) -> np.ndarray:
    w = F.dequantize_int8(inp["w"], inp["wscale"])
    return F.bf16_bits_to_f64(inp["x"]) @ w.T


def linear_q4b32(inp: dict) -> np.ndarray:
    w = F.dequantize_q4b32(F.unpack_q4b32(inp["w"]), inp["wscale"])
    return F.bf16_bits_to_f64(inp["x"]) @ w.T


def relative_errors(y, ref) -> tuple[float, float]:
    """(||y - ref||_2 / ||ref||_2, max|y - ref| / max|ref|); inf when y has a NaN/Inf."""
    y = np.asarray(y, dtype=np.float64)
    ref = np.asarray(ref, dtype=np.float64)
    if y.shape != ref.shape:
        raise ValueError(f"shape {y.shape} != oracle shape {ref.shape}")
    if not np.all(np.isfinite(y)):
        return float("inf"), float("inf")
    d = y - ref
    nref = float(np.linalg.norm(ref))
    mref = float(np.abs(ref).max()) if ref.size else 0.0
    rel_l2 = float(np.linalg.norm(d)) / nref if nref > 0 else float(np.linalg.norm(d))
    rel_max = float(np.abs(d).max()) / mref if mref > 0 else float(np.abs(d).max() if d.size else 0.0)
    return rel_l2, rel_max


def linear_q4b32p(inp: dict) -> np.ndarray:
    w = F.dequantize_q4b32(F.unpack_q4b32p(inp["w"]), inp["wscale"])
    return F.bf16_bits_to_f64(inp["x"]) @ w.T
