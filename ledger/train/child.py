"""The training child: `python -m ledger.train.child WORKDIR`.

It runs inside the sandbox (ledger.sandbox), granted only WORKDIR/inputs (read) and WORKDIR/out
(read-write). It reads the job the parent wrote, trains, and writes everything it produced
into out/; it never opens the store. Its contract with the parent:

  inputs/job.json      plan body, paths of base / dataset / checkpoint to resume from
  out/progress.jsonl   one JSON line per optimizer step (step, loss, tokens/s), flushed
  out/checkpoints/step-NNNNNNNN/   complete checkpoints (see checkpoint.py)
  out/adapter/         adapter_model.safetensors + adapter_config.json (finite runs only)
  out/final/           the end-of-run checkpoint (optimizer, RNG, cursor)
  out/result.json      losses, counters, timings, memory, versions, stop reason
  out/error.json       a typed error (then the exit code is 3)

Determinism (bit-exact on CPU): fixed thread count from the plan, deterministic algorithms,
seeded LoRA init, data order and dropout from the plan's seeds, the LR computed from the step
number (no scheduler state), and every piece of mutable state in the checkpoint. A resumed
run replays exactly the operations an uninterrupted one would have run after that step.
"""

from __future__ import annotations

import json
import math
import os
import platform
import sys
import time
from pathlib import Path

from ledger.errors import BadInput, LedgerError, RealizationUnavailable

CHILD_ERROR_EXIT = 3


# --- memory measurement ------------------------------------------------------------------------
def _status() -> dict:
    out = {}
    with open("/proc/self/status") as f:
        for line in f:
            k, _, v = line.partition(":")
            if k in ("VmRSS", "VmHWM"):
                out[k] = int(v.split()[0]) * 1024
    return out


def memory_baseline() -> dict:
    """RSS right before the model is built. Peak RSS is reset (clear_refs 5) when the kernel and
    the sandbox allow it; otherwise the import-time peak stays in VmHWM and is reported as a floor."""
    reset = False
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        reset = True
    except OSError:
        pass
    s = _status()
    return {"rss": s["VmRSS"], "hwm": s["VmHWM"], "reset": reset}


def memory_observed(base: dict) -> dict:
    s = _status()
    growth = s["VmHWM"] - base["rss"]
    return {"method": "peak RSS (VmHWM) minus RSS before encoding the data and building the model"
                      + ("; peak reset via /proc/self/clear_refs" if base["reset"] else "; peak not resettable here"),
            "baseline_rss_bytes": base["rss"], "peak_rss_bytes": s["VmHWM"], "peak_growth_bytes": growth,
            # Without a reset, growth below this is invisible (the import peak hides it).
            "floor_bytes": 0 if base["reset"] else base["hwm"] - base["rss"]}


# --- the job -------------------------------------------------------------------------------------
def lr_at(step: int, c: dict) -> float:
    """LR for 1-based `step`: linear warmup, then constant / linear / cosine decay to 0."""
    base, warm, total, kind = c["optimizer"]["lr"], c["schedule"]["warmup_steps"], c["data"]["steps"], c["schedule"]["kind"]
    if warm and step <= warm:
        return base * step / warm
    if kind == "constant":
        return base
    frac = (step - warm) / max(1, total - warm)
    if kind == "linear":
        return base * (1.0 - frac)
    return base * 0.5 * (1.0 + math.cos(math.pi * frac))


def check_realizations(plan: dict) -> None:
    """Selection is not fallback: a realization that cannot run here stops the run."""
    import importlib.util

    import torch

    for op, r in sorted(plan["realizations"].items()):
        if r["device"] == "cuda" and not torch.cuda.is_available():
            raise RealizationUnavailable(
                f"the plan selected {r['name']} on cuda for operator {op} (target {plan['target']['name']}), "
                "but no CUDA device is available here; nothing was trained",
                "run it on a machine with the target's GPU, or compile for --target cpu")
        if r["name"] == "torch-compiled" and importlib.util.find_spec("triton") is None:
            raise RealizationUnavailable(f"the plan selected torch-compiled for operator {op}, which needs triton; "
                                         "it is not installed here", "install torch's triton, or compile with "
                                         "compile.realization = \"torch-eager\"")
        if r["name"] == "cupy-fused":
            from ledger.kernels import runtime

            runtime.device_info()  # RealizationUnavailable: no cupy / no device
    n = plan["config"]["train"].get("devices", 1)
    if plan["target"]["device"] == "cuda" and torch.cuda.device_count() < n:
        raise RealizationUnavailable(f"the plan runs on {n} devices; {torch.cuda.device_count()} CUDA device(s) are visible",
                                     "run it on a machine with that many GPUs, or compile with train.devices = 1")


def read_rows(path: Path) -> list[tuple[str, str]]:
    from ledger.artefacts import dataset as datalib

    return datalib.read_turns(path)


def read_chat(work: Path, job: dict):
    """The base's tokenizer and chat template the parent handed over (inputs/chat), checked
    against the ids the plan pins."""
    from ledger.artefacts import template as templatelib

    inputs = job["plan"]["inputs"]
    return templatelib.read_folder(work / job["chat"], inputs["tokenizer"], inputs.get("template"))


def encode_rows(rows, seq_len: int, chat):
    """(ids, attention mask, labels) as int64 tensors [rows, seq_len]; labels only on the action span."""
    from ledger.artefacts import dataset as datalib

    return datalib.encode_rows(rows, seq_len, chat)


def batch_indices(m: int, B: int, n: int, data_seed: int, cache: dict):
    """Rows of global micro-batch `m`: consecutive slices of per-epoch seeded permutations."""
    import torch

    out = []
    for p in range(m * B, (m + 1) * B):
        epoch, j = divmod(p, n)
        if epoch not in cache:
            g = torch.Generator().manual_seed(data_seed * 1_000_003 + epoch)
            cache.clear()
            cache[epoch] = torch.randperm(n, generator=g)
        out.append(int(cache[epoch][j]))
    return out


def build(plan: dict, base_dir: Path):
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import LlamaForCausalLM

    c = plan["config"]
    dtype = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}[c["precision"]["dtype"]]
    model = LlamaForCausalLM.from_pretrained(str(base_dir), dtype=dtype, local_files_only=True)
    torch.manual_seed(c["seeds"]["lora_init"])
    lcfg = LoraConfig(r=c["lora"]["r"], lora_alpha=c["lora"]["alpha"], lora_dropout=c["lora"]["dropout"],
                      target_modules=sorted(c["lora"]["target_modules"]), bias="none", task_type="CAUSAL_LM")
    model = get_peft_model(model, lcfg)
    for n, p in model.named_parameters():
        if p.requires_grad:  # LoRA weights train in fp32 whatever the base dtype (see memory.py)
            p.data = p.data.float()
    named = sorted((n, p) for n, p in model.named_parameters() if p.requires_grad)
    return model, named


def load_init_adapter(model, folder: Path) -> None:
    """Start from an existing adapter's weights (the learn cycle continues from HEAD's)."""
    from peft import set_peft_model_state_dict
    from safetensors.torch import load_file

    res = set_peft_model_state_dict(model, load_file(str(folder / "adapter_model.safetensors")))
    if getattr(res, "unexpected_keys", None):
        raise BadInput(f"init adapter does not match the plan's model: {res.unexpected_keys[:3]}")


def adapter_tensors(model) -> dict:
    from peft import get_peft_model_state_dict

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
    import torch
    from peft import set_peft_model_state_dict

    res = set_peft_model_state_dict(model, adapter)
    if getattr(res, "unexpected_keys", None):
        raise BadInput(f"checkpoint adapter does not match the plan's model: {res.unexpected_keys[:3]}")
    for n, p in named:
        if f"{n}::step" in optim:
            opt.state[p] = {k: optim[f"{n}::{k}"].clone() for k in ("step", "exp_avg", "exp_avg_sq")}
    torch.set_rng_state(rng["torch_cpu"])


def adapter_config(model, base_id: str) -> dict:
    cfg = model.peft_config["default"].to_dict()
    for k, v in list(cfg.items()):
        if isinstance(v, (set, frozenset, tuple)):
            cfg[k] = sorted(v) if isinstance(v, (set, frozenset)) else list(v)
    cfg["target_modules"] = sorted(cfg["target_modules"])  # peft keeps a set: its order is arbitrary
    cfg["base_model_name_or_path"] = base_id
    return json.loads(json.dumps(cfg, default=str))


def versions() -> dict:
    from importlib.metadata import PackageNotFoundError, version

    out = {"python": platform.python_version()}
    for pkg in ("torch", "transformers", "peft", "safetensors", "pyarrow", "numpy", "cupy-cuda12x", "cupy-cuda13x",
                "triton", "wasmtime"):
        try:
            out[pkg] = version(pkg)
        except PackageNotFoundError:
            out[pkg] = None
    return out


def device_info() -> dict:
    import torch

    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    info = {"cpu": cpu, "machine": platform.machine(), "kernel": platform.release(),
            "torch_threads": torch.get_num_threads(), "cuda": None}
    if torch.cuda.is_available():
        props = torch.cuda.get_device_properties(torch.cuda.current_device())
        info["cuda"] = {"device": props.name, "capability": f"{props.major}.{props.minor}",
                        "visible_devices": torch.cuda.device_count(),
                        "memory_bytes": props.total_memory, "cuda_runtime": torch.version.cuda,
                        "driver": getattr(torch.cuda, "driver_version", lambda: None)() if hasattr(torch.cuda, "driver_version") else None}
    return info


class _Dist:
    """This process's place in a data-parallel run: one process per device, started by torchrun
    (ledger.train.run.torchrun), each confined by the sandbox. World size 1 is the plain run."""

    def __init__(self, plan: dict):
        import torch

        self.world = int(os.environ.get("WORLD_SIZE", "1"))
        self.rank = int(os.environ.get("RANK", "0"))
        self.local = int(os.environ.get("LOCAL_RANK", "0"))
        want = plan["config"]["train"].get("devices", 1)
        if self.world != want:
            raise RealizationUnavailable(f"the plan runs on {want} device(s) but this run has {self.world} process(es)",
                                         "launch it with `ledger train`, which starts one process per device")
        self.cuda = plan["target"]["device"] == "cuda"
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
        import torch

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


def _cpu(tensors: dict) -> dict:
    return {k: v.detach().cpu() for k, v in tensors.items()}


def _optimizer_to(opt, fused: bool) -> None:
    """Restored optimizer state lives where the parameters do (fused AdamW keeps `step` there too)."""
    for p, st in opt.state.items():
        for k, v in list(st.items()):
            st[k] = v.to(p.device) if (k != "step" or fused) else v.cpu()


def run(work: Path) -> dict:
    t_start = time.perf_counter()
    job = json.loads((work / "inputs" / "job.json").read_text())
    plan = job["plan"]
    c = plan["config"]
    out = work / "out"

    import torch

    threads = plan["runtime"]["threads"]
    torch.set_num_threads(threads)
    cuda = plan["target"]["device"] == "cuda"
    # Bit-exactness is promised on the CPU; CUDA runs the fast (non-deterministic) kernels.
    torch.use_deterministic_algorithms(not cuda)
    import transformers

    transformers.utils.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()
    check_realizations(plan)
    dist = _Dist(plan)
    if dist.writer:
        (out / "checkpoints").mkdir(parents=True, exist_ok=True)
    loop_kind = plan["runtime"].get("loop", "eager")
    autocast = plan["runtime"].get("autocast")
    fused_lora = plan["realizations"]["linear_lora"]["name"] == "cupy-fused"

    from ledger.artefacts import checkpoint as ck

    # Everything imported before the baseline, so the measured growth is the run's own memory
    # (data, model, adapter, optimizer, activations), not library code.
    import peft  # noqa: F401
    import safetensors.torch  # noqa: F401
    from transformers import LlamaForCausalLM  # noqa: F401

    # Decoding Parquet is input loading (its reader keeps codec and pool memory): done before
    # the baseline. The encoded tensors the run holds are the plan's `data` line, after it.
    rows = read_rows(work / job["dataset"])
    mem0 = memory_baseline()
    if cuda:
        torch.cuda.reset_peak_memory_stats()
    ids, mask, labels = encode_rows(rows, c["data"]["seq_len"], read_chat(work, job))
    del rows
    model, named = build(plan, work / job["base_dir"])
    peft_model = model
    kernel_op = None
    if cuda:
        model.to(dist.device)
    if fused_lora:
        from ledger.kernels import lora_train

        kernel_op = lora_train.KernelOp(lora_train.load_build(work / job["kernels"][lora_train.KERNEL]))
        want = plan["realizations"]["linear_lora"]["code_object"]
        if kernel_op.code_object != want:
            raise RealizationUnavailable(f"the kernel build handed to this run is {kernel_op.code_object}, "
                                         f"the plan names {want}")
        lora_train.install(model, kernel_op)
    if loop_kind == "compiled":
        compile_layers(model.base_model.model.model.layers)
    model.train()
    if dist.world > 1:
        from torch.nn.parallel import DistributedDataParallel as DDP

        model = DDP(model, device_ids=[dist.local] if cuda else None, gradient_as_bucket_view=True)
    d = c["optimizer"]
    fused_adam = loop_kind == "compiled"
    opt = torch.optim.AdamW([p for _, p in named], lr=d["lr"], betas=tuple(d["betas"]), eps=d["eps"],
                            weight_decay=d["weight_decay"], **({"fused": True} if fused_adam else {"foreach": False}))
    losses: list[float] = []
    start_step = 0
    if job.get("resume"):
        a, o, r, state = ck.read_dir(work / job["resume"])
        if state["plan"] != job["plan_id"]:
            raise BadInput("the checkpoint belongs to another plan")
        restore(peft_model, opt, named, a, o, r)
        if cuda:
            _optimizer_to(opt, fused_adam)
            if "torch_cuda" in r:
                torch.cuda.set_rng_state(r["torch_cuda"])
        start_step, losses = state["step"], [float(x) for x in state["losses"]]
    else:
        if job.get("init_adapter"):
            load_init_adapter(peft_model, work / job["init_adapter"])
        torch.manual_seed(c["seeds"]["dropout"])
    if cuda:
        torch.cuda.synchronize()
        mem_setup = torch.cuda.memory_allocated()
    t_ready = time.perf_counter()

    def rng_state() -> dict:
        st = {"torch_cpu": torch.get_rng_state()}
        if cuda:
            st["torch_cuda"] = torch.cuda.get_rng_state()
        return st

    B, accum, steps, n = c["data"]["micro_batch"], c["data"]["grad_accum"], c["data"]["steps"], ids.shape[0]
    perm_cache: dict = {}
    every = plan["runtime"]["checkpoint_every"]
    tokens = 0
    stopped = None
    step_times, step_cpu = [], []
    step_tokens = []
    fwd_peak = 0
    prog = open(out / "progress.jsonl", "a", buffering=1) if dist.writer else None
    t_loop = time.perf_counter()
    step = start_step
    for step in range(start_step + 1, steps + 1):
        _fault(dist.rank, step)
        t0, c0 = time.perf_counter(), time.thread_time()
        lr = lr_at(step, c)
        for g in opt.param_groups:
            g["lr"] = lr
        total = 0.0
        step_tok = 0
        for k in range(accum):
            m_index = (step - 1) * accum + k
            if dist.world == 1:
                rows = batch_indices(m_index, B, n, c["seeds"]["data"], perm_cache)
            else:  # one global micro-batch of world x B rows; this process takes its slice
                rows = batch_indices(m_index, B * dist.world, n, c["seeds"]["data"], perm_cache)
                rows = rows[dist.rank * B:(dist.rank + 1) * B]
            x, m, y = ids[rows], mask[rows], labels[rows]
            step_tok += int(m.sum())
            if cuda:
                x, m, y = (t.to(dist.device, non_blocking=True) for t in (x, m, y))
            sync_off = dist.world > 1 and k < accum - 1  # all-reduce gradients once per step
            with model.no_sync() if sync_off else _null():
                with torch.autocast("cuda", dtype=torch.bfloat16) if autocast == "bf16" else _null():
                    loss = model(input_ids=x, attention_mask=m, labels=y).loss
                if cuda:
                    fwd_peak = max(fwd_peak, torch.cuda.memory_allocated())
                (loss / accum).backward()
            total += loss.item()
        step_loss = dist.mean(total / accum)
        if dist.world > 1:
            step_tok = int(round(dist.mean(float(step_tok)) * dist.world))
        tokens += step_tok
        if not math.isfinite(step_loss):
            stopped = {"reason": "non-finite loss", "step": step, "loss": repr(step_loss)}
            opt.zero_grad(set_to_none=True)
            break
        opt.step()
        opt.zero_grad(set_to_none=True)
        losses.append(step_loss)
        el = time.perf_counter() - t_loop
        if dist.writer:
            prog.write(json.dumps({"step": step, "steps": steps, "loss": step_loss, "lr": lr,
                                   "tokens_per_s": tokens / el if el > 0 else 0.0}) + "\n")
            if step % every == 0 and step < steps:
                ck.write_dir(out / "checkpoints" / f"step-{step:08d}", adapter=_cpu(adapter_tensors(peft_model)),
                             optimizer=_cpu(optimizer_tensors(opt, named)), rng=rng_state(),
                             state={"plan": job["plan_id"], "step": step, "cursor": {"next_step": step + 1, "micro_batch": step * accum},
                                    "losses": losses})
        if cuda:
            torch.cuda.synchronize()  # the step's optimizer kernels belong to its time
        step_times.append(time.perf_counter() - t0)  # the whole step: progress and checkpoints too
        # CPU time of the compute thread: unlike wall time, not moved by other processes' load
        step_cpu.append(time.thread_time() - c0)
        step_tokens.append(step_tok)
    t_end = time.perf_counter()
    if prog is not None:
        prog.close()
    loop_s = t_end - t_loop
    mem = memory_observed(mem0)
    if cuda:
        mine = {"device": dist.local, "peak_allocated_bytes": torch.cuda.max_memory_allocated(),
                "peak_reserved_bytes": torch.cuda.max_memory_reserved(), "after_setup_bytes": mem_setup,
                "forward_peak_bytes": fwd_peak}
        per = dist.gather(mine)
        peak = max(x["peak_allocated_bytes"] for x in per)
        predicted = plan["memory"]["total_bytes"]
        mem["cuda"] = {"method": "torch.cuda.max_memory_allocated over the whole child (per device; the plan is per device)",
                       "peak_allocated_bytes": peak, "predicted_bytes": predicted,
                       "prediction_error": predicted / peak - 1 if peak else None, "per_device": per}
    done = step if stopped is None else step - 1
    # Steady state: without the first steps, which compile the layers (torch-compiled) and
    # allocate the optimizer state.
    warm = min(2, max(0, len(step_times) - 1))
    steady_s, steady_tok = sum(step_times[warm:]), sum(step_tokens[warm:])
    timing_list = sorted(step_times)
    result = {
        "steps_done": done, "start_step": start_step, "losses": losses, "stopped": stopped,
        "counters": {"optimizer_steps": done - start_step, "micro_batches": (done - start_step) * accum, "tokens": tokens},
        "timings": {"total_s": time.perf_counter() - t_start, "setup_s": t_ready - t_start, "train_s": loop_s,
                    "step_median_s": timing_list[len(timing_list) // 2] if timing_list else None,
                    "step_cpu_median_s": sorted(step_cpu)[len(step_cpu) // 2] if step_cpu else None,
                    "tokens_per_s": tokens / loop_s if loop_s > 0 else None,
                    "steady_tokens_per_s": steady_tok / steady_s if steady_s > 0 else None,
                    "steady_steps": len(step_times) - warm, "first_step_s": step_times[0] if step_times else None},
        "memory": mem, "versions": versions(), "device": device_info(),
        "determinism": {"threads": threads, "deterministic_algorithms": torch.are_deterministic_algorithms_enabled(),
                        "pythonhashseed": os.environ.get("PYTHONHASHSEED"),
                        "allocator_env": {k: v for k, v in sorted(os.environ.items()) if k.startswith("MALLOC_")}},
    }
    result["device"]["distributed"] = {"world_size": dist.world, "backend": dist.backend,
                                       # torchrun sets TORCHELASTIC_RUN_ID in every worker it starts
                                       "launcher": "torchrun" if os.environ.get("TORCHELASTIC_RUN_ID") else None,
                                       "loss": "mean over processes (all-reduced)" if dist.world > 1 else "single process"}
    if kernel_op is not None:
        result["device"]["fused_kernel"] = {"code_object": kernel_op.code_object, "fused_calls": kernel_op.calls}
    if dist.writer:
        if stopped is None:
            (out / "adapter").mkdir()
            from safetensors.torch import save_file

            save_file(_cpu(adapter_tensors(peft_model)), str(out / "adapter" / "adapter_model.safetensors"),
                      metadata={"format": "pt"})
            (out / "adapter" / "adapter_config.json").write_text(
                json.dumps(adapter_config(peft_model, plan["inputs"]["base"]), sort_keys=True, indent=2) + "\n")
        ck.write_dir(out / "final", adapter=_cpu(adapter_tensors(peft_model)), optimizer=_cpu(optimizer_tensors(opt, named)),
                     rng=rng_state(),
                     state={"plan": job["plan_id"], "step": done, "cursor": {"next_step": done + 1, "micro_batch": done * accum},
                            "losses": losses})
        (out / "result.json").write_text(json.dumps(result, sort_keys=True))
    dist.close()
    return result


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
        import signal

        os.kill(os.getpid(), signal.SIGKILL)


def _die_with_parent() -> None:
    """A parent that is killed must not leave a training child running unobserved."""
    try:
        import ctypes
        import signal

        ctypes.CDLL(None).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
        if os.getppid() == 1:
            os._exit(1)
    except (OSError, AttributeError):
        pass


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("usage: python -m ledger.train.child WORKDIR", file=sys.stderr)
        return 2
    _die_with_parent()
    work = Path(argv[0])
    try:
        run(work)
    except LedgerError as e:
        try:  # the first rank to fail names the error
            with open(work / "out" / "error.json", "x") as f:
                f.write(json.dumps(e.to_json(), sort_keys=True, default=str))
        except FileExistsError:
            pass
        print(f"error: {e.message}", file=sys.stderr)
        return CHILD_ERROR_EXIT
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
