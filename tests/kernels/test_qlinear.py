"""Quantized base linears (ledger.kernels.qlinear) on the CPU: the torch quantizers are
formats.py's bit for bit, the module's forward and backward are the dequantized matmul's, peft
wraps it, and the memory plan's bytes are the module's own."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from ledger.kernels import formats, qlinear


@pytest.mark.parametrize("shape", [(5, 64), (48, 160), (7, 32)])
def test_torch_q4b32_is_formats_bit_for_bit(shape):
    g = torch.Generator().manual_seed(1)
    w = torch.randn(shape, generator=g, dtype=torch.float32) * 0.05
    w[0, :32] = 0.0                                   # an all-zero block: scale 1.0, q = 8
    packed, scale = qlinear.quantize_q4b32(w)
    q_np, s_np = formats.quantize_q4b32(w.numpy())
    assert np.array_equal(packed.numpy(), formats.pack_q4b32(q_np))
    assert np.array_equal(scale.view(torch.int16).numpy().view(np.uint16), s_np)
    deq = qlinear.dequantize_q4b32(packed, scale, torch.float32).numpy()
    assert np.array_equal(deq, formats.dequantize_q4b32(q_np, s_np).astype(np.float32))


def test_torch_int8_is_formats_bit_for_bit():
    w = torch.randn(33, 70, generator=torch.Generator().manual_seed(2)) * 0.1
    q, s = qlinear.quantize_int8(w)
    q_np, s_np = formats.quantize_int8(w.numpy())
    assert np.array_equal(q.numpy(), q_np) and np.array_equal(s.numpy(), s_np)


@pytest.mark.parametrize("fmt", qlinear.FORMATS)
def test_forward_and_backward_are_the_dequantized_matmul(fmt):
    lin = torch.nn.Linear(64, 24, bias=False)
    ql = qlinear.QuantLinear.from_linear(lin, fmt)
    assert ql.weight is None and not list(ql.parameters())          # nothing of the base trains
    x = torch.randn(3, 5, 64, requires_grad=True)
    y = ql(x)
    w = ql.dense(torch.float32)
    assert torch.equal(y, x @ w.t())
    gy = torch.randn_like(y)
    y.backward(gy)
    assert torch.allclose(x.grad, gy @ w, atol=1e-6)
    assert (w - lin.weight).abs().max() <= (lin.weight.abs().max() / (7 if fmt == "q4b32" else 127))


def test_the_dequantized_weight_is_not_kept_for_backward():
    ql = qlinear.QuantLinear.from_linear(torch.nn.Linear(64, 32, bias=False), "q4b32")
    saved = []
    with torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(t) or t, lambda t: t):
        ql(torch.randn(2, 64, requires_grad=True)).sum().backward()
    assert {t.dtype for t in saved} == {torch.uint8, torch.bfloat16}     # packed weight and scales only
    assert all(t.numel() <= 32 * 32 for t in saved)


def _tiny_llama(intermediate=96):
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(vocab_size=100, hidden_size=64, intermediate_size=intermediate, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=32)
    torch.manual_seed(0)
    return LlamaForCausalLM(cfg)


def test_peft_trains_lora_on_a_quantized_base_and_the_plan_counts_its_bytes():
    from peft import LoraConfig, get_peft_model

    from ledger.artefacts.model import arch_of
    from ledger.plan import memory

    m = _tiny_llama()
    assert qlinear.quantize_model_(m, "q4b32") == 14
    arch = arch_of(m.config.to_dict())
    held = sum(b.numel() * b.element_size() for b in m.buffers() if b.dtype in (torch.uint8, torch.bfloat16))
    dense = sum(p.numel() * p.element_size() for p in m.parameters())
    line = memory.weight_lines(arch, 4, "q4b32")[0]
    assert line.name == "weights" and line.bytes == held + dense
    pm = get_peft_model(m, LoraConfig(r=8, lora_alpha=16, target_modules=list(qlinear.LINEARS), task_type="CAUSAL_LM"))
    trainable = [p for p in pm.parameters() if p.requires_grad]
    assert len(trainable) == 2 * 14
    ids = torch.randint(0, 100, (2, 12))
    opt = torch.optim.AdamW(trainable, lr=1e-2)
    losses = []
    for _ in range(15):
        loss = pm(input_ids=ids, labels=ids).loss
        loss.backward()
        opt.step()
        opt.zero_grad()
        losses.append(float(loss.detach()))
    assert losses[-1] < losses[0] - 0.5


def test_int8_bytes_match_the_plan():
    from ledger.artefacts.model import arch_of
    from ledger.plan import memory

    m = _tiny_llama(intermediate=88)
    qlinear.quantize_model_(m, "int8")
    arch = arch_of(m.config.to_dict())
    held = sum(b.numel() * b.element_size() for b in m.buffers() if b.dtype in (torch.int8, torch.float32))
    held -= sum(b.numel() * b.element_size() for n, b in m.named_buffers() if "rotary" in n)
    dense = sum(p.numel() * p.element_size() for p in m.parameters())
    assert memory.weight_lines(arch, 4, "int8")[0].bytes == held + dense
