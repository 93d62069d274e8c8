"""The SFT recipe: supervised LoRA training of a compiled plan (`python -m ledger.train.child WORK`).

Read top to bottom: `SftRecipe.setup` builds the data, model, adapter and optimizer the plan
names (and restores a checkpoint when resuming), `train` runs the optimizer steps, `save` writes
the adapter, the final state and out/result.json. The plan is read once, into the typed view
(ledger.plan.plan.Plan); the child's contract with its parent is in ledger/train/child.py.

Determinism (bit-exact on CPU): fixed thread count from the plan, deterministic algorithms,
seeded LoRA init, data order and dropout from the plan's seeds, the LR computed from the step
number (no scheduler state), and every piece of mutable state in the checkpoint. A resumed
run replays exactly the operations an uninterrupted one would have run after that step.

This module runs in the child only: torch and friends are imported at its top, before the
memory baseline is taken, so the measured growth is the run's own memory, not library code.
"""

from __future__ import annotations

import gc
import importlib.util
import json
import math
import os
import signal
import time
from pathlib import Path

import peft  # noqa: F401 - imported before the memory baseline (see the module docstring)
import safetensors.torch
import torch
import transformers
from peft import LoraConfig, get_peft_model, get_peft_model_state_dict, set_peft_model_state_dict
from transformers import LlamaForCausalLM

from ledger.artefacts import checkpoint as ck
from ledger.artefacts import dataset as datalib
from ledger.artefacts import template as templatelib
from ledger.errors import BadInput, RealizationUnavailable
from ledger.kernels import qlinear
from ledger.plan.plan import Config, Plan
from ledger.train import compile_cache as ccache
from ledger.train import runtime

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


# --- small parts ---------------------------------------------------------------------------------
def lr_at(step: int, c: Config) -> float:
    """LR for 1-based `step`: linear warmup, then constant / linear / cosine decay to 0."""
    base, warm, total, kind = c.optimizer.lr, c.schedule.warmup_steps, c.data.steps, c.schedule.kind
    if warm and step <= warm:
        return base * step / warm
    if kind == "constant":
        return base
    frac = (step - warm) / max(1, total - warm)
    if kind == "linear":
        return base * (1.0 - frac)
    return base * 0.5 * (1.0 + math.cos(math.pi * frac))


def check_realizations(plan: Plan) -> None:
    """Selection is not fallback: a realization that cannot run here stops the run."""
    for op, r in sorted(plan.realizations.items()):
        if r.device == "cuda" and not torch.cuda.is_available():
            raise RealizationUnavailable(
                f"the plan selected {r.name} on cuda for operator {op} (target {plan.target.name}), "
                "but no CUDA device is available here; nothing was trained",
                "run it on a machine with the target's GPU, or compile for --target cpu")
        if r.name in ("torch-compiled", "fused-lora", "fp8-base") and importlib.util.find_spec("triton") is None:
            raise RealizationUnavailable(f"the plan selected torch-compiled for operator {op}, which needs triton; "
                                         "it is not installed here", "install torch's triton, or compile with "
                                         "compile.realization = \"torch-eager\"")
        if r.name == "cupy-fused":
            from ledger.kernels import runtime as kernel_runtime  # cupy: only for a fused plan

            kernel_runtime.device_info()  # RealizationUnavailable: no cupy / no device
    n = plan.devices
    if plan.cuda and torch.cuda.device_count() < n:
        raise RealizationUnavailable(f"the plan runs on {n} devices; {torch.cuda.device_count()} CUDA device(s) "
                                     "are visible",
                                     "run it on a machine with that many GPUs, or compile with train.devices = 1")


def read_rows(path: Path) -> list[tuple[str, str]]:
    return datalib.read_turns(path)


def read_chat(work: Path, job: dict, plan):
    """The base's tokenizer and chat template the parent handed over (inputs/chat), checked
    against the ids the plan pins."""
    return templatelib.read_folder(work / job["chat"], plan.inputs.tokenizer, plan.inputs.template)


def encode_rows(rows, seq_len: int, chat):
    """(ids, attention mask, labels) as int64 tensors [rows, seq_len]; labels only on the action
    span (action tokens + end-of-turn), each turn encoded by the base's chat (artefacts/dataset.py)."""
    return datalib.encode_rows(rows, seq_len, chat)


def batch_indices(m: int, B: int, n: int, data_seed: int, cache: dict):
    """Rows of global micro-batch `m`: consecutive slices of per-epoch seeded permutations."""
    out = []
    for p in range(m * B, (m + 1) * B):
        epoch, j = divmod(p, n)
        if epoch not in cache:
            g = torch.Generator().manual_seed(data_seed * 1_000_003 + epoch)
            cache.clear()
            cache[epoch] = torch.randperm(n, generator=g)
        out.append(int(cache[epoch][j]))
    return out


def build(c: Config, base_dir: Path):
    """The base model with a freshly seeded LoRA adapter; (model, sorted trainable parameters)."""
    model = LlamaForCausalLM.from_pretrained(str(base_dir), dtype=DTYPES[c.precision.dtype], local_files_only=True)
    if c.precision.base_format != "none":   # QLoRA: the frozen projections held in q4b32 / int8
        qlinear.quantize_model_(model, c.precision.base_format)
    torch.manual_seed(c.seeds.lora_init)
    lcfg = LoraConfig(r=c.lora.r, lora_alpha=c.lora.alpha, lora_dropout=c.lora.dropout,
                      target_modules=sorted(c.lora.target_modules), bias="none", task_type="CAUSAL_LM")
    model = get_peft_model(model, lcfg)
    for n, p in model.named_parameters():
        if p.requires_grad:  # LoRA weights train in fp32 whatever the base dtype (see memory.py)
            p.data = p.data.float()
    named = sorted((n, p) for n, p in model.named_parameters() if p.requires_grad)
    return model, named


def load_init_adapter(model, folder: Path) -> None:
    """Start from an existing adapter's weights (the learn cycle continues from HEAD's)."""
    res = set_peft_model_state_dict(model, safetensors.torch.load_file(str(folder / "adapter_model.safetensors")))
    if getattr(res, "unexpected_keys", None):
        raise BadInput(f"init adapter does not match the plan's model: {res.unexpected_keys[:3]}")


def adapter_tensors(model) -> dict:
    return {k: v.detach().clone() for k, v in sorted(get_peft_model_state_dict(model).items())}


def optimizer_tensors(opt, named) -> dict:
    out = {}
    for n, p in named:
        st = opt.state.get(p)
        if st:
            for k in ("exp_avg", "exp_avg_sq", "step"):
                out[f"{n}::{k}"] = st[k].detach().clone().reshape(st[k].shape)
    return out


def restore(model, opt, named, adapter: dict, optim: dict, rng: dict) -> None:
    res = set_peft_model_state_dict(model, adapter)
    if getattr(res, "unexpected_keys", None):
        raise BadInput(f"checkpoint adapter does not match the plan's model: {res.unexpected_keys[:3]}")
    for n, p in named:
        if f"{n}::step" in optim:
            opt.state[p] = {k: optim[f"{n}::{k}"].clone() for k in ("step", "exp_avg", "exp_avg_sq")}
    torch.set_rng_state(rng["torch_cpu"])


def adapter_config(model, base_id: str) -> dict:
    """adapter_config.json as peft writes it, made canonical (sorted modules, the base's id)."""
    cfg = model.peft_config["default"].to_dict()
    for k, v in list(cfg.items()):
        if isinstance(v, (set, frozenset, tuple)):
            cfg[k] = sorted(v) if isinstance(v, (set, frozenset)) else list(v)
    cfg["target_modules"] = sorted(cfg["target_modules"])  # peft keeps a set: its order is arbitrary
    cfg["base_model_name_or_path"] = base_id
    return json.loads(json.dumps(cfg, default=str))


class Dist:
    """This process's place in a data-parallel run: one process per device, started by torchrun
    (ledger.train.run.torchrun), each confined by the sandbox. World size 1 is the plain run."""

    def __init__(self, plan: Plan):
        self.world = int(os.environ.get("WORLD_SIZE", "1"))
        self.rank = int(os.environ.get("RANK", "0"))
        self.local = int(os.environ.get("LOCAL_RANK", "0"))
        self.node = int(os.environ.get("GROUP_RANK", "0"))   # torchrun: this rank's node (agent) rank
        if self.world != plan.world:
            raise RealizationUnavailable(f"the plan runs on {plan.world} rank(s) ({plan.nodes} node(s) x "
                                         f"{plan.devices} device(s)) but this run has {self.world} "
                                         "process(es)",
                                         "launch it with `ledger train`, which starts one process per device")
        self.cuda = plan.cuda
        self.device = torch.device("cuda", self.local) if self.cuda else torch.device("cpu")
        if self.cuda:
            torch.cuda.set_device(self.device)
        self.backend = None
        if self.world > 1:
            import torch.distributed as dist

            self.backend = "nccl" if self.cuda else "gloo"
            dist.init_process_group(self.backend)
            self.dist = dist

    @property
    def writer(self) -> bool:
        return self.rank == 0

    def mean(self, value: float) -> float:
        """The mean over processes (every process gets the same number, so all of them take
        the same decisions -- stopping on a non-finite loss included)."""
        if self.world == 1:
            return value
        t = torch.tensor([value], dtype=torch.float64, device=self.device)
        self.dist.all_reduce(t)
        return float(t.item()) / self.world

    def gather(self, obj):
        if self.world == 1:
            return [obj]
        out = [None] * self.world
        self.dist.all_gather_object(out, obj)
        return out

    def close(self) -> None:
        if self.world > 1:
            self.dist.barrier()
            self.dist.destroy_process_group()


def compile_layers(layers) -> None:
    """torch.compile every decoder layer: one graph, the same shapes for all of them.

    Each layer is its own module, and dynamo counts a compile per layer against its recompile
    limit (8 by default); past it, dynamo silently runs the remaining layers eagerly -- on an
    H200 a 22-layer plan ran 14 layers eagerly that way (more memory than the plan, slower).
    The limit is raised to cover every layer and hitting it is made an error: selection is
    not fallback."""
    import torch._dynamo as dynamo

    need = len(layers) + 8
    for name in ("recompile_limit", "cache_size_limit"):   # the older name is an alias
        if hasattr(dynamo.config, name):
            setattr(dynamo.config, name, max(int(getattr(dynamo.config, name)), need))
    if hasattr(dynamo.config, "fail_on_recompile_limit_hit"):
        dynamo.config.fail_on_recompile_limit_hit = True
    for layer in layers:
        layer.compile()


def fusedlib_groups():
    from ledger.train import fused as fusedlib  # loaded already where a fused plan runs

    return fusedlib.GROUPS


def _cpu(tensors: dict) -> dict:
    return {k: v.detach().cpu() for k, v in tensors.items()}


def _optimizer_to(opt, fused: bool) -> None:
    """Restored optimizer state lives where the parameters do (fused AdamW keeps `step` there too)."""
    for p, st in opt.state.items():
        for k, v in list(st.items()):
            st[k] = v.to(p.device) if (k != "step" or fused) else v.cpu()


class _FusedLoss(torch.nn.Module):
    """The fused-lora forward as a module that owns the peft model's parameters, so DDP can wrap
    it like the model itself (its forward is what DDP's reducer hooks)."""

    def __init__(self, peft_model, fused):
        super().__init__()
        self.peft_model = peft_model
        self.fused = fused

    def forward(self, input_ids, labels):
        return self.fused.loss(input_ids, labels)


class _null:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def _fault(rank: int, step: int) -> None:
    """LEDGER_FAULT_RANK=R:S (tests): rank R SIGKILLs itself as it starts step S, the way a rank
    lost to the OOM killer or a driver fault goes: no error file."""
    spec = os.environ.get("LEDGER_FAULT_RANK")
    if spec and spec == f"{rank}:{step}":
        os.kill(os.getpid(), signal.SIGKILL)


# --- the recipe ----------------------------------------------------------------------------------
class SftRecipe:
    """setup -> train -> save, over one work folder (ledger.train.recipe.Recipe)."""

    def __init__(self, work: Path):
        self.t_start = time.perf_counter()
        self.work = work
        self.out = work / "out"
        self.job = json.loads((work / "inputs" / "job.json").read_text())
        self.plan = Plan.from_json(self.job["plan"])   # the one read of the plan in the child
        self.c = self.plan.config

    # setup ----------------------------------------------------------------------------------
    def setup(self) -> None:
        plan, c, job, work = self.plan, self.c, self.job, self.work
        torch.set_num_threads(plan.runtime.threads)
        self.cuda = plan.cuda
        # Bit-exactness is promised on the CPU; CUDA runs the fast (non-deterministic) kernels.
        torch.use_deterministic_algorithms(not self.cuda)
        transformers.utils.logging.set_verbosity_error()
        transformers.utils.logging.disable_progress_bar()
        check_realizations(plan)
        self.dist = dist = Dist(plan)
        if dist.writer:
            (self.out / "checkpoints").mkdir(parents=True, exist_ok=True)
        self.loop_kind = plan.runtime.loop_kind

        # Decoding Parquet is input loading (its reader keeps codec and pool memory): done before
        # the baseline. The encoded tensors the run holds are the plan's `data` line, after it.
        rows = read_rows(work / job["dataset"])
        self.mem0 = runtime.memory_baseline()
        if self.cuda:
            torch.cuda.reset_peak_memory_stats()
        self.ids, self.mask, self.labels = encode_rows(rows, c.data.seq_len, read_chat(work, job, plan))
        del rows
        model, self.named = build(c, work / job["base_dir"])
        self.peft_model = model
        self.kernel_op = None
        if self.cuda:
            model.to(dist.device)
        if plan.realizations["linear_lora"].name == "cupy-fused":
            from ledger.kernels import lora_train  # cupy: only for a fused plan

            self.kernel_op = lora_train.KernelOp(lora_train.load_build(work / job["kernels"][lora_train.KERNEL]))
            want = plan.realizations["linear_lora"].code_object
            if self.kernel_op.code_object != want:
                raise RealizationUnavailable(f"the kernel build handed to this run is {self.kernel_op.code_object}, "
                                             f"the plan names {want}")
            lora_train.install(model, self.kernel_op)
        # compile once: the handed Inductor cache seeds the private cache folder before anything
        # compiles (a cache for another device or library version is refused here)
        self.cache_spec = job.get("compile_cache")
        self.cache_dir = ccache.enter(work, self.cache_spec) if self.cache_spec is not None else None
        self.fused = None
        if self.loop_kind == "compiled":
            compile_layers(model.base_model.model.model.layers)
        elif self.loop_kind == "fused":
            from ledger.train import fused as fusedlib  # the fused realization: CUDA plans only

            fp8 = plan.realizations["linear_lora"].name == "fp8-base"   # fp8 frozen base GEMMs (gated below)
            self.fused = fusedlib.FusedLlama(model, c.lora.dropout, attention=plan.realizations["attention"].name,
                                             base_gemm="fp8" if fp8 else "bf16")
            model = _FusedLoss(model, self.fused)
        model.train()
        if dist.world > 1:
            from torch.nn.parallel import DistributedDataParallel as DDP

            model = DDP(model, device_ids=[dist.local] if self.cuda else None, gradient_as_bucket_view=True)
        self.model = model
        o = c.optimizer
        self.fused_adam = self.loop_kind in ("compiled", "fused")
        self.opt = torch.optim.AdamW([p for _, p in self.named], lr=o.lr, betas=tuple(o.betas), eps=o.eps,
                                     weight_decay=o.weight_decay,
                                     **({"fused": True} if self.fused_adam else {"foreach": False}))
        self.losses: list[float] = []
        self.start_step = 0
        if job.get("resume"):
            a, opt_state, r, state = ck.read_dir(work / job["resume"])
            if state["plan"] != job["plan_id"]:
                raise BadInput("the checkpoint belongs to another plan")
            restore(self.peft_model, self.opt, self.named, a, opt_state, r)
            if self.cuda:
                _optimizer_to(self.opt, self.fused_adam)
                if "torch_cuda" in r:
                    torch.cuda.set_rng_state(r["torch_cuda"])
            self.start_step, self.losses = state["step"], [float(x) for x in state["losses"]]
        else:
            if job.get("init_adapter"):
                load_init_adapter(self.peft_model, work / job["init_adapter"])
            torch.manual_seed(c.seeds.dropout)
        self.numerics_gate = None
        if self.fused is not None and self.fused.base_gemm == "fp8":
            self._numerics_gate()   # before anything trains; a failure stops the run (exit 3)
        self.mem_setup = None
        if self.cuda:
            torch.cuda.synchronize()
            self.mem_setup = torch.cuda.memory_allocated()
        # Everything setup built (modules, peft's wrappers, the tokenizer, the plan, transformers'
        # caches) lives for the whole run: frozen, the cyclic collector no longer walks it at
        # each full collection the step's short-lived objects trigger. Only collection timing
        # changes: no object's life, no result. (Issue 20, session 7: landed with dropping
        # CUBLAS_WORKSPACE_CONFIG from CUDA children, ledger/train/run.py; together they took the
        # sandboxed SmolLM2-shape step from 156 to 92 ms -- which of the two did it was not
        # separated; a fresh process's loop spent 0.2-0.6 ms a step in the collector.)
        gc.collect()
        gc.freeze()
        self.t_ready = time.perf_counter()

    def _numerics_gate(self) -> None:
        """fp8-base against fused-lora's bf16 base GEMMs on the first micro-batch this run trains
        on, with the plan's tolerances (ledger.train.numerics); the adapter is left as it was."""
        from ledger.train import numerics  # fp8-base plans only

        c, dist = self.c, self.dist
        B, n = c.data.micro_batch, self.ids.shape[0]
        m_index = self.start_step * c.data.grad_accum
        rows = batch_indices(m_index, B * dist.world, n, c.seeds.data, {})[dist.rank * B:(dist.rank + 1) * B]
        x, y = (t[rows].to(dist.device) for t in (self.ids, self.labels))
        # the gate's steps move the adapter as AdamW's first step would: sign(g) x lr
        tol = numerics.Tolerance.from_json({**self.plan.realizations["linear_lora"].numerics_gate,
                                            "update": c.optimizer.lr})
        f = self.fused
        self.numerics_gate = numerics.run(f.name, lambda: f.loss(x, y, base_gemm="bf16-dequantized"),
                                          lambda: f.loss(x, y), list(self.named), tol,
                                          base=lambda: f.loss(x, y, base_gemm="bf16"))

    def _rng_state(self) -> dict:
        st = {"torch_cpu": torch.get_rng_state()}
        if self.cuda:
            st["torch_cuda"] = torch.cuda.get_rng_state()
        return st

    def _checkpoint(self, dest: Path, step: int) -> None:
        accum = self.c.data.grad_accum
        ck.write_dir(dest, adapter=_cpu(adapter_tensors(self.peft_model)),
                     optimizer=_cpu(optimizer_tensors(self.opt, self.named)), rng=self._rng_state(),
                     state={"plan": self.job["plan_id"], "step": step,
                            "cursor": {"next_step": step + 1, "micro_batch": step * accum}, "losses": self.losses})

    # train ----------------------------------------------------------------------------------
    def train(self) -> None:
        c, dist, model, opt = self.c, self.dist, self.model, self.opt
        B, accum, steps, n = c.data.micro_batch, c.data.grad_accum, c.data.steps, self.ids.shape[0]
        autocast = self.plan.runtime.autocast
        every = self.plan.runtime.checkpoint_every
        perm_cache: dict = {}
        self.tokens, self.stopped = 0, None
        self.step_times, self.step_cpu, self.step_tokens, self.step_host = [], [], [], []
        self.fwd_peak = 0
        prog = open(self.out / "progress.jsonl", "a", buffering=1) if dist.writer else None
        self.t_loop = time.perf_counter()
        step = self.start_step
        for step in range(self.start_step + 1, steps + 1):
            _fault(dist.rank, step)
            t0, c0 = time.perf_counter(), time.thread_time()
            lr = lr_at(step, c)
            for g in opt.param_groups:
                g["lr"] = lr
            total = 0.0
            step_tok = 0
            host = 0.0
            for k in range(accum):
                h0 = time.perf_counter()
                m_index = (step - 1) * accum + k
                if dist.world == 1:
                    rows = batch_indices(m_index, B, n, c.seeds.data, perm_cache)
                else:  # one global micro-batch of world x B rows; this process takes its slice
                    rows = batch_indices(m_index, B * dist.world, n, c.seeds.data, perm_cache)
                    rows = rows[dist.rank * B:(dist.rank + 1) * B]
                x, m, y = self.ids[rows], self.mask[rows], self.labels[rows]
                step_tok += int(m.sum())
                if self.cuda:
                    x, m, y = (t.to(dist.device, non_blocking=True) for t in (x, m, y))
                sync_off = dist.world > 1 and k < accum - 1  # all-reduce gradients once per step
                with model.no_sync() if sync_off else _null():
                    if self.fused is not None:   # no mask: rows are right-padded (ledger.train.fused)
                        loss = model(x, y)
                    else:
                        with torch.autocast("cuda", dtype=torch.bfloat16) if autocast == "bf16" else _null():
                            loss = model(input_ids=x, attention_mask=m, labels=y).loss
                    if self.cuda:
                        self.fwd_peak = max(self.fwd_peak, torch.cuda.memory_allocated())
                    (loss / accum).backward()
                # the host's share: until here the work is only queued on a GPU (no sync yet), so
                # a host time near the step time says the step waits on Python, not on the GPU
                host += time.perf_counter() - h0
                total += loss.item()
            step_loss = dist.mean(total / accum)
            if dist.world > 1:
                step_tok = int(round(dist.mean(float(step_tok)) * dist.world))
            self.tokens += step_tok
            if not math.isfinite(step_loss):
                self.stopped = {"reason": "non-finite loss", "step": step, "loss": repr(step_loss)}
                opt.zero_grad(set_to_none=True)
                break
            opt.step()
            opt.zero_grad(set_to_none=True)
            self.losses.append(step_loss)
            el = time.perf_counter() - self.t_loop
            if dist.writer:
                prog.write(json.dumps({"step": step, "steps": steps, "loss": step_loss, "lr": lr,
                                       "tokens_per_s": self.tokens / el if el > 0 else 0.0}) + "\n")
                if step % every == 0 and step < steps:
                    self._checkpoint(self.out / "checkpoints" / f"step-{step:08d}", step)
            if self.cuda:
                torch.cuda.synchronize()  # the step's optimizer kernels belong to its time
            self.step_times.append(time.perf_counter() - t0)  # the whole step: progress and checkpoints too
            # CPU time of the compute thread: unlike wall time, not moved by other processes' load
            self.step_cpu.append(time.thread_time() - c0)
            self.step_tokens.append(step_tok)
            self.step_host.append(host)
        self.t_end = time.perf_counter()
        if prog is not None:
            prog.close()
        self.done = step if self.stopped is None else step - 1

    # save -----------------------------------------------------------------------------------
    def save(self) -> dict:
        c, dist, plan = self.c, self.dist, self.plan
        accum = c.data.grad_accum
        loop_s = self.t_end - self.t_loop
        mem = runtime.memory_observed(self.mem0)
        if self.cuda:
            mine = {"device": dist.local, "peak_allocated_bytes": torch.cuda.max_memory_allocated(),
                    "peak_reserved_bytes": torch.cuda.max_memory_reserved(), "after_setup_bytes": self.mem_setup,
                    "forward_peak_bytes": self.fwd_peak}
            per = dist.gather(mine)
            peak = max(x["peak_allocated_bytes"] for x in per)
            predicted = plan.memory.total_bytes
            mem["cuda"] = {"method": "torch.cuda.max_memory_allocated over the whole child (per device; the plan is "
                                     "per device)",
                           "peak_allocated_bytes": peak, "predicted_bytes": predicted,
                           "prediction_error": predicted / peak - 1 if peak else None, "per_device": per}
        # every rank says where it ran (a collective: all ranks reach save() together)
        self.ranks = sorted(dist.gather({"rank": dist.rank, "node": dist.node, "local_rank": dist.local}),
                            key=lambda x: x["rank"]) if plan.nodes > 1 else None
        done, start = self.done, self.start_step
        # Steady state: without the first steps, which compile the layers (torch-compiled) and
        # allocate the optimizer state.
        st = self.step_times
        warm = min(2, max(0, len(st) - 1))
        steady_s, steady_tok = sum(st[warm:]), sum(self.step_tokens[warm:])
        timing_list = sorted(st)
        result = {
            "steps_done": done, "start_step": start, "losses": self.losses, "stopped": self.stopped,
            "counters": {"optimizer_steps": done - start, "micro_batches": (done - start) * accum,
                         "tokens": self.tokens},
            "timings": {"total_s": time.perf_counter() - self.t_start, "setup_s": self.t_ready - self.t_start,
                        "train_s": loop_s,
                        "step_median_s": timing_list[len(timing_list) // 2] if timing_list else None,
                        "step_cpu_median_s": sorted(self.step_cpu)[len(self.step_cpu) // 2] if self.step_cpu else None,
                        "step_host_median_s": sorted(self.step_host)[len(self.step_host) // 2] if self.step_host else None,
                        "tokens_per_s": self.tokens / loop_s if loop_s > 0 else None,
                        "steady_tokens_per_s": steady_tok / steady_s if steady_s > 0 else None,
                        "steady_steps": len(st) - warm, "first_step_s": st[0] if st else None},
            "memory": mem, "versions": runtime.versions(), "device": runtime.device_info(),
            "determinism": {"threads": plan.runtime.threads,
                            "deterministic_algorithms": torch.are_deterministic_algorithms_enabled(),
                            "pythonhashseed": os.environ.get("PYTHONHASHSEED"),
                            "allocator_env": {k: v for k, v in sorted(os.environ.items()) if k.startswith("MALLOC_")}},
        }
        result["device"]["distributed"] = {
            "world_size": dist.world, "backend": dist.backend,
            # torchrun sets TORCHELASTIC_RUN_ID in every worker it starts
            "launcher": "torchrun" if os.environ.get("TORCHELASTIC_RUN_ID") else None,
            "loss": "mean over processes (all-reduced)" if dist.world > 1 else "single process"}
        if self.plan.nodes > 1:
            # where every rank ran: its node (the rendezvous's agent rank) and its rank on that node
            result["device"]["distributed"].update({
                "nodes": self.plan.nodes, "ranks": self.ranks,
                "rendezvous": json.loads(os.environ.get("LEDGER_RENDEZVOUS", "null"))})
        if self.fused is not None:
            result["device"]["fused_lora"] = {"attention": self.fused.attention, "groups": [list(g[1]) for g in
                                                                                            fusedlib_groups()],
                                              "realization": self.fused.name, "base_gemm": self.fused.base_gemm}
        if self.numerics_gate is not None:
            result["device"]["numerics_gate"] = self.numerics_gate
        if self.kernel_op is not None:
            result["device"]["fused_kernel"] = {"code_object": self.kernel_op.code_object,
                                                "fused_calls": self.kernel_op.calls}
        if dist.writer:
            if self.stopped is None:
                (self.out / "adapter").mkdir()
                safetensors.torch.save_file(_cpu(adapter_tensors(self.peft_model)),
                                            str(self.out / "adapter" / "adapter_model.safetensors"),
                                            metadata={"format": "pt"})
                (self.out / "adapter" / "adapter_config.json").write_text(
                    json.dumps(adapter_config(self.peft_model, plan.inputs.base), sort_keys=True, indent=2) + "\n")
            self._checkpoint(self.out / "final", done)
            if self.cache_spec is not None and self.cache_spec.get("id") is None:
                ccache.leave(self.cache_dir, self.out)   # a new cache for the next run of this shape
            (self.out / "result.json").write_text(json.dumps(result, sort_keys=True))
        dist.close()
        return result
