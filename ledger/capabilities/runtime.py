"""The wasm sandbox: one engine per process, one fresh wasmtime Store per call.

Every call runs under three limits that the guest cannot escape:
  * fuel — a budget of wasm instructions (deterministic: the same call uses the same fuel);
  * time — an epoch deadline; a ticker thread advances the engine's epoch every EPOCH_TICK_S
    while any call is running, and the guest traps when its deadline passes;
  * memory — Store limits on linear-memory bytes, table elements, instances, tables, memories,
    plus a fixed wasm stack size (deep recursion traps with STACK_OVERFLOW).

Authority is exactly the handles passed in: no argv, no environment, no stdin; stdout/stderr
and directories only when granted (ungranted stdio answers EBADF). The guest may import only
WASI preview1 functions; anything else is refused before instantiation. `poll_oneoff` is
replaced by a stub that answers ENOTSUP, because a guest sleeping inside a host call would
not be interrupted by the epoch deadline (it only fires in wasm code).
"""

from __future__ import annotations

import atexit
import errno
import functools
import math
import platform
import threading
import time
from dataclasses import dataclass, field
from importlib.metadata import version
from pathlib import Path

import blake3

from ledger.capabilities.manifest import Export, Handle, Limits, parse_arg
from ledger.errors import BadInput, CapabilityTrapped, InternalError, Refused
from ledger.store import canonical
from ledger.store.ids import hash_bytes

WASI_MODULE = "wasi_snapshot_preview1"
# Every function of WASI preview1 (witx snapshot 1). A module may import these and nothing else.
WASI_PREVIEW1 = frozenset("""
args_get args_sizes_get environ_get environ_sizes_get clock_res_get clock_time_get fd_advise
fd_allocate fd_close fd_datasync fd_fdstat_get fd_fdstat_set_flags fd_fdstat_set_rights
fd_filestat_get fd_filestat_set_size fd_filestat_set_times fd_pread fd_prestat_get
fd_prestat_dir_name fd_pwrite fd_read fd_readdir fd_renumber fd_seek fd_sync fd_tell fd_write
path_create_directory path_filestat_get path_filestat_set_times path_link path_open
path_readlink path_remove_directory path_rename path_symlink path_unlink_file poll_oneoff
proc_exit proc_raise sched_yield random_get sock_accept sock_recv sock_send sock_shutdown
""".split())
WASI_ENOTSUP = 58

# The engine configuration is part of the compiled-artefact cache key: change anything here
# and every cached artefact is keyed anew.
ENGINE_CONFIG = {
    "consume_fuel": True,
    "epoch_interruption": True,
    "max_wasm_stack": 512 << 10,
    "cranelift_opt_level": "speed",
    "wasm_threads": False,
    # GC objects live outside linear memory, where the Store's memory limit is not the bound
    # that tests prove; capabilities are plain functions and need neither proposal.
    "wasm_gc": False,
    "wasm_function_references": False,
}
EPOCH_TICK_S = 0.005
TICKER_IDLE_S = 2.0
STORE_LIMITS = {"table_elements": 100_000, "instances": 1, "tables": 4, "memories": 1}
MAX_OUTPUT_BYTES = 1 << 20   # per stream per call; further writes fail with EFBIG

TRAP_TEXT = {
    "OUT_OF_FUEL": "ran out of fuel",
    "INTERRUPT": "hit the time limit (epoch deadline)",
    "STACK_OVERFLOW": "overflowed the wasm stack",
    "MEMORY_OUT_OF_BOUNDS": "accessed memory out of bounds",
    "UNREACHABLE": "reached `unreachable` (a guest abort or panic)",
    "INTEGER_DIVISION_BY_ZERO": "divided by zero",
    "INTEGER_OVERFLOW": "overflowed an integer operation",
    "RESOURCE_LIMIT": "asked for more memory or table space than its limit",
    "EXIT": "called proc_exit",
    "HOST_ERROR": "made a WASI call the host rejected",
}


@functools.cache
def wasmtime_version() -> str:
    # importlib.metadata scans all of sys.path (40-80 ms, a tenth of a CLI call); the
    # installed package's own dist-info beside it gives the same answer in well under 1 ms.
    import wasmtime

    found = sorted(Path(wasmtime.__file__).parent.parent.glob("wasmtime-*.dist-info"))
    if len(found) == 1:
        return found[0].name[len("wasmtime-"):-len(".dist-info")]

    return version("wasmtime")


@functools.cache
def engine_identity() -> dict:
    return {"wasmtime": wasmtime_version(), "config": ENGINE_CONFIG, "machine": platform.machine(),
            "store_limits": STORE_LIMITS, "epoch_tick_s": EPOCH_TICK_S}


@functools.cache
def engine_key() -> str:
    """Names this engine's compiled artefacts: wasmtime version + config + machine."""
    return hash_bytes(canonical.dumps(engine_identity()))[3:]


_engine_lock = threading.Lock()
_engine = None


@atexit.register
def _release() -> None:
    # wasmtime objects free themselves through its ffi module; at interpreter teardown that
    # module may be gone first, so drop ours while it still exists.
    global _engine, _linker
    _pre_cache.clear()
    _linker = None
    _engine = None


def engine():
    global _engine
    with _engine_lock:
        if _engine is None:
            import wasmtime

            cfg = wasmtime.Config()
            for k, v in ENGINE_CONFIG.items():
                setattr(cfg, k, v)
            _engine = wasmtime.Engine(cfg)
        return _engine


class _Ticker:
    """Advances the engine epoch every EPOCH_TICK_S while calls are running.

    The thread outlives a call by TICKER_IDLE_S: starting a thread costs a context switch
    (0.1-0.5 ms on a loaded machine), a tenth of the warm-call budget. Ticks while no call
    runs are harmless: each call sets its deadline relative to the epoch at its start."""

    def __init__(self):
        self._lock = threading.Lock()
        self._users = 0
        self._running = False
        self._idle_since = 0.0

    def __enter__(self):
        with self._lock:
            self._users += 1
            if not self._running:
                self._running = True
                threading.Thread(target=self._run, args=(engine(),), name="ledger-wasm-epoch", daemon=True).start()
        return self

    def _run(self, eng) -> None:
        while True:
            time.sleep(EPOCH_TICK_S)
            with self._lock:
                if self._users == 0 and time.monotonic() - self._idle_since > TICKER_IDLE_S:
                    self._running = False
                    return
            eng.increment_epoch()

    def __exit__(self, *exc):
        with self._lock:
            self._users -= 1
            if self._users == 0:
                self._idle_since = time.monotonic()


_ticker = _Ticker()


def compile_module(wasm: bytes):
    """Compile wasm bytes for this engine (validation errors are BadInput)."""
    import wasmtime

    try:
        return wasmtime.Module(engine(), wasm)
    except wasmtime.WasmtimeError as e:
        raise BadInput(f"not a valid wasm module: {_cause(e)}", "give a wasm32-wasi core module") from None


# --- linking ---------------------------------------------------------------------------------
_linker_lock = threading.Lock()
_linker = None


def linker():
    """WASI preview1 with `poll_oneoff` stubbed; store-independent, so built once."""
    global _linker
    with _linker_lock:
        if _linker is None:
            import wasmtime

            lk = wasmtime.Linker(engine())
            lk.define_wasi()
            lk.allow_shadowing = True
            i32 = wasmtime.ValType.i32()
            lk.define_func(WASI_MODULE, "poll_oneoff", wasmtime.FuncType([i32] * 4, [i32]), _no_poll)
            lk.allow_shadowing = False
            _linker = lk
        return _linker


def _no_poll(_in, _out, _n, _nevents) -> int:
    return WASI_ENOTSUP


# --- the fixed world of admission tests -------------------------------------------------------------
# Admission must decide the same way every time it runs: a test that read the real clock or real
# random bytes could pass today and fail tomorrow (or pass by chance). So admission runs the
# module in a world where both are fixed: the clocks start at FIXED_CLOCK_NS and each read moves
# them by FIXED_CLOCK_STEP_NS (so a loop that waits for time to pass ends, the same way every
# time), and random_get returns the BLAKE3 output stream of FIXED_RANDOM_SEED, from its start at
# every run. Live calls (the image, `ledger capability call`) see the real ones.
FIXED_CLOCK_NS = 1_700_000_000 * 10**9      # 2023-11-14T22:13:20Z
FIXED_CLOCK_STEP_NS = 1_000
FIXED_CLOCK_RES_NS = 1_000
FIXED_RANDOM_SEED = b"ledger.capabilities.admission/1"
WASI_EFAULT, WASI_EINVAL = 21, 28
_CLOCKS = 4  # realtime, monotonic, process cputime, thread cputime


def fixed_world_description() -> dict:
    """What a test report records about the world its tests ran in."""
    return {"clock": {"start_ns": FIXED_CLOCK_NS, "step_ns": FIXED_CLOCK_STEP_NS},
            "random": {"stream": "blake3", "seed": FIXED_RANDOM_SEED.decode()}}


class _FixedWorld:
    """The clock and random stream of one admission run (fresh for each test)."""

    def __init__(self):
        self.now = FIXED_CLOCK_NS
        self.offset = 0

    @staticmethod
    def _write(caller, ptr: int, data: bytes) -> int:
        import wasmtime

        mem = caller.get("memory")
        if not isinstance(mem, wasmtime.Memory) or ptr < 0 or ptr + len(data) > mem.data_len(caller):
            return WASI_EFAULT
        mem.write(caller, data, ptr)
        return 0

    def clock_time_get(self, caller, clock_id: int, _precision: int, ptr: int) -> int:
        if not 0 <= clock_id < _CLOCKS:
            return WASI_EINVAL
        now, self.now = self.now, self.now + FIXED_CLOCK_STEP_NS
        return self._write(caller, ptr, now.to_bytes(8, "little"))

    def clock_res_get(self, caller, clock_id: int, ptr: int) -> int:
        if not 0 <= clock_id < _CLOCKS:
            return WASI_EINVAL
        return self._write(caller, ptr, FIXED_CLOCK_RES_NS.to_bytes(8, "little"))

    def random_get(self, caller, ptr: int, n: int) -> int:
        import wasmtime

        mem = caller.get("memory")
        n &= 0xFFFFFFFF
        if not isinstance(mem, wasmtime.Memory) or ptr < 0 or ptr + n > mem.data_len(caller):
            return WASI_EFAULT  # checked before generating: a guest cannot make the host allocate
        data = blake3.blake3(FIXED_RANDOM_SEED).digest(length=n, seek=self.offset)
        self.offset += n
        return self._write(caller, ptr, data)


def _fixed_linker(world: _FixedWorld):
    """A linker like `linker()`, with the clock and random functions of `world`."""
    import wasmtime

    lk = wasmtime.Linker(engine())
    lk.define_wasi()
    lk.allow_shadowing = True
    i32, i64 = wasmtime.ValType.i32(), wasmtime.ValType.i64()
    lk.define_func(WASI_MODULE, "poll_oneoff", wasmtime.FuncType([i32] * 4, [i32]), _no_poll)
    lk.define_func(WASI_MODULE, "clock_time_get", wasmtime.FuncType([i32, i64, i32], [i32]),
                   world.clock_time_get, access_caller=True)
    lk.define_func(WASI_MODULE, "clock_res_get", wasmtime.FuncType([i32, i32], [i32]),
                   world.clock_res_get, access_caller=True)
    lk.define_func(WASI_MODULE, "random_get", wasmtime.FuncType([i32, i32], [i32]),
                   world.random_get, access_caller=True)
    lk.allow_shadowing = False
    return lk


def check_imports(module) -> None:
    """Refuse any import that is not a WASI preview1 function (before linking)."""
    import wasmtime

    unknown = [f"{i.module}::{i.name}" for i in module.imports
               if i.module != WASI_MODULE or i.name not in WASI_PREVIEW1 or not isinstance(i.type, wasmtime.FuncType)]
    if unknown:
        shown = ", ".join(unknown[:8]) + (f" (+{len(unknown) - 8} more)" if len(unknown) > 8 else "")
        raise Refused(f"the module imports what the sandbox does not provide: {shown}",
                      f"a capability may import only WASI preview1 functions ({WASI_MODULE})", imports=unknown)


def check_exports(module, exports: tuple[Export, ...]) -> None:
    """Every export the manifest declares exists with exactly the declared signature."""
    import wasmtime

    have = {e.name: e.type for e in module.exports}
    init = have.get("_initialize")
    if init is not None and (not isinstance(init, wasmtime.FuncType) or list(init.params) or list(init.results)):
        raise Refused("export '_initialize' must be a function () -> () (a WASI reactor's constructor)")
    for ex in exports:
        ty = have.get(ex.name)
        if ty is None:
            raise Refused(f"the module has no export {ex.name!r} declared in the manifest",
                          f"module exports: {', '.join(sorted(have)) or 'none'}")
        if not isinstance(ty, wasmtime.FuncType):
            raise Refused(f"export {ex.name!r} is not a function")
        params, results = tuple(str(p) for p in ty.params), tuple(str(r) for r in ty.results)
        if (params, results) != (ex.params, ex.results):
            raise Refused(f"export {ex.name!r} has signature ({', '.join(params)}) -> ({', '.join(results)}); "
                          f"the manifest declares {ex.signature()}", "make the manifest match the module")


_pre_lock = threading.Lock()
_pre_cache: dict[int, object] = {}


def _instance_pre(module):
    """Linking is checked once per module and kept (wasmtime's InstancePre)."""
    import wasmtime

    key = id(module)
    with _pre_lock:
        hit = _pre_cache.get(key)
        if hit is not None and hit[0] is module:
            return hit[1]
    check_imports(module)
    try:
        pre = linker().instantiate_pre(module)
    except wasmtime.WasmtimeError as e:
        raise Refused(
            f"cannot link the module: {_cause(e, with_head=True)}",
            f"a capability may import only WASI preview1 functions ({WASI_MODULE})",
        ) from None
    with _pre_lock:
        if len(_pre_cache) > 256:
            _pre_cache.clear()
        _pre_cache[key] = (module, pre)
    return pre


# --- running ---------------------------------------------------------------------------------
@dataclass(frozen=True)
class Grant:
    """A handle with its resolved host path (directories only)."""
    handle: Handle
    host_path: Path | None = None


class _Output:
    def __init__(self, limit: int = MAX_OUTPUT_BYTES):
        self.buf = bytearray()
        self.limit = limit

    def write(self, data: bytes):
        if len(self.buf) + len(data) > self.limit:
            return -errno.EFBIG
        self.buf += data
        return len(data)


def _ebadf(_data: bytes):
    return -errno.EBADF


def _wasi(grants: tuple[Grant, ...], out: _Output, err: _Output):
    import wasmtime

    c = wasmtime.WasiConfig()   # empty: no argv, no environment, no stdin, no preopens
    kinds = {g.handle.kind for g in grants}
    c.stdout_custom = out.write if "stdout" in kinds else _ebadf
    c.stderr_custom = err.write if "stderr" in kinds else _ebadf
    for g in grants:
        if g.handle.kind == "dir":
            if g.host_path is None:
                raise InternalError(f"grant {g.handle} has no resolved host path")
            c.preopen_dir(str(g.host_path), g.handle.path, g.handle.mode == "rw")
    return c


@dataclass(frozen=True)
class CallResult:
    export: str
    values: tuple
    stdout: bytes = b""
    stderr: bytes = b""
    fuel_used: int = 0
    elapsed_s: float = 0.0
    types: tuple = field(default=())

    def to_json(self) -> dict:
        return {"export": self.export, "results": [format_value(v, t) for v, t in zip(self.values, self.types)],
                "values": list(_jsonable(v) for v in self.values),
                "stdout": self.stdout.decode("utf-8", "replace"), "stderr": self.stderr.decode("utf-8", "replace"),
                "fuel_used": self.fuel_used, "elapsed_ms": round(self.elapsed_s * 1e3, 3)}


def _jsonable(v):
    return v if not isinstance(v, float) or math.isfinite(v) else repr(v)


def format_value(v, ty: str) -> str:
    if ty in ("f32", "f64"):
        return repr(float(v))
    return str(int(v))


def run(module, export: Export, args: tuple, limits: Limits, grants: tuple[Grant, ...] = (), *,
        label: str = "", fixed_world: bool = False) -> CallResult:
    """Instantiate `module` in a fresh store with exactly `grants`, call `export(*args)`.
    `fixed_world`: the clock and random bytes are fixed (admission tests; see FIXED_CLOCK_NS).

    Traps and limit hits raise CapabilityTrapped with details {"trap": CODE}; nothing the guest
    does escapes as anything else."""
    import wasmtime

    pre = _instance_pre(module)  # also checks the imports, for both worlds
    eng = engine()
    st = wasmtime.Store(eng)
    st.set_limits(memory_size=limits.memory_bytes, **STORE_LIMITS)
    st.set_fuel(limits.fuel)
    out, err = _Output(), _Output()
    st.set_wasi(_wasi(grants, out, err))
    who = label or export.name
    ticks = math.ceil(limits.time_ms / 1e3 / EPOCH_TICK_S) + 1
    t0 = time.perf_counter()
    with _ticker:
        st.set_epoch_deadline(ticks)
        try:
            inst = _fixed_linker(_FixedWorld()).instantiate(st, module) if fixed_world else pre.instantiate(st)
            exports = inst.exports(st)
            init = exports.get("_initialize")   # a WASI reactor's constructors (wasi-libc)
            if init is not None:
                init(st)
            fn = exports.get(export.name)
            if fn is None:
                raise Refused(f"{who}: the module has no export {export.name!r}")
            raw = fn(st, *args)
        except (wasmtime.Trap, wasmtime.WasmtimeError) as e:
            elapsed = time.perf_counter() - t0
            raise trap_error(e, who, limits, _fuel_used(st, limits), elapsed, out.buf, err.buf) from None
    elapsed = time.perf_counter() - t0
    values = () if raw is None else tuple(raw) if isinstance(raw, (list, tuple)) else (raw,)
    return CallResult(export.name, values, bytes(out.buf), bytes(err.buf), _fuel_used(st, limits), elapsed, export.results)


def _fuel_used(st, limits: Limits) -> int:
    try:
        return limits.fuel - st.get_fuel()
    except Exception:  # noqa: BLE001 - reporting only; a store in a failed state has no fuel to read
        return -1


def _cause(e, with_head: bool = False) -> str:
    """The most specific line of a wasmtime error: its innermost `Caused by:` entry (after its
    first line when that names the subject, as link errors do)."""
    lines = [x.strip() for x in str(e).splitlines() if x.strip()]
    if "Caused by:" in lines:
        rest = lines[lines.index("Caused by:") + 1:]
        if rest:
            return f"{lines[0]}: {rest[-1]}" if with_head else rest[-1]
    return lines[0] if lines else type(e).__name__


def trap_error(e, who: str, limits: Limits, fuel_used: int, elapsed: float, stdout: bytes = b"",
               stderr: bytes = b"") -> CapabilityTrapped:
    import wasmtime

    details = {"fuel_used": fuel_used, "elapsed_ms": round(elapsed * 1e3, 3)}
    if isinstance(e, wasmtime.ExitTrap):
        code, what = "EXIT", f"called proc_exit({e.code})"
        details["status"] = e.code
    elif isinstance(e, wasmtime.Trap) and e.trap_code is not None:
        code = e.trap_code.name
        what = TRAP_TEXT.get(code, f"trapped ({code.lower().replace('_', ' ')})")
        if code == "OUT_OF_FUEL":
            what += f" (limit {limits.fuel})"
        elif code == "INTERRUPT":
            what += f" ({limits.time_ms} ms)"
        elif code == "STACK_OVERFLOW":
            what += f" ({ENGINE_CONFIG['max_wasm_stack'] >> 10} KiB)"
    else:
        cause = _cause(e)
        if "exceeds memory limits" in cause or "table" in cause and "limit" in cause:
            code, what = (
                "RESOURCE_LIMIT",
                f"asked for more than its limits allow ({cause}; memory limit {limits.memory_bytes >> 20} MiB)",
            )
        else:
            code, what = "HOST_ERROR", f"failed: {cause}"
    if stderr:
        details["stderr"] = stderr[-2000:].decode("utf-8", "replace")
    return CapabilityTrapped(f"{who} {what} [{code}]", trap=code, **details)


def parse_args(export: Export, argv: list[str]) -> tuple:
    if len(argv) != len(export.params):
        raise BadInput(f"{export.name} takes {len(export.params)} arguments {export.signature()}, got {len(argv)}")
    return tuple(parse_arg(a, t, f"argument {i + 1} of {export.name}") for i, (a, t) in enumerate(zip(argv, export.params)))
