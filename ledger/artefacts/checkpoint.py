"""Checkpoints: adapter + optimizer state + RNG state + data cursor, as store objects.

On disk (the child writes it, the parent ingests it) a checkpoint is a folder:
    adapter_model.safetensors   LoRA weights (peft state-dict names)
    optimizer.safetensors       AdamW exp_avg / exp_avg_sq / step per parameter name
    rng.safetensors             torch CPU generator state (uint8 tensor)
    state.json                  step, cursor, losses so far, plan id (canonical JSON)
Nothing is pickled: tensors are safetensors, the rest canonical JSON, so a checkpoint from an
untrusted source can at worst be malformed (BadInput), never run code.

The child writes into `<name>.tmp/` and renames it to `<name>/` when every file is fsynced, so
a folder without the suffix is always complete; the parent ingests only those.

In the store a checkpoint is a manifest {"kind": "checkpoint", "plan", "step", "adapter",
"optimizer", "rng", "state"} whose blobs are the three safetensors files.
"""

from __future__ import annotations

import os
from pathlib import Path

from ledger.errors import BadInput
from ledger.store import canonical

FILES = {"adapter": "adapter_model.safetensors", "optimizer": "optimizer.safetensors", "rng": "rng.safetensors"}
STATE = "state.json"


def _fsync_file(p: Path) -> None:
    fd = os.open(p, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_dir(dest: Path, *, adapter: dict, optimizer: dict, rng: dict, state: dict) -> None:
    """Write a complete checkpoint folder atomically (tmp folder + rename)."""
    from safetensors.torch import save_file

    tmp = dest.with_name(dest.name + ".tmp")
    tmp.mkdir(parents=True, exist_ok=False)
    for key, tensors in (("adapter", adapter), ("optimizer", optimizer), ("rng", rng)):
        save_file({k: tensors[k].contiguous() for k in sorted(tensors)}, str(tmp / FILES[key]), metadata={"format": "pt"})
    (tmp / STATE).write_bytes(canonical.dumps(state))
    for f in (*FILES.values(), STATE):
        _fsync_file(tmp / f)
    os.rename(tmp, dest)


def read_dir(src: Path) -> tuple[dict, dict, dict, dict]:
    """(adapter, optimizer, rng, state) tensors/JSON of a checkpoint folder."""
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    try:
        out = [load_file(str(src / FILES[k])) for k in ("adapter", "optimizer", "rng")]
        state = canonical.loads((src / STATE).read_bytes())
    except (OSError, SafetensorError, BadInput) as e:
        raise BadInput(f"checkpoint at {src} is unreadable: {e}", "resume from another checkpoint") from None
    if not isinstance(state, dict) or not isinstance(state.get("step"), int) or not isinstance(state.get("losses"), list):
        raise BadInput(f"checkpoint at {src} has a malformed state.json")
    return out[0], out[1], out[2], state


def ingest(tx, blobs: dict[str, bytes], state: dict) -> str:
    """Put one checkpoint into the store from its files' bytes ({file name: bytes}, read by the
    parent without following links: ledger.train.job) and its checked state; returns the
    manifest id."""
    ids = {k: tx.put_bytes(blobs[f]) for k, f in FILES.items()}
    return tx.put_json({"kind": "checkpoint", "plan": state["plan"], "step": state["step"], **ids, "state": state})


def load_manifest(store, ref: str) -> tuple[str, dict]:
    oid = store.resolve(ref)
    m = store.get_json(oid)
    if not isinstance(m, dict) or m.get("kind") != "checkpoint":
        raise BadInput(f"{oid} is not a checkpoint", "pass a checkpoint id from `ledger log` (kind checkpoint)")
    return oid, m


def materialise(store, manifest: dict, dest: Path) -> None:
    dest.mkdir(parents=True, exist_ok=True)
    for k, f in FILES.items():
        store.export_file(manifest[k], dest / f)
    (dest / STATE).write_bytes(canonical.dumps(manifest["state"]))
