"""The "ledger-cuda" decoder: HEAD's adapter merged into the base, the base held in int8 or q4b32,
every decode matvec one launch of ledger's gated decode kernels, the whole step one CUDA graph.

Why each part (docs/kernels.md has the kernels' figures):
  * merged, not fused: y = (W + s B A) x costs one read of W; the fused LoRA kernel reads W, A
    and B every token, and was measured slower than the merged matvec for serving (issue 20).
    The adapter is folded in fp32, then the merged weight is quantized once per generation.
  * int8 / q4b32: decode reads every weight once per token, so bytes are time; the 4-bit base
    reads 0.5625 B a weight instead of 2. The matvecs (M <= 8 rows) are ledger's
    `linear-int8` / `linear-q4b32` kernels, or their fp16-tensor-core variants `-x16` for the
    large matrices that fit them (X16_OF below); a matrix whose K no kernel can take (q4b32 needs
    K % 128 == 0, int8 K % 64) is served by torch's dequantize + F.linear, and `realizations`
    says so per matrix -- selection, never a silent fallback. "bf16" keeps the merged weight
    dense and uses cuBLAS (ledger's own bf16 matvec ties it and its gate refuses it).
  * one CUDA graph per step: the step takes the token and the position from device buffers and
    writes the next token back, so N tokens are N replays with no host round trip; stop tokens
    are checked after each chunk (greedy decoding: what follows a stop token is discarded, the
    answer is the same).
  * the fused step (`StepKernels`, ledger/kernels/decode_step.cu): in the graph, a step of the
    torch path was ~50 small kernels a layer (the norms, rotary embedding, cache writes, masked
    SDPA, SiLU...) of ~2 us each -- at 135M parameters that, not the weights, was the step's
    time. On CUDA every layer is 9 launches instead: residual add + RMSNorm, the q|k|v matvec,
    rotary + cache write, attention over the cache, o, add + RMSNorm, gate|up, SiLU * up, down;
    then the final norm, the head and an argmax kernel that also advances token and position.
    Same operations, same bf16 roundings as the torch path (tested against it on a GPU).
    `step_realization` records which step runs.
  * q4b32 needs K % 128 == 0. With the fused step a matrix whose K is not (SmolLM2: hidden 576)
    is stored zero-padded to the next multiple of 128 (a zero weight quantizes to q = 8, i.e.
    exactly 0) and reads the fused step's activation buffers, whose padding is zero and never
    written: it runs on the kernel at 128/K more bytes instead of torch's dequantize. Chosen per
    matrix when the weights are made and recorded in `realizations` ("... K 576->640").
  * prompt (prefill): one batched forward in torch (rows > 8 are GEMMs, not matvecs).

Prompts + new tokens are bounded by the cache preallocated at construction (`context`); the KV
cache is [layers, kv_heads, context, head_dim] bf16 and attention reads it through a mask of the
positions written so far (static shapes: what a graph needs).

Runs on the CPU too (torch path only, no graph): that is how tests/image/test_cuda_decode.py
checks it against the "ledger" FastLlama decoder.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as Fn

from ledger.errors import BadInput, RealizationUnavailable
from ledger.kernels import qlinear
from ledger.kernels.records import b3

FORMATS = ("bf16", "int8", "q4b32")
KERNEL_OF = {"int8": "linear-int8", "q4b32": "linear-q4b32"}
# The fp16-tensor-core variants (x staged in shared memory as fp16 * 2^-p; docs/kernels.md): they
# need M * (K + 8) <= 16448 and pay a fixed staging prologue, so a matrix takes them only where
# they measured faster on an H200 (bench_strongest.py --serving, benchmarks/RESULTS.md, session 6):
# q4b32 from 2048x2048 weights up (faster at every measured shape from there: 6.53 vs 6.62 us at
# 2048^2 ... 24.83 vs 28.27 us at 49152x2048); int8 above 4096^2 weights, or K >= 8192 with
# N >= 2048 (11.94 vs 12.96 us at 2048x8192), while at 8192x2048 and 4096^2 and below the
# bf16-path kernel was as fast or faster. Selection by shape, recorded per matrix.
X16_OF = {"int8": "linear-int8-x16", "q4b32": "linear-q4b32-x16"}


def prefers_x16(fmt: str, n: int, k: int) -> bool:
    """Whether an [n, k] matrix in `fmt` is faster on the x16 kernel (measured rule above)."""
    if fmt == "q4b32":
        return n * k >= 2048 * 2048
    return n * k > 4096 * 4096 or (k >= 8192 and n >= 2048)
MAX_ROWS = 8    # the decode kernels' mma n-side (ledger.kernels.specs.MAX_M)


@dataclass
class Matrix:
    """One merged weight [n, k] in its serving format, and how its matvec runs."""
    fmt: str
    n: int
    k: int
    w: torch.Tensor                      # bf16 [n, k] | int8 [n, k] | packed uint8 [n, kp/2]
    s: torch.Tensor | None               # int8: fp32 [n]; q4b32: bf16 [n, kp/32]
    realization: str = "torch"           # "ledger:<kernel>" or "cublas" / "torch-dequant"
    launch: object = None                # the bound kernel (Kernels.bind), for M = 1
    kp: int = 0                          # K as stored: k, or k zero-padded for the q4b32 kernels

    def __post_init__(self):
        self.kp = self.kp or self.k

    def dense(self, dtype) -> torch.Tensor:
        if self.fmt == "bf16":
            return self.w.to(dtype)
        w = qlinear.dequantize(self.w, self.s, self.fmt, dtype)
        return w[:, :self.k] if self.kp != self.k else w


def padded_k(fmt: str, k: int) -> int:
    """K a q4b32 matrix is stored with for the fused step's kernels (the next multiple of 128)."""
    return -(-k // 128) * 128 if fmt == "q4b32" else k


class Kernels:
    """ledger's built decode kernels (cupy + NVRTC), launched on torch's current stream with the
    tensors' own pointers (nothing allocated per call: a CUDA graph can capture them)."""

    def __init__(self, arch: str | None = None):
        from ledger.kernels import harness
        from ledger.kernels import runtime as R
        from ledger.kernels import specs as S

        self.R, self.S = R, S
        info = R.device_info()
        arch = arch or f"sm_{info['cc'][0]}{info['cc'][1]}"
        names = (*KERNEL_OF.values(), *X16_OF.values())
        self.builds = {name: harness.build(name, arch) for name in names}
        self.modules = {name: R.load(b) for name, b in self.builds.items()}
        self.code_objects = {name: b.code_object for name, b in self.builds.items()}

    def _why_not(self, name: str, n: int, k: int, m: int) -> str | None:
        spec = self.S.get(name)
        try:
            spec.requirements.check_shape(spec.name, self.S.Shape(m, n, k, 0))
        except RealizationUnavailable as e:
            return e.message
        return None

    def kernel_for(self, fmt: str, n: int, k: int, m: int = 1) -> str | None:
        """The kernel that serves an [n, k] matrix in `fmt` (None: neither can take it)."""
        if prefers_x16(fmt, n, k) and self._why_not(X16_OF[fmt], n, k, m) is None:
            return X16_OF[fmt]
        return KERNEL_OF[fmt] if self._why_not(KERNEL_OF[fmt], n, k, m) is None else None

    def supports(self, fmt: str, n: int, k: int, m: int = 1) -> str | None:
        """Why no kernel can take this matrix, or None."""
        return None if self.kernel_for(fmt, n, k, m) else self._why_not(KERNEL_OF[fmt], n, k, m)

    def bind(self, mat: Matrix):
        """A launcher y[1, n] = x[1, k] W^T for `mat` (one block grid fixed for M = 1)."""
        name = self.kernel_for(mat.fmt, mat.n, mat.kp)
        if name is None:
            raise RealizationUnavailable(f"no ledger kernel takes a {mat.n}x{mat.kp} {mat.fmt} matrix",
                                         self._why_not(KERNEL_OF[mat.fmt], mat.n, mat.kp, 1) or "")
        spec = self.S.get(name)
        mod = self.modules[name]
        shape = self.S.Shape(1, mat.n, mat.kp, 0)
        cfg = self.R.auto_config(mod, spec, shape)
        fn = mod.function(spec.entry(cfg))
        grid, block = (spec.grid_blocks(cfg, shape),), (32 * cfg[0],)
        cp = self.R.cupy()
        w, s = np.uint64(mat.w.data_ptr()), np.uint64(mat.s.data_ptr())
        n32, k32 = np.int32(mat.n), np.int32(mat.kp)
        zero = np.uint64(0)

        def launch(x: torch.Tensor, y: torch.Tensor) -> None:
            with cp.cuda.ExternalStream(torch.cuda.current_stream().cuda_stream):
                fn(grid, block, (w, s, np.uint64(x.data_ptr()), np.uint64(y.data_ptr()), np.int32(1), n32, k32,
                                 zero, zero, np.float32(0.0), np.int32(0), zero, zero, np.uint32(1), np.int32(0)))
        return launch


STEP_SOURCE = Path(__file__).resolve().parents[1] / "kernels" / "decode_step.cu"
STEP_ENTRIES = ("ledger_rms", "ledger_rope_cache", "ledger_attn", "ledger_silu_mul", "ledger_argmax_step")
MAX_STEP_CONTEXT = 8192     # the attention kernel keeps a row of scores in shared memory (fp32)
_STEP_MODULES: dict = {}


def step_unmet(shape, context: int) -> str | None:
    """Why the fused step cannot serve this shape (None: it can); the torch step serves it then."""
    if shape.hidden > 8 * 1024:
        return f"hidden {shape.hidden} > 8192 (the norm kernel holds 8 elements a thread, 1024 threads)"
    if shape.head_dim > 256 or shape.head_dim % 2:
        return f"head_dim {shape.head_dim} is not an even number <= 256"
    if shape.heads % shape.kv_heads:
        return f"{shape.heads} heads are not a multiple of {shape.kv_heads} kv heads"
    if context > MAX_STEP_CONTEXT:
        return f"context {context} > {MAX_STEP_CONTEXT} (attention scores in shared memory)"
    return None


class StepKernels:
    """The fused decode-step kernels (ledger/kernels/decode_step.cu), NVRTC-compiled once per
    process and device; launched on torch's current stream with fixed pointers (capturable)."""

    def __init__(self, arch: str | None = None):
        from ledger.kernels import runtime as R

        self.R = R
        info = R.device_info()
        arch = arch or f"sm_{info['cc'][0]}{info['cc'][1]}"
        if arch not in _STEP_MODULES:
            src = STEP_SOURCE.read_text()
            cubin, _, _ = R.compile_source(src, [], ("-std=c++17", f"-arch={arch}"), STEP_SOURCE.name)
            mod = R.cupy().cuda.function.Module()
            mod.load(cubin)
            _STEP_MODULES[arch] = (mod, {e: mod.get_function(e) for e in STEP_ENTRIES}, b3(cubin))
        self.module, self.fns, self.code_object = _STEP_MODULES[arch]

    def launch(self, name: str, grid: int, block: int, args: tuple, shared: int = 0) -> None:
        cp = self.R.cupy()
        with cp.cuda.ExternalStream(torch.cuda.current_stream().cuda_stream):
            self.fns[name]((grid,), (block,), args, shared_mem=shared)


def _ptr(t: torch.Tensor) -> np.uint64:
    return np.uint64(t.data_ptr())


class CudaLlama:
    """Greedy decoding of a Llama base + merged adapter in `fmt` (module docstring)."""

    name = "ledger-cuda"

    def __init__(self, base_sd: dict, shape, fmt: str = "q4b32", *, device=None, context: int = 512,
                 kernels: Kernels | None = None, dtype=torch.bfloat16, graphs: bool | None = None,
                 fused_step: bool | None = None):
        if fmt not in FORMATS:
            raise BadInput(f"unknown serving format {fmt!r}", f"use one of {', '.join(FORMATS)}")
        self.device = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
        self.cuda = self.device.type == "cuda"
        if self.cuda and kernels is None and fmt != "bf16":
            kernels = Kernels()
        self.kernels, self.fmt, self.dtype, self.shape = kernels, fmt, dtype, shape
        self.graphs = self.cuda if graphs is None else graphs
        if self.graphs and not self.cuda:
            raise BadInput("CUDA graphs need a CUDA device")
        s = shape
        self.context = min(context, s.max_positions)
        g = lambda k: base_sd[k].to(self.device, torch.float32)  # noqa: E731
        try:
            self.base = {"embed": g("model.embed_tokens.weight"), "norm": g("model.norm.weight"),
                         "head": (g("model.embed_tokens.weight") if s.tied else g("lm_head.weight")), "layers": []}
            for i in range(s.layers):
                p = f"model.layers.{i}."
                self.base["layers"].append({m: base_sd[f"{p}{blk}.{m}.weight"] for m, blk in _MODULES.items()}
                                           | {"ln1": g(p + "input_layernorm.weight"),
                                              "ln2": g(p + "post_attention_layernorm.weight")})
        except KeyError as e:
            raise BadInput(f"base weights lack {e.args[0]}", "the base is not a Llama checkpoint ledger can serve") from None
        inv = 1.0 / (s.theta ** (torch.arange(0, s.head_dim, 2, dtype=torch.int64).float() / s.head_dim))
        freqs = torch.outer(torch.arange(self.context, dtype=torch.float32), inv)
        emb = torch.cat((freqs, freqs), dim=-1)
        self.cos, self.sin = emb.cos().to(self.device, dtype), emb.sin().to(self.device, dtype)
        self.k_cache = torch.zeros(s.layers, s.kv_heads, self.context, s.head_dim, device=self.device, dtype=dtype)
        self.v_cache = torch.zeros_like(self.k_cache)
        # the step's static buffers, made once: every captured graph (one per set of weights)
        # reads the token and position from them and writes the next token into _out
        self._tok = torch.zeros(1, dtype=torch.long, device=self.device)
        self._pos = torch.zeros(1, dtype=torch.long, device=self.device)
        self._out = torch.zeros(self.context + 1, dtype=torch.long, device=self.device)
        self.W = None
        self._graph = None
        self.realizations: dict[str, str] = {}
        # the step: the fused kernels on CUDA (bf16 only: they read and write bf16), unless asked
        # otherwise or the shape is one they cannot take -- recorded either way, never silent
        why = (None if self.cuda and dtype == torch.bfloat16 else "not a CUDA bf16 decoder") or step_unmet(s, self.context)
        if fused_step and why:
            raise RealizationUnavailable(f"the fused decode step cannot run here: {why}")
        self.step = StepKernels() if (fused_step is None or fused_step) and why is None else None
        self.step_realization = (f"ledger:decode-step {self.step.code_object}" if self.step else
                                 f"torch ({why or 'fused_step=False'})")
        if self.step:
            self._buffers()

    # --- weights -------------------------------------------------------------------------------
    def _matrix(self, w32: torch.Tensor, name: str) -> Matrix:
        n, k = w32.shape
        fmt = self.fmt
        if fmt == "bf16":
            m = Matrix("bf16", n, k, w32.to(self.dtype).contiguous(), None, "cublas" if self.cuda else "torch")
        else:
            # the fused step's activation buffers are zero-padded: a q4b32 matrix whose K the
            # kernels cannot take is stored with zero columns up to the next multiple of 128
            kp = padded_k(fmt, k) if self.step and self.kernels is not None else k
            if kp != k and self.kernels.supports(fmt, n, kp) is None:
                w32 = torch.cat([w32, w32.new_zeros(n, kp - k)], 1)
            else:
                kp = k
            q, sc = qlinear.quantize(w32, fmt)
            m = Matrix(fmt, n, k, q.contiguous(), sc.contiguous(), "torch-dequant", kp=kp)
            why = self.kernels.supports(fmt, n, kp) if self.kernels is not None else "no CUDA device"
            if why is None:
                m.realization = f"ledger:{self.kernels.kernel_for(fmt, n, kp)}" + (f" K {k}->{kp}" if kp != k else "")
                m.launch = self.kernels.bind(m)
        self.realizations[name] = m.realization
        return m

    def load(self, lora_sd: dict | None = None, cfg: dict | None = None) -> None:
        """Merge the adapter (None: the base alone), quantize, and serve those weights."""
        self.use(self.merged(lora_sd, cfg))

    def use(self, W: dict) -> None:
        """Serve `W` (from merged()); its graph, captured on first use, is kept with it."""
        if self.W is not W:
            self.W = W
            self._graph = W.get("graph")

    def merged(self, lora_sd: dict | None = None, cfg: dict | None = None) -> dict:
        """The served weights: base + (alpha / r) B A per targeted module, fused (q|k|v, gate|up)
        and held in this decoder's format."""
        scaling = float(cfg["lora_alpha"]) / int(cfg["r"]) if lora_sd is not None else 0.0
        used = 0
        layers = []
        for i, L in enumerate(self.base["layers"]):
            merged = {}
            for m, blk in _MODULES.items():
                w = L[m].to(self.device, torch.float32)
                if lora_sd is not None:
                    key = f"base_model.model.model.layers.{i}.{blk}.{m}"
                    a, b = lora_sd.get(key + ".lora_A.weight"), lora_sd.get(key + ".lora_B.weight")
                    if (a is None) != (b is None):
                        raise BadInput(f"adapter has only one of lora_A / lora_B for {key}")
                    if a is not None:
                        w = w + scaling * (b.to(self.device, torch.float32) @ a.to(self.device, torch.float32))
                        used += 2
                merged[m] = w
            layers.append({"ln1": L["ln1"].to(self.dtype), "ln2": L["ln2"].to(self.dtype),
                           "qkv": self._matrix(torch.cat([merged["q_proj"], merged["k_proj"], merged["v_proj"]]),
                                               f"layers.{i}.qkv"),
                           "o": self._matrix(merged["o_proj"], f"layers.{i}.o"),
                           "gu": self._matrix(torch.cat([merged["gate_proj"], merged["up_proj"]]), f"layers.{i}.gu"),
                           "down": self._matrix(merged["down_proj"], f"layers.{i}.down")})
            del merged
        if lora_sd is not None and used != sum(1 for k in lora_sd if ".lora_A." in k or ".lora_B." in k):
            raise BadInput("adapter holds LoRA weights for modules this decoder does not know")
        return {"embed": self.base["embed"].to(self.dtype), "norm": self.base["norm"].to(self.dtype),
                "head": self._matrix(self.base["head"], "lm_head"), "layers": layers, "graph": None}

    # --- the forward ---------------------------------------------------------------------------
    def _mv(self, x: torch.Tensor, m: Matrix) -> torch.Tensor:
        if m.launch is not None and x.shape[0] == 1 and m.kp == m.k:
            y = torch.empty(1, m.n, device=x.device, dtype=self.dtype)
            m.launch(x.contiguous(), y)
            return y
        return Fn.linear(x, m.w) if m.fmt == "bf16" else Fn.linear(x, m.dense(self.dtype))

    def _rms(self, x, w):
        xf = x.float()
        return (w * (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.shape.eps))).to(self.dtype)

    @staticmethod
    def _rot(x, cos, sin):
        h = x.shape[-1] // 2
        return x * cos + torch.cat((-x[..., h:], x[..., :h]), dim=-1) * sin

    def _forward(self, tok: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
        """Logits of the last row after feeding tokens `tok` [T] at positions `pos` [T] (device
        tensors; the cache is written at `pos`). Static shapes only: a CUDA graph can hold it."""
        s, W = self.shape, self.W
        T = tok.shape[0]
        nq, nkv = s.heads * s.head_dim, s.kv_heads * s.head_dim
        x = W["embed"].index_select(0, tok)
        cos, sin = self.cos.index_select(0, pos)[None], self.sin.index_select(0, pos)[None]
        # key j is visible to row t when j <= pos[t] (written now or before)
        mask = (torch.arange(self.context, device=tok.device)[None, :] <= pos[:, None])[None, None]
        for i, L in enumerate(W["layers"]):
            h = self._rms(x, L["ln1"])
            qkv = self._mv(h, L["qkv"])
            q = qkv[:, :nq].view(T, s.heads, s.head_dim).transpose(0, 1)
            k = qkv[:, nq:nq + nkv].view(T, s.kv_heads, s.head_dim).transpose(0, 1)
            v = qkv[:, nq + nkv:].view(T, s.kv_heads, s.head_dim).transpose(0, 1)
            q, k = self._rot(q, cos, sin), self._rot(k, cos, sin)
            self.k_cache[i].index_copy_(1, pos, k)
            self.v_cache[i].index_copy_(1, pos, v)
            a = Fn.scaled_dot_product_attention(q[None], self.k_cache[i][None], self.v_cache[i][None], attn_mask=mask,
                                                enable_gqa=s.heads != s.kv_heads)[0]
            x = x + self._mv(a.transpose(0, 1).reshape(T, nq), L["o"])
            h = self._rms(x, L["ln2"])
            gu = self._mv(h, L["gu"])
            half = gu.shape[-1] // 2
            x = x + self._mv(Fn.silu(gu[:, :half]) * gu[:, half:], L["down"])
        return self._mv(self._rms(x[-1:], W["norm"]), W["head"])[0]

    # --- the fused step (CUDA) -------------------------------------------------------------------
    def _buffers(self) -> None:
        """The fused step's activations, made once (zero: the padding past each width stays 0)."""
        s, dev, dt = self.shape, self.device, self.dtype
        nq, nkv = s.heads * s.head_dim, s.kv_heads * s.head_dim
        def z(n):   # normal tensors even when built under inference mode: the capture writes them outside it
            with torch.inference_mode(False):
                return torch.zeros(1, n, device=dev, dtype=dt)
        self._x, self._h, self._o, self._d = z(s.hidden), z(padded_k("q4b32", s.hidden)), z(s.hidden), z(s.hidden)
        self._qkv, self._q, self._a = z(nq + 2 * nkv), z(nq), z(padded_k("q4b32", nq))
        self._logits = z(s.vocab)
        self._gu = self._act = None        # sized by the MLP width, known from the weights (_step_fused)

    def _mv_into(self, m: Matrix, x: torch.Tensor, y: torch.Tensor) -> None:
        """y[1, n] = x[1, :k] W^T into the preallocated y: the bound kernel (x's zero padding
        is the padded matrix's K), else cuBLAS on the dense or dequantized weight (the matrix's
        recorded realization, "cublas" / "torch-dequant")."""
        if m.launch is not None:
            m.launch(x, y)
        else:
            torch.mm(x[:, :m.k], (m.w if m.fmt == "bf16" else m.dense(self.dtype)).t(), out=y)

    def _step_fused(self) -> None:
        """One decode step on the static buffers through the fused kernels (9 launches a layer)."""
        s, W, K = self.shape, self.W, self.step
        inter = W["layers"][0]["down"].k
        if self._gu is None or self._gu.shape[1] != 2 * inter:
            with torch.inference_mode(False):   # normal tensors: the capture runs outside inference mode
                self._gu = torch.zeros(1, 2 * inter, device=self.device, dtype=self.dtype)
                self._act = torch.zeros(1, padded_k("q4b32", inter), device=self.device, dtype=self.dtype)
        D, hd, ctx = s.hidden, s.head_dim, self.context
        nq, nkv = s.heads * hd, s.kv_heads * hd
        i32, f32 = np.int32, np.float32
        mv = self._mv_into
        rms_block = min(1024, max(64, -(-D // 64) * 32))     # ~2 elements a thread; <= 8 (D <= 8192)
        att_block = next(hd * j for j in range(1, 1025) if hd * j >= 128 and hd * j % 32 == 0)  # whole warps
        x, h, tok, pos = _ptr(self._x), _ptr(self._h), _ptr(self._tok), _ptr(self._pos)
        embed, zero = _ptr(W["embed"]), np.uint64(0)
        cos, sin = _ptr(self.cos), _ptr(self.sin)
        layer_kv = self.k_cache[0].numel() * self.k_cache.element_size()
        nt = nq + 2 * nkv
        for i, L in enumerate(W["layers"]):
            K.launch("ledger_rms", 1, rms_block, (x, _ptr(self._d), embed, tok, _ptr(L["ln1"]), h, i32(D),
                                                  f32(s.eps), i32(2 if i == 0 else 1)))
            mv(L["qkv"], self._h, self._qkv)
            kc, vc = np.uint64(self.k_cache.data_ptr() + i * layer_kv), np.uint64(self.v_cache.data_ptr() + i * layer_kv)
            K.launch("ledger_rope_cache", -(-nt // 256), 256, (_ptr(self._qkv), cos, sin, pos, _ptr(self._q), kc, vc,
                                                             i32(s.heads), i32(s.kv_heads), i32(hd), i32(ctx)))
            K.launch("ledger_attn", s.heads, att_block, (_ptr(self._q), kc, vc, pos, _ptr(self._a), i32(s.heads),
                                                         i32(s.kv_heads), i32(hd), i32(ctx), f32(hd ** -0.5)),
                     shared=4 * (ctx + att_block))
            mv(L["o"], self._a, self._o)
            K.launch("ledger_rms", 1, rms_block, (x, _ptr(self._o), zero, tok, _ptr(L["ln2"]), h, i32(D), f32(s.eps),
                                                  i32(1)))
            mv(L["gu"], self._h, self._gu)
            K.launch("ledger_silu_mul", -(-inter // 256), 256, (_ptr(self._gu), _ptr(self._act), i32(inter)))
            mv(L["down"], self._act, self._d)
        K.launch("ledger_rms", 1, rms_block, (x, _ptr(self._d), zero, tok, _ptr(W["norm"]), h, i32(D), f32(s.eps),
                                              i32(1)))
        mv(W["head"], self._h, self._logits)
        K.launch("ledger_argmax_step", 1, 1024, (_ptr(self._logits), i32(s.vocab), _ptr(self._out), tok, pos))

    def _step_into(self) -> None:
        """One decode step on the static buffers: token and position in, next token out."""
        if self.step is not None:
            self._step_fused()
            return
        logits = self._forward(self._tok, self._pos)
        nxt = logits.argmax().view(1)
        self._out.index_copy_(0, self._pos + 1, nxt)      # out[p + 1]: the token after position p
        self._tok.copy_(nxt)
        self._pos.add_(1)

    def _capture(self) -> None:
        if not self.graphs:
            self._graph = self.W["graph"] = False
            return
        keep = (self.k_cache.clone(), self.v_cache.clone())
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):      # warm-up outside the capture (allocator, cuBLAS handles)
            for _ in range(2):
                self._pos.fill_(0)
                self._step_into()
        torch.cuda.current_stream().wait_stream(side)
        self._graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(self._graph):
            self._step_into()
        self.W["graph"] = self._graph
        self.k_cache.copy_(keep[0])
        self.v_cache.copy_(keep[1])

    # --- greedy decoding -------------------------------------------------------------------------
    def greedy(self, W: dict, ids: list[int], max_new: int, stop: frozenset) -> list[int]:
        """The image's interface (ledger.image.generate.Model): decode with weights `W`."""
        self.use(W)
        return self.decode(ids, max_new, stop)

    def logits(self, W: dict, ids: list[int]) -> torch.Tensor:
        """Logits at every position of `ids` from an empty cache (the decoders' equivalence test)."""
        self.use(W)
        with torch.inference_mode():
            rows = []
            for t in range(len(ids)):
                self.k_cache.zero_()
                self.v_cache.zero_()
                rows.append(self._forward(torch.tensor(ids[:t + 1], device=self.device),
                                          torch.arange(t + 1, device=self.device)).float())
            return torch.stack(rows).cpu()

    def decode(self, ids: list[int], max_new: int, stop: frozenset = frozenset(), chunk: int = 8) -> list[int]:
        """Greedy tokens after `ids` with the weights in use (load() or use()), up to a stop token."""
        if self.W is None:
            self.load(None)
        if not ids or len(ids) + max_new > self.context:
            raise BadInput(f"the prompt ({len(ids)} tokens) and {max_new} new tokens exceed this decoder's context "
                           f"{self.context}")
        if self._graph is None:
            self._capture()
        with torch.inference_mode():
            self.k_cache.zero_()
            self.v_cache.zero_()
            tok = torch.tensor(ids, device=self.device)
            first = self._forward(tok, torch.arange(len(ids), device=self.device)).argmax()
            self._tok.copy_(first.view(1))
            self._pos.fill_(len(ids))
            self._out[len(ids)] = first
            out: list[int] = []
            done, taken = 1, 0        # tokens in _out so far (the first), tokens read from it
            start = len(ids)
            while True:
                for t in self._out[start + taken:start + done].tolist():
                    taken += 1
                    if t in stop:
                        return out
                    out.append(t)
                    if len(out) == max_new:
                        return out
                for _ in range(min(chunk, max_new - done)):   # > 0: fewer than max_new were read
                    if self._graph:
                        self._graph.replay()
                    else:
                        self._step_into()
                    done += 1


_MODULES = {"q_proj": "self_attn", "k_proj": "self_attn", "v_proj": "self_attn", "o_proj": "self_attn",
            "gate_proj": "mlp", "up_proj": "mlp", "down_proj": "mlp"}
