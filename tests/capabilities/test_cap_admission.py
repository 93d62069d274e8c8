"""Admission: one `capability` transaction and a new generation, only after every test passes."""

from __future__ import annotations

import pytest

from ledger import generations
from ledger.capabilities import admission, registry
from ledger.capabilities.manifest import Handle
from ledger.errors import BadInput, Refused, UnknownRef
from ledger.store.verify import verify
from tests.capabilities.helpers import ADDER_EXPORTS, ADDER_TESTS, ADDER_WAT, EXAMPLES, store_snapshot, write_cap


def test_adder_example_is_admitted_as_one_record_and_a_generation(store):
    seq = store.state.seq
    a = admission.admit(store, EXAMPLES / "adder.wat", EXAMPLES / "adder.toml")
    assert store.state.seq == seq + 1
    rec = store.journal.tail(1)[0]
    assert rec["kind"] == "capability" and rec["payload"]["capability"] == "adder"
    head = generations.head(store)
    assert head.id == a.generation.id and head.n == a.generation.n == 0
    entry = head.capabilities["adder"]
    assert entry["module"] == a.module and entry["manifest"] == a.manifest and entry["source"] == a.source
    assert entry["admitted_in"] == 0 and entry["grants"] == []
    assert entry["compiler"]["id"] == a.compiler and entry["compiler"]["tool"] == "wasmtime.wat2wasm"
    # Every object the entry names is in the store and part of the record.
    for oid in (a.module, a.source, a.manifest, a.compiler, a.tests):
        assert store.has(oid) and oid in rec["outputs"]
    assert store.get_bytes(a.module)[:4] == b"\0asm"
    assert store.get_bytes(a.source) == (EXAMPLES / "adder.wat").read_bytes()
    report = store.get_json(a.tests)
    assert report["authority"] == "none" and all(r["ok"] for r in report["results"])
    assert [r["name"] for r in report["results"]] == [o.name for o in a.outcomes]
    assert registry.call(store, "adder", "add", ["2", "3"]).values == (5,)
    assert verify(store, read_data=True).ok


def test_spin_example_is_refused_and_nothing_changes(store):
    admission.admit(store, EXAMPLES / "adder.wat", EXAMPLES / "adder.toml")
    before, head, seq = store_snapshot(store), store.state.head, store.state.seq
    with pytest.raises(Refused) as ei:
        admission.admit(store, EXAMPLES / "spin.wat", EXAMPLES / "spin.toml")
    e = ei.value
    assert e.exit_code == 3 and e.details["test"] == "returns zero" and e.details["trap"] == "OUT_OF_FUEL"
    assert "'spin'" in e.message and "out of fuel" in e.message
    assert store_snapshot(store) == before and store.state.head == head and store.state.seq == seq
    assert [x.name for x in registry.entries(store)] == ["adder"]


def test_wrong_result_is_refused_naming_the_test(store, tmp_path):
    src, man = write_cap(tmp_path, "adder", ADDER_WAT, ADDER_EXPORTS,
                         [{"name": "good", "export": "add", "args": [1, 1], "expect": [2]},
                          {"name": "bad sum", "export": "add", "args": [2, 2], "expect": [5]},
                          {"name": "never run", "export": "add", "args": [0, 0], "expect": [0]}])
    with pytest.raises(Refused) as ei:
        admission.admit(store, src, man)
    assert "'bad sum'" in ei.value.message and "returned [4]; expected [5]" in ei.value.message
    assert "1 later test not run" in ei.value.hint
    assert store.state.seq == 1   # only `init`


@pytest.mark.parametrize("exports, msg", [
    ({"sub": (["i32", "i32"], ["i32"])}, "no export 'sub'"),
    ({"add": (["i64", "i64"], ["i64"])}, "the manifest declares (i64, i64) -> (i64)"),
])
def test_manifest_must_match_the_module(store, tmp_path, exports, msg):
    name = next(iter(exports))
    src, man = write_cap(tmp_path, "adder", ADDER_WAT, exports,
                         [{"name": "t", "export": name, "args": [1, 1], "expect": [2]}])
    with pytest.raises(Refused) as ei:
        admission.admit(store, src, man)
    assert msg in ei.value.message


def test_same_name_twice_is_refused_unless_replacing(store, tmp_path):
    src, man = write_cap(tmp_path, "adder", ADDER_WAT, ADDER_EXPORTS, ADDER_TESTS)
    admission.admit(store, src, man)
    with pytest.raises(Refused) as ei:
        admission.admit(store, src, man)
    assert "already live" in ei.value.message and store.state.seq == 2
    with pytest.raises(BadInput):
        src2, man2 = write_cap(tmp_path / "x", "other", ADDER_WAT, ADDER_EXPORTS, ADDER_TESTS)
        admission.admit(store, src2, man2, replace=True)
    wat2 = ADDER_WAT.replace("(i32.add (local.get 0) (local.get 1))",
                             "(i32.add (i32.add (local.get 0) (local.get 1)) (i32.const 0))")
    src3, man3 = write_cap(tmp_path / "v2", "adder", wat2, ADDER_EXPORTS, ADDER_TESTS)
    a = admission.admit(store, src3, man3, replace=True)
    assert a.replaced and generations.head(store).capabilities["adder"]["module"] == a.module
    assert registry.call(store, "adder", "add", ["2", "3"]).values == (5,)


def test_grants_at_admission_are_within_the_manifest(store, tmp_path):
    (tmp_path / "data" / "sub").mkdir(parents=True)
    handles = [{"kind": "dir", "path": "data", "mode": "ro"}, {"kind": "stdout"}]
    src, man = write_cap(tmp_path, "adder", ADDER_WAT, ADDER_EXPORTS, ADDER_TESTS, handles=handles)
    with pytest.raises(Refused) as ei:
        admission.admit(store, src, man, grants=[Handle("dir", "data", "rw")])
    assert "widen" in ei.value.message
    with pytest.raises(Refused):
        admission.admit(store, src, man, grants=[Handle("stderr")])
    a = admission.admit(store, src, man, grants=[Handle("dir", "data/sub", "ro")])
    assert a.grants == (Handle("dir", "data/sub", "ro"),)
    assert registry.entry(store, "adder").grants == (Handle("dir", "data/sub", "ro"),)


def test_replacing_may_not_widen_grants(store, tmp_path):
    (tmp_path / "data").mkdir()
    handles = [{"kind": "dir", "path": "data", "mode": "rw"}]
    src, man = write_cap(tmp_path, "adder", ADDER_WAT, ADDER_EXPORTS, ADDER_TESTS, handles=handles)
    admission.admit(store, src, man, grants=[Handle("dir", "data", "ro")])
    head = store.state.head
    with pytest.raises(Refused) as ei:
        admission.admit(store, src, man, replace=True)   # default grants = the manifest's rw
    assert "widen" in ei.value.message and store.state.head == head
    admission.admit(store, src, man, replace=True, grants=[Handle("dir", "data", "ro")])


def _rollback(store, to_n: int):
    with store.transaction("rollback") as tx:
        generations.move_head(tx, store, generations.load(store, f"gen-{to_n}"))


def test_added_rolled_back_and_re_added_behaves_identically(store, tmp_path):
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "n.txt").write_text("x")
    base = write_cap(tmp_path / "base", "base", ADDER_WAT, ADDER_EXPORTS, ADDER_TESTS)
    admission.admit(store, *base)                                    # gen-0
    first = admission.admit(store, EXAMPLES / "adder.wat", EXAMPLES / "adder.toml")   # gen-1
    calls = [("add", ["2", "3"]), ("add64", ["4294967296", "-1"]), ("mean", ["1", "2.5"])]
    before = [registry.call(store, "adder", e, a) for e, a in calls]
    entry1 = registry.entry(store, "adder")

    _rollback(store, 0)
    assert generations.head(store).n == 0
    with pytest.raises(UnknownRef):
        registry.call(store, "adder", "add", ["2", "3"])
    assert [e.name for e in registry.entries(store)] == ["base"]

    again = admission.admit(store, EXAMPLES / "adder.wat", EXAMPLES / "adder.toml")
    assert again.generation.n == 2 and again.generation.parent == generations.load(store, "gen-0").id
    after = [registry.call(store, "adder", e, a) for e, a in calls]
    entry2 = registry.entry(store, "adder")
    for x, y in zip(before, after):
        assert (x.values, x.fuel_used, x.stdout) == (y.values, y.fuel_used, y.stdout)
    # Same objects, same grants; only the admitting generation differs.
    for f in ("module", "source", "manifest_id", "compiler", "tests", "grants"):
        assert getattr(entry1, f) == getattr(entry2, f), f
    assert (first.module, first.manifest, first.tests) == (again.module, again.manifest, again.tests)
    assert (entry1.admitted_in, entry2.admitted_in) == (1, 2)
    # Rolling forward to gen-1 brings back the first admission exactly.
    _rollback(store, 1)
    assert registry.entry(store, "adder").admitted_in == 1
    assert verify(store, read_data=True).ok


def test_check_only_reads(store, tmp_path):
    before = store_snapshot(store)
    m, compiled, module, outcomes = admission.check(EXAMPLES / "adder.wat", EXAMPLES / "adder.toml")
    assert m.name == "adder" and all(o.ok for o in outcomes) and compiled.language == "wat"
    assert store_snapshot(store) == before


def test_a_module_with_stdout_and_dir_handles_passes_with_zero_authority(store, tmp_path):
    """The sandbox at admission holds nothing even when the manifest declares handles."""
    wat = '''(module (import "wasi_snapshot_preview1" "fd_prestat_get" (func $p (param i32 i32) (result i32)))
      (memory (export "memory") 1)
      (func (export "preopens") (result i32) (call $p (i32.const 3) (i32.const 0))))'''
    (tmp_path / "data").mkdir()
    src, man = write_cap(tmp_path, "probe", wat, {"preopens": ([], ["i32"])},
                         [{"name": "fd 3 is not open", "export": "preopens", "args": [], "expect": [8]}],
                         handles=[{"kind": "dir", "path": "data", "mode": "rw"}, {"kind": "stdout"}])
    admission.admit(store, src, man)
    # With its grant, descriptor 3 is the preopened folder.
    assert registry.call(store, "probe", "preopens", []).values == (0,)
