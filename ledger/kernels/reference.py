"""Torch reference realizations: what a user gets without ledger's kernels.

Each function takes torch tensors (bf16 as torch.bfloat16, on any device) and returns y [M, N]
in bf16. They are the gate's baselines and the bench's side-by-side figures, so they are
written the way plain PyTorch code is written: F.linear, eager LoRA, dequantize-then-F.linear.
"""

from __future__ import annotations

import inspect


def linear_bf16(x, w, **_):
    import torch.nn.functional as Fn

    return Fn.linear(x, w)


def lora_linear_bf16(x, w, a, b, s, **_):
    # peft's eager path: base(x) + lora_B(lora_A(dropout(x))) * scaling
    import torch.nn.functional as Fn

    return Fn.linear(x, w) + Fn.linear(Fn.linear(x, a), b) * s


def dequant_int8(w, wscale):
    import torch

    return (w.to(torch.float32) * wscale[:, None]).to(torch.bfloat16)


def linear_int8(x, w, wscale, **_):
    import torch.nn.functional as Fn

    return Fn.linear(x, dequant_int8(w, wscale))


def dequant_q4b32(w, wscale):
    """packed uint8 [N, K/2] + bf16 scales [N, K/32] -> bf16 [N, K] (layout: ledger.kernels.formats)."""
    import torch

    n, kh = w.shape
    word = w.contiguous().view(torch.int32).reshape(n, kh // 4, 1)
    shifts = torch.tensor([0, 16, 4, 20, 8, 24, 12, 28], dtype=torch.int32, device=w.device)
    q = (word >> shifts) & 0xF                            # [N, K/8, 8] in element order
    q = q.reshape(n, -1, 32).to(torch.float32) - 8.0      # [N, K/32, 32]
    return (q * wscale.to(torch.float32)[:, :, None]).reshape(n, 2 * kh).to(torch.bfloat16)


def linear_q4b32(x, w, wscale, **_):
    import torch.nn.functional as Fn

    return Fn.linear(x, dequant_q4b32(w, wscale))


def dequant_q4b32p(w, wscale):
    """q4b32p (ledger.kernels.formats: each 128-chunk of a row pre-permuted) -> bf16 [N, K]."""
    import torch

    n, kh = w.shape
    word = w.contiguous().view(torch.int32).reshape(n, kh // 4, 1)
    shifts = torch.tensor([0, 16, 4, 20, 8, 24, 12, 28], dtype=torch.int32, device=w.device)
    stored = ((word >> shifts) & 0xF).reshape(n, -1, 128)              # [N, K/128, 128] stored order
    s = torch.arange(128, device=w.device)
    logical = 32 * ((s % 32) // 8) + 16 * (((s % 32) // 4) % 2) + 4 * (s // 32) + s % 4
    q = torch.empty_like(stored)
    q[:, :, logical] = stored                                            # logical order
    q = q.reshape(n, -1, 32).to(torch.float32) - 8.0
    return (q * wscale.to(torch.float32)[:, :, None]).reshape(n, 2 * kh).to(torch.bfloat16)


def linear_q4b32p(x, w, wscale, **_):
    import torch.nn.functional as Fn

    return Fn.linear(x, dequant_q4b32p(w, wscale))


def get(name: str):
    return globals()[name]


def description(name: str) -> dict:
    """What a baseline's code-object id is the hash of: the realization's own source plus the
    torch build that executes it (cuBLAS and torch's kernels come with that build)."""
    fn = get(name)
    src = inspect.getsource(fn)
    helpers = [h for h in ("dequant_int8", "dequant_q4b32", "dequant_q4b32p") if f"{h}(" in src]
    try:
        import torch

        torch_v, cuda_v = torch.__version__, str(torch.version.cuda)
    except ImportError:  # pragma: no cover - torch is a base dependency
        torch_v, cuda_v = "absent", "absent"
    return {"realization": f"torch-eager:{name}", "source": src,
            "helpers": {h: inspect.getsource(get(h)) for h in helpers},
            "torch": torch_v, "torch_cuda": cuda_v}
