"""Compile: a spec + a target + a budget become a plan object, or a rejection.

A plan is canonical JSON with no clock or host in it, so the same inputs give the same plan id
on every machine. It holds the normalised closed config, the input ids (base, tokenizer,
dataset), shapes and parameter counts, the memory plan in named byte lines, the realization
selected for each operator with what it requires, and the fit proof against the target.

Every check that can fail runs before anything is written: a rejected spec leaves no trace
in the store. A rejection names the requirement that failed and the nearest configuration that
would pass (the largest micro-batch that fits, or the longest sequence at micro-batch 1).
"""

from __future__ import annotations

import importlib.util
import json
from dataclasses import dataclass, field

from ledger import records
from ledger.artefacts import dataset as datalib
from ledger.artefacts import model
from ledger.artefacts import template as templatelib
from ledger.artefacts import tokenizer as toklib
from ledger.errors import CompileRejected, LedgerError, SpecError
from ledger.plan import memory
from ledger.plan import plan as planlib
from ledger.plan.plan import Config
from ledger.plan.spec import BUILTIN_BASE, BUILTIN_DATASET, Spec, line_of
from ledger.plan.targets import Target
from ledger.store import canonical
from ledger.store.ids import hash_bytes

PLAN_VERSION = planlib.PLAN_VERSION
OPERATORS = ("embedding", "rmsnorm", "rope", "attention", "linear_lora", "mlp_act", "lm_head", "cross_entropy", "adamw")
GIB = 1 << 30


@dataclass(frozen=True)
class Plan:
    """A stored plan: its canonical body (what the id hashes) and the typed view of it
    (ledger.plan.plan), read once here; an ill-shaped body is refused naming the field."""
    body: dict
    view: planlib.Plan = field(init=False, repr=False, compare=False)

    def __post_init__(self):
        object.__setattr__(self, "view", planlib.Plan.from_json(self.body))

    @property
    def id(self) -> str:
        return hash_bytes(canonical.dumps(self.body))

    @property
    def config(self) -> dict:
        return self.body["config"]


def from_body(body) -> Plan:
    return Plan(body)


def gib(n: int) -> str:
    return f"{n / GIB:.2f} GiB" if n >= GIB / 10 else f"{n / (1 << 20):.1f} MiB"


# --- realizations -------------------------------------------------------------------------------
def _cupy_here() -> str | None:
    """Why cupy-fused cannot be selected on this machine, or None if it could."""
    if importlib.util.find_spec("cupy") is None:
        return "cupy is not installed"
    try:
        import cupy

        if cupy.cuda.runtime.getDeviceCount() < 1:
            return "no CUDA device is visible"
    except Exception as e:  # noqa: BLE001 - any driver failure means: not available
        return f"cupy cannot reach a CUDA device ({type(e).__name__})"
    # ledger.kernels provides inference kernels; a training (forward+backward) realization must
    # register itself as ledger.kernels.lora_train before a plan may select it.
    if importlib.util.find_spec("ledger.kernels.lora_train") is None:
        return "ledger.kernels registers no cupy-fused training realization (ledger.kernels.lora_train)"
    return None


FUSED_KERNEL = "lora-linear-bf16"   # the kernel cupy-fused runs for LoRA linears (ledger.kernels)


def fused_unmet(c: Config, arch) -> str | None:
    """The first requirement of the fused LoRA kernel the plan's shapes do not meet, or None.

    The kernel is a decode matvec: at most 8 rows of x per launch, bf16 in and out, K a
    multiple of 32, rank a multiple of 8 up to 64, no dropout inside (ledger.kernels.specs)."""
    from ledger.kernels import specs as KS

    req = KS.get(FUSED_KERNEL).requirements
    rows = c.data.micro_batch * c.data.seq_len
    if c.precision.dtype != "bf16":
        return f"kernel {FUSED_KERNEL} computes in bf16; precision.dtype is {c.precision.dtype}"
    if c.precision.base_format != "none":
        return f"kernel {FUSED_KERNEL} reads a bf16 base weight; the base is held in {c.precision.base_format}"
    if rows > KS.MAX_M:
        return (f"kernel {FUSED_KERNEL} is a decode kernel for at most {KS.MAX_M} rows per launch; each LoRA linear "
                f"here sees micro_batch x seq_len = {rows} rows (torch's GEMM is the realization for that)")
    r = c.lora.r
    if r < 8 or r > KS.MAX_R or r % 8:
        return f"kernel {FUSED_KERNEL} needs LoRA rank a multiple of 8 between 8 and {KS.MAX_R}; lora.r is {r}"
    if c.lora.dropout > 0:
        return f"kernel {FUSED_KERNEL} has no dropout on the LoRA input; lora.dropout is {c.lora.dropout}"
    for m in c.lora.target_modules:
        k = model.MODULE_SHAPES[m](arch)[0]
        if k % req.k_multiple:
            return f"kernel {FUSED_KERNEL} needs K a multiple of {req.k_multiple}; {m} has in_features {k}"
    return None


def gated_kernel(store, target: Target) -> dict | None:
    """The fused kernel's accepted gate for this target in this store (ref kernel/<name>/<target>)."""
    if store is None:
        return None
    from ledger.kernels import store_records as sr

    return sr.gated(store, FUSED_KERNEL, target.name)


FUSED_LORA = "fused-lora"
CE_CHUNK_ROWS = 4096   # ledger.kernels.train_ops.CE_CHUNK_ROWS (plan/ imports no torch)


def fused_lora_unmet(c: Config, target: Target) -> tuple[str, str] | None:
    """(requirement, why) of the first requirement of the fused-lora training realization
    (ledger.train.fused) the plan does not meet, or None. Checked again where it runs, with the
    base's config (a Llama with SiLU and no projection biases)."""
    if target.device != "cuda":
        return "device", f"target {target.name} is {target.device}"
    if target.cc is None or target.cc < (8, 0):
        return "compute_capability", f"compute capability {target.compute_capability or 'none'} < 8.0 (cuDNN attention)"
    if c.precision.dtype != "bf16":
        return "dtype", f"fused-lora runs bf16; precision.dtype is {c.precision.dtype}"
    if c.precision.base_format != "none":
        return "base_format", f"fused-lora reads a bf16 base weight; the base is held in {c.precision.base_format}"
    if c.lora.dropout > 0:
        return "dropout", f"the fused LoRA linear has no dropout on its input; lora.dropout is {c.lora.dropout}"
    return None


FP8_BASE = "fp8-base"
FP8_MIN_CC = (9, 0)   # ledger.kernels.fp8_ops.FP8_MIN_CC (plan/ imports no torch)
# The numerics gate fp8-base passes before it trains (ledger.train.numerics): the run's first
# batch through the fp8 and the bf16 fused forward from the same adapter state. Fixed here, in
# the plan, before any run: e4m3 keeps 3 mantissa bits (a rounding error up to 2^-4 of each
# quantized value), so a GEMM's output moves by a few percent of its norm; the loss, a mean over
# every token, moves far less.
# The loss is judged against the bf16 base, the gradients against the fp8 base dequantized to bf16
# (the same base function in bf16 arithmetic; ledger.train.numerics says why two references).
FP8_GATE = {"steps": 3, "loss_rel": 0.01, "grad_rel_l2_median": 0.10, "grad_rel_l2_max": 0.25,
            "reference": "fused-lora's bf16 GEMMs, same batch, same adapter state: the loss against the bf16 "
                         "base, the gradients against the fp8 base dequantized to bf16; between steps sign-SGD "
                         "at optimizer.lr (AdamW's first step)"}


def fp8_base_unmet(c: Config, target: Target) -> tuple[str, str] | None:
    """(requirement, why) of the first requirement of the fp8-base realization the plan does not
    meet, or None: every fused-lora requirement, then fp8 tensor cores (compute capability 9.0)."""
    why = fused_lora_unmet(c, target)
    if why is not None:
        return why
    if target.cc < FP8_MIN_CC:
        return "compute_capability", (f"target {target.name} has compute capability {target.compute_capability} "
                                      f"< {FP8_MIN_CC[0]}.{FP8_MIN_CC[1]}: no fp8 tensor cores with rowwise scales")
    return None


def fp8_base_realizations(c: Config) -> dict:
    """fused-lora's operators with the frozen base GEMMs in fp8 (ledger.kernels.fp8_ops)."""
    out = fused_lora_realizations(c)
    out["linear_lora"] = {
        "name": FP8_BASE, "device": "cuda",
        "requires": {**out["linear_lora"]["requires"], "compute_capability": ">=9.0", "fp8": "float8_e4m3fn"},
        "how": "ledger::lora_linear_fp8 per group (q,k,v | o | gate,up | down): the frozen base weights quantized "
               "ONCE to float8_e4m3fn with per-output-row scales, plus a transposed copy with per-input-column "
               "scales for the activation gradient; x and the output gradient quantized rowwise per step "
               "inside the compiled layer; y = x W^T and dx = gy W by torch._scaled_mm (fp32 accumulation, "
               "bf16 out), the LoRA terms (x A^T, the B term added into y and the A term into dx with cuBLAS "
               "beta = 1, dA, dB) in bf16 over fp32 masters",
        "numerics_gate": dict(FP8_GATE),
    }
    return out


def fused_lora_realizations(c: Config, not_selected: dict | None = None) -> dict:
    """The operators of the fused-lora realization (ledger.train.fused, ledger.kernels.train_ops);
    what each one is, for the plan and the receipt."""
    req = {"device": "cuda", "torch_cuda": True, "triton": True, "dtype": "bf16", "lora_dropout": 0}
    def r(name, how):
        return {"name": name, "device": "cuda", "requires": req, "how": how}
    graph = "one Inductor graph for every decoder layer (the layer is a pure function: traced once)"
    ce = ("lm_head + cross-entropy in chunks of 4096 rows: logits, loss and the gradient of h per chunk, "
          "never the [rows, vocab] logits")
    out = {
        "embedding": r("torch-eager", "embedding lookup, bf16"),
        "rmsnorm": r("torch-compiled", graph), "rope": r("torch-compiled", graph),
        "mlp_act": r("torch-compiled", graph),
        "attention": r("cudnn-sdpa", "causal SDPA on cuDNN's fused attention only, grouped-query heads in the "
                                     "kernel, no mask (rows are right-padded)"),
        "linear_lora": r(FUSED_LORA, "ledger::lora_linear per group (q,k,v | o | gate,up | down): stacked base "
                                     "weights, x A^T once per group, the B term added into the base GEMM's "
                                     "output (cuBLAS beta = 1); bf16, fp32 adapter masters"),
        "lm_head": r("chunked-linear-ce", ce), "cross_entropy": r("chunked-linear-ce", ce),
        "adamw": r("torch-fused-adamw", "torch.optim.AdamW(fused=True) over the fp32 adapter"),
    }
    if not_selected:
        out["linear_lora"]["not_selected"] = not_selected
    return out


def training_loop(c: Config, target: Target, realizations: dict | None = None) -> str:
    """Which training loop (and so which memory model) runs the plan: "fused" for fused-lora,
    "compiled" for the torch-compiled CUDA realization, "eager" otherwise (CPU, torch-eager,
    cupy-fused)."""
    if realizations is not None:
        names = {r["name"] for r in realizations.values()}
        return ("fused" if names & {FUSED_LORA, FP8_BASE} else "compiled" if "torch-compiled" in names
                else "eager")
    want = c.compile.realization
    if target.device == "cuda" and want in ("auto", FUSED_LORA) and fused_lora_unmet(c, target) is None:
        return "fused"
    if target.device == "cuda" and want == FP8_BASE and fp8_base_unmet(c, target) is None:
        return "fused"
    return "compiled" if target.device == "cuda" and want in ("auto", "torch-compiled") else "eager"


def select_realizations(spec: Spec, target: Target, store=None, arch=None) -> dict:
    """The realization of every operator. Selection is not fallback: an explicit request that
    cannot be met is a rejection naming the unmet requirement; `auto` picks cupy-fused for LoRA
    linears only when its kernel is built AND gated for this target in this store, cupy and a
    GPU are present here, and the plan's shapes meet the kernel's requirements."""
    c = Config.from_json(spec.config)
    want = c.compile.realization
    dev = target.device
    eager = {"name": "torch-eager", "device": dev,
             "requires": {"device": dev, **({"torch_cuda": True} if dev == "cuda" else {})}}
    compiled = {"name": "torch-compiled", "device": "cuda",
                "requires": {"device": "cuda", "torch_cuda": True, "triton": True},
                "how": "torch.compile per decoder layer, fused AdamW"
                       + (", bf16 autocast" if c.precision.dtype == "bf16" else "")}
    if want == "torch-compiled" and dev != "cuda":
        raise CompileRejected(f"realization torch-compiled requires a CUDA target; target {target.name} is {dev}",
                              "compile for a CUDA target, or set compile.realization = \"auto\"",
                              requirement="realization.torch-compiled.device", needed="cuda", available=dev)
    if arch is None and c.model.base.startswith("builtin:"):
        arch = model.arch_of(model.builtin_config(c.model.to_json()))
    fused_why, fused_req, gate = None, None, None
    if dev != "cuda":
        fused_why, fused_req = f"target {target.name} is {dev}", "device"
    elif target.cc is None or target.cc < (8, 0):
        fused_why, fused_req = f"compute capability {target.compute_capability or 'none'} < 8.0", "compute_capability"
    else:
        fused_why, fused_req = _cupy_here(), "available"
        if fused_why is None:
            gate = gated_kernel(store, target)
            if gate is None:
                fused_why, fused_req = (f"kernel {FUSED_KERNEL} is not built and gated for target {target.name} in "
                                        f"this store (ref kernel/{FUSED_KERNEL}/{target.name}; "
                                        "see `ledger kernel gate`)", "gated")
        if fused_why is None and arch is not None:
            fused_why, fused_req = fused_unmet(c, arch), "shapes"
    if want == "cupy-fused":
        if fused_req == "device":
            raise CompileRejected(f"realization cupy-fused requires a CUDA target; target {target.name} is {dev}",
                                  "compile for a CUDA target, or set compile.realization = \"auto\"",
                                  requirement="realization.cupy-fused.device", needed="cuda", available=dev)
        if fused_req == "compute_capability":
            raise CompileRejected(f"realization cupy-fused requires compute capability >= 8.0; "
                                  f"{target.name} has {target.compute_capability}",
                                  requirement="realization.cupy-fused.compute_capability")
        if fused_why:
            raise CompileRejected(f"realization cupy-fused cannot be selected: {fused_why}",
                                  "set compile.realization = \"auto\" (ledger never falls back by itself)",
                                  requirement=f"realization.cupy-fused.{fused_req}", reason=fused_why)
    if want in ("cupy-fused", "auto") and dev == "cuda" and fused_why is None:
        fused = {"name": "cupy-fused", "device": "cuda", "kernel": FUSED_KERNEL, "gate": gate["gate"],
                 "build": gate["build"], "code_object": gate["code_object"], "arch": gate["arch"],
                 "requires": {"device": "cuda", "cupy": True, "compute_capability": ">=8.0",
                              "kernel_gate": f"kernel/{FUSED_KERNEL}/{target.name}"}}
        return {op: (fused if op == "linear_lora" else eager) for op in OPERATORS}
    if want == FP8_BASE:   # never selected by auto: it changes the numerics (gated, named)
        why = fp8_base_unmet(c, target)
        if why is not None:
            raise CompileRejected(f"realization fp8-base cannot be selected: {why[1]}",
                                  "compile for a target of compute capability >= 9.0, or set compile.realization = "
                                  "\"fused-lora\" (ledger never falls back by itself)",
                                  requirement=f"realization.fp8-base.{why[0]}", reason=why[1])
        return fp8_base_realizations(c)
    lora_why = fused_lora_unmet(c, target)
    if want == FUSED_LORA and lora_why is not None:
        raise CompileRejected(f"realization fused-lora cannot be selected: {lora_why[1]}",
                              "set compile.realization = \"auto\" (ledger never falls back by itself)",
                              requirement=f"realization.fused-lora.{lora_why[0]}", reason=lora_why[1])
    if want in ("auto", FUSED_LORA) and lora_why is None:
        return fused_lora_realizations(c, {"cupy-fused": fused_why} if want == "auto" else None)
    if dev == "cuda" and want in ("auto", "torch-compiled"):
        out = {op: compiled for op in OPERATORS}
        if want == "auto":
            out["linear_lora"] = {**compiled, "not_selected": {"cupy-fused": fused_why,
                                                               FUSED_LORA: lora_why[1] if lora_why else None}}
        return out
    return {op: eager for op in OPERATORS}


# --- memory and fit -----------------------------------------------------------------------------
def _lines(arch, c: Config, micro_batch: int, seq_len: int, rows: int, loop: str = "eager", padded: bool = True,
           device: str = "cpu"):
    kw = dict(r=c.lora.r, modules=c.lora.target_modules, dropout=c.lora.dropout,
              dtype=c.precision.dtype, micro_batch=micro_batch, seq_len=seq_len, base_quant=c.precision.base_format)
    if loop in ("compiled", "fused"):  # memory per device: DDP replicates all but the data
        return memory.lines_compiled(arch, padded=padded, devices=c.train.device_count,
                                     ce_chunk=CE_CHUNK_ROWS if loop == "fused" else None,
                                     fp8_base=loop == "fused" and c.compile.realization == FP8_BASE, **kw)
    return memory.lines(arch, dataset_rows=rows, padded=padded, device=device, **kw)


def _nearest(arch, c: Config, rows: int, usable: int, loop: str = "eager", padded: bool = True,
             device: str = "cpu") -> dict:
    """The nearest configuration that fits: the largest micro-batch, else the longest sequence."""
    T = c.data.seq_len

    def fits(b, t):
        return memory.total(_lines(arch, c, b, t, rows, loop, padded, device)) <= usable

    if fits(1, T):
        lo, hi = 1, c.data.micro_batch
        while lo < hi:  # total is monotone in the micro-batch: bisect for the largest that fits
            mid = (lo + hi + 1) // 2
            lo, hi = (mid, hi) if fits(mid, T) else (lo, mid - 1)
        return {"data.micro_batch": lo}
    if fits(1, 1):
        lo, hi = 1, T
        while lo < hi:
            mid = (lo + hi + 1) // 2
            lo, hi = (mid, hi) if fits(1, mid) else (lo, mid - 1)
        return {"data.micro_batch": 1, "data.seq_len": lo}
    return {}


def fit_check(arch, c: Config, target: Target, rows: int, loop: str | None = None,
              padded: bool = True) -> tuple[list, dict]:
    """The memory plan (per device) and its fit proof, or a rejection. `loop` picks the memory
    model of the realization that runs (training_loop); `padded` whether batches carry padding."""
    B, T = c.data.micro_batch, c.data.seq_len
    loop = loop or training_loop(c, target)
    ls = _lines(arch, c, B, T, rows, loop, padded, target.device)
    need = memory.total(ls)
    frac = c.budget.memory_fraction
    usable = int(target.memory_bytes * frac)
    checks = [{"requirement": f"precision {c.precision.dtype} supported by {target.name}",
               "ok": c.precision.dtype in target.dtypes}]
    if not checks[0]["ok"]:
        raise CompileRejected(f"precision {c.precision.dtype} is not supported by target {target.name} "
                              f"(it offers {', '.join(target.dtypes)})", "set precision.dtype to one the target offers",
                              requirement="precision.dtype", needed=c.precision.dtype, available=list(target.dtypes))
    ok = need <= usable
    checks.append({"requirement": f"memory: plan {need} B <= {frac:g} x {target.memory_bytes} B", "ok": ok})
    if not ok:
        by = {x.name: x.bytes for x in ls}
        biggest = max(ls, key=lambda x: x.bytes)
        near = _nearest(arch, c, rows, usable, loop, padded, target.device)
        if near.get("data.micro_batch") and "data.seq_len" not in near:
            tail = f"largest micro-batch that fits: {near['data.micro_batch']}"
        elif near:
            tail = (f"no micro-batch fits at seq_len {T}; at micro-batch 1 the longest sequence that fits is "
                    f"{near['data.seq_len']}")
        else:
            tail = f"nothing fits: weights alone need {gib(by['weights'])}"
        raise CompileRejected(
            f"memory: the plan needs {gib(need)} ({biggest.name} {gib(biggest.bytes)} at micro-batch {B} x {T} "
            f"tokens); target {target.name} has {gib(target.memory_bytes)} ({gib(usable)} usable at memory_fraction "
            f"{frac:g}); {tail}",
            "use the nearest configuration that fits, shown above",
            requirement="memory", needed_bytes=need, usable_bytes=usable, lines=by, nearest=near)
    fit = {"fits": True, "needed_bytes": need, "usable_bytes": usable, "target_bytes": target.memory_bytes,
           "memory_fraction": frac, "headroom_bytes": usable - need, "checks": checks,
           "memory_model": loop, "devices": c.train.device_count, "per_device": True, "nodes": c.train.node_count}
    return ls, fit


# --- compile ------------------------------------------------------------------------------------
def _arch_for(store, c: Config):
    if c.model.base == BUILTIN_BASE:
        return model.arch_of(model.builtin_config(c.model.to_json())), None
    if c.model.base.startswith("builtin:"):
        raise SpecError(f"spec field `model.base`: unknown built-in base {c.model.base!r}",
                        f"the built-in base is {BUILTIN_BASE}", field="model.base")
    base_id = store.resolve(c.model.base)
    man = model.load_manifest(store, base_id)
    return model.arch_of(man["config"]), base_id


def _dataset_rows(store, c: Config) -> tuple[int, str | None]:
    if c.data.dataset == BUILTIN_DATASET:
        return datalib.BUILTIN_TURNS, None
    oid = store.resolve(c.data.dataset)
    return len(datalib.read_turns(store.get_bytes(oid))), oid


def _chat(store, base_id: str | None):
    """The base's encoder of turns (its tokenizer and chat template); the built-in base's is the
    byte tokenizer in the plain format."""
    if base_id is None:
        return templatelib.Chat(toklib.ByteTokenizer())
    return templatelib.for_base(store, model.load_manifest(store, base_id))


def _check_lengths(store, dataset_id: str, seq_len: int, chat) -> int:
    longest = max(len(chat.encode_turn(s, a).ids) for s, a in datalib.read_turns(store.get_bytes(dataset_id)))
    if longest > seq_len:
        raise SpecError(f"spec field `data.seq_len`: the longest turn of dataset {dataset_id[:15]}… needs "
                        f"{longest} tokens, more than seq_len {seq_len}", "raise data.seq_len", field="data.seq_len")
    return longest


def _padded(store, dataset_id: str, seq_len: int, chat) -> bool:
    """Whether any batch can carry padding (some turn is shorter than seq_len): then attention
    gets an explicit mask, which the compiled memory model counts."""
    return min(len(chat.encode_turn(s, a).ids) for s, a in datalib.read_turns(store.get_bytes(dataset_id))) < seq_len


def quant_check(spec: Spec, c: Config, arch) -> None:
    """A quantized base needs every projection's in_features to be a multiple of the format's
    block (q4b32: 32 weights share a scale), and the fused decode kernel to be out of the way
    (it reads a bf16 W)."""
    fmt = c.precision.base_format
    if fmt == "none":
        return
    ln = line_of(spec.source, "precision.base_quant") if spec.source else None
    where = f"spec field `precision.base_quant`{f' (line {ln})' if ln else ''}"
    if fmt == "q4b32":
        for m, f in model.MODULE_SHAPES.items():
            k = f(arch)[0]
            if k % memory.Q4_BLOCK:
                raise CompileRejected(f"{where}: q4b32 quantizes blocks of {memory.Q4_BLOCK} weights along in_features; "
                                      f"{m} has in_features {k}", "use base_quant = \"int8\", or a base whose "
                                      f"hidden and intermediate sizes are multiples of {memory.Q4_BLOCK}",
                                      requirement="precision.base_quant", module=m, in_features=k)
    if c.compile.realization == "cupy-fused":
        raise CompileRejected(f"{where}: realization cupy-fused reads a bf16 base weight; the base is {fmt}",
                              "set compile.realization = \"auto\"", requirement="precision.base_quant")


def world_check(spec: Spec, c: Config, rows: int) -> None:
    """Every rank of a step reads distinct rows: nodes x devices x micro_batch (one global
    micro-batch) must not exceed the dataset, or ranks would train on the same row in one step."""
    world = c.train.node_count * c.train.device_count
    need = world * c.data.micro_batch
    if world > 1 and need > rows:
        field_ = "train.nodes" if c.train.node_count > 1 else "train.devices"
        ln = line_of(spec.source, field_) if spec.source else None
        raise CompileRejected(
            f"spec field `{field_}`{f' (line {ln})' if ln else ''}: {c.train.node_count} node(s) x "
            f"{c.train.device_count} device(s) x micro_batch {c.data.micro_batch} = {need} rows per global "
            f"micro-batch, more than the dataset's {rows} rows",
            f"use at most {max(1, rows // c.data.micro_batch)} ranks in all, or a smaller data.micro_batch",
            requirement=field_, needed_rows=need, dataset_rows=rows)


def body_for(spec: Spec, target: Target, arch, inputs: dict, rows: int, longest: int | None, store=None,
             padded: bool = True) -> dict:
    c = Config.from_json(spec.config)
    real = select_realizations(spec, target, store, arch)
    loop = training_loop(c, target, real)
    ls, fit = fit_check(arch, c, target, rows, loop, padded)
    n_dev, nodes = c.train.device_count, c.train.node_count
    params = arch.params()
    lora = arch.lora_params(c.lora.r, c.lora.target_modules)
    d = c.data
    return {
        "kind": "plan", "version": PLAN_VERSION, "config": spec.config, "spec": spec.id,
        "target": {"name": target.name, "id": target.id, "device": target.device},
        "inputs": inputs,
        "shapes": {"arch": arch.to_json(), "micro_batch": d.micro_batch, "seq_len": d.seq_len,
                   "grad_accum": d.grad_accum, "steps": d.steps, "dataset_rows": rows,
                   "longest_turn": longest, "padded": padded, "devices": n_dev,
                   "tokens_per_step": d.micro_batch * d.seq_len * d.grad_accum * n_dev * nodes, "nodes": nodes,
                   "lora_modules": {m: list(model.MODULE_SHAPES[m](arch)) for m in c.lora.target_modules}},
        "parameters": {"total": sum(params.values()) + lora, "base": sum(params.values()), "trainable": lora,
                       "by_group": params},
        "memory": {"lines": [x.to_json() for x in ls], "total_bytes": memory.total(ls)},
        "realizations": real,
        "fit": fit,
        "runtime": {"threads": c.train.threads, "deterministic": target.device == "cpu",
                    "checkpoint_every": c.train.checkpoint_every, "loss": "action span only",
                    "loop": loop, "devices": n_dev,
                    "autocast": "bf16" if loop == "compiled" and c.precision.dtype == "bf16" else None,
                    # one sandboxed process per device (DDP) started by torchrun; rank 0
                    # writes every output (ledger.train.run.torchrun)
                    "launcher": "ddp" if n_dev * nodes > 1 else "python",
                    # nodes > 1: one torchrun agent per node at one c10d rendezvous (ledger.train.nodes)
                    "nodes": nodes, "rendezvous": "c10d" if nodes > 1 else "static"},
    }


def _init_adapter(store, c: Config) -> str:
    """The adapter tree a run starts from; its LoRA shape must be the spec's."""

    ref = c.lora.init_adapter
    try:
        oid = store.resolve(ref)
        files = {e["path"]: e["id"] for e in store.get_json(oid)["entries"]}
        cfg = json.loads(store.get_bytes(files["adapter_config.json"]))
        files["adapter_model.safetensors"]
    except (LedgerError, KeyError, TypeError, ValueError):
        raise SpecError(f"spec field `lora.init_adapter`: {ref!r} is not an adapter in this store",
                        "name an adapter tree (a receipt's `adapter`), or leave it empty",
                        field="lora.init_adapter") from None
    want = {"r": c.lora.r, "target_modules": sorted(c.lora.target_modules)}
    have = {"r": cfg.get("r"), "target_modules": sorted(cfg.get("target_modules") or [])}
    if want != have:
        raise SpecError(f"spec field `lora.init_adapter`: the adapter has {have}, the spec asks for {want}",
                        "start from an adapter with the same r and target modules", field="lora.init_adapter")
    return oid


class _Exists(Exception):
    pass


@dataclass(frozen=True)
class CompileResult:
    plan: Plan
    new: bool            # False when the same plan was already in the store (nothing written)
    record: dict | None  # the compile journal record, when one was appended


def compile_spec(store, spec: Spec, target: Target) -> CompileResult:
    """Check, then write the plan (and its inputs) in one `compile` transaction."""
    if spec.get("compile.target") != target.name:
        spec = spec.with_overrides({"compile.target": target.name})
    c = Config.from_json(spec.config)   # the typed view of the closed config, read once
    arch, base_id = _arch_for(store, c)
    rows, data_id = _dataset_rows(store, c)
    chat = _chat(store, base_id)
    padded = True if data_id is None else _padded(store, data_id, c.data.seq_len, chat)
    real = select_realizations(spec, target, store, arch)   # reject before writing anything
    world_check(spec, c, rows)
    quant_check(spec, c, arch)
    fit_check(arch, c, target, rows, training_loop(c, target, real), padded)
    plan = None
    try:
        with store.transaction("compile") as tx:
            if base_id is None:
                base_id = model.ensure_builtin(tx, store, c.model.to_json())
            if data_id is None:
                data_id = datalib.ensure_builtin(tx, store)
            longest = _check_lengths(store, data_id, c.data.seq_len, chat)
            man = model.load_manifest(store, base_id)
            inputs = {"base": base_id, "tokenizer": man["tokenizer"], "template": chat.template_id, "dataset": data_id}
            if c.lora.init_adapter:
                inputs["init_adapter"] = _init_adapter(store, c)
            plan = Plan(body_for(spec, target, arch, inputs, rows, longest, store, padded))
            if store.has(plan.id):
                raise _Exists
            # the base's tokenizer and template objects exist: whatever wrote the manifest wrote them
            tok_id = man["tokenizer"]
            spec_id = tx.put_json(spec.body())
            source = {"spec_source": tx.put_bytes(spec.source.encode("utf-8"), "spec-source")} if spec.source else {}
            tx.put_json(target.body())
            pid = tx.put_json(plan.body)
            tx.inputs.extend([base_id, data_id, tok_id, spec_id])
            tx.outputs.append(pid)
            records.write(tx, records.Compile(plan=pid, spec=spec_id, target=target.name, **source))
    except _Exists:
        return CompileResult(plan, False, None)
    return CompileResult(plan, True, tx.record)


def load(store, ref: str) -> Plan:
    oid = store.resolve(ref)
    p = from_body(store.get_json(oid))
    if p.id != oid:
        raise SpecError(f"{oid} is not a canonical plan")
    return p


# --- explain ------------------------------------------------------------------------------------
def _flatten(d, prefix=""):
    out = {}
    for k, v in d.items():
        key = f"{prefix}{k}"
        if isinstance(v, dict) and v:
            out.update(_flatten(v, key + "."))
        else:
            out[key] = v
    return out


def explain(a: Plan, b: Plan) -> dict:
    """What differs from plan `a` to plan `b`: config fields changed, then every derived part
    they invalidated (shapes, parameter counts, memory lines, realizations, fit, inputs)."""
    ca, cb = _flatten(a.config), _flatten(b.config)
    config = [{"field": k, "old": ca.get(k), "new": cb.get(k)} for k in sorted(set(ca) | set(cb))
              if ca.get(k) != cb.get(k)]
    derived = []

    def cmp(part, x, y):
        if x != y:
            derived.append({"part": part, "old": x, "new": y})

    for k in ("base", "tokenizer", "dataset"):
        cmp(f"inputs.{k}", a.body["inputs"].get(k), b.body["inputs"].get(k))
    cmp("target", a.body["target"]["name"], b.body["target"]["name"])
    sa, sb = _flatten(a.body["shapes"]), _flatten(b.body["shapes"])
    for k in sorted(set(sa) | set(sb)):
        cmp(f"shapes.{k}", sa.get(k), sb.get(k))
    for k in ("total", "base", "trainable"):
        cmp(f"parameters.{k}", a.body["parameters"][k], b.body["parameters"][k])
    la = {x["name"]: x["bytes"] for x in a.body["memory"]["lines"]}
    lb = {x["name"]: x["bytes"] for x in b.body["memory"]["lines"]}
    for k in sorted(set(la) | set(lb)):
        cmp(f"memory.{k}", la.get(k), lb.get(k))
    cmp("memory.total_bytes", a.body["memory"]["total_bytes"], b.body["memory"]["total_bytes"])
    for op in sorted(set(a.body["realizations"]) | set(b.body["realizations"])):
        cmp(f"realizations.{op}", (a.body["realizations"].get(op) or {}).get("name"),
            (b.body["realizations"].get(op) or {}).get("name"))
    cmp("fit.headroom_bytes", a.body["fit"]["headroom_bytes"], b.body["fit"]["headroom_bytes"])
    ra, rb = a.body["runtime"], b.body["runtime"]
    for k in sorted(set(ra) | set(rb)):
        cmp(f"runtime.{k}", ra.get(k), rb.get(k))
    return {"from": a.id, "to": b.id, "same": a.id == b.id, "config": config, "derived": derived}
