"""The static memory plan: every byte a LoRA training step holds at its peak, in named lines.

The peak of a step is during backward of the second and later steps: weights, adapter,
gradients and optimizer state are all allocated, the forward's saved activations are still
held, and backward's transient buffers are live. Each line is an exact integer computed from the
shapes; what the formulas assume about the eager torch realization (which tensors autograd
saves, in which dtype) is written beside each one. benchmarks/bench_memory_plan.py measures how
close the sum comes to the observed peak.

Notation: B micro-batch, T sequence length, H hidden, I intermediate, V vocabulary, L layers,
nh/nkv heads, d head dim, r LoRA rank, e activation bytes (dtype), 4 bytes for fp32 adapter
state (LoRA weights and their optimizer state are kept in fp32 whatever the base dtype).
"""

from __future__ import annotations

from dataclasses import dataclass

from ledger.runners.model import MODULE_SHAPES, Arch

DTYPE_BYTES = {"fp32": 4, "bf16": 2, "fp16": 2}
INDEX_BYTES = 8  # int64 token ids, masks and labels as torch builds them


@dataclass(frozen=True)
class Line:
    name: str
    bytes: int
    formula: str
    scales_with_micro_batch: bool = False

    def to_json(self) -> dict:
        return {"name": self.name, "bytes": self.bytes, "formula": self.formula,
                "per_micro_batch": self.scales_with_micro_batch}


def lines(arch: Arch, *, r: int, modules, dropout: float, dtype: str, micro_batch: int, seq_len: int,
          dataset_rows: int) -> list[Line]:
    a, B, T = arch, micro_batch, seq_len
    e = DTYPE_BYTES[dtype]
    total_params = sum(a.params().values())
    lora = a.lora_params(r, modules)
    n_lora_tensors = 2 * a.layers * len(modules)
    H, I, V, L, nh = a.hidden, a.intermediate, a.vocab, a.layers, a.heads
    q_dim, kv_dim = a.heads * a.head_dim, a.kv_heads * a.head_dim
    BT = B * T

    # Saved for backward, per layer (elements):
    #   2 RMSNorms: input and normalised output (2*B*T*H each) + rsqrt (B*T each)
    #   RoPE: q, k and their rotate_half copies (2*B*T*(q_dim+kv_dim)); v (B*T*kv_dim)
    #   attention: softmax probabilities (B*nh*T*T) kept for both matmuls' backward
    #   o_proj input (B*T*q_dim); MLP: gate, silu(gate), up and their product (4*B*T*I)
    #   LoRA: each adapted module keeps A's output (B*T*r); with dropout also its dropped input
    per_layer = (4 * BT * H + 2 * BT + 2 * BT * (q_dim + kv_dim) + BT * kv_dim + B * nh * T * T
                 + BT * q_dim + 4 * BT * I)
    lora_act = sum(BT * r + (BT * MODULE_SHAPES[m](a)[0] if dropout > 0 else 0) for m in modules)
    act = L * (per_layer + lora_act) * e
    # Final norm (2*B*T*H + B*T), logits and cross-entropy's log-softmax (fp32, B*T*V each).
    head = (2 * BT * H + BT) * e + 2 * BT * V * 4
    # Backward transients: the logits' gradient, and one layer's widest gradient (the
    # attention probabilities' or the MLP's) alive at once.
    work = BT * V * 4 + max(2 * B * nh * T * T, 2 * BT * I) * e
    return [
        Line("weights", total_params * e, f"{total_params} params x {e} B"),
        Line("adapter", lora * 4, f"{lora} LoRA params x 4 B"),
        Line("gradients", lora * 4, f"{lora} LoRA grads x 4 B"),
        Line("optimizer_state", lora * 8 + n_lora_tensors * 4,
             f"AdamW exp_avg + exp_avg_sq: {lora} x 8 B + {n_lora_tensors} step counters x 4 B"),
        Line("data", dataset_rows * T * INDEX_BYTES * 3, f"{dataset_rows} rows x {T} tokens x 3 int64 tensors"),
        Line("activations", act + head, f"saved for backward at micro-batch {B} x {T} tokens ({L} layers + head)", True),
        Line("workspace", work, "backward transients: logits grad + widest per-layer grad", True),
    ]


def total(ls: list[Line]) -> int:
    return sum(x.bytes for x in ls)
