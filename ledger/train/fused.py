"""The `fused-lora` training realization: a Llama forward over the same peft model, whose
operators are the named realizations of the plan (ledger.plan.compile.fused_lora_realizations):

  * `linear_lora`: q/k/v and gate/up each ONE `ledger::lora_linear` call (ledger/kernels/train_ops.py):
    stacked base weights (the modules' own weights become views of one buffer: no copy), x @ A^T
    once per group, the B term added into the base GEMM's output; o and down one call each;
  * `attention`: causal SDPA with grouped-query heads handled by the kernel (no repeat of k/v)
    and no mask: rows are right-padded (artefacts/dataset.encode_rows) and positions count from
    0, so a causal kernel gives every labelled position exactly what the masked one gives;
  * `rmsnorm`, `rope`, `mlp_act`: the model's own modules, fused by Inductor (one compiled
    graph per decoder layer, the op opaque inside it);
  * `lm_head` + `cross_entropy`: `linear_cross_entropy`, in row chunks, no [rows, vocab] logits.

The adapter's parameters stay peft's (fp32 masters; a bf16 copy is taken per forward, as
autocast would), so checkpoints, the saved adapter and resume are unchanged. Requirements
(checked by compile, ledger.plan.compile.fused_lora_unmet, and again here): a Llama base
with SiLU MLP and no projection biases, lora.dropout 0, bf16, a CUDA device.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

from ledger.errors import RealizationUnavailable
from ledger.kernels import fp8_ops
from ledger.kernels.train_ops import block_diagonal, linear_cross_entropy, lora_linear

# the frozen base GEMMs' realization: "bf16" (fused-lora) or "fp8" (fp8-base: ledger/kernels/fp8_ops.py,
# the LoRA term added by a bf16 rank-R GEMM into the fp8 GEMM's output). "fp8-in-gemm" carries the
# LoRA term inside the fp8 GEMM instead; measured slower on the H200 (benchmarks/RESULTS.md, session
# 7) and less exact, it is kept for the bench's comparison and is no plan's realization
BASE_GEMMS = ("bf16", "fp8", "fp8-in-gemm")

GROUPS = (("self_attn", ("q_proj", "k_proj", "v_proj")), ("self_attn", ("o_proj",)),
          ("mlp", ("gate_proj", "up_proj")), ("mlp", ("down_proj",)))


def unmet(cfg, lora_dropout: float, dtype) -> str | None:
    """Why this model cannot run the realization (None: it can)."""
    if getattr(cfg, "model_type", None) not in ("llama",):
        return f"the base is {getattr(cfg, 'model_type', None)!r}, the fused forward is Llama's"
    if getattr(cfg, "hidden_act", None) != "silu":
        return f"hidden_act is {cfg.hidden_act!r}, not silu"
    if getattr(cfg, "attention_bias", False) or getattr(cfg, "mlp_bias", False):
        return "the base has projection biases"
    if lora_dropout:
        return f"lora.dropout is {lora_dropout}; the fused linear has no dropout on the LoRA input"
    if dtype != torch.bfloat16:
        return f"the base dtype is {dtype}, the fused realization runs bf16"
    return None


# attention realizations: SDPA restricted to one backend (cuDNN's fused attention ran the
# bench's causal GQA shape 1.50x faster than flash on an H200: benchmarks/RESULTS.md)
ATTENTION = {"cudnn-sdpa": "CUDNN_ATTENTION", "flash-sdpa": "FLASH_ATTENTION"}


def _backend(name: str):
    from torch.nn.attention import SDPBackend, sdpa_kernel  # only where the realization runs

    if not torch.cuda.is_available():  # CPU tests of the same function: the math kernel
        return sdpa_kernel([SDPBackend.MATH])
    return sdpa_kernel([getattr(SDPBackend, ATTENTION[name])])


def _stack(parent, names):
    """The modules' frozen weights stacked into one buffer (the modules keep views of it: no
    copy), and each module's peft LoRA pair (A, B, scale) or None."""
    mods = [getattr(parent, n) for n in names]
    bases = [getattr(m, "base_layer", m) for m in mods]
    ws = [b.weight for b in bases]
    if len(ws) > 1:
        stacked = torch.cat([w.detach() for w in ws], 0)
        at = 0
        for b, w in zip(bases, ws):
            b.weight.data = stacked[at:at + w.shape[0]]
            at += w.shape[0]
    else:
        stacked = ws[0].detach()
    lora = []
    for m in mods:
        if hasattr(m, "lora_A") and "default" in m.lora_A:
            lora.append((m.lora_A["default"].weight, m.lora_B["default"].weight, float(m.scaling["default"])))
        else:
            lora.append(None)
    return stacked, tuple(w.shape[0] for w in ws), tuple(lora)


def _group(x2, w, rows, lora, w8=None, in_gemm=False):
    """One `lora_linear` call for a group of projections that read x2; with w8 (the group's
    Fp8Weight.tensors) the fp8-base one, whose frozen GEMMs read the fp8 copies instead of w."""
    if all(p is None for p in lora):
        return x2 @ w.t() if w8 is None else fp8_ops.base_fp8(x2, w8)
    dt = w.dtype
    a = torch.cat([p[0].to(dt) for p in lora if p is not None], 0)
    b = block_diagonal([(p[1] * p[2]).to(dt) if p is not None else None for p in lora], list(rows))
    if w8 is not None:
        return fp8_ops.lora_group_fp8(x2, w8, a, b, in_gemm)
    return lora_linear(x2, w, a, b)[0]


def _rms(h, weight, eps):
    # transformers' LlamaRMSNorm, operation for operation (fp32 statistics, then the weight)
    hf = h.float()
    hf = hf * torch.rsqrt(hf.pow(2).mean(-1, keepdim=True) + eps)
    return weight * hf.to(h.dtype)


def layer_forward(h, cos, sin, p, shape):
    """One decoder layer as a pure function of its tensors `p` and the static `shape`, so ONE
    compiled graph serves every layer (dynamo traces it once, not once per layer)."""
    B, T, D = h.shape
    eps, head_dim, scaling = shape["eps"], shape["head_dim"], shape["scaling"]
    x = _rms(h, p["ln1"], eps).reshape(B * T, D)
    qkv = _group(x, p["w_qkv"], shape["rows_qkv"], p["lora_qkv"], p.get("w8_qkv"), shape["in_gemm"])
    nq, nk, _ = shape["rows_qkv"]
    q = qkv[:, :nq].view(B, T, -1, head_dim).transpose(1, 2)
    k = qkv[:, nq:nq + nk].view(B, T, -1, head_dim).transpose(1, 2)
    v = qkv[:, nq + nk:].view(B, T, -1, head_dim).transpose(1, 2)
    q, k = apply_rotary_pos_emb(q, k, cos, sin)
    o = F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=scaling, enable_gqa=k.shape[1] != q.shape[1])
    o = o.transpose(1, 2).reshape(B * T, -1)
    h = h + _group(o, p["w_o"], shape["rows_o"], p["lora_o"], p.get("w8_o"), shape["in_gemm"]).view(B, T, D)
    x = _rms(h, p["ln2"], eps).reshape(B * T, D)
    gu = _group(x, p["w_gu"], shape["rows_gu"], p["lora_gu"], p.get("w8_gu"), shape["in_gemm"])
    ni = shape["rows_gu"][0]
    m = F.silu(gu[:, :ni]) * gu[:, ni:]
    return h + _group(m, p["w_d"], shape["rows_d"], p["lora_d"], p.get("w8_d"), shape["in_gemm"]).view(B, T, D)


def layer_tensors(layer, base_gemm: str = "bf16"):
    """(tensors, static shape) of one decoder layer for layer_forward; with base_gemm "fp8" each
    group's stacked frozen weight is also quantized ONCE here (`w8_<group>`, Fp8Weight.tensors)."""
    at, mlp = layer.self_attn, layer.mlp
    p, shape = {"ln1": layer.input_layernorm.weight, "ln2": layer.post_attention_layernorm.weight}, {}
    for key, parent, names in (("qkv", at, GROUPS[0][1]), ("o", at, GROUPS[1][1]), ("gu", mlp, GROUPS[2][1]),
                               ("d", mlp, GROUPS[3][1])):
        w, rows, lora = _stack(parent, names)
        p[f"w_{key}"], p[f"lora_{key}"], shape[f"rows_{key}"] = w, lora, rows
        if base_gemm.startswith("fp8"):
            p[f"w8_{key}"] = fp8_ops.Fp8Weight.of(w).tensors
    shape.update(eps=float(layer.input_layernorm.variance_epsilon), head_dim=int(at.head_dim),
                 scaling=float(at.scaling), in_gemm=base_gemm == "fp8-in-gemm")
    return p, shape


def allow_recompiles(n: int) -> None:
    """Dynamo's recompile limit raised to n and hitting it made an error (never a silent eager
    fallback; see ledger.train.sft.compile_layers)."""
    import torch._dynamo as dynamo  # only where a compiled realization runs

    for name in ("recompile_limit", "cache_size_limit"):
        if hasattr(dynamo.config, name):
            setattr(dynamo.config, name, max(int(getattr(dynamo.config, name)), n))
    if hasattr(dynamo.config, "fail_on_recompile_limit_hit"):
        dynamo.config.fail_on_recompile_limit_hit = True


class FusedLlama:
    """The realization over a peft-wrapped LlamaForCausalLM: `loss(ids, labels)`. `check=False`
    skips the device/dtype requirements (CPU tests of the same function in fp32)."""

    def __init__(self, peft_model, lora_dropout: float, compile_layers: bool = True, check: bool = True,
                 attention: str = "cudnn-sdpa", mode: str | None = None, base_gemm: str = "bf16"):
        lm = peft_model.base_model.model
        if base_gemm not in BASE_GEMMS:
            raise RealizationUnavailable(f"base GEMM realization {base_gemm!r} is not one of {list(BASE_GEMMS)}")
        name = "fp8-base" if base_gemm.startswith("fp8") else "fused-lora"
        dev = lm.model.embed_tokens.weight.device
        why = unmet(lm.config, lora_dropout, lm.model.embed_tokens.weight.dtype) if check else None
        if why is None and check and dev.type != "cuda":
            why = "the model is not on a CUDA device"
        # fp8 is checked even when `check` is off: without fp8 GEMMs there is no fp8-base to test
        if why is None and base_gemm.startswith("fp8") and (check or dev.type == "cuda"):
            why = fp8_ops.fp8_unmet(dev)
        if why:
            raise RealizationUnavailable(f"the plan selected {name}, which cannot run here: {why}",
                                         "compile with compile.realization = \"fused-lora\" or \"torch-compiled\"")
        self.lm = lm
        self.name, self.base_gemm = name, base_gemm
        self.layers = [layer_tensors(layer, base_gemm) for layer in lm.model.layers]
        # the bf16 reference over the same stacked weights (fp8-base's numerics gate): the same
        # tensors without the fp8 copies, so nothing is stacked or held twice
        self.layers_bf16 = [({k: v for k, v in p.items() if not k.startswith("w8_")}, shape)
                            for p, shape in self.layers]
        if attention not in ATTENTION:
            raise RealizationUnavailable(f"attention realization {attention!r} is not one of {sorted(ATTENTION)}")
        self.attention = attention
        if compile_layers:
            allow_recompiles(8)
            self.fn = torch.compile(layer_forward, mode=mode)
        else:
            self.fn = layer_forward

    def loss(self, ids, labels, base_gemm: str | None = None):
        """The mean loss. On an fp8-base instance, for its numerics gate: base_gemm "bf16" runs
        fused-lora's bf16 base GEMMs over the bf16 base, "bf16-dequantized" the same over the
        fp8 base dequantized to bf16 (the same base function, bf16 arithmetic; those weights are
        formed for this call and dropped after its backward), never anything else."""
        if base_gemm not in (None, self.base_gemm) and not (self.name == "fp8-base" and base_gemm in
                                                             ("bf16", "bf16-dequantized")):
            raise RealizationUnavailable(f"this {self.name} forward has no {base_gemm!r} base GEMMs")
        layers = self.layers_bf16 if base_gemm == "bf16" else self.layers
        if base_gemm == "bf16-dequantized":
            layers = [({k: (fp8_ops.dequantize(v[0], v[1]).to(p[k.replace("w8_", "w_")].dtype)
                            if k.startswith("w8_") else v) for k, v in p.items() if not k.startswith("w_")},
                       shape) for p, shape in self.layers]
            layers = [({(k.replace("w8_", "w_") if k.startswith("w8_") else k): v for k, v in p.items()}, shape)
                      for p, shape in layers]
        m = self.lm.model
        h = m.embed_tokens(ids)
        pos = torch.arange(ids.shape[1], device=ids.device)[None]
        cos, sin = m.rotary_emb(h, position_ids=pos)
        # the attention kernel is chosen when the layer is traced (forward and backward); only
        # the named backend is allowed, so a shape it refuses is an error, never another kernel
        with _backend(self.attention):
            for p, shape in layers:
                h = self.fn(h, cos, sin, p, shape)
        h = m.norm(h)
        B, T, D = h.shape
        # next-token targets: position t predicts labels[t + 1] (transformers' causal-LM loss);
        # the last position of each row has none
        ys = torch.cat([labels[:, 1:], labels.new_full((B, 1), -100)], 1).reshape(-1)
        return linear_cross_entropy(h.reshape(B * T, D), self.lm.lm_head.weight, ys)
