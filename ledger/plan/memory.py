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

from ledger.artefacts.model import MODULE_SHAPES, Arch

DTYPE_BYTES = {"fp32": 4, "bf16": 2, "fp16": 2}
INDEX_BYTES = 8  # int64 token ids, masks and labels as torch builds them
BASE_QUANTS = ("none", "q4b32", "int8")
Q4_BLOCK = 32    # ledger.kernels.formats.Q4_BLOCK (plan/ imports no torch and no kernels)


def quantized_linear_bytes(n: int, k: int, fmt: str) -> int:
    """Bytes of one frozen [n, k] base linear held in `fmt` (ledger.kernels.qlinear.QuantLinear):
    q4b32 packs two weights a byte plus one bf16 scale per 32; int8 one byte plus an fp32 scale a row."""
    if fmt == "q4b32":
        return n * k // 2 + n * (k // Q4_BLOCK) * 2
    if fmt == "int8":
        return n * k + n * 4
    raise ValueError(f"unknown base format {fmt!r}")


def weight_lines(arch: Arch, e: int, base_quant: str) -> list[Line]:
    """The base's weights: dense in the dtype, or -- for a quantized base -- the seven projections
    of every layer in their format (embeddings, norms and LM head stay dense), plus the dequantized
    transient: the largest projection formed in the compute dtype, twice (forward's or backward's
    Ŵ and a second one while the first is released; ledger.kernels.qlinear)."""
    total_params = sum(arch.params().values())
    if base_quant == "none":
        return [Line("weights", total_params * e, f"{total_params} params x {e} B")]
    shapes = [MODULE_SHAPES[m](arch) for m in MODULE_SHAPES]
    linear_params = arch.layers * sum(i * o for i, o in shapes)
    q = arch.layers * sum(quantized_linear_bytes(o, i, base_quant) for i, o in shapes)
    dense = total_params - linear_params
    largest = max(i * o for i, o in shapes)
    return [Line("weights", dense * e + q, f"{linear_params} projection params in {base_quant} ({q} B) + "
                                             f"{dense} other params x {e} B"),
            Line("dequant", 2 * largest * e, f"2 x the largest projection ({largest} weights) dequantized to {e} B")]


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
          dataset_rows: int, base_quant: str = "none", padded: bool = True, device: str = "cpu") -> list[Line]:
    a, B, T = arch, micro_batch, seq_len
    e = DTYPE_BYTES[dtype]
    lora = a.lora_params(r, modules)
    n_lora_tensors = 2 * a.layers * len(modules)
    H, I, V, L, nh = a.hidden, a.intermediate, a.vocab, a.layers, a.heads  # noqa: E741 - the docstring's notation
    q_dim = a.heads * a.head_dim
    BT = B * T

    mods = set(modules)
    # Saved for backward, per layer (elements), as autograd holds them for torch-eager with
    # SDPA attention (checked tensor by tensor with saved_tensors_hooks; see docs/compile-train.md):
    #   both RMSNorm inputs (2*B*T*H) and their rsqrt (2*B*T)
    #   the normalised inputs LoRA A needs: attention's if q/k/v are adapted, the MLP's if gate/up are
    #   SDPA: q, k and v (k, v expanded to nh heads) and the output, which o_proj reads as a view
    #   (4*B*T*nh*d), its log-sum-exp (B*nh*T) and the expanded additive mask (B*T*T)
    #   MLP: gate, silu(gate), up (3*B*T*I), and their product if down_proj is adapted
    #   LoRA: each adapted module keeps A's output (B*T*r); with dropout also its dropped input
    per_layer = (2 * BT * H + 2 * BT
                 + BT * H * (bool(mods & {"q_proj", "k_proj", "v_proj"}) + bool(mods & {"gate_proj", "up_proj"}))
                 + 4 * BT * q_dim + B * nh * T + B * T * T
                 + 3 * BT * I + (BT * I if "down_proj" in mods else 0))
    lora_act = sum(BT * r + (BT * MODULE_SHAPES[m](a)[0] if dropout > 0 else 0) for m in modules)
    act = L * (per_layer + lora_act) * e
    if e < 4:
        act = L * BT * _half_precision_eager_per_token(a, mods, r, dropout, e, padded, T, device)
    # Head: cross-entropy's log-softmax in fp32 (B*T*V*4) and the int64 labels; the lm_head is
    # frozen and not adapted, so its input is not kept.
    head = BT * V * 4 + BT * INDEX_BYTES
    if e < 4:   # and the final norm's fp32 input and rstd (see _half_precision_eager_per_token)
        head += BT * (4 * H + 4)
    # Transients on top of the saved set: at the start of backward the log-softmax gradient and
    # the logits gradient (fp32, 2*B*T*V*4); then one MLP's gradients (2*B*T*I) while the
    # earlier layers' activations are still held.
    work = 2 * BT * V * 4 + 2 * BT * I * e
    return [
        *weight_lines(a, e, base_quant),
        Line("adapter", lora * 4, f"{lora} LoRA params x 4 B"),
        Line("gradients", lora * 4, f"{lora} LoRA grads x 4 B"),
        Line("optimizer_state", lora * 8 + n_lora_tensors * 4,
             f"AdamW exp_avg + exp_avg_sq: {lora} x 8 B + {n_lora_tensors} step counters x 4 B"),
        Line("data", dataset_rows * T * INDEX_BYTES * 3, f"{dataset_rows} rows x {T} tokens x 3 int64 tensors"),
        Line("activations", act + head, f"saved for backward at micro-batch {B} x {T} tokens ({L} layers + head)",
             True),
        Line("workspace", work, "backward transients: log-softmax and logits grads + one MLP's grads", True),
    ]


def _half_precision_eager_per_token(a: Arch, mods: set, r: int, dropout: float, e: int, padded: bool,
                                    seq_len: int, device: str) -> int:
    """Bytes torch-eager autograd keeps per token and decoder layer for a bf16/fp16 base, the fp32
    LoRA masters on it (counted storage by storage with saved_tensors_hooks:
    tests/plan/test_compile.py::test_activation_line_matches_what_autograd_saves[bf16...]):

      RMSNorm (x2)   transformers upcasts its input: the fp32 copy (4H) and the fp32 rstd (4)
      LoRA inputs    peft casts each adapted module's input to the adapter's fp32 (`x.to(A.dtype)`):
                     a copy PER MODULE (4 in_features), none shared; with dropout the dropped
                     fp32 input and what dropout keeps for backward: on CUDA its bool mask (1),
                     on the CPU its fp32 noise tensor (4)
      LoRA A out     fp32 (4r per adapted module)
      attention      q and the output (e each), k and v at the kv heads when no batch is padded
                     (transformers drops an all-ones mask and SDPA meets grouped-query heads
                     itself), else expanded to nh heads with the float mask (e T); the
                     log-sum-exp in fp32 (4 nh)
      MLP            gate, silu(gate), up (3 I e); the product is not kept (down's base is frozen,
                     its LoRA keeps its own fp32 copy)
    The fp32 formula above stays: there `x.to(fp32)` is the input itself, shared by q/k/v and gate/up."""
    H, I, nh = a.hidden, a.intermediate, a.heads  # noqa: E741 - the docstring's notation
    q_dim, kv_dim = a.heads * a.head_dim, a.kv_heads * a.head_dim
    norms = 2 * (4 * H + 4)
    keep = 4 + (1 if device == "cuda" else 4) if dropout > 0 else 4
    lora_in = sum(MODULE_SHAPES[m](a)[0] * keep for m in mods)
    lora_out = 4 * r * len(mods)
    attn = e * (2 * q_dim + (2 * q_dim + seq_len if padded else 2 * kv_dim)) + 4 * nh
    mlp = 3 * I * e
    return norms + lora_in + lora_out + attn + mlp


# cuBLAS workspaces on CUDA: torch's default on Hopper (a CUDA child gets no CUBLAS_WORKSPACE_CONFIG,
# ledger/train/run.py) and the CPU plans' :4096:8 both come to 32 MiB, taken from torch's caching
# allocator on first use.
CUBLAS_WORKSPACE = 8 * 4096 * 1024


def lines_compiled(arch: Arch, *, r: int, modules, dropout: float, dtype: str, micro_batch: int, seq_len: int,
                   padded: bool = True, devices: int = 1, base_quant: str = "none",
                   ce_chunk: int | None = None, fp8_base: bool = False) -> list[Line]:
    """The memory plan of the `torch-compiled` CUDA realization (ledger.train.child): each decoder
    layer compiled with torch.compile, bf16 autocast when the base is bf16, fused AdamW, the
    encoded dataset kept on the host and one micro-batch at a time moved to the device.

    Per device (DDP replicates everything but the data). The compiled layers keep far less than
    eager autograd: the partitioner saves each matmul's and attention's inputs and recomputes
    the pointwise work in between (norms, RoPE, SiLU*up, casts). What the formulas assume it
    saves is written beside each term; benchmarks/bench_train_gpu_ledger.py measures the sum
    against torch.cuda.max_memory_allocated.

    `ce_chunk` (the fused-lora realization, ledger.train.fused): no attention mask (causal on
    right-padded rows), and the loss in chunks of `ce_chunk` rows (chunked-linear-ce): no
    [rows, vocab] logits are kept, only h's gradient, and one chunk's fp32 logits, their softmax
    and its bf16 copy are live at a time. Measured on an H200 with SmolLM2 (vocab 49,152): the
    plan without this overestimated the fused loop by 62 % (benchmarks/RESULTS.md).

    `fp8_base` (the fp8-base realization, ledger.kernels.fp8_ops): every projection's frozen
    weight is also held as two float8_e4m3fn copies (W and W^T) with fp32 scales per row and
    column (`fp8_weights`), beside the bf16 weights the model keeps; what autograd saves is the
    same as fused-lora's (the bf16 inputs LoRA's gradients read, not their fp8 copies); the
    per-step fp8 activations are transients of one GEMM (the largest: the gate/up output
    gradient's, B*T x 2I bytes and its row scales) and go into the workspace line.
    """
    a, B, T = arch, micro_batch, seq_len
    e = DTYPE_BYTES[dtype]
    lora = a.lora_params(r, modules)
    n_lora_tensors = 2 * a.layers * len(modules)
    H, I, V, L, nh = a.hidden, a.intermediate, a.vocab, a.layers, a.heads  # noqa: E741 - the docstring's notation
    q_dim = a.heads * a.head_dim
    BT = B * T
    mods = set(modules)
    # Saved per token per layer (elements of e bytes unless noted):
    #   the layer input and the mid-layer residual, for the two RMSNorm backwards (2H) + rstd (2 x 4 B)
    #   the normalised inputs LoRA A reads: attention's if q/k/v are adapted, the MLP's if gate/up are
    #   SDPA's q, and k and v EXPANDED to all nh heads (torch's SDPA meets grouped-query attention
    #   by repeating k and v before the kernel, and the kernel's backward keeps what it was given:
    #   measured on an H200, benchmarks/RESULTS.md), its output (which o_proj reads) and its
    #   log-sum-exp (nh x 4 B)
    #   gate and up (SiLU*up's backward), and their product if down_proj is adapted (LoRA A's input)
    #   each adapted module's A output (r)
    per_token = (e * (2 * H + H * (bool(mods & {"q_proj", "k_proj", "v_proj"}) + bool(mods & {"gate_proj", "up_proj"}))
                      + 2 * q_dim + 2 * q_dim + 2 * I + (I if "down_proj" in mods else 0) + r * len(mods))
                 + 4 * nh + 2 * 4)
    # A padded batch carries an explicit mask: built once per forward (bool B x T x T) and kept by
    # every layer's memory-efficient attention as a bias (B x T x T in e bytes).
    mask = (B * T * T + L * B * T * T * e) if padded and ce_chunk is None else 0
    # Head (eager, under autocast): the final norm's input (H, e) and rstd, the fp32 log-softmax the
    # loss keeps (V x 4 B) and the int64 labels.
    head = BT * (H * e + 4 + V * 4 + INDEX_BYTES)
    if ce_chunk is not None:   # h's gradient (e) instead of the log-softmax
        head = BT * (2 * H * e + 4 + INDEX_BYTES)
    act = L * BT * per_token + mask + head
    # Backward transients on top of the saved set: at its start the log-softmax and logits
    # gradients (2 x V x 4 B per token); later one compiled layer's backward (the MLP's gradients
    # and its recomputed product, 3I + 2H). Whichever is larger, plus cuBLAS's workspaces.
    logits = 2 * BT * V * 4 if ce_chunk is None else min(ce_chunk, BT) * V * (4 + 4 + e)
    work = max(logits, BT * (3 * I + 2 * H) * e) + CUBLAS_WORKSPACE
    fp8 = []
    if fp8_base:
        shapes = [MODULE_SHAPES[m](a) for m in MODULE_SHAPES]
        n8 = L * sum(2 * i * o + 4 * (i + o) for i, o in shapes)
        fp8 = [Line("fp8_weights", n8, f"{L} layers x 7 projections: W and W^T in float8_e4m3fn (1 B a weight "
                                       f"each) + fp32 scales a row and a column")]
        work += BT * (2 * I + 4)   # the gate/up output gradient's fp8 copy and its row scales (backward)
        # the numerics gate's reference (ledger.train.numerics): the fp8 base dequantized to the
        # dtype, alive through one forward and backward at setup, with that step's activations
        fp8.append(Line("numerics_gate", L * sum(i * o for i, o in shapes) * e,
                        "at setup only: the fp8 projections dequantized for the gate's reference step", True))
    return [
        *weight_lines(a, e, base_quant),
        *fp8,
        Line("adapter", lora * 4, f"{lora} LoRA params x 4 B"),
        Line("gradients", lora * 4, f"{lora} LoRA grads x 4 B" + (" (DDP bucket views)" if devices > 1 else "")),
        Line("optimizer_state", lora * 8 + n_lora_tensors * 4,
             f"AdamW exp_avg + exp_avg_sq: {lora} x 8 B + {n_lora_tensors} step counters x 4 B"),
        Line("data", BT * INDEX_BYTES * 3, f"one micro-batch on the device: {B} x {T} tokens x 3 int64 tensors", True),
        Line("activations", act, f"saved for backward by the compiled layers at micro-batch {B} x {T} tokens "
                                 f"({L} layers + head{' + padding mask' if padded else ''})", True),
        Line("workspace", work, "backward transients: logits grads or one compiled layer's grads + cuBLAS workspace",
             True),
    ]


def total(ls: list[Line]) -> int:
    return sum(x.bytes for x in ls)
