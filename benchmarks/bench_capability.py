"""Capability benchmarks (issue 6), each figure beside its peer's, measured in the same run.

    .venv/bin/python benchmarks/bench_capability.py [--calls 500] [--cli-runs 7] [--functions 3000]

1. Warm `capability call` in-process (target <= 5 ms): ledger's call — read HEAD's entry and
   manifest (verified reads), parse args, resolve grants, fetch the compiled module from the
   cache, fresh wasmtime store with fuel/epoch/memory limits and WASI, call — beside bare
   wasmtime-py doing only the sandboxed part (fresh store + limits + WASI + instantiate + call
   on a module it already holds), and beside a bare call with no sandbox at all.
2. CLI wall time of `ledger capability call adder add 2 3` beside `python -c pass`,
   `ledger --help`, and a bare Python script that imports wasmtime, compiles the same
   module and calls it (what one would write without ledger).
3. Compiled-module cache: miss (compile + serialize + write) vs disk hit (read + BLAKE3 check
   + deserialize) vs memory hit, on the adder and on a generated module with many functions;
   peers: wasmtime compiling from bytes, and deserializing without the hash check.
Work files go to benchmarks/_work/capability (gitignored).
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
WORK = ROOT / "benchmarks" / "_work" / "capability"
EXAMPLES = ROOT / "examples" / "capabilities"
PY = sys.executable


def stats_ms(samples: list[float]) -> str:
    s = sorted(samples)
    med = statistics.median(s) * 1e3
    p90 = s[min(len(s) - 1, int(0.9 * len(s)))] * 1e3
    return f"median {med:8.3f} ms   p90 {p90:8.3f} ms   (n={len(s)})"


def median_ms(samples) -> float:
    return statistics.median(samples) * 1e3


def timeit(fn, n: int) -> list[float]:
    out = []
    for _ in range(n):
        t0 = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t0)
    return out


def big_wat(n: int) -> str:
    body = "\n".join(
        f'(func $f{i} (export "f{i}") (param i32 i32) (result i32) '
        f'(i32.add (i32.mul (local.get 0) (i32.const {i + 3})) (i32.xor (local.get 1) (i32.const {i * 7 + 1}))))'
        for i in range(n))
    return f"(module {body})"


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--calls", type=int, default=500)
    ap.add_argument("--cli-runs", type=int, default=7)
    ap.add_argument("--functions", type=int, default=3000)
    args = ap.parse_args()

    import wasmtime

    from ledger.capabilities import admission, cache, registry, runtime
    from ledger.capabilities.manifest import Limits
    from ledger.store import Store
    from ledger.store.ids import hash_bytes

    if WORK.exists():
        shutil.rmtree(WORK)
    WORK.mkdir(parents=True)
    store = Store.init(WORK)
    a = admission.admit(store, EXAMPLES / "adder.wat", EXAMPLES / "adder.toml")
    print(f"wasmtime {runtime.wasmtime_version()}, python {sys.version.split()[0]}, store {store.root}")

    # --- 1. warm call in-process ----------------------------------------------------------------
    print("\n1. warm call of adder.add(2, 3), in-process")
    for _ in range(20):
        assert registry.call(store, "adder", "add", ["2", "3"]).values == (5,)
    ledger_s = timeit(lambda: registry.call(store, "adder", "add", ["2", "3"]), args.calls)

    eng = runtime.engine()
    module = cache.load(store, a.module)
    lim = Limits(1_000_000, 1000, 1 << 20)
    lk = wasmtime.Linker(eng)
    lk.define_wasi()

    def bare_sandboxed():
        st = wasmtime.Store(eng)
        st.set_limits(memory_size=lim.memory_bytes, table_elements=100_000, instances=1, tables=4, memories=1)
        st.set_fuel(lim.fuel)
        st.set_epoch_deadline(1000)
        st.set_wasi(wasmtime.WasiConfig())
        inst = lk.instantiate(st, module)
        return inst.exports(st)["add"](st, 2, 3)

    def bare_unsandboxed_setup():
        st = wasmtime.Store(eng)
        st.set_fuel(lim.fuel)
        st.set_epoch_deadline(1000)
        inst = wasmtime.Instance(st, module, [])
        return st, inst.exports(st)["add"]
    st0, add0 = bare_unsandboxed_setup()

    for _ in range(20):
        bare_sandboxed()
    bare_s = timeit(bare_sandboxed, args.calls)
    raw_s = timeit(lambda: add0(st0, 2, 3), args.calls)
    print(f"  ledger capability call (in-process)      {stats_ms(ledger_s)}")
    print(f"  peer: bare wasmtime, fresh sandbox/call  {stats_ms(bare_s)}")
    print(f"  peer: bare wasmtime, same instance       {stats_ms(raw_s)}")
    verdict = "meets" if median_ms(ledger_s) <= 5 else "MISSES"
    print(f"  -> ledger median {median_ms(ledger_s):.3f} ms {verdict} the 5 ms target; "
          f"{median_ms(ledger_s) / median_ms(bare_s):.2f}x the bare sandboxed call")

    # --- 2. CLI wall time -------------------------------------------------------------------------
    print("\n2. CLI wall time (fresh process each run)")
    bare_script = WORK / "bare_call.py"
    bare_script.write_text(
        "import wasmtime\n"
        "e = wasmtime.Engine()\n"
        f"m = wasmtime.Module(e, open({str(EXAMPLES / 'adder.wat')!r}).read())\n"
        "s = wasmtime.Store(e)\n"
        "print(wasmtime.Instance(s, m, []).exports(s)['add'](s, 2, 3))\n")
    cmds = {
        "python -c pass": [PY, "-c", "pass"],
        "ledger --help": [PY, "-m", "ledger.cli.main", "--help"],
        "bare python+wasmtime script (compiles)": [PY, str(bare_script)],
        "ledger capability call adder add 2 3": [PY, "-m", "ledger.cli.main", "capability", "call", "adder", "add", "2", "3"],
    }
    walls = {}
    for name, cmd in cmds.items():
        out = subprocess.run(cmd, cwd=WORK, capture_output=True, text=True, check=True).stdout  # warm the page cache
        if "add" in name:
            assert out.strip() == "5", out
        walls[name] = timeit(lambda: subprocess.run(cmd, cwd=WORK, stdout=subprocess.DEVNULL, check=True), args.cli_runs)
        print(f"  {name:42s} {stats_ms(walls[name])}")
    call_ms = median_ms(walls["ledger capability call adder add 2 3"])
    print(f"  -> ledger call minus `ledger --help`: {call_ms - median_ms(walls['ledger --help']):.1f} ms; "
          f"minus the bare script: {call_ms - median_ms(walls['bare python+wasmtime script (compiles)']):.1f} ms")

    # --- 3. compile cache -------------------------------------------------------------------------
    print("\n3. compiled-module cache: miss vs hit")
    big = WORK / "big.wat"
    big.write_text(big_wat(args.functions))
    wasm_big = wasmtime.wat2wasm(big.read_text())
    with store.transaction("bench") as tx:
        big_id = tx.put_bytes(bytes(wasm_big), kind="wasm")
    for label, mid in (("adder", a.module), (f"generated, {args.functions} functions, {len(wasm_big) >> 10} KiB", big_id)):
        wasm = store.get_bytes(mid)
        n = 5 if mid == big_id else 50
        k = cache.key(mid)

        def miss():
            cache.clear_memory()
            for p in cache.cache_dir(store).glob(f"{k}.*"):
                p.unlink()
            cache.load(store, mid)

        def disk_hit():
            cache.clear_memory()
            cache.load(store, mid)

        def mem_hit():
            cache.load(store, mid)

        miss_s = timeit(miss, n)
        disk_s = timeit(disk_hit, n * 4)
        mem_s = timeit(mem_hit, n * 4)
        art = next(cache.cache_dir(store).glob(f"{k}.*.cwasm"))
        ser = art.read_bytes()
        compile_s = timeit(lambda: wasmtime.Module(eng, wasm), n)
        deser_s = timeit(lambda: wasmtime.Module.deserialize(eng, ser), n * 4)
        hash_s = timeit(lambda: hash_bytes(ser), n * 4)
        print(f"  {label}: artefact {len(ser) >> 10} KiB")
        print(f"    ledger miss (compile+serialize+write) {stats_ms(miss_s)}")
        print(f"    ledger disk hit (read+BLAKE3+deser.)  {stats_ms(disk_s)}")
        print(f"    ledger memory hit                     {stats_ms(mem_s)}")
        print(f"    peer: wasmtime compile from bytes     {stats_ms(compile_s)}")
        print(f"    peer: wasmtime deserialize, no check  {stats_ms(deser_s)}")
        print(f"    (of which BLAKE3 of the artefact      {stats_ms(hash_s)})")
        print(f"    -> disk hit is {median_ms(compile_s) / median_ms(disk_s):.1f}x faster than compiling")
    return 0


if __name__ == "__main__":
    sys.exit(main())
