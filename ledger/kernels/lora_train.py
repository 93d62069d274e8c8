"""cupy-fused as a training realization: peft LoRA linears whose forward is ONE launch of the
gated `lora-linear-bf16` kernel (y = W x + s * B (A x), t = A x kept in fp32 inside) and whose
backward is torch.

It is decode-shaped: at most 8 rows of x per call (the kernel's mma n-side). Compile selects
it only when micro_batch x seq_len <= 8 (ledger.plan.compile.fused_unmet); a call with more
rows here raises RealizationUnavailable -- it never quietly runs torch's path instead. For
training at batch x sequence rows torch's GEMM is the right realization (torch-compiled).

Gradients (y = x W^T + s (x A^T) B^T; W frozen):
    dx = gy W + s (gy B) A        dA = s (gy B)^T x        dB = s gy^T (x A^T)
computed in torch from bf16 operands; dA and dB are accumulated in fp32 (the adapter's master
weights are fp32, see ledger.plan.memory).
"""

from __future__ import annotations

import json
import types
from pathlib import Path

from ledger.errors import BadInput, RealizationUnavailable
from ledger.kernels.records import BuildRecord

KERNEL = "lora-linear-bf16"


def load_build(folder):
    """The BuildRecord the plan names, from the files train.prepare materialised (body.json,
    source, ptx, cubin), checked against its id."""


    folder = Path(folder)
    body = json.loads((folder / "body.json").read_text())
    rec = BuildRecord(kernel=body["kernel"], arch=body["arch"], source=(folder / "source").read_text(encoding="utf-8"),
                      source_file=body["source_file"], options=tuple(body["options"]),
                      ptx_options=tuple(body["ptx_options"]), nvrtc_version=body["nvrtc_version"],
                      entry_points=dict(body["entry_points"]), ptx=(folder / "ptx").read_bytes(),
                      cubin=(folder / "cubin").read_bytes(), log=body.get("log", ""))
    return rec


class KernelOp:
    """Calls the loaded cubin on torch tensors (zero-copy through DLPack), on torch's stream."""

    def __init__(self, build):
        from ledger.kernels import runtime
        from ledger.kernels import specs as S

        if build.kernel != KERNEL:
            raise BadInput(f"build is of {build.kernel}, not {KERNEL}")
        info = runtime.device_info()
        if build.arch != f"sm_{info['cc'][0]}{info['cc'][1]}":
            raise RealizationUnavailable(f"the plan's kernel build is for {build.arch}; this device is {info['name']}",
                                         "compile the plan for this device's target")
        self.runtime, self.S = runtime, S
        self.spec = S.get(KERNEL)
        self.module = runtime.load(build)
        self.code_object = build.code_object
        self.calls = 0
        self._ops: dict = {}

    def __call__(self, x, w, a, b, s: float):
        import torch

        cp = self.runtime.cupy()
        m, k = x.shape
        n, r = w.shape[0], a.shape[0]
        shape = self.S.Shape(m, n, k, r)
        self.spec.requirements.check_shape(KERNEL, shape)   # M <= 8, K multiple, rank: loud if not

        def view(t):
            return cp.from_dlpack(t.contiguous().view(torch.int16)).view(cp.uint16)

        with cp.cuda.ExternalStream(torch.cuda.current_stream().cuda_stream):
            dev = {"x": view(x), "w": view(w), "a": view(a), "b": view(b), "s": float(s)}
            key = (m, n, k, r, w.data_ptr())
            op = self._ops.get(key)
            if op is None:
                op = self._ops[key] = self.runtime.DecodeLinear(self.module, self.spec, shape, dev)
            op.dev = dev
            y = op()
            out = torch.from_dlpack(y.view(cp.int16)).view(torch.bfloat16).clone()
        self.calls += 1
        return out


def _function():
    import torch

    class FusedLoRA(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x, w, a, b, s, op):
            a16, b16 = a.to(torch.bfloat16), b.to(torch.bfloat16)
            ctx.save_for_backward(x, w, a16, b16)
            ctx.s = s
            return op(x, w, a16, b16, s)

        @staticmethod
        def backward(ctx, gy):
            x, w, a16, b16 = ctx.saved_tensors
            s = ctx.s
            gy = gy.to(torch.bfloat16)
            gyb = gy @ b16                                     # [M, r] = dL/dt / s
            gx = gy @ w + (gyb @ a16) * s
            ga = (gyb.float().t() @ x.float()) * s            # [r, K]
            gb = (gy.float().t() @ (x @ a16.t()).float()) * s  # [N, r]
            return gx, None, ga, gb, None, None

    return FusedLoRA


_FN = None


def fused_lora(x, w, a, b, s, op):
    global _FN
    if _FN is None:
        _FN = _function()
    return _FN.apply(x, w, a, b, s, op)


def install(model, op) -> int:
    """Route every peft LoRA linear of `model` through `op` (a KernelOp, or in tests the torch
    reference with the same signature). Returns how many modules now run fused."""

    import torch
    from peft.tuners.lora import Linear as LoraLinear

    def forward(self, x, *args, **kwargs):
        if self.merged or self.disable_adapters or list(self.active_adapters) != ["default"]:
            raise RealizationUnavailable("cupy-fused runs one unmerged, active adapter named 'default'")
        lead = x.shape[:-1]
        x2 = x.reshape(-1, x.shape[-1]).to(torch.bfloat16)
        y = fused_lora(x2, self.base_layer.weight, self.lora_A["default"].weight, self.lora_B["default"].weight,
                       float(self.scaling["default"]), op)
        if self.base_layer.bias is not None:
            y = y + self.base_layer.bias
        return y.reshape(*lead, y.shape[-1])

    n = 0
    for mod in model.modules():
        if isinstance(mod, LoraLinear):
            if mod.base_layer.weight.dtype != torch.bfloat16:
                raise RealizationUnavailable(f"cupy-fused needs bf16 base weights; got {mod.base_layer.weight.dtype}")
            mod.forward = types.MethodType(forward, mod)
            n += 1
    if n == 0:
        raise BadInput("the model has no LoRA linears to route through cupy-fused")
    return n
