"""Compile once (ledger/train/compile_cache.py), checked on the CPU: what the key covers, the
refusal of a cache built for another shape, device or library version (by the parent and by
the child), the hostile read of a child's new cache, and a receipt that names the cache it
built and the one it used. The GPU side (first step of a repeated cycle <= 10 s) is
tests/train/test_fused_gpu.py and benchmarks/bench_train_gpu_ledger.py --parts loops --repeat."""

from __future__ import annotations

import dataclasses
import json
import os

import pytest

from ledger.errors import CompileCacheRefused
from ledger.plan import compile as comp
from ledger.plan import spec, targets
from ledger.train import compile_cache as ccache
from ledger.train import job
from ledger.train import run as trainlib

H200 = targets.get("h200")
ENV = {"device": "NVIDIA H200", "capability": "9.0", "torch": "2.11.0+cu130", "triton": "3.6.0", "cuda": "13.0"}


def _body(store, text='[precision]\ndtype = "bf16"\n[data]\nsteps = 2\n'):
    return comp.compile_spec(store, spec.parse(text), H200).plan.body


def test_the_key_covers_shape_and_environment_not_data_lr_seeds_or_steps(store):
    base = ccache.shape_of(_body(store))
    same = ccache.shape_of(_body(store, '[precision]\ndtype = "bf16"\n[data]\nsteps = 7\n[optimizer]\nlr = 0.01\n'
                                        '[seeds]\ndata = 3\n'))
    assert same == base and ccache.cache_key(same, ENV) == ccache.cache_key(base, ENV)
    other = ccache.shape_of(_body(store, '[precision]\ndtype = "bf16"\n[data]\nsteps = 2\nmicro_batch = 4\n'))
    assert other != base and ccache.cache_key(other, ENV) != ccache.cache_key(base, ENV)
    keys = {ccache.cache_key(base, dict(ENV, **{k: "other"})) for k in ccache.ENV_FIELDS}
    assert len(keys) == len(ccache.ENV_FIELDS) and ccache.cache_key(base, ENV) not in keys
    assert base["realizations"]["linear_lora"] == "fused-lora"


@pytest.mark.parametrize("field", ccache.ENV_FIELDS)
def test_a_cache_for_another_device_or_library_version_is_refused_naming_it(field):
    shape = {"loop": "fused"}
    man = {"kind": ccache.KIND, "version": ccache.VERSION, "shape": shape, "env": ENV}
    here = dict(ENV, **{field: "something else"})
    with pytest.raises(CompileCacheRefused) as e:
        ccache.check(man, shape, here, "b3:" + "a" * 64)
    assert e.value.exit_code == 3 and f"env.{field}" in e.value.message and "not used" in e.value.message
    assert e.value.details["mismatches"][0].startswith(f"env.{field}")
    with pytest.raises(CompileCacheRefused, match="another plan shape"):
        ccache.check(man, {"loop": "compiled"}, ENV, "b3:" + "a" * 64)
    ccache.check(man, shape, ENV, "b3:" + "a" * 64)   # the same: accepted


def _outputs(tmp_path):
    out = tmp_path / "out"
    (out / "compile-cache" / "fxgraph" / "ab").mkdir(parents=True)
    (out / "compile-cache" / "fxgraph" / "ab" / "graph").write_bytes(b"g" * 100)
    (out / "compile-cache" / "triton.bin").write_bytes(b"t" * 10)
    return out, job.ChildOutputs(out, job.Limits(steps=1, adapter_bytes=1))


def test_a_childs_cache_is_read_bounded_and_without_links(tmp_path):
    out, reader = _outputs(tmp_path)
    files = reader.read_tree("compile-cache", 1000, 10, 4)
    assert {k: len(v[0]) for k, v in files.items()} == {"fxgraph/ab/graph": 100, "triton.bin": 10}
    with pytest.raises(job.Refusal, match="more than the 105 bytes in all"):
        reader.read_tree("compile-cache", 105, 10, 4)
    with pytest.raises(job.Refusal, match="more than the 1 (files|entries)"):
        reader.read_tree("compile-cache", 1000, 1, 4)
    with pytest.raises(job.Refusal, match="folders deep"):
        reader.read_tree("compile-cache", 1000, 10, 1)
    os.symlink("/etc/passwd", out / "compile-cache" / "fxgraph" / "ab" / "link")
    with pytest.raises(job.Refusal, match="symbolic link|link"):
        reader.read_tree("compile-cache", 1000, 10, 4)
    os.unlink(out / "compile-cache" / "fxgraph" / "ab" / "link")
    os.link(out / "compile-cache" / "triton.bin", tmp_path / "outside")
    with pytest.raises(job.Refusal, match="hard link"):
        reader.read_tree("compile-cache", 1000, 10, 4)


def test_the_child_copies_regular_files_only(tmp_path):
    src, dest = tmp_path / "src", tmp_path / "dest"
    (src / "a").mkdir(parents=True)
    (src / "a" / "k").write_bytes(b"kernel")
    (src / "a" / "x.lock").write_bytes(b"")
    os.symlink("/etc/passwd", src / "a" / "link")
    ccache._copy_regular(src, dest)
    assert sorted(p.relative_to(dest).as_posix() for p in dest.rglob("*") if p.is_file()) == ["a/k"]


def test_a_run_builds_a_cache_the_next_run_of_its_shape_uses_and_the_receipts_name_them(store, monkeypatch):
    """Through the real parent and child (a CPU plan standing in for a compiled one: the child's
    eager loop compiles nothing, so the cache's files are put in the child's place)."""
    monkeypatch.setattr(ccache, "uses_cache", lambda plan: True)
    plan = comp.compile_spec(store, spec.parse("[data]\nsteps = 2\nmicro_batch = 4\n"), targets.get("cpu")).plan
    run = trainlib.execute(store, plan)
    try:
        handed = run.compile_cache
        assert handed is not None and handed["id"] is None and not handed["files"]   # a miss; nothing compiled
        files = {"fxgraph/ab/graph": (b"compiled graph", 0o644), "triton/k.cubin": (b"cubin", 0o644)}
        run = dataclasses.replace(run, compile_cache=dict(handed, files=files))
        with store.transaction("train", wait=60) as tx:
            rid, body = trainlib.commit(tx, plan, run, None)
            tx.payload.update({"receipt": rid, "plan": plan.id, "adapter": body["adapter"], "rung": body["rung"],
                               "unsandboxed": False, "wall_s": 0.0})
    finally:
        store.discard_work_folder(run.work)
    cc = body["compile_cache"]
    assert cc["built"] and not cc["hit"] and cc["key"] == handed["key"]
    assert store.state.refs[ccache.ref_name(cc["key"])] == cc["id"]
    man = store.get_json(cc["id"])
    assert man["kind"] == "compile-cache" and man["bytes"] == 19 and man["built_by"] == plan.id
    # the next run of the same shape (another step count: same shape) gets it as a read-only input
    plan2 = comp.compile_spec(store, spec.parse("[data]\nsteps = 3\nmicro_batch = 4\n"), targets.get("cpu")).plan
    r2 = trainlib.train(store, plan2.id).receipt
    assert r2["compile_cache"] == {"key": cc["key"], "id": cc["id"], "hit": True, "built": False, "env": cc["env"]}
    # naming a cache built for another environment: refused before anything runs
    seq = store.state.seq
    monkeypatch.setattr(ccache, "environment", lambda: dict(cc["env"], torch="0.0.0"))
    with pytest.raises(CompileCacheRefused, match="env.torch"):
        trainlib.train(store, plan2.id, compile_cache=cc["id"])
    assert store.state.seq == seq


def test_the_child_refuses_a_cache_keyed_for_another_environment(store, monkeypatch):
    monkeypatch.setattr(ccache, "uses_cache", lambda plan: True)
    monkeypatch.setattr(ccache, "environment", lambda: dict(ENV))   # the parent's view; the child sees the CPU
    plan = comp.compile_spec(store, spec.parse("[data]\nsteps = 2\nmicro_batch = 4\n"), targets.get("cpu")).plan
    seq = store.state.seq
    with pytest.raises(CompileCacheRefused) as e:
        trainlib.train(store, plan.id)
    assert "in the training child" in e.value.message and "env.device" in e.value.message
    assert store.state.seq == seq


def test_a_plan_that_compiles_nothing_takes_no_cache(store):
    plan = comp.compile_spec(store, spec.parse("[data]\nsteps = 2\n"), targets.get("cpu")).plan
    assert not ccache.uses_cache(plan.view)
    with pytest.raises(Exception, match="compiles nothing"):
        trainlib.train(store, plan.id, compile_cache="b3:" + "0" * 64)
    assert json.dumps(ccache.shape_of(plan.body))   # canonical-JSON-ready


def test_a_compiled_run_works_in_a_folder_named_by_its_cache_key_and_gives_the_name_back(store, monkeypatch):
    """MUST (docs/gpu.md): a compiled run's work folder is named by its compile-cache key while it
    runs, so the absolute paths Inductor bakes into the cache (its autotune records) are the same
    in every run of the shape and the child keeps them (stable_path); a second run of the same
    shape meanwhile keeps its own folder and runs without the records; afterwards the folder has
    its own name again (gc's lock intact: the store removes it) and the run is named by it."""
    monkeypatch.setattr(ccache, "uses_cache", lambda plan: True)
    seen: dict = {}
    real = trainlib._execute

    def spy(st, pl, work, unsandboxed, progress, name=None):
        seen.update(work=work, name=name, spec=json.loads((work / "inputs" / "job.json").read_text())["compile_cache"])
        other = job.new_work(st, "train")
        seen["other"] = (other, ccache.settle(other, seen["spec"]["key"]))
        ccache.unsettle(seen["other"][1], other)
        st.discard_work_folder(other)
        return real(st, pl, work, unsandboxed, progress, name)

    monkeypatch.setattr(trainlib, "_execute", spy)
    plan = comp.compile_spec(store, spec.parse("[data]\nsteps = 2\nmicro_batch = 4\n"), targets.get("cpu")).plan
    run = trainlib.execute(store, plan)
    try:
        assert seen["work"].name.startswith(ccache.STABLE_PREFIX) and seen["spec"]["stable_path"] is True
        assert seen["other"][0] == seen["other"][1]                # the name was taken: its own folder
        assert run.work.name == seen["name"] and run.work.is_dir() and not seen["work"].exists()
    finally:
        store.discard_work_folder(run.work)
    assert not run.work.exists() and not seen["work"].exists()
