"""Train: execute a plan in a sandboxed child and commit what it produced.

The parent (this module) never trains. It
  1. materialises the plan's declared inputs -- base files, dataset, the checkpoint to resume
     from -- into a fresh work folder (inputs/ read-only to the child, out/ read-write);
  2. launches `python -m ledger.train.child WORK` through ledger.sandbox, which grants the
     child those two folders and the system paths Python needs, nothing else (not the store,
     not the sealed suite);
  3. while the child runs, reports its progress and commits each complete checkpoint it writes
     as a `checkpoint` transaction, so a crash of either process loses at most K steps;
  4. ingests the outputs -- adapter, final optimizer/RNG/cursor state, receipt -- in ONE `train`
     transaction whose payload names the receipt.

`unsandboxed=True` runs the child without Landlock; the receipt says so.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import socket
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from ledger import errors, records
from ledger.artefacts import checkpoint as ck
from ledger.artefacts import model as modellib
from ledger.artefacts import template as templatelib
from ledger.errors import BadInput, InternalError
from ledger.plan import compile as comp
from ledger.plan.plan import Plan as PlanView
from ledger.store import canonical, trees
from ledger.train import compile_cache as ccache
from ledger.train import job
from ledger.train import receipt as rcpt

_PASS_ENV = ("PATH", "LANG", "LC_ALL", "TZ", "CUDA_VISIBLE_DEVICES", "NVIDIA_VISIBLE_DEVICES", "LEDGER_DEBUG",
             "LEDGER_FAULT_RANK",   # tests: a rank that dies mid-run (ledger.train.child._fault)
             "OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE",
             # glibc allocator knobs change memory use, never results; the receipt records them
             "MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_", "MALLOC_ARENA_MAX")


@dataclass(frozen=True)
class RunOutput:
    """What one child execution left behind (before the final transaction)."""
    work: Path
    result: dict | None
    checkpoints: tuple[str, ...] = ()
    sandbox: dict = field(default_factory=dict)
    returncode: int = 0
    stderr: str = ""
    final: tuple[dict, dict] | None = None     # ({file: bytes}, state) of out/final, read safely
    adapter: dict | None = None                # {file: (bytes, mode)} of out/adapter, or None
    compile_cache: dict | None = None          # the handed cache (key, env, shape, id) + "files" read on a miss


@dataclass(frozen=True)
class TrainResult:
    receipt_id: str
    receipt: dict
    record: dict

    @property
    def rung(self) -> str:
        return self.receipt["rung"]

    @property
    def adapter(self) -> str | None:
        return self.receipt["adapter"]

    def to_json(self) -> dict:
        return {"receipt": self.receipt_id, "rung": self.rung, "adapter": self.adapter,
                "stopped": self.receipt["stopped"], "plan": self.receipt["plan"],
                "steps": self.receipt["cursor"]["end_step"], "final_loss": (self.receipt["losses"] or [None])[-1],
                "tokens_per_s": self.receipt["timings"].get("tokens_per_s"),
                "memory": {"predicted_bytes": self.receipt["memory"]["predicted_bytes"],
                           "observed_growth_bytes": self.receipt["memory"]["observed"]["peak_growth_bytes"]},
                "checkpoints": self.receipt["checkpoints"], "sandboxed": self.receipt["sandbox"].get("sandboxed")}


def check_runnable_here(plan: PlanView) -> None:
    """Fail before materialising anything when the plan's realization cannot run on this machine.

    The child checks again where it executes; this is only the early, cheap answer."""
    if any(r.device == "cuda" for r in plan.realizations.values()):
        import torch

        names = ", ".join(sorted({r.name for r in plan.realizations.values()}))
        if not torch.cuda.is_available():
            raise errors.RealizationUnavailable(
                f"the plan selected {names} on cuda (target {plan.target.name}), but no CUDA device is "
                "available here; nothing was trained",
                "run it on a machine with the target's GPU, or compile for --target cpu")
        # every node agent runs on this host (ledger.train.nodes): all nodes' devices must be here
        n = plan.world
        if torch.cuda.device_count() < n:
            what = f"{plan.nodes} nodes x {plan.devices} devices" if plan.nodes > 1 else f"{n} devices"
            raise errors.RealizationUnavailable(
                f"the plan runs on {what}; {torch.cuda.device_count()} CUDA device(s) are visible here",
                "run it on a machine with that many GPUs, or compile with train.devices = 1")


def prepare(store, plan: comp.Plan, resume: tuple[str, dict] | None, work: Path,
            compile_cache: str | None = None) -> None:
    """Fill work/inputs/ with what the plan declares (the child reads nothing else), and the
    compile cache of the plan's shape when there is one (ledger.train.compile_cache)."""
    inputs = work / "inputs"
    view = plan.view
    man = modellib.load_manifest(store, view.inputs.base)
    trees.materialise_tree(store, man["files"], inputs / "base")
    # the base's tokenizer and chat template: the child encodes the turns with them
    templatelib.write_folder(templatelib.for_base(store, man), inputs / "chat")
    store.export_file(view.inputs.dataset, inputs / "dataset.parquet")
    spec = {"plan": plan.body, "plan_id": plan.id, "base_dir": "inputs/base", "dataset": "inputs/dataset.parquet",
            "chat": "inputs/chat", "resume": None}
    if view.inputs.init_adapter:
        trees.materialise_tree(store, view.inputs.init_adapter, inputs / "init_adapter")
        spec["init_adapter"] = "inputs/init_adapter"
    fused = view.realizations.get("linear_lora")
    if fused is not None and fused.name == "cupy-fused":
        # The child cannot read the store: it gets the exact build the plan names (body, source,
        # PTX, cubin), and checks the cubin against the plan's code object before loading it.
        kdir = inputs / "kernels" / fused.kernel
        kdir.mkdir(parents=True)
        body = store.get_json(fused.build)
        (kdir / "body.json").write_text(json.dumps(body, sort_keys=True))
        for name, key in (("source", "source_id"), ("ptx", "ptx"), ("cubin", "cubin")):
            store.export_file(body[key], kdir / name)
        spec["kernels"] = {fused.kernel: f"inputs/kernels/{fused.kernel}"}
    if resume is not None:
        cid, cman = resume
        if cman["plan"] != plan.id:
            raise BadInput(f"checkpoint {cid[:15]}… belongs to plan {cman['plan'][:15]}…, not {plan.id[:15]}…",
                           "resume with the plan the checkpoint was made by")
        ck.materialise(store, cman, inputs / "checkpoint")
        spec["resume"] = "inputs/checkpoint"
    if ccache.uses_cache(view):
        shape, env = ccache.shape_of(plan.body), ccache.environment()
        key, cid = ccache.lookup(store, shape, env, compile_cache)   # a mismatched cache is refused here
        if cid is not None:
            ccache.materialise(store, cid, work / ccache.INPUT_DIR)
        spec["compile_cache"] = {"key": key, "env": env, "shape": shape, "id": cid,
                                 "dir": ccache.INPUT_DIR if cid else None, "stable_path": ccache.settled(work)}
    elif compile_cache:
        raise BadInput("--compile-cache names a compile cache, but this plan compiles nothing",
                       "it applies to CUDA plans with a torch-compiled or fused-lora realization")
    (inputs / "job.json").write_text(json.dumps(spec, sort_keys=True))


def child_env(work: Path, plan: PlanView) -> dict:
    env = job.child_env(work, plan.runtime.threads, _PASS_ENV)
    if not plan.cuda:
        # deterministic algorithms (a CPU plan's bit-exactness) refuse cuBLAS calls without a
        # fixed workspace configuration; a CUDA child runs the non-deterministic kernels and
        # keeps torch's own default (32 MiB on Hopper, the plan's workspace line). Issue 20,
        # session 7: the SmolLM2-shape fused loop with it, 114 ms a step (cold cache); without
        # it, 104 ms cold and 79 ms warm -- never A/B'd in one run (benchmarks/RESULTS.md).
        env["CUBLAS_WORKSPACE_CONFIG"] = ":4096:8"
    if plan.runtime.loop_kind in ("compiled", "fused"):
        # Inductor compiles in a pool of worker processes by default; a confined child grants
        # /proc/self to itself only, so its workers cannot run there: compile in-process.
        env.setdefault("TORCHINDUCTOR_COMPILE_THREADS", "1")
        # the child's private, writable Inductor/Triton cache, seeded from the compile cache
        env["TORCHINDUCTOR_CACHE_DIR"] = str(work / ccache.SCRATCH_DIR)
    if plan.world > 1:
        # Collective settings of this machine travel to the DDP processes (NCCL_*, ...); NVLink
        # multicast stays off unless asked for: a LoRA's gradients are small, and on shared
        # hosts multicast can take GPUs out of service.
        collective = ("NCCL_", "TORCH_SYMM_MEM_", "NVSHMEM_", "GLOO_")
        env.update({k: v for k, v in os.environ.items() if k.startswith(collective)})
        env.setdefault("NCCL_NVLS_ENABLE", "0")
        env.setdefault("TORCH_SYMM_MEM_DISABLE_MULTICAST", "1")
        env.setdefault("NVSHMEM_DISABLE_NVLS", "1")
        # NCCL's cuMem path passes memory handles between ranks over abstract unix sockets, which
        # Landlock (ABI 6) scopes to the sandbox that made them -- and every rank is its own
        # sandbox. The legacy CUDA IPC path exchanges its handles over NCCL's TCP connections.
        env.setdefault("NCCL_CUMEM_ENABLE", "0")
    return env


def child_argv(work: Path) -> list[str]:
    """The child's command line (one place, so a test can replace the child)."""
    return job.module_argv("ledger.train.child", work)


def limits(plan: PlanView) -> job.Limits:
    """What the child may write: adapter and optimizer files sized by the memory plan (plus
    safetensors headers), progress and JSON by the step count."""
    tensors = plan.shapes.lora_tensors
    return job.Limits(steps=plan.shapes.steps,
                      adapter_bytes=job.tensor_file_bound(plan.memory.line("adapter"), tensors),
                      optimizer_bytes=job.tensor_file_bound(plan.memory.line("optimizer_state"), 3 * tensors))


def child_job(store, work: Path, plan: comp.Plan, *, unsandboxed: bool, timeout: float | None = None,
              name: str | None = None) -> job.ChildJob:
    view = plan.view
    n, nodes = view.devices, view.nodes
    # Several devices: data-parallel (DDP), one process per device. Their rendezvous store and
    # the NCCL/gloo bootstrap talk TCP on loopback, so such a policy allows TCP (recorded in the
    # receipt's sandbox policy); the filesystem grants are the same as for one process.
    policy = job.policy_for(store, work, gpu=view.cuda, network=view.world > 1)
    env = child_env(work, view)
    launcher, net = (tuple(torchrun(n)) if n > 1 else ()), "host"
    if nodes > 1:
        # N node agents on this host at one c10d rendezvous; all of them, and every rank, in a
        # network namespace of loopback alone (Landlock restricts TCP by port only, and the
        # rendezvous and gloo pick ports at run time): they reach each other and nothing else.
        endpoint, run_id = f"127.0.0.1:{_free_port()}", f"ledger-{work.name}"
        launcher, net = tuple(node_agents(nodes, n, endpoint, run_id)), ("host" if unsandboxed else "loopback")
        env["LEDGER_RENDEZVOUS"] = json.dumps({"backend": "c10d", "endpoint": endpoint, "id": run_id,
                                               "network": "loopback namespace" if net == "loopback" else "host"},
                                              sort_keys=True)
        env.setdefault("GLOO_SOCKET_IFNAME", "lo")     # the only interface there is
    return job.ChildJob(trainer="sft", work=work, argv=tuple(child_argv(work)), env=env,
                        policy=policy, limits=limits(view), launcher=launcher, net=net,
                        processes=view.world, unsandboxed=unsandboxed, timeout=timeout, plan=plan.id, name=name)


def node_agents(nodes: int, devices: int, endpoint: str, run_id: str) -> list[str]:
    """`nodes` torchrun agents on this host meeting at one c10d rendezvous (ledger.train.nodes),
    each starting `devices` ranks; like torchrun(), unconfined and without the audit hook (-E)."""
    return [sys.executable, "-E", "-m", "ledger.train.nodes", f"--nodes={nodes}", f"--nproc-per-node={devices}",
            f"--endpoint={endpoint}", f"--id={run_id}", "--"]


def torchrun(n: int) -> list[str]:
    """torchrun starting `n` ranks on this host, each of them the sandbox's bootstrap.

    torchrun itself runs unconfined (it is torch's launcher, with ledger's own authority, and
    reads none of the run's inputs); `-E` keeps the audit hook out of it. Each rank confines
    ITSELF: Landlock grants /proc/self as the /proc/<pid> of the process that confines itself,
    so workers forked by one confined process could neither initialise CUDA (the driver names
    its threads through /proc/self/task) nor measure their memory. No restarts (a failed step
    is not retried behind the receipt's back); torchrun stops the other ranks when one fails,
    the ranks die with torchrun, and torchrun dies with this process."""
    return [sys.executable, "-E", "-m", "torch.distributed.run", "--nnodes=1", f"--nproc-per-node={n}",
            "--rdzv-backend=static", "--node-rank=0", "--master-addr=127.0.0.1", f"--master-port={_free_port()}",
            "--max-restarts=0", "--monitor-interval=0.1", "--no-python"]


def _free_port() -> int:

    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _last_words(stderr: str) -> str | None:
    """The line of a failed child's output that says what went wrong: torchrun's summary (the
    rank it saw fail first, then every other rank that failed, with exit statuses), else the
    last line with words in it. torchrun orders failures by whole-second timestamps, so when
    ranks fall together its "first" can be a rank that only followed its peer down."""
    if "Root Cause" in stderr:
        root = re.search(r"Root Cause.*?rank\s*:\s*(\d+).*?exitcode\s*:\s*(-?\d+)", stderr, re.S)
        failed = dict(re.findall(r"rank\s*:\s*(\d+)[^\n]*\n\s*exitcode\s*:\s*(-?\d+)", stderr))
        if root:
            failed.pop(root.group(1), None)
            rest = "".join(f"; then rank {r}, exit status {x}" for r, x in sorted(failed.items()))
            return f"rank {root.group(1)} failed first, exit status {root.group(2)}{rest}"
    return next((line.strip() for line in reversed(stderr.splitlines()) if any(c.isalnum() for c in line)), None)


def _crashed(returncode: int, stderr: str, sandbox: dict, checkpoints: list[str]) -> InternalError:
    last = f"; resume with --resume {checkpoints[-1]}" if checkpoints else ""
    said = _last_words(stderr)
    denied = sandbox["denied_attempts"]
    # A denial is a lead, not a verdict: healthy runs are denied harmless reads too (e.g.
    # /proc/mounts), so the hint names one and the details list them all.
    hint = (f"its sandbox denied {len(denied)} access(es), e.g. {denied[0]['op']} {denied[0]['path']}; "
            if denied else "") + ("rerun with LEDGER_DEBUG=1 to see the child's output; "
                                  "checkpoints committed so far are kept")
    return InternalError(f"the training child exited with {returncode}" + (f" ({said[:300]})" if said else "") + last,
                         hint, stderr=stderr[-8000:], denied_attempts=denied[:50])


# what receipt.build reads from out/result.json (checked before it is read: job.check_result)
RESULT_TYPES = {"steps_done": int, "start_step": int, "losses": list, "stopped": (type(None), dict), "counters": dict,
                "timings": dict, "memory": dict, "versions": dict, "device": dict, "determinism": dict}

_STEP_DIR = re.compile(r"step-(\d{8})")
_STEP_TMP = re.compile(r"step-\d{8}\.tmp")   # being written: never read


def _checkpoint_bounds(lim: job.Limits) -> dict[str, int]:
    return {ck.FILES["adapter"]: lim.adapter_bytes, ck.FILES["optimizer"]: lim.optimizer_bytes,
            ck.FILES["rng"]: lim.rng_bytes, ck.STATE: lim.state_bytes}


def read_checkpoint(outputs: job.ChildOutputs, rel: str, plan_id: str, step: int | None) -> tuple[dict, dict]:
    """({file: bytes}, state) of checkpoint folder out/<rel>, checked: exactly the checkpoint's
    files, each within its bound, and a state naming this plan (and `step`, when given)."""
    files = outputs.read_folder(rel, _checkpoint_bounds(outputs.limits))
    if files is None:
        raise job.Refusal(job.Violation(rel, "missing"))
    try:
        state = canonical.loads(files[ck.STATE][0])
    except BadInput:
        raise job.Refusal(job.Violation(f"{rel}/{ck.STATE}", "not JSON")) from None
    cursor = state.get("cursor") if isinstance(state, dict) else None
    if (not isinstance(state, dict) or state.get("plan") != plan_id or not isinstance(state.get("step"), int)
            or isinstance(state.get("step"), bool) or (step is not None and state["step"] != step)
            or not isinstance(state.get("losses"), list) or not isinstance(cursor, dict)
            or not all(isinstance(cursor.get(k), int) for k in ("next_step", "micro_batch"))):
        raise job.Refusal(job.Violation(f"{rel}/{ck.STATE}", f"a state that does not name plan {plan_id[:15]}… "
                                                              f"{'' if step is None else f'and step {step} '}"
                                                              "with its losses and cursor"))
    return {name: data for name, (data, _) in files.items()}, state


def execute(store, plan: comp.Plan, *, resume: str | None = None, unsandboxed: bool = False,
            progress=None, compile_cache: str | None = None) -> RunOutput:
    """Materialise, run the child, commit its checkpoints as they appear. The caller removes
    run.work (`store.discard_work_folder`)."""
    check_runnable_here(plan.view)
    resumed = None
    if resume:
        job.check_resumable(store, resume)
        resumed = ck.load_manifest(store, resume)
    work = home = job.new_work(store, "train")
    try:
        if ccache.uses_cache(plan.view):   # the same absolute paths in every run of this shape
            work = ccache.settle(home, ccache.cache_key(ccache.shape_of(plan.body), ccache.environment()))
        prepare(store, plan, resumed, work, compile_cache)
        out = _execute(store, plan, work, unsandboxed, progress, home.name)
    except BaseException:
        ccache.unsettle(work, home)
        store.discard_work_folder(home)
        raise
    ccache.unsettle(work, home)
    return dataclasses.replace(out, work=home)


def _execute(store, plan: comp.Plan, work: Path, unsandboxed: bool, progress, name: str | None = None) -> RunOutput:
    cj = child_job(store, work, plan, unsandboxed=unsandboxed, name=name)
    done: set[str] = set()

    def poll(outputs: job.ChildOutputs) -> list[str]:
        committed = []
        for name in outputs.list_folder("checkpoints", _STEP_DIR, _STEP_TMP):
            if name in done:
                continue
            blobs, state = read_checkpoint(outputs, f"checkpoints/{name}", plan.id, int(name[5:]))
            with store.transaction("checkpoint", wait=60) as tx:
                cid = ck.ingest(tx, blobs, state)
                tx.inputs.append(plan.id)
                tx.outputs.append(cid)
                records.write(tx, records.Checkpoint(checkpoint=cid, plan=plan.id, step=state["step"], run=cj.run_name))
            done.add(name)
            committed.append(cid)
        return committed

    def collect(outputs: job.ChildOutputs, result: dict) -> tuple:
        final = read_checkpoint(outputs, "final", plan.id, None)
        adapter = None
        if result.get("stopped") is None:
            adapter = outputs.read_folder("adapter", {"adapter_model.safetensors": outputs.limits.adapter_bytes,
                                                      "adapter_config.json": outputs.limits.config_bytes})
            if adapter is None:
                raise job.Refusal(job.Violation("adapter", "missing from a run that finished"))
        job.check_result(result, RESULT_TYPES)
        if not isinstance(result["counters"].get("optimizer_steps"), int):
            raise job.Refusal(job.Violation("result.json", "field 'counters' lacks an integer optimizer_steps"))
        cache = None
        if handed is not None:
            cache = dict(handed)
            if handed["id"] is None:   # a miss: the child's new cache, read as hostile as the rest
                cache["files"] = outputs.read_tree(ccache.OUTPUT_DIR, ccache.MAX_BYTES, ccache.MAX_FILES,
                                                   ccache.MAX_DEPTH)
        return final, adapter, cache

    handed = json.loads((work / "inputs" / "job.json").read_text()).get("compile_cache")
    fin = job.run_job(store, cj, progress=progress, poll=poll, collect=collect, describe_failure=_crashed)
    final, adapter, cache = fin.collected
    return RunOutput(work=work, result=fin.result, checkpoints=fin.checkpoints, sandbox=fin.sandbox,
                     returncode=fin.returncode, stderr=fin.stderr, final=final, adapter=adapter,
                     compile_cache=cache)


def commit(tx, plan: comp.Plan, run: RunOutput, resumed_from: str | None) -> tuple[str, dict]:
    """Write the run's outputs and receipt into `tx` (a train or reproduce transaction)."""
    final_id = ck.ingest(tx, *run.final)
    final_manifest = tx.store.get_json(final_id)
    adapter = job.put_tree_bytes(tx, run.adapter) if run.adapter is not None else None
    body = rcpt.build(plan_id=plan.id, plan=plan.view, result=run.result, final_checkpoint=final_id,
                      final_manifest=final_manifest, adapter=adapter, checkpoints=list(run.checkpoints),
                      resumed_from=resumed_from, sandbox=run.sandbox)
    cc = run.compile_cache
    if cc is not None:
        built = None
        if cc["id"] is None and cc.get("files"):
            built = ccache.put(tx, cc["files"], cc["shape"], cc["env"], cc["key"], plan.id)
            tx.outputs.append(built)
        elif cc["id"] is not None:
            tx.inputs.append(cc["id"])
        # which compiled artefacts the run used (a hit) or left for the next run of its shape
        body["compile_cache"] = {"key": cc["key"], "id": cc["id"] or built, "hit": cc["id"] is not None,
                                 "built": built is not None, "env": cc["env"]}
    rid = tx.put_json(body)
    b = plan.view.inputs
    tx.inputs.extend([plan.id, b.base, b.dataset, b.tokenizer] + ([resumed_from] if resumed_from else []))
    tx.outputs.extend([rid, final_id] + ([adapter] if adapter else []))
    return rid, body


def train(store, plan_ref: str, *, resume: str | None = None, unsandboxed: bool = False, progress=None,
          compile_cache: str | None = None) -> TrainResult:
    plan = comp.load(store, plan_ref)
    resume_id = store.resolve(resume) if resume else None
    t0 = time.time()
    run = execute(store, plan, resume=resume_id, unsandboxed=unsandboxed, progress=progress,
                  compile_cache=compile_cache)
    try:
        with store.transaction("train", wait=60) as tx:
            rid, body = commit(tx, plan, run, resume_id)
            records.write(tx, records.Train(receipt=rid, plan=plan.id, adapter=body["adapter"], rung=body["rung"],
                                            unsandboxed=unsandboxed, wall_s=round(time.time() - t0, 3)))
    finally:
        store.discard_work_folder(run.work)
    return TrainResult(rid, body, tx.record)
