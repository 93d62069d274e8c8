"""Admission runs in a fixed world (a fixed clock, fixed random bytes), so a capability's tests
pass or fail the same way every time; grants belong to the module's content id, so an
attenuated grant is not regained by admitting the same module under another name (issue 16)."""

from __future__ import annotations

import json

import blake3
import pytest

from ledger.capabilities import admission, registry, runtime
from ledger.capabilities.manifest import Handle
from ledger.cli.main import main
from ledger.errors import BadInput, Refused
from ledger.store import Store
from tests.capabilities.helpers import ADDER_EXPORTS, ADDER_TESTS, ADDER_WAT, store_snapshot, write_cap

DICE_WAT = '''(module
  (import "wasi_snapshot_preview1" "random_get" (func $rand (param i32 i32) (result i32)))
  (import "wasi_snapshot_preview1" "clock_time_get" (func $clock (param i32 i64 i32) (result i32)))
  (memory (export "memory") 1)
  (func (export "rand8") (result i32)            ;; the first random byte of a fresh run
    (drop (call $rand (i32.const 0) (i32.const 8)))
    (i32.load8_u (i32.const 0)))
  (func (export "rand_twice") (result i32)       ;; the 9th byte: the stream continues in a run
    (drop (call $rand (i32.const 0) (i32.const 8)))
    (drop (call $rand (i32.const 0) (i32.const 8)))
    (i32.load8_u (i32.const 0)))
  (func (export "rand_oob") (result i32)         ;; past the end of memory: EFAULT, not a host crash
    (call $rand (i32.const 65530) (i32.const 64)))
  (func (export "now_s") (result i64)
    (drop (call $clock (i32.const 0) (i64.const 1) (i32.const 16)))
    (i64.div_u (i64.load (i32.const 16)) (i64.const 1000000000)))
  (func (export "tick_ns") (result i64)          ;; two reads of the monotonic clock
    (drop (call $clock (i32.const 1) (i64.const 1) (i32.const 16)))
    (drop (call $clock (i32.const 1) (i64.const 1) (i32.const 24)))
    (i64.sub (i64.load (i32.const 24)) (i64.load (i32.const 16)))))'''
DICE_EXPORTS = {"rand8": ([], ["i32"]), "rand_twice": ([], ["i32"]), "rand_oob": ([], ["i32"]),
                "now_s": ([], ["i64"]), "tick_ns": ([], ["i64"])}
STREAM = blake3.blake3(runtime.FIXED_RANDOM_SEED).digest(16)


def dice_tests():
    return [{"name": "first byte", "export": "rand8", "args": [], "expect": [STREAM[0]]},
            {"name": "ninth byte", "export": "rand_twice", "args": [], "expect": [STREAM[8]]},
            {"name": "out of bounds", "export": "rand_oob", "args": [], "expect": [runtime.WASI_EFAULT]},
            {"name": "the clock", "export": "now_s", "args": [], "expect": [runtime.FIXED_CLOCK_NS // 10**9]},
            {"name": "a tick", "export": "tick_ns", "args": [], "expect": [runtime.FIXED_CLOCK_STEP_NS]}]


def test_admission_sees_a_fixed_clock_and_fixed_random_bytes(store, tmp_path):
    src, man = write_cap(tmp_path, "dice", DICE_WAT, DICE_EXPORTS, dice_tests())
    # the same outcome at every run: check it three times, then admit
    for _ in range(3):
        _, _, _, outcomes = admission.check(src, man)
        assert [o.ok for o in outcomes] == [True] * 5
        assert [o.got for o in outcomes] == [f"[{STREAM[0]}]", f"[{STREAM[8]}]", "[21]",
                                             f"[{runtime.FIXED_CLOCK_NS // 10**9}]", "[1000]"]
    a = admission.admit(store, src, man)
    report = store.get_json(a.tests)
    assert report["world"] == runtime.fixed_world_description()
    assert report["world"]["clock"]["start_ns"] == runtime.FIXED_CLOCK_NS


def test_a_test_that_expects_other_random_bytes_fails_every_time(store, tmp_path):
    tests = [{"name": "lucky", "export": "rand8", "args": [], "expect": [(STREAM[0] + 1) % 256]}]
    src, man = write_cap(tmp_path, "dice", DICE_WAT, DICE_EXPORTS, tests)
    for _ in range(3):
        with pytest.raises(Refused, match=f"returned \\[{STREAM[0]}\\]"):
            admission.admit(store, src, man)


def test_live_calls_see_the_real_clock(store, tmp_path):
    src, man = write_cap(tmp_path, "dice", DICE_WAT, DICE_EXPORTS, dice_tests())
    admission.admit(store, src, man)
    now = registry.call(store, "dice", "now_s", []).values[0]
    assert now > runtime.FIXED_CLOCK_NS // 10**9 + 3600 * 24 * 365  # this machine's clock, not the fixed one


# --- grants belong to the module's content ----------------------------------------------------------
D = lambda p, m="ro": Handle("dir", p, m)  # noqa: E731
RW = [{"kind": "dir", "path": "data", "mode": "rw"}, {"kind": "stdout"}]


@pytest.fixture
def attenuated(store, tmp_path):
    """`notes` admitted with dir:data:rw + stdout, then attenuated to dir:data:ro."""
    (tmp_path / "data").mkdir()
    src, man = write_cap(tmp_path, "notes", ADDER_WAT, ADDER_EXPORTS, ADDER_TESTS, handles=RW)
    admission.admit(store, src, man)
    registry.grant(store, "notes", [D("data", "ro")])
    return store, tmp_path


def test_the_same_module_under_another_name_does_not_regain_the_grant(attenuated):
    store, tmp = attenuated
    src, man = write_cap(tmp / "again", "notes2", ADDER_WAT, ADDER_EXPORTS, ADDER_TESTS, handles=RW)
    before, seq = store_snapshot(store), store.state.seq
    with pytest.raises(Refused, match="--regrant-reason") as e:
        admission.admit(store, src, man)  # default: the manifest's rw and stdout
    assert e.value.exit_code == 3 and "'notes'" in e.value.message
    assert {h["mode"] if "mode" in h else h["kind"] for h in e.value.details["widening"]} == {"rw", "stdout"}
    assert store_snapshot(store) == before and store.state.seq == seq
    # as much as it held (or less) needs no reason
    a = admission.admit(store, src, man, grants=[D("data", "ro")])
    assert a.grants == (D("data", "ro"),)
    assert "regrant" not in store.journal.tail(1)[0]["payload"]


def test_regaining_a_grant_needs_the_operators_reason_which_is_recorded(attenuated):
    store, tmp = attenuated
    src, man = write_cap(tmp / "again", "notes2", ADDER_WAT, ADDER_EXPORTS, ADDER_TESTS, handles=RW)
    with pytest.raises(BadInput, match="regrant reason is empty"):
        admission.admit(store, src, man, regrant_reason="  ")
    a = admission.admit(store, src, man, regrant_reason="the review of notes found the rw grant is needed")
    assert set(a.grants) == {D("data", "rw"), Handle("stdout")}
    p = store.journal.tail(1)[0]["payload"]
    assert p["regrant"]["reason"] == "the review of notes found the rw grant is needed"
    assert p["regrant"]["held"]["names"] == {"notes": [{"kind": "dir", "mode": "ro", "path": "data"}]}
    assert sorted(h["kind"] for h in p["regrant"]["widening"]) == ["dir", "stdout"]


def test_a_different_module_under_a_new_name_is_not_affected(attenuated):
    store, tmp = attenuated
    other = ADDER_WAT.replace("(module", "(module (func (export \"nop\"))", 1)
    src, man = write_cap(tmp / "other", "other", other, ADDER_EXPORTS, ADDER_TESTS, handles=RW)
    assert set(admission.admit(store, src, man).grants) == {D("data", "rw"), Handle("stdout")}


def test_regrant_reason_on_the_command_line(attenuated, monkeypatch, capsys):
    store, tmp = attenuated
    monkeypatch.chdir(tmp)
    monkeypatch.delenv("LEDGER_DIR", raising=False)
    src, man = write_cap(tmp / "again", "notes2", ADDER_WAT, ADDER_EXPORTS, ADDER_TESTS, handles=RW)
    assert main(["capability", "add", str(src), "-m", str(man)]) == 3
    err = " ".join(capsys.readouterr().err.split())
    assert "--regrant-reason" in err and "Traceback" not in err
    assert main(["capability", "add", str(src), "-m", str(man), "--regrant-reason", "operator review #12", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert {g.get("mode", g["kind"]) for g in out["grants"]} == {"rw", "stdout"}
    assert Store.open(tmp).journal.tail(1)[0]["payload"]["regrant"]["reason"] == "operator review #12"
