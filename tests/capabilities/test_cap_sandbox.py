"""The wasm abuse cases (docs/capabilities.md): each ends in a typed error within its limits, and neither
the host process nor the store is affected.

Admission-time cases prove "nothing changes" byte for byte (every file under .ledger); call-time
cases grant real handles and prove the sandbox still holds. After every case the host process
calls a healthy capability to show it is unharmed.
"""

from __future__ import annotations

import os
import time

import pytest

from ledger.capabilities import admission, registry, runtime
from ledger.capabilities import compile as compile_mod
from ledger.capabilities.manifest import Handle
from ledger.errors import CapabilityTrapped, LedgerError, Refused
from tests.capabilities.helpers import (
    ADDER_EXPORTS,
    ADDER_TESTS,
    ADDER_WAT,
    EBADF,
    ELOOP,
    ENOTCAPABLE,
    ENOTSUP,
    EPERM,
    WASI,
    open_module,
    store_snapshot,
    write_cap,
)


@pytest.fixture
def live(store, tmp_path):
    """A store with a healthy capability, to prove the host still works after each abuse."""
    src, man = write_cap(tmp_path, "adder", ADDER_WAT, ADDER_EXPORTS, ADDER_TESTS)
    admission.admit(store, src, man)
    return store


def host_ok(store) -> None:
    assert registry.call(store, "adder", "add", ["40", "2"]).values == (42,)


def refused(store, tmp_path, name, wat, exports, tests, *, limits=None, within_s=3.0, err=Refused):
    """Admission must fail with `err`, quickly, leaving every byte of the store as it was."""
    before, head = store_snapshot(store), store.state.head
    src, man = write_cap(tmp_path, name, wat, exports, tests, limits=limits)
    t0 = time.perf_counter()
    with pytest.raises(err) as ei:
        admission.admit(store, src, man)
    elapsed = time.perf_counter() - t0
    assert elapsed < within_s, f"took {elapsed:.2f} s"
    assert ei.value.exit_code == 3
    assert store_snapshot(store) == before
    assert store.state.head == head
    host_ok(store)
    return ei.value


def admitted(store, tmp_path, name, wat, exports, tests, *, handles=(), limits=None):
    src, man = write_cap(tmp_path, name, wat, exports, tests, handles=handles, limits=limits)
    return admission.admit(store, src, man)


SPIN = '(module (func (export "spin") (result i32) (loop (br 0)) (i32.const 0)))'
SPIN_N = '''(module (func (export "spin") (param $n i64) (result i64)
  (block (loop (br_if 1 (i64.eqz (local.get $n)))
               (local.set $n (i64.sub (local.get $n) (i64.const 1))) (br 0)))
  (local.get $n)))'''


# --- infinite loops ------------------------------------------------------------------------------
def test_infinite_loop_runs_out_of_fuel(live, tmp_path):
    e = refused(live, tmp_path, "spin", SPIN, {"spin": ([], ["i32"])},
                [{"name": "returns", "export": "spin", "args": [], "expect": [0]}],
                limits={"fuel": 5_000_000, "time_ms": 10_000})
    assert e.details["trap"] == "OUT_OF_FUEL" and e.details["test"] == "returns"
    assert "out of fuel" in e.message and "'returns'" in e.message


def test_infinite_loop_hits_the_wall_time_limit(live, tmp_path):
    # Fuel at the host maximum: only the epoch deadline can stop it.
    t0 = time.perf_counter()
    e = refused(live, tmp_path, "spin", SPIN, {"spin": ([], ["i32"])},
                [{"name": "returns", "export": "spin", "args": [], "expect": [0]}],
                limits={"fuel": 100_000_000_000, "time_ms": 200})
    assert e.details["trap"] == "INTERRUPT"
    assert 0.15 < time.perf_counter() - t0 < 2.0
    assert "time limit" in e.message


def test_loop_at_call_time_fuel_and_time(live, tmp_path):
    admitted(live, tmp_path, "loop", SPIN_N, {"spin": (["i64"], ["i64"])},
             [{"name": "zero", "export": "spin", "args": [0], "expect": [0]},
              {"name": "ten", "export": "spin", "args": [10], "expect": [0]}],
             limits={"fuel": 1_000_000, "time_ms": 5_000})
    with pytest.raises(CapabilityTrapped) as ei:
        registry.call(live, "loop", "spin", [str(1 << 62)])
    assert ei.value.details["trap"] == "OUT_OF_FUEL" and ei.value.exit_code == 3
    assert ei.value.details["fuel_used"] == 1_000_000
    t0 = time.perf_counter()
    with pytest.raises(CapabilityTrapped) as ei:
        registry.call(live, "loop", "spin", [str(1 << 62)], fuel=100_000_000_000, time_ms=100)
    assert ei.value.details["trap"] == "INTERRUPT"
    assert 0.08 < time.perf_counter() - t0 < 1.5
    # The same call within its budget completes, and uses the same fuel every time.
    a = registry.call(live, "loop", "spin", ["1000"])
    b = registry.call(live, "loop", "spin", ["1000"])
    assert a.values == (0,) and a.fuel_used == b.fuel_used > 1000
    host_ok(live)


# --- memory bombs --------------------------------------------------------------------------------
GROW_UNTIL_REFUSED = '''(module (memory 1)
  (func (export "grow") (result i32)
    (block (loop
      (br_if 1 (i32.eq (memory.grow (i32.const 1)) (i32.const -1)))
      ;; touch the new page so it is really committed
      (i32.store (i32.sub (i32.mul (memory.size) (i32.const 65536)) (i32.const 4)) (i32.const 7))
      (br 0)))
    (memory.size)))'''
GROW_OR_ABORT = '''(module (memory 1)
  (func (export "grow") (result i32)
    (loop (if (i32.eq (memory.grow (i32.const 16)) (i32.const -1)) (then unreachable)) (br 0))
    (i32.const 0)))'''
GROW_IGNORING = '''(module (memory 1)
  (func (export "grow") (result i32) (loop (drop (memory.grow (i32.const 1))) (br 0)) (i32.const 0)))'''


def test_grow_loop_stops_at_the_memory_limit(live, tmp_path):
    # 4 MiB = 64 pages: memory.grow fails there, and the module sees exactly the limit.
    a = admitted(live, tmp_path, "grow", GROW_UNTIL_REFUSED, {"grow": ([], ["i32"])},
                 [{"name": "stops at 4 MiB", "export": "grow", "args": [], "expect": [64]}],
                 limits={"memory_mib": 4})
    assert a.outcomes[0].ok
    host_ok(live)


def test_grow_loop_that_aborts_is_a_typed_trap(live, tmp_path):
    e = refused(live, tmp_path, "bomb", GROW_OR_ABORT, {"grow": ([], ["i32"])},
                [{"name": "grows", "export": "grow", "args": [], "expect": [0]}], limits={"memory_mib": 8})
    assert e.details["trap"] == "UNREACHABLE"


def test_grow_loop_that_ignores_failure_runs_out_of_fuel(live, tmp_path):
    e = refused(live, tmp_path, "bomb", GROW_IGNORING, {"grow": ([], ["i32"])},
                [{"name": "grows", "export": "grow", "args": [], "expect": [0]}],
                limits={"memory_mib": 8, "fuel": 2_000_000})
    assert e.details["trap"] == "OUT_OF_FUEL"


@pytest.mark.parametrize("decl", ["(memory 60000)", "(memory 257)", "(table 50000000 funcref)"])
def test_huge_initial_memory_or_table_is_refused_at_instantiation(live, tmp_path, decl):
    wat = f'(module {decl} (func (export "f") (result i32) (i32.const 1)))'
    e = refused(live, tmp_path, "huge", wat, {"f": ([], ["i32"])},
                [{"name": "f", "export": "f", "args": [], "expect": [1]}], limits={"memory_mib": 16})
    assert e.details["trap"] == "RESOURCE_LIMIT"


# --- files and environment with no grant -----------------------------------------------------------
@pytest.mark.parametrize("path", ["/etc/passwd", "etc/passwd", "..", "../../../../etc/passwd"])
def test_opening_files_with_no_grant_is_denied(live, tmp_path, path):
    e = refused(live, tmp_path, "peek", open_module(path), {"open": ([], ["i32"]), "errno": ([], ["i32"])},
                [{"name": "reads the file", "export": "open", "args": [], "expect": [1]}])
    assert e.details["trap"] == "UNREACHABLE"
    # The module's own view: there is no descriptor 3 at all (no preopens).
    a = admitted(live, tmp_path, "peek", open_module(path), {"open": ([], ["i32"]), "errno": ([], ["i32"])},
                 [{"name": "no such descriptor", "export": "errno", "args": [], "expect": [EBADF]}])
    assert a.outcomes[0].ok


def test_escaping_a_granted_folder_is_denied(live, tmp_path):
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "inside.txt").write_text("ok\n")
    (tmp_path / "secret.txt").write_text("secret\n")
    os.symlink("../secret.txt", tmp_path / "data" / "link")
    exports = {"open": ([], ["i32"]), "errno": ([], ["i32"])}
    no_authority = [{"name": "denied without a grant", "export": "errno", "args": [], "expect": [EBADF]}]
    ro = [{"kind": "dir", "path": "data", "mode": "ro"}]
    cases = {"inside": ("inside.txt", 0, 0), "dotdot": ("../secret.txt", 0, None), "abs": ("/etc/passwd", 0, None),
             "link": ("link", 0, None), "linkfollow": ("link", 1, None)}
    for name, (path, follow, want) in cases.items():
        wat = open_module(path).replace("(i32.const 3) (i32.const 0)", f"(i32.const 3) (i32.const {follow})")
        admitted(live, tmp_path, name, wat, exports, no_authority, handles=ro)
        got = registry.call(live, name, "errno", []).values[0]
        if want is not None:
            assert got == want, (name, got)
        else:
            # wasmtime answers EPERM or ENOTCAPABLE for an escape and ELOOP for a link it will not follow
            assert got in (EPERM, ENOTCAPABLE, ELOOP), (name, got)
            with pytest.raises(CapabilityTrapped):
                registry.call(live, name, "open", [])
    host_ok(live)


def test_writing_through_a_read_only_grant_is_denied(live, tmp_path):
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "existing.txt").write_text("keep\n")
    exports = {"open": ([], ["i32"]), "errno": ([], ["i32"])}
    no_authority = [{"name": "denied without a grant", "export": "errno", "args": [], "expect": [EBADF]}]
    O_CREAT, O_TRUNC, FD_WRITE = 1, 8, 1 << 6
    for mode in ("ro", "rw"):
        for target, oflags in (("new.txt", O_CREAT), ("existing.txt", O_TRUNC)):
            name = f"w{mode}{target[:3]}"
            wat = open_module(target, rights=FD_WRITE, oflags=oflags)
            admitted(live, tmp_path, name, wat, exports, no_authority,
                     handles=[{"kind": "dir", "path": "data", "mode": mode}])
            got = registry.call(live, name, "errno", []).values[0]
            if mode == "ro":
                assert got in (EPERM, ENOTCAPABLE), (name, got)
            else:
                assert got == 0, (name, got)   # the control: the same module can write when allowed
    assert (tmp_path / "data" / "new.txt").exists()   # created by the rw grant only
    assert (tmp_path / "data" / "existing.txt").read_text() == ""  # truncated by the rw grant only


def test_read_only_grant_blocks_writes_but_rw_stays_inside(live, tmp_path):
    """Same capability, grant narrowed from rw to ro: the write that worked is now denied."""
    (tmp_path / "data").mkdir()
    exports = {"open": ([], ["i32"]), "errno": ([], ["i32"])}
    wat = open_module("made.txt", rights=1 << 6, oflags=1)
    admitted(live, tmp_path, "writer", wat, exports,
             [{"name": "denied without a grant", "export": "errno", "args": [], "expect": [EBADF]}],
             handles=[{"kind": "dir", "path": "data", "mode": "rw"}])
    assert registry.call(live, "writer", "errno", []).values == (0,)
    (tmp_path / "data" / "made.txt").unlink()
    registry.grant(live, "writer", [Handle("dir", "data", "ro")])
    assert registry.call(live, "writer", "errno", []).values[0] in (EPERM, ENOTCAPABLE)
    assert not (tmp_path / "data" / "made.txt").exists()


ENV_WAT = f'''(module
  (import "{WASI}" "environ_sizes_get" (func $env (param i32 i32) (result i32)))
  (import "{WASI}" "args_sizes_get" (func $args (param i32 i32) (result i32)))
  (memory (export "memory") 1)
  (func (export "envc") (result i32) (drop (call $env (i32.const 0) (i32.const 4))) (i32.load (i32.const 0)))
  (func (export "argc") (result i32) (drop (call $args (i32.const 0) (i32.const 4))) (i32.load (i32.const 0)))
  (func (export "need_env") (result i32)
    (drop (call $env (i32.const 0) (i32.const 4)))
    (if (i32.eqz (i32.load (i32.const 0))) (then unreachable))
    (i32.load (i32.const 0))))'''


def test_reading_env_sees_nothing(live, tmp_path, monkeypatch):
    monkeypatch.setenv("LEDGER_TEST_SECRET", "hunter2")
    assert len(os.environ) > 0
    exports = {"envc": ([], ["i32"]), "argc": ([], ["i32"]), "need_env": ([], ["i32"])}
    # A capability that needs the environment is refused: there is none.
    e = refused(live, tmp_path, "env", ENV_WAT, exports,
                [{"name": "reads env", "export": "need_env", "args": [], "expect": [1]}])
    assert e.details["trap"] == "UNREACHABLE"
    (tmp_path / "data").mkdir()
    admitted(live, tmp_path, "env", ENV_WAT, exports,
             [{"name": "no env", "export": "envc", "args": [], "expect": [0]},
              {"name": "no args", "export": "argc", "args": [], "expect": [0]}],
             handles=[{"kind": "dir", "path": "data", "mode": "rw"}, {"kind": "stdout"}, {"kind": "stderr"}])
    # Even holding every kind of handle, a call sees no environment and no arguments.
    assert registry.call(live, "env", "envc", []).values == (0,)
    assert registry.call(live, "env", "argc", []).values == (0,)


# --- imports ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("imp, shown", [
    ('(import "env" "x" (func))', "env::x"),
    (f'(import "{WASI}" "not_a_wasi_function" (func))', "not_a_wasi_function"),
    ('(import "wasi_snapshot_preview2" "fd_write" (func (param i32 i32 i32 i32) (result i32)))', "wasi_snapshot_preview2::fd_write"),
    ('(import "env" "memory" (memory 1))', "env::memory"),
    (f'(import "{WASI}" "fd_write" (func (param i32)))', "incompatible import type"),
])
def test_unknown_imports_are_refused_at_link_time(live, tmp_path, imp, shown):
    wat = f'(module {imp} (func (export "f") (result i32) (i32.const 1)))'
    e = refused(live, tmp_path, "imp", wat, {"f": ([], ["i32"])},
                [{"name": "f", "export": "f", "args": [], "expect": [1]}])
    assert shown in e.message


# --- size, stack, sleeping, stdio, exit, start ----------------------------------------------------
def test_oversized_module_is_refused_before_compiling(live, tmp_path, monkeypatch):
    compiled = []
    real = runtime.compile_module
    monkeypatch.setattr(runtime, "compile_module", lambda w: compiled.append(1) or real(w))
    # A valid module made huge by one custom section (9 MiB > the 8 MiB limit).
    payload = b"\0" * (9 << 20)
    name = b"\x04junk"
    body = name + payload

    def leb(n):
        out = bytearray()
        while True:
            b, n = n & 0x7F, n >> 7
            out.append(b | (0x80 if n else 0))
            if not n:
                return bytes(out)
    big = tmp_path / "big.wasm"
    big.write_bytes(compile_mod.WASM_MAGIC + b"\x00" + leb(len(body)) + body)
    src, man = write_cap(tmp_path, "big", ADDER_WAT, ADDER_EXPORTS, ADDER_TESTS)
    before = store_snapshot(live)
    with pytest.raises(Refused) as ei:
        admission.admit(live, big, man)
    assert "limit" in ei.value.message and ei.value.details["size"] > ei.value.details["limit"]
    # A WAT module over a (lowered) limit is refused after assembling, before compiling.
    with pytest.raises(Refused):
        admission.admit(live, src, man, max_module_bytes=16)
    assert compiled == [] and store_snapshot(live) == before
    host_ok(live)


def test_deep_recursion_overflows_the_stack(live, tmp_path):
    wat = '''(module (func $r (export "r") (param i32) (result i32)
               (i32.add (call $r (i32.add (local.get 0) (i32.const 1))) (i32.const 1))))'''
    e = refused(live, tmp_path, "deep", wat, {"r": (["i32"], ["i32"])},
                [{"name": "recurses", "export": "r", "args": [0], "expect": [0]}])
    assert e.details["trap"] == "STACK_OVERFLOW"


SLEEP_WAT = f'''(module
  (import "{WASI}" "poll_oneoff" (func $poll (param i32 i32 i32 i32) (result i32)))
  (memory (export "memory") 1)
  (func (export "sleep") (result i32)
    ;; one clock subscription: 10 s relative (a guest sleeping inside the host would not
    ;; be interrupted by the epoch deadline, so the sandbox refuses to sleep)
    (i32.store8 (i32.const 8) (i32.const 0))
    (i32.store (i32.const 16) (i32.const 1))
    (i64.store (i32.const 24) (i64.const 10000000000))
    (call $poll (i32.const 0) (i32.const 128) (i32.const 1) (i32.const 256))))'''


def test_sleeping_in_the_host_is_not_allowed(live, tmp_path):
    t0 = time.perf_counter()
    a = admitted(live, tmp_path, "sleepy", SLEEP_WAT, {"sleep": ([], ["i32"])},
                 [{"name": "no sleep", "export": "sleep", "args": [], "expect": [ENOTSUP]}],
                 limits={"time_ms": 500})
    assert a.outcomes[0].ok and time.perf_counter() - t0 < 3


STDIO_WAT = f'''(module
  (import "{WASI}" "fd_write" (func $w (param i32 i32 i32 i32) (result i32)))
  (memory (export "memory") 2)
  (data (i32.const 64) "hello\\n")
  (func (export "say") (param $fd i32) (result i32)
    (i32.store (i32.const 0) (i32.const 64)) (i32.store (i32.const 4) (i32.const 6))
    (call $w (local.get $fd) (i32.const 0) (i32.const 1) (i32.const 8)))
  (func (export "flood") (result i32)   ;; 64 KiB per write until a write fails
    (local $e i32)
    (i32.store (i32.const 0) (i32.const 0)) (i32.store (i32.const 4) (i32.const 65536))
    (loop (local.set $e (call $w (i32.const 1) (i32.const 0) (i32.const 1) (i32.const 8)))
          (br_if 0 (i32.eqz (local.get $e))))
    (local.get $e)))'''


def test_stdio_only_when_granted(live, tmp_path):
    exports = {"say": (["i32"], ["i32"]), "flood": ([], ["i32"])}
    tests = [{"name": "no stdout", "export": "say", "args": [1], "expect": [EBADF]},
             {"name": "no stderr", "export": "say", "args": [2], "expect": [EBADF]},
             {"name": "no stdin", "export": "say", "args": [0], "expect": [EBADF]}]
    admitted(live, tmp_path, "talk", STDIO_WAT, exports, tests, handles=[{"kind": "stdout"}])
    r = registry.call(live, "talk", "say", ["1"])
    assert r.values == (0,) and r.stdout == b"hello\n" and r.stderr == b""
    assert registry.call(live, "talk", "say", ["2"]).values == (EBADF,)   # stderr not granted
    r = registry.call(live, "talk", "flood", [])
    assert r.values == (22,) and len(r.stdout) == runtime.MAX_OUTPUT_BYTES   # EFBIG past the cap
    registry.grant(live, "talk", [])
    assert registry.call(live, "talk", "say", ["1"]).values == (EBADF,)


def test_proc_exit_and_trapping_start_function(live, tmp_path):
    exit_wat = f'''(module (import "{WASI}" "proc_exit" (func $exit (param i32)))
      (memory (export "memory") 1)
      (func (export "f") (result i32) (call $exit (i32.const 7)) (i32.const 0)))'''
    e = refused(live, tmp_path, "quit", exit_wat, {"f": ([], ["i32"])},
                [{"name": "f", "export": "f", "args": [], "expect": [0]}])
    assert e.details["trap"] == "EXIT" and "proc_exit(7)" in e.message
    start_wat = '(module (func $s (loop (br 0))) (start $s) (func (export "f") (result i32) (i32.const 1)))'
    e = refused(live, tmp_path, "starter", start_wat, {"f": ([], ["i32"])},
                [{"name": "f", "export": "f", "args": [], "expect": [1]}], limits={"fuel": 1_000_000})
    assert e.details["trap"] == "OUT_OF_FUEL"


def test_expected_traps_can_be_tested(live, tmp_path):
    wat = '(module (func (export "div") (param i32 i32) (result i32) (i32.div_s (local.get 0) (local.get 1))))'
    a = admitted(live, tmp_path, "div", wat, {"div": (["i32", "i32"], ["i32"])},
                 [{"name": "7/2", "export": "div", "args": [7, 2], "expect": [3]},
                  {"name": "by zero", "export": "div", "args": [1, 0], "trap": "INTEGER_DIVISION_BY_ZERO"}])
    assert [o.ok for o in a.outcomes] == [True, True]
    with pytest.raises(CapabilityTrapped) as ei:
        registry.call(live, "div", "div", ["1", "0"])
    assert ei.value.details["trap"] == "INTEGER_DIVISION_BY_ZERO"
    # ... and a test expecting a trap fails when there is none.
    e = refused(live, tmp_path, "div2", wat, {"div": (["i32", "i32"], ["i32"])},
                [{"name": "by one", "export": "div", "args": [1, 1], "trap": "INTEGER_DIVISION_BY_ZERO"}])
    assert "expected trap" in e.message


def test_every_abuse_error_is_a_ledger_error(live, tmp_path):
    """Sweep: nothing the guest does escapes as a non-ledger exception."""
    wats = [SPIN, GROW_OR_ABORT, open_module("/etc/passwd"), ENV_WAT,
            '(module (memory 1) (func (export "open") (result i32) (i32.load (i32.const 99999999))))']
    for i, wat in enumerate(wats):
        src, man = write_cap(tmp_path / f"sweep{i}", f"s{i}", wat, {"open": ([], ["i32"])} if "open" in wat else
                             {"need_env": ([], ["i32"])} if "need_env" in wat else
                             {"grow": ([], ["i32"])} if "grow" in wat else {"spin": ([], ["i32"])},
                             [{"name": "t", "export": "open" if "open" in wat else "need_env" if "need_env" in wat
                               else "grow" if "grow" in wat else "spin", "args": [], "expect": [1]}],
                             limits={"fuel": 2_000_000, "memory_mib": 8})
        try:
            admission.admit(live, src, man)
        except LedgerError as e:
            assert e.exit_code in (2, 3), e
        else:
            raise AssertionError(f"sweep case {i} was admitted")
    host_ok(live)


def test_gc_proposal_is_not_available(live, tmp_path):
    """GC objects would live outside the limited linear memory: the engine refuses them."""
    wat = '''(module (type $a (array (mut i8)))
      (func (export "f") (result i32) (drop (array.new_default $a (i32.const 1000000))) (i32.const 1)))'''
    before = store_snapshot(live)
    src, man = write_cap(tmp_path, "gc", wat, {"f": ([], ["i32"])}, [{"name": "f", "export": "f", "args": [], "expect": [1]}])
    with pytest.raises(LedgerError) as ei:
        admission.admit(live, src, man)
    assert ei.value.exit_code == 2 and "not a valid wasm module" in ei.value.message
    assert store_snapshot(live) == before
    host_ok(live)


def test_reactor_initializer_runs_first_and_must_be_nullary(live, tmp_path):
    wat = '''(module (global $g (mut i32) (i32.const 0))
      (func (export "_initialize") (global.set $g (i32.const 41)))
      (func (export "get") (result i32) (i32.add (global.get $g) (i32.const 1))))'''
    a = admitted(live, tmp_path, "reactor", wat, {"get": ([], ["i32"])},
                 [{"name": "initialised", "export": "get", "args": [], "expect": [42]}])
    assert a.outcomes[0].ok
    bad = wat.replace('(func (export "_initialize") (global.set $g (i32.const 41)))',
                      '(func (export "_initialize") (param i32))')
    e = refused(live, tmp_path, "reactor2", bad, {"get": ([], ["i32"])},
                [{"name": "initialised", "export": "get", "args": [], "expect": [1]}])
    assert "_initialize" in e.message


def test_a_spinning_call_does_not_stall_the_host(live, tmp_path):
    """wasm runs without the GIL: while one thread's guest spins to its deadline, the host
    keeps serving other calls, and the spinning one still ends on time with a typed error."""
    import threading

    admitted(live, tmp_path, "loop", SPIN_N, {"spin": (["i64"], ["i64"])},
             [{"name": "zero", "export": "spin", "args": [0], "expect": [0]}])
    box = {}

    def spin():
        t0 = time.perf_counter()
        try:
            registry.call(live, "loop", "spin", [str(1 << 62)], fuel=100_000_000_000, time_ms=400)
        except CapabilityTrapped as e:
            box["trap"] = e.details["trap"]
        box["elapsed"] = time.perf_counter() - t0

    th = threading.Thread(target=spin)
    th.start()
    time.sleep(0.05)
    served = 0
    t0 = time.perf_counter()
    while th.is_alive() and time.perf_counter() - t0 < 5:
        host_ok(live)
        served += 1
    th.join(5)
    # 400 ms limit; the upper bound leaves room for a loaded 2-core CI machine
    assert box["trap"] == "INTERRUPT" and 0.35 < box["elapsed"] < 4.0
    assert served >= 10, served
