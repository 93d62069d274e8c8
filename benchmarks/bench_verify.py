"""`ledger verify` at scale (issue 18): `verify --full` per record and its peak memory, and
`verify --read-data` of one large object beside `b3sum` of the same bytes, measured in the same run.

    .venv/bin/python benchmarks/bench_verify.py --store /path/to/a/bench_scale/store   # --full
    .venv/bin/python benchmarks/bench_verify.py --size-gib 2                           # --read-data vs b3sum

`--store` takes a store built by benchmarks/bench_scale.py (e.g. its cached 1M store) and works on
a copy whose objects are hard links (verify writes only its watermark; the copy keeps the cache
pristine). Each figure is a fresh CLI process (`ledger verify --full`), wall and peak RSS by GNU
time, CPU from the process's rusage; beside it the peers a user could run on the same journal:
`b3sum` of the journal file (hashing alone) and a bare Python loop of `json.loads` over its lines
(parsing alone), which verify does both of and more. `--size-gib` makes a store holding one
random object of that size (stored as chunks, ledger/store/chunks.py) and alternates `b3sum` of
the source file with `ledger verify --read-data` (CLI) and verify in process, min/median/max.
Targets: verify --full <= 5 us per record, peak RSS <= 300 MiB at 10M records; verify --read-data
>= 0.9x b3sum's throughput.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PY = sys.executable
LEDGER = [PY, "-m", "ledger.cli.main"]
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}


def run(cmd, cwd=None) -> dict:
    """Wall s, user+sys CPU s and peak RSS (MiB) of one command (its children included)."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t = time.perf_counter()
    p = subprocess.run(["/usr/bin/time", "-f", "%M", *cmd], cwd=cwd, env=ENV, stdout=subprocess.PIPE,
                       stderr=subprocess.PIPE, text=True)
    wall = time.perf_counter() - t
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    rss = int(p.stderr.strip().splitlines()[-1]) / 1024
    return {"wall_s": wall, "cpu_s": cpu, "rss_mib": rss, "rc": p.returncode, "out": p.stdout}


def mmm(xs) -> str:
    return f"{min(xs):.2f} / {statistics.median(xs):.2f} / {max(xs):.2f}"


def copy_store(src: Path, dest: Path) -> Path:
    """A working copy, every file hard-linked: verify writes only by rename (its watermark; a
    false refs.json moved aside), which replaces the copy's link and leaves the original alone."""
    shutil.rmtree(dest, ignore_errors=True)
    subprocess.run(["cp", "-al", str(src), str(dest)], check=True)
    (dest / ".ledger" / "cache" / "verified.json").unlink(missing_ok=True)
    return dest


PARSE = """import json, sys, time
t = time.process_time()
n = 0
with open(sys.argv[1], "rb") as f:
    for line in f:
        json.loads(line)
        n += 1
print(n, time.process_time() - t)
"""


def bench_full(store: Path, repeat: int, work: Path) -> dict:
    s = copy_store(store, work / "verify-full")
    journal = s / ".ledger" / "journal"
    records = sum(1 for _ in open(journal, "rb"))
    out = {"records": records, "verify": [], "b3sum": [], "parse": []}
    for _ in range(repeat):  # alternating: ledger, then each peer
        (s / ".ledger" / "cache" / "verified.json").unlink(missing_ok=True)
        r = run(LEDGER + ["verify", "--full", "--json"], cwd=s)
        rep = json.loads(r["out"])
        r["ok"] = rep["result"]["ok"] if "result" in rep else rep.get("ok")
        r.pop("out")
        out["verify"].append(r)
        b = run(["b3sum", str(journal)])
        b.pop("out")
        out["b3sum"].append(b)
        p = subprocess.run([PY, "-c", PARSE, str(journal)], capture_output=True, text=True, env=ENV, check=True)
        out["parse"].append(float(p.stdout.split()[1]))
    v = out["verify"]
    print(f"verify --full, {records:,} records ({repeat} runs, min / median / max):")
    print(f"  wall   {mmm([x['wall_s'] for x in v])} s  = {statistics.median(x['wall_s'] for x in v) / records * 1e6:.1f} us/record")
    print(f"  CPU    {mmm([x['cpu_s'] for x in v])} s  = {statistics.median(x['cpu_s'] for x in v) / records * 1e6:.1f} us/record")
    print(f"  RSS    {mmm([x['rss_mib'] for x in v])} MiB   ok: {[x['ok'] for x in v]}")
    print(f"  peer b3sum of the journal: {mmm([x['wall_s'] for x in out['b3sum']])} s wall")
    print(f"  peer json.loads of each line: {mmm(out['parse'])} s CPU = "
          f"{statistics.median(out['parse']) / records * 1e6:.2f} us/record")
    shutil.rmtree(s, ignore_errors=True)
    return out


def bench_read_data(size: int, repeat: int, work: Path) -> dict:
    src = work / "big.bin"
    if not src.exists() or src.stat().st_size != size:
        with open(src, "wb") as f:
            left = size
            while left:
                n = min(left, 64 << 20)
                f.write(os.urandom(n))
                left -= n
    store = work / "rd-store"
    shutil.rmtree(store, ignore_errors=True)
    store.mkdir()
    subprocess.run(LEDGER + ["init"], cwd=store, env=ENV, check=True, stdout=subprocess.DEVNULL)
    subprocess.run(LEDGER + ["add", str(src)], cwd=store, env=ENV, check=True, stdout=subprocess.DEVNULL)
    subprocess.run(["sh", "-c", f"cat {src} > /dev/null; cat {store}/.ledger/packs/*/* > /dev/null 2>&1 || true"])
    inproc = ("import sys, time; from ledger.store import Store; from ledger.store.verify import verify; "
              "s = Store.open(sys.argv[1]); t = time.perf_counter(); r = verify(s, read_data=True); "
              "print(time.perf_counter() - t, r.ok)")
    out = {"bytes": size, "b3sum": [], "cli": [], "inproc": [], "startup": []}
    for _ in range(repeat):
        out["b3sum"].append(run(["b3sum", str(src)])["wall_s"])
        r = run(LEDGER + ["verify", "--read-data"], cwd=store)
        assert r["rc"] == 0, r
        out["cli"].append(r["wall_s"])
        p = subprocess.run([PY, "-c", inproc, str(store)], capture_output=True, text=True, env=ENV, check=True)
        out["inproc"].append(float(p.stdout.split()[0]))
        out["startup"].append(run(LEDGER + ["--help"], cwd=store)["wall_s"])
    gb = size / 1e9
    b, c = statistics.median(out["b3sum"]), statistics.median(out["cli"])
    print(f"one {size / (1 << 30):.1f} GiB object ({repeat} runs, min / median / max, s):")
    print(f"  b3sum                       {mmm(out['b3sum'])}  {gb / b:.2f} GB/s")
    print(f"  ledger verify --read-data   {mmm(out['cli'])}  {gb / c:.2f} GB/s = {b / c:.2f}x b3sum (target >= 0.9)")
    print(f"  verify in process           {mmm(out['inproc'])}")
    print(f"  `ledger --help` (start-up)  {mmm(out['startup'])}")
    shutil.rmtree(store, ignore_errors=True)
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--store", type=Path, help="a store built by bench_scale.py: time verify --full on a copy")
    ap.add_argument("--size-gib", type=float, default=0, help="time verify --read-data of one object this large")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--work", type=Path, default=Path(tempfile.gettempdir()) / "ledger-bench-verify")
    ap.add_argument("--json", type=Path, help="write the figures here")
    a = ap.parse_args(argv)
    a.work.mkdir(parents=True, exist_ok=True)
    res = {}
    if a.store:
        res["full"] = bench_full(a.store, a.repeat, a.work)
    if a.size_gib:
        res["read_data"] = bench_read_data(int(a.size_gib * (1 << 30)), a.repeat, a.work)
    if not res:
        ap.error("give --store and/or --size-gib")
    if a.json:
        a.json.write_text(json.dumps(res, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
