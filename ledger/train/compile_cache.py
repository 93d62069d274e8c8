"""Compile once: the Inductor/Triton artefacts of a plan shape, kept as ledger objects.

A CUDA plan whose realization is compiled (torch-compiled, fused-lora) spends its first step in
dynamo, AOTAutograd, Inductor and Triton. What they produce depends only on the plan's SHAPE
(the realizations, the model's architecture, micro-batch x sequence, dtype, the LoRA shape and
scale) and on the ENVIRONMENT that compiles it (the GPU and its compute capability, torch,
triton and CUDA versions) -- not on the data, the learning rate, the seeds or the step count, so
every later cycle of the same plan shape can reuse it.

  key       = BLAKE3 of canonical JSON {kind, version, shape, env}
  manifest  = {"kind": "compile-cache", "version", "key", "shape", "env", "files": <tree>, "bytes",
               "files_count", "built_by": <plan id>}, ref `compile-cache/<key hex>` -> the manifest

The parent (ledger.train.run) looks the key up before it launches the child and hands a hit in
as a read-only input (inputs/compile-cache/); the child copies it into its private, writable
Inductor cache folder (scratch/inductor, TORCHINDUCTOR_CACHE_DIR) before it compiles anything.
A miss: the child leaves its cache folder in out/compile-cache/, which the parent reads like
every other child output -- hostile: walked by descriptor, no links, regular files only, at
most MAX_FILES files and MAX_BYTES bytes, at most MAX_DEPTH folders deep (ChildOutputs.read_tree)
-- and stores it in the run's `train` transaction, moving the ref.

MUST: a cache built for another shape, device or library version is refused before anything
is compiled, never used (CompileCacheRefused naming each field that differs): by the parent
for a cache named explicitly (`ledger train --compile-cache ID`), and by the child, which
compares the environment it runs in with the one the cache was keyed by.
"""

from __future__ import annotations

import importlib.metadata
import os
import shutil
import stat
from pathlib import Path

from ledger.errors import BadInput, CompileCacheRefused
from ledger.store import canonical, trees
from ledger.store.ids import hash_bytes, hex_of

KIND = "compile-cache"
VERSION = 1
MAX_BYTES = 1 << 30       # an Inductor cache of one plan shape is tens of MB
MAX_FILES = 20_000
MAX_DEPTH = 12
REF_PREFIX = "compile-cache/"
INPUT_DIR = "inputs/compile-cache"
OUTPUT_DIR = "compile-cache"          # under out/
SCRATCH_DIR = "scratch/inductor"      # the child's TORCHINDUCTOR_CACHE_DIR
ENV_FIELDS = ("device", "capability", "torch", "triton", "cuda")
STABLE_PREFIX = "train-inductor-"     # the work folder of a compiled run, named by its cache key


def uses_cache(plan) -> bool:
    """Whether the plan (typed view) compiles anything the cache can hold."""
    return plan.cuda and plan.runtime.loop_kind in ("compiled", "fused")


def shape_of(body: dict) -> dict:
    """What the compiled artefacts depend on, from a plan body (no data, lr, seeds or steps)."""
    c, sh = body["config"], body["shapes"]
    return {"realizations": {op: r["name"] for op, r in sorted(body["realizations"].items())},
            "arch": sh["arch"], "micro_batch": sh["micro_batch"], "seq_len": sh["seq_len"],
            "dtype": c["precision"]["dtype"], "base_format": c["precision"].get("base_format", "none"),
            "lora": {"r": c["lora"]["r"], "alpha": c["lora"]["alpha"],
                     "target_modules": sorted(c["lora"]["target_modules"])},
            "loop": body["runtime"].get("loop"), "autocast": body["runtime"].get("autocast")}


def environment() -> dict:
    """The compiling environment: GPU, compute capability, torch / triton / CUDA versions."""
    import torch  # the GPU's name and capability: only for a CUDA plan, which imports torch anyway

    try:
        triton = importlib.metadata.version("triton")
    except importlib.metadata.PackageNotFoundError:
        triton = None
    if not torch.cuda.is_available():
        return {"device": None, "capability": None, "torch": torch.__version__, "triton": triton,
                "cuda": torch.version.cuda}
    cc = torch.cuda.get_device_capability(0)
    return {"device": torch.cuda.get_device_name(0), "capability": f"{cc[0]}.{cc[1]}", "torch": torch.__version__,
            "triton": triton, "cuda": torch.version.cuda}


def cache_key(shape: dict, env: dict) -> str:
    return hash_bytes(canonical.dumps({"kind": KIND, "version": VERSION, "shape": shape, "env": env}))


def ref_name(key: str) -> str:
    return REF_PREFIX + hex_of(key)


def mismatches(manifest: dict, shape: dict, env: dict) -> list[str]:
    """Each field in which a cache manifest differs from this shape and environment."""
    out = [f"env.{k}: the cache was built with {manifest.get('env', {}).get(k)!r}, this run has {env.get(k)!r}"
           for k in ENV_FIELDS if (manifest.get("env") or {}).get(k) != env.get(k)]
    if manifest.get("shape") != shape:
        have = manifest.get("shape") or {}
        diff = sorted(k for k in set(have) | set(shape) if have.get(k) != shape.get(k))
        out.append(f"shape: the cache was built for another plan shape (differs in {', '.join(diff)})")
    return out


def check(manifest: dict, shape: dict, env: dict, cache_id: str) -> None:
    """Refuse (CompileCacheRefused) a cache built for another shape or environment."""
    if not isinstance(manifest, dict) or manifest.get("kind") != KIND or manifest.get("version") != VERSION:
        raise BadInput(f"{cache_id} is not a compile cache", "pass the id a receipt names under compile_cache")
    bad = mismatches(manifest, shape, env)
    if bad:
        raise CompileCacheRefused(f"compile cache {cache_id[:15]}… refused, not used: {bad[0]}"
                                  + (f" (and {len(bad) - 1} more)" if len(bad) > 1 else ""),
                                  cache=cache_id, mismatches=bad)


def lookup(store, shape: dict, env: dict, explicit: str | None = None) -> tuple[str, str | None]:
    """(key, cache id or None): the explicitly named cache (checked) or the ref of this key."""
    key = cache_key(shape, env)
    if explicit:
        cid = store.resolve(explicit)
        check(store.get_json(cid), shape, env, cid)
        return key, cid
    cid = store.state.refs.get(ref_name(key))
    if cid is not None:  # a ref of this key names a manifest of this key; checked all the same
        check(store.get_json(cid), shape, env, cid)
    return key, cid


def materialise(store, cache_id: str, dest: Path) -> None:
    trees.materialise_tree(store, store.get_json(cache_id)["files"], dest)


def put(tx, files: dict, shape: dict, env: dict, key: str, plan_id: str) -> str:
    """Store a cache read from the child (ChildOutputs.read_tree) and move its ref."""
    from ledger.train import job  # job imports the sandbox: only where a run is committed

    tree = job.put_tree_bytes(tx, files)
    man = {"kind": KIND, "version": VERSION, "key": key, "shape": shape, "env": env, "files": tree,
           "bytes": sum(len(d) for d, _ in files.values()), "files_count": len(files), "built_by": plan_id}
    cid = tx.put_json(man, KIND)
    tx.refs[ref_name(key)] = cid
    return cid


def settle(work: Path, key: str) -> Path:
    """The parent's side of the autotune records (see enter): the fresh work folder renamed to a
    name fixed by the cache key, so that every run of a plan shape compiles at the SAME absolute
    paths. A rename keeps the folder's inode, so its flock (Store.work_folder: gc keeps a live
    folder) holds. When a run of the same shape holds that name (a non-empty folder: the rename
    fails), the folder keeps its own name and the child runs without autotune records. The
    caller renames it back (unsettle) before the store removes it."""
    stable = work.parent / (STABLE_PREFIX + hex_of(key)[:24])
    try:
        os.rename(work, stable)
    except OSError:
        return work
    return stable


def unsettle(work: Path, home: Path) -> None:
    if work != home:
        try:
            os.rename(work, home)
        except OSError:   # never left behind under the shared name: the next run would take it
            shutil.rmtree(work, ignore_errors=True)


def settled(work: Path) -> bool:
    return work.name.startswith(STABLE_PREFIX)


# --- the child's side ----------------------------------------------------------------------------
def enter(work: Path, spec: dict | None) -> Path:
    """Before anything compiles: check the environment, and seed the private Inductor cache
    folder with the handed cache (a copy: the input is read-only). Returns the folder."""
    folder = Path(os.environ.get("TORCHINDUCTOR_CACHE_DIR") or work / SCRATCH_DIR)
    folder.mkdir(parents=True, exist_ok=True)
    import torch._inductor.config as inductor_config  # the child imports torch already

    # Inductor bakes the ABSOLUTE path of each kernel's autotune record into the code it
    # caches. In a work folder settled under its cache key's name (settle) those paths are the
    # same in every run of the shape, so the records are kept and reused; elsewhere a reused
    # cache would read (denied) and write (denied: another work folder) the first run's paths,
    # so there the records are off and the kernels re-tune at start (seconds).
    inductor_config.autotune_local_cache = bool(spec and spec.get("stable_path"))
    if spec is None:
        return folder
    env = environment()
    bad = [f"env.{k}: the cache was keyed with {spec['env'].get(k)!r}, this process has {env.get(k)!r}"
           for k in ENV_FIELDS if spec["env"].get(k) != env.get(k)]
    if bad:
        raise CompileCacheRefused(f"compile cache refused in the training child, not used: {bad[0]}",
                                  mismatches=bad, cache=spec.get("id"))
    if spec.get("id"):
        _copy_regular(work / spec["dir"], folder)
    return folder


def leave(folder: Path, out: Path) -> None:
    """A new cache (a miss): the cache folder's regular files into out/compile-cache/."""
    _copy_regular(folder, out / OUTPUT_DIR)


def _copy_regular(src: Path, dest: Path) -> None:
    """Regular files only, links never followed (Inductor writes nothing else worth keeping)."""
    src_b = os.fsencode(src)
    for dirpath, dirnames, filenames in os.walk(src_b, followlinks=False):
        rel = os.path.relpath(dirpath, src_b)
        for name in filenames:
            p = os.path.join(dirpath, name)
            if not stat.S_ISREG(os.lstat(p).st_mode) or name.endswith(b".lock"):
                continue
            target = Path(os.fsdecode(os.path.join(os.fsencode(dest), rel, name)))
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(p, target, follow_symlinks=False)
