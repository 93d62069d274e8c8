"""The fused training operators (ledger/kernels/train_ops.py) and the fused-lora forward
(ledger/train/fused.py) compute the same function and the same gradients as the paths they
replace -- checked on the CPU in float64/float32 on fresh random inputs (never zeros). The GPU
side (bf16, compiled, cuDNN attention) is tests/train/test_fused_gpu.py and the bench."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F

from ledger.kernels.train_ops import IGNORE, block_diagonal, linear_cross_entropy, lora_linear


def _rel(a, b) -> float:
    return float((a - b).norm() / b.norm())


@pytest.mark.parametrize("rows, k, n, r", [(7, 32, 24, 8), (33, 64, 80, 24)])
def test_lora_linear_forward_and_backward_match_autograd_in_float64(rows, k, n, r):
    g = torch.Generator().manual_seed(rows)
    x, w = torch.randn(rows, k, generator=g, dtype=torch.float64), torch.randn(n, k, generator=g, dtype=torch.float64)
    a = torch.randn(r, k, generator=g, dtype=torch.float64, requires_grad=True)
    b = torch.randn(n, r, generator=g, dtype=torch.float64, requires_grad=True)
    x.requires_grad_(True)
    gy = torch.randn(rows, n, generator=g, dtype=torch.float64)
    y, t = lora_linear(x, w, a, b)
    (y * gy).sum().backward()
    got = (y.detach(), t.detach(), x.grad, a.grad, b.grad)
    x2, a2, b2 = (v.detach().clone().requires_grad_(True) for v in (x, a, b))
    y2 = x2 @ w.t() + (x2 @ a2.t()) @ b2.t()
    (y2 * gy).sum().backward()
    want = (y2.detach(), (x2 @ a2.t()).detach(), x2.grad, a2.grad, b2.grad)
    for name, u, v in zip(("y", "t", "dx", "da", "db"), got, want):
        assert _rel(u, v) < 1e-12, name


def test_a_group_of_projections_is_one_call_with_each_b_getting_its_own_block():
    g = torch.Generator().manual_seed(3)
    x = torch.randn(9, 16, generator=g, dtype=torch.float64)
    ws = [torch.randn(n, 16, generator=g, dtype=torch.float64) for n in (16, 8, 8)]
    As = [torch.randn(4, 16, generator=g, dtype=torch.float64, requires_grad=True) for _ in range(2)]
    Bs = [torch.randn(n, 4, generator=g, dtype=torch.float64, requires_grad=True) for n in (16, 8)]
    gy = torch.randn(9, 32, generator=g, dtype=torch.float64)
    # q and k adapted, v not: v is a zero-width block
    y, _ = lora_linear(x, torch.cat(ws), torch.cat(As), block_diagonal([Bs[0], Bs[1], None], [16, 8, 8]))
    (y * gy).sum().backward()
    got = [p.grad.clone() for p in As + Bs]
    for p in As + Bs:
        p.grad = None
    ref = torch.cat([x @ ws[0].t() + x @ As[0].t() @ Bs[0].t(), x @ ws[1].t() + x @ As[1].t() @ Bs[1].t(),
                     x @ ws[2].t()], 1)
    assert _rel(y.detach(), ref.detach()) < 1e-12
    (ref * gy).sum().backward()
    for u, p in zip(got, As + Bs):
        assert _rel(u, p.grad) < 1e-12


@pytest.mark.parametrize("rows, chunk", [(37, 8), (37, 4096), (64, 16)])
def test_linear_cross_entropy_matches_the_materialised_loss_and_gradient(rows, chunk):
    g = torch.Generator().manual_seed(rows + chunk)
    h = torch.randn(rows, 24, generator=g, dtype=torch.float64, requires_grad=True)
    w = torch.randn(50, 24, generator=g, dtype=torch.float64)
    y = torch.randint(0, 50, (rows,), generator=g)
    y[::3] = IGNORE
    loss = linear_cross_entropy(h, w, y, chunk)
    loss.backward()
    h2 = h.detach().clone().requires_grad_(True)
    ref = F.cross_entropy(h2 @ w.t(), y, ignore_index=IGNORE)
    ref.backward()
    assert abs(float(loss) - float(ref)) < 1e-12
    assert _rel(h.grad, h2.grad) < 1e-12
    (2.5 * linear_cross_entropy(h2, w, y, chunk)).backward()   # the upstream gradient scales it
    assert _rel(h2.grad, h.grad * 3.5) < 1e-12


def test_linear_cross_entropy_of_no_labelled_row_is_zero_not_nan():
    h = torch.randn(5, 8, dtype=torch.float64, requires_grad=True)
    loss = linear_cross_entropy(h, torch.randn(11, 8, dtype=torch.float64), torch.full((5,), IGNORE))
    loss.backward()
    assert float(loss) == 0.0 and torch.isfinite(h.grad).all() and float(h.grad.abs().sum()) == 0.0


def _tiny(kv=2, mods=("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")):
    from peft import LoraConfig, get_peft_model
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    cfg = LlamaConfig(hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
                      num_key_value_heads=kv, vocab_size=50, max_position_embeddings=64, initializer_range=0.02,
                      attn_implementation="sdpa")
    base = LlamaForCausalLM(cfg)
    ref = get_peft_model(copy.deepcopy(base), LoraConfig(r=8, lora_alpha=16, target_modules=list(mods)))
    for n, p in ref.named_parameters():
        if "lora_B" in n:   # peft starts B at zero, which would hide every dA
            p.data.normal_(0, 0.05)
    mine = get_peft_model(copy.deepcopy(base), LoraConfig(r=8, lora_alpha=16, target_modules=list(mods)))
    mine.load_state_dict(ref.state_dict())
    return ref, mine


@pytest.mark.parametrize("kv, mods", [(2, None), (4, ("q_proj", "v_proj", "down_proj"))])
def test_the_fused_forward_is_peft_s_function_and_gradients(kv, mods):
    from ledger.train.fused import FusedLlama

    ref, mine = _tiny(kv, mods) if mods else _tiny(kv)
    g = torch.Generator().manual_seed(kv)
    ids = torch.randint(0, 50, (3, 16), generator=g)
    labels = ids.clone()
    labels[:, :4] = IGNORE
    labels[2, 10:] = IGNORE   # a right-padded row: its tail is neither attended to nor scored
    mask = (labels[:, :] != IGNORE) | (torch.arange(16) < 10)
    mask[2, 10:] = False
    want = ref(input_ids=ids, attention_mask=mask.long(), labels=labels).loss
    want.backward()
    f = FusedLlama(mine, 0.0, compile_layers=False, check=False)
    got = f.loss(ids, labels)
    got.backward()
    assert abs(float(got) - float(want)) < 1e-5
    gr = {n: p.grad for n, p in ref.named_parameters() if p.requires_grad}
    gm = {n: p.grad for n, p in mine.named_parameters() if p.requires_grad}
    assert gr.keys() == gm.keys() and gr
    assert max(_rel(gm[n], gr[n]) for n in gr) < 1e-4


def test_the_fused_realization_refuses_what_it_cannot_run():
    from ledger.errors import RealizationUnavailable
    from ledger.train.fused import FusedLlama, unmet

    ref, mine = _tiny()
    with pytest.raises(RealizationUnavailable, match="fused-lora"):   # fp32 on the CPU
        FusedLlama(mine, 0.0)
    cfg = mine.base_model.model.config
    assert "dropout" in unmet(cfg, 0.1, torch.bfloat16)
    assert "bf16" in unmet(cfg, 0.0, torch.float32)
    cfg.hidden_act = "gelu"
    assert "silu" in unmet(cfg, 0.0, torch.bfloat16)
