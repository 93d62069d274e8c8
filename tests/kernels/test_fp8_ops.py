"""The fp8-base operator (ledger/kernels/fp8_ops.py) on the CPU (torch's _scaled_mm has a CPU
implementation): the quantization, the two weight layouts, and that the op computes exactly
the dequantized function it claims (fp8 operands, fp32 accumulation) with the LoRA terms and
their gradients in bf16. Speed and the numerics against bf16 on a real GPU: test_fused_gpu.py."""

from __future__ import annotations

import pytest
import torch

from ledger.kernels import fp8_ops as f


def _rel(a, b) -> float:
    return float((a.float() - b.float()).norm() / b.float().norm())


def test_rowwise_quantization_scales_each_row_to_e4m3_s_range_and_keeps_zero_rows():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(6, 40, generator=g) * torch.tensor([1e-3, 1.0, 30.0, 1e4, 0.0, 2.0])[:, None]
    q, s = f.quant_rows(x.bfloat16())
    assert q.dtype == f.E4M3 and s.shape == (6, 1) and s.dtype == torch.float32
    assert float(s[4]) == 1.0 and float(q[4].float().abs().max()) == 0.0   # a zero row: scale 1, zeros
    amax = q.float().abs().amax(1)
    assert torch.equal(amax[[0, 1, 2, 3, 5]], torch.full((5,), f.E4M3_MAX))   # every row uses the full range
    back = q.float() * s
    for i in (0, 1, 2, 3, 5):   # e4m3: 3 mantissa bits, a relative rounding error <= 2^-4 per value
        assert _rel(back[i], x[i].bfloat16()) < 2 ** -4


def test_a_frozen_weight_is_held_twice_in_the_layouts_the_fp8_gemms_take():
    g = torch.Generator().manual_seed(1)
    w = (torch.randn(48, 32, generator=g) * 0.05).bfloat16()
    w8 = f.Fp8Weight.of(w)
    assert w8.q.shape == (48, 32) and w8.sw.shape == (1, 48) and w8.qt.shape == (32, 48) and w8.swt.shape == (1, 32)
    assert w8.q.is_contiguous() and w8.qt.is_contiguous()
    assert w8.nbytes == f.fp8_bytes(48, 32) == 2 * 48 * 32 + 4 * (48 + 32)
    assert _rel(w8.dequantized(), w) < 2 ** -4
    assert _rel(w8.qt.float() * w8.swt.reshape(-1, 1), w.t()) < 2 ** -4   # per input column of W


@pytest.mark.parametrize("rows, k, n, r", [(16, 64, 48, 8), (40, 128, 96, 16)])
@pytest.mark.parametrize("in_gemm", [True, False])
def test_lora_linear_fp8_is_the_dequantized_function_and_its_lora_gradients_are_bf16s(rows, k, n, r, in_gemm):
    g = torch.Generator().manual_seed(rows)
    x = torch.randn(rows, k, generator=g).bfloat16().requires_grad_(True)
    w = (torch.randn(n, k, generator=g) * 0.05).bfloat16()
    a = (torch.randn(r, k, generator=g) * 0.1).bfloat16().requires_grad_(True)
    b = (torch.randn(n, r, generator=g) * 0.1).bfloat16().requires_grad_(True)
    gy = torch.randn(rows, n, generator=g).bfloat16()
    w8 = f.Fp8Weight.of(w)
    y = f.lora_group_fp8(x, w8.tensors, a, b, in_gemm)
    y.backward(gy)
    # the claimed function, computed in fp64 from the same fp8 operands
    t = x.detach() @ a.detach().t()
    dt = gy @ b.detach()

    def deq(q, s):
        return q.double() * s.double()
    if in_gemm:   # [x | t c] . [W | B / c]^T and [gy | dt c'] . [W^T | A^T / c']^T
        qe, c = f.extend(w8.q, w8.sw, b.detach())
        xq, sx = f.quant_rows(torch.cat([x.detach(), t * c.bfloat16()], 1))
        want_y = deq(xq, sx) @ deq(qe, w8.sw.t()).t()
        qte, c2 = f.extend(w8.qt, w8.swt, a.detach().t())
        gq, sg = f.quant_rows(torch.cat([gy, dt * c2.bfloat16()], 1))
        want_dx = deq(gq, sg) @ deq(qte, w8.swt.t()).t()
    else:          # the LoRA terms exact on top of the fp8 base GEMM
        xq, sx = f.quant_rows(x)
        want_y = deq(xq, sx) @ deq(w8.q, w8.sw.t()).t() + t.double() @ b.detach().double().t()
        gq, sg = f.quant_rows(gy)
        want_dx = deq(gq, sg) @ deq(w8.qt, w8.swt.t()).t() + dt.double() @ a.detach().double()
    assert _rel(y.detach(), want_y) < 1e-2   # bf16 output (and the fast-accumulating forward): rounding only
    assert _rel(x.grad, want_dx) < 1e-2
    assert _rel(a.grad, dt.t() @ x.detach()) < 1e-2 and _rel(b.grad, gy.t() @ t) < 1e-2
    assert a.grad.shape == a.shape and b.grad.shape == b.shape   # the padding to 16 is not the caller's
    # and against full precision: fp8's few percent, no more
    ref = x.detach().double() @ w.double().t() + t.double() @ b.detach().double().t()
    assert _rel(y.detach(), ref) < 0.08
    assert _rel(x.grad, gy.double() @ w.double() + dt.double() @ a.detach().double()) < 0.08


def test_an_adapter_larger_than_the_weight_s_range_is_rescaled_never_clipped():
    g = torch.Generator().manual_seed(7)
    w = (torch.randn(32, 64, generator=g) * 0.01).bfloat16()
    w8 = f.Fp8Weight.of(w)
    big = (torch.randn(32, 16, generator=g) * 50.0).bfloat16()   # |B| >> 448 x W's row scale
    qe, c = f.extend(w8.q, w8.sw, big)
    assert float(c) > 1 and float(c) == 2 ** round(float(torch.log2(c)))
    back = qe[:, 64:].float() * w8.sw.reshape(-1, 1) * c
    assert _rel(back, big) < 2 ** -4 and float(qe[:, 64:].float().abs().max()) <= f.E4M3_MAX
    x = torch.randn(8, 64, generator=g).bfloat16()
    a = (torch.randn(16, 64, generator=g) * 0.1).bfloat16()
    y = f.lora_group_fp8(x, w8.tensors, a, big, in_gemm=True)
    ref = x.double() @ w.double().t() + (x.double() @ a.double().t()) @ big.double().t()
    assert _rel(y, ref) < 0.08


def test_a_group_without_lora_runs_only_the_fp8_gemm_and_passes_its_gradient():
    g = torch.Generator().manual_seed(5)
    x = torch.randn(24, 64, generator=g).bfloat16().requires_grad_(True)
    w = (torch.randn(32, 64, generator=g) * 0.05).bfloat16()
    w8 = f.Fp8Weight.of(w)
    y = f.base_fp8(x, w8.tensors)
    gy = torch.randn(24, 32, generator=g).bfloat16()
    y.backward(gy)
    assert _rel(y.detach(), x.detach().float() @ w.float().t()) < 0.08
    assert _rel(x.grad, gy.float() @ w.float()) < 0.08


def test_fp8_is_refused_off_cuda():
    assert "CUDA" in f.fp8_unmet("cpu")
