"""`ledger report` on a store: wall time of the command beside `ledger gens` (a plain read of the
same store through the same CLI start-up), and the library's gather / render split.

    python benchmarks/bench_report.py DEMO_DIR      # DEMO_DIR from `ledger demo --dir DEMO_DIR`
"""

from __future__ import annotations

import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def wall(cmd: list[str], n: int) -> float:
    ts = []
    for _ in range(n):
        t0 = time.perf_counter()
        subprocess.run(cmd, check=True, capture_output=True)
        ts.append(time.perf_counter() - t0)
    return statistics.median(ts)


def main(store_dir: str, n: int = 7) -> None:
    from ledger.report import gather, render
    from ledger.store import Store

    exe = str(Path(sys.executable).with_name("ledger"))
    with tempfile.TemporaryDirectory() as td:
        out = Path(td) / "report.html"
        report = wall([exe, "--store", store_dir, "report", "-o", str(out)], n)
        size = out.stat().st_size
    gens = wall([exe, "--store", store_dir, "gens"], n)
    store = Store.open(store_dir)
    g, r = [], []
    for _ in range(n):
        t0 = time.perf_counter()
        m = gather(store)
        t1 = time.perf_counter()
        render(m)
        t2 = time.perf_counter()
        g.append(t1 - t0)
        r.append(t2 - t1)
    print(f"store: {store.state.seq} records, {len(m.receipts)} receipts, {len(m.judges)} gate runs ({store_dir})")
    print(f"ledger report   {report * 1e3:8.1f} ms wall (median of {n}), page {size / 1024:.1f} KiB")
    print(f"ledger gens     {gens * 1e3:8.1f} ms wall (peer: same store, same CLI start-up)")
    print(f"  gather {statistics.median(g) * 1e3:.2f} ms, render {statistics.median(r) * 1e3:.2f} ms (in process)")


if __name__ == "__main__":
    main(sys.argv[1])
