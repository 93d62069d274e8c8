"""The compiled-module cache: keyed by module + engine, verified before deserializing."""

from __future__ import annotations

import json

import pytest

from ledger.capabilities import admission, cache, registry, runtime
from tests.capabilities.helpers import EXAMPLES


@pytest.fixture
def adder(store):
    a = admission.admit(store, EXAMPLES / "adder.wat", EXAMPLES / "adder.toml")
    cache.clear_memory()
    return store, a.module


def _entry(store, module_id):
    k = cache.key(module_id)
    d = cache.cache_dir(store)
    meta = json.loads((d / f"{k}.json").read_bytes())
    return d / f"{k}.{meta['blake3'][:32]}.cwasm", d / f"{k}.json", meta


def _no_compile(monkeypatch):
    def boom(_wasm):
        raise AssertionError("compiled although the cache should have served it")
    monkeypatch.setattr(runtime, "compile_module", boom)


def test_admission_writes_an_entry_and_calls_do_not_recompile(adder, monkeypatch):
    store, mid = adder
    art, side, meta = _entry(store, mid)
    assert art.exists() and meta["module"] == mid and meta["engine"] == runtime.engine_key()
    assert meta["size"] == art.stat().st_size
    _no_compile(monkeypatch)
    s0 = cache.Stats(**vars(cache.stats))
    assert registry.call(store, "adder", "add", ["2", "3"]).values == (5,)      # from disk
    assert registry.call(store, "adder", "add", ["4", "3"]).values == (7,)      # from memory
    assert cache.stats.disk_hits == s0.disk_hits + 1 and cache.stats.memory_hits == s0.memory_hits + 1
    assert cache.stats.misses == s0.misses


def test_key_depends_on_module_and_engine(adder, monkeypatch):
    store, mid = adder
    k = cache.key(mid)
    assert cache.key("b3:" + "0" * 64) != k
    monkeypatch.setattr(runtime, "engine_key", lambda: "another-engine")
    assert cache.key(mid) != k


@pytest.mark.parametrize("damage", ["flip", "truncate", "sidecar-hash", "sidecar-garbage", "sidecar-module",
                                    "missing-artefact"])
def test_a_damaged_entry_is_never_deserialized(adder, damage, monkeypatch):
    store, mid = adder
    art, side, meta = _entry(store, mid)
    deserialized = []
    import wasmtime

    real = wasmtime.Module.deserialize
    monkeypatch.setattr(wasmtime.Module, "deserialize",
                        classmethod(lambda cls, eng, data: deserialized.append(1) or real(eng, data)))
    if damage == "flip":
        b = bytearray(art.read_bytes())
        b[len(b) // 2] ^= 0x01
        art.write_bytes(bytes(b))
    elif damage == "truncate":
        art.write_bytes(art.read_bytes()[:-10])
    elif damage == "sidecar-hash":
        # Bytes that "match" a forged hash: the artefact is replaced and the sidecar claims it.
        art.write_bytes(b"\0" * 100)
        side.write_text(json.dumps({**meta, "size": 100}))
    elif damage == "sidecar-garbage":
        side.write_text("{not json")
    elif damage == "sidecar-module":
        side.write_text(json.dumps({**meta, "module": "b3:" + "1" * 64}))
    elif damage == "missing-artefact":
        art.unlink()
    s0 = cache.stats.rejected
    assert registry.call(store, "adder", "add", ["2", "3"]).values == (5,)
    assert deserialized == [] and cache.stats.rejected == s0 + 1
    assert any("cache entry" in w for w in store.warnings)
    # It was rebuilt from the (verified) module object: the next process gets a clean hit.
    cache.clear_memory()
    store.warnings.clear()
    assert registry.call(store, "adder", "add", ["2", "3"]).values == (5,)
    assert deserialized == [1] and not store.warnings


def test_a_missing_cache_is_rebuilt(adder):
    store, mid = adder
    import shutil

    shutil.rmtree(cache.cache_dir(store))
    m0 = cache.stats.misses
    assert registry.call(store, "adder", "add", ["2", "3"]).values == (5,)
    assert cache.stats.misses == m0 + 1 and _entry(store, mid)[0].exists()
