"""Compiled-module cache: wasmtime `Module.serialize()` artefacts under `.ledger/cache/wasm/`.

Compiling a module costs milliseconds to seconds; deserializing a compiled artefact costs
microseconds, so calls never recompile. Deserializing is only safe for bytes this store wrote
(wasmtime maps them as native code), so:
  * an entry is keyed by the module id, the wasmtime version and the engine configuration
    (runtime.engine_key), so an artefact is only ever loaded by the engine that made it;
  * the artefact file is named by the BLAKE3 of its bytes, and a sidecar `<key>.json` written
    after it records that hash and size; bytes are hashed and compared before deserializing.
Two writers racing on one key each leave a consistent pair (artefact first, then sidecar).
An entry that does not verify is removed, reported as a store warning, and rebuilt from the
module object (which is itself verified on read) — it is a cache, never a source of truth.
"""

from __future__ import annotations

import atexit
import json
import threading
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path

from ledger.capabilities import runtime
from ledger.store import canonical, fsio
from ledger.store.ids import hash_bytes

MEMORY_ENTRIES = 64


@dataclass
class Stats:
    memory_hits: int = 0
    disk_hits: int = 0
    misses: int = 0
    rejected: int = 0


stats = Stats()
_lock = threading.Lock()
_memory: "OrderedDict[str, object]" = OrderedDict()


def cache_dir(store) -> Path:
    return store.root / "cache" / "wasm"


def key(module_id: str) -> str:
    return hash_bytes(canonical.dumps({"module": module_id, "engine": runtime.engine_key()}))[3:]


@atexit.register   # before runtime's release (atexit runs last-registered first)
def clear_memory() -> None:
    with _lock:
        _memory.clear()


def load(store, module_id: str):
    """The compiled wasmtime Module for `module_id`: from memory, from disk, or compiled now."""
    k = key(module_id)
    with _lock:
        m = _memory.get(k)
        if m is not None:
            _memory.move_to_end(k)
            stats.memory_hits += 1
            return m
    m = _load_disk(store, k, module_id)
    if m is None:
        m = runtime.compile_module(store.get_bytes(module_id))
        stats.misses += 1
        put(store, module_id, m)
    else:
        stats.disk_hits += 1
    _remember(k, m)
    return m


def _remember(k: str, m) -> None:
    with _lock:
        _memory[k] = m
        _memory.move_to_end(k)
        while len(_memory) > MEMORY_ENTRIES:
            _memory.popitem(last=False)


def _load_disk(store, k: str, module_id: str):
    import wasmtime

    d = cache_dir(store)
    side = d / f"{k}.json"
    try:
        meta = json.loads(side.read_bytes())
        digest, size = meta["blake3"], int(meta["size"])
        ok_meta = meta.get("module") == module_id and meta.get("engine") == runtime.engine_key() and isinstance(digest, str)
    except FileNotFoundError:
        return None
    except (OSError, ValueError, KeyError, TypeError):
        return _reject(store, k, "its sidecar is unreadable")
    if not ok_meta:
        return _reject(store, k, "its sidecar names another module or engine")
    art = d / f"{k}.{digest[:32]}.cwasm"
    try:
        data = art.read_bytes()
    except OSError:
        return _reject(store, k, "its artefact is missing")
    if len(data) != size or hash_bytes(data)[3:] != digest:
        return _reject(store, k, "its artefact does not hash to the recorded BLAKE3")
    try:
        return wasmtime.Module.deserialize(runtime.engine(), data)
    except wasmtime.WasmtimeError as e:
        return _reject(store, k, f"wasmtime refused it ({runtime._cause(e)})")


def _reject(store, k: str, why: str):
    stats.rejected += 1
    store.warnings.append(f"compiled-module cache entry {k[:16]} was discarded: {why}; recompiled from the module object")
    for p in cache_dir(store).glob(f"{k}.*"):
        try:
            p.unlink()
        except OSError:
            pass
    return None


def put(store, module_id: str, module) -> None:
    """Write the artefact (content-named), then the sidecar that vouches for it."""
    k = key(module_id)
    data = bytes(module.serialize())
    digest = hash_bytes(data)[3:]
    d = cache_dir(store)
    try:
        d.mkdir(parents=True, exist_ok=True)
        fsio.atomic_write(d / f"{k}.{digest[:32]}.cwasm", data, store.tmp, durable=False)
        meta = {"module": module_id, "engine": runtime.engine_key(), "wasmtime": runtime.wasmtime_version(),
                "blake3": digest, "size": len(data)}
        fsio.atomic_write(d / f"{k}.json", canonical.dumps(meta), store.tmp, durable=False)
    except OSError as e:
        # A cache that cannot be written costs a recompile next time; say so, don't fail the call.
        store.warnings.append(f"could not write the compiled-module cache ({e.strerror or e})")
    _remember(k, module)
