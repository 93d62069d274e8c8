"""Packed objects at scale (issue 18; docs/store-format.md, "Packed objects").

From one built store (e.g. `bench_scale.py --records 1000000 --build-only`), two hard-linked
working copies: one left as written — one file per object, the layout of DVC's cache and of
ledger before packing — and one packed by `ledger gc --prune` (timed, with its peak RSS: the
migration a year-old store meets once). Then, alternating between the two copies, each a fresh
CLI process under /usr/bin/time: `verify --full` and gc's first walk (`gc`, its saved state
removed first); with --cold the page cache is dropped before every run (root only), as a store
larger than memory is read. Prints the disk each copy's objects take, every run, and
min/median/max per command and copy.

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/bench_packed.py /tmp/bs/store-n1000000-c2700-b2-v2 \\
        --work /tmp/bp --repeat 3 [--cold]
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
from pathlib import Path

import bench_passes_ab  # its timed CLI run (this folder is on sys.path when a benchmark runs)

ROOT = Path(__file__).resolve().parents[1]
COMMANDS = {"verify-full": ["verify", "--full"], "gc": ["gc"]}
SAVED_STATES = ("reach.bin", "reach.seal")


def timed(argv: list[str], store: Path) -> tuple[float, float, float, int]:
    """(wall s, CPU s, peak RSS MiB, exit code) of one CLI process of this checkout in `store`."""
    return bench_passes_ab.run(ROOT, argv, store)


def disk(path: Path) -> tuple[int, int]:
    """(bytes on disk, apparent bytes) of the files under `path` (hard links counted once)."""
    seen, used, apparent = set(), 0, 0
    for dirpath, _, files in os.walk(path):
        for f in files:
            st = os.lstat(os.path.join(dirpath, f))
            if (st.st_dev, st.st_ino) in seen:
                continue
            seen.add((st.st_dev, st.st_ino))
            used += st.st_blocks * 512
            apparent += st.st_size
    return used, apparent


def drop_caches() -> None:
    os.sync()
    with open("/proc/sys/vm/drop_caches", "w") as f:
        f.write("1\n")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("store", type=Path, help="a built store (its folder holding .ledger)")
    ap.add_argument("--work", type=Path, required=True, help="where the two working copies go (replaced)")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--cold", action="store_true", help="drop the page cache before every run (root)")
    a = ap.parse_args(argv)
    copies = {"one file per object": a.work / "loose", "packed": a.work / "packed"}
    shutil.rmtree(a.work, ignore_errors=True)
    a.work.mkdir(parents=True)
    for path in copies.values():
        subprocess.run(["cp", "-al", str(a.store), str(path)], check=True)
    wall, cpu, rss, rc = timed(["gc", "--prune"], copies["packed"])
    print(f"gc --prune on the copy to pack (the migration): {wall:.2f} s wall, {cpu:.2f} s CPU, {rss:.0f} MiB, rc {rc}")
    if rc:
        return 1
    for label, path in copies.items():
        ledger = path / ".ledger"
        parts = [ledger / "objects"] + ([ledger / "packed"] if (ledger / "packed").is_dir() else [])
        used = [disk(p) for p in parts]
        print(f"{label}: objects take {sum(u for u, _ in used) / 1e9:.3f} GB on disk "
              f"({sum(x for _, x in used) / 1e9:.3f} GB apparent)")
    res: dict[tuple[str, str], list[tuple[float, float, float]]] = {}
    for r in range(a.repeat):
        for name, argv_ in COMMANDS.items():
            for label in list(copies) if r % 2 == 0 else list(copies)[::-1]:
                path = copies[label]
                for f in SAVED_STATES:
                    (path / ".ledger" / "cache" / f).unlink(missing_ok=True)
                if a.cold:
                    drop_caches()
                wall, cpu, rss, rc = timed(argv_, path)
                print(f"  round {r + 1} {name:<12} {label:<20} {wall:8.2f} s wall {cpu:8.2f} s CPU {rss:6.0f} MiB rc {rc}")
                res.setdefault((name, label), []).append((wall, cpu, rss))
    print(f"\n{'command':<12} {'copy':<20} {'wall min / median / max':>28} {'CPU median':>11} {'peak RSS':>9}")
    for (name, label), runs in res.items():
        w = sorted(x[0] for x in runs)
        print(f"{name:<12} {label:<20} {w[0]:8.2f} / {statistics.median(w):6.2f} / {w[-1]:6.2f} s "
              f"{statistics.median(x[1] for x in runs):9.2f} s {max(x[2] for x in runs):7.0f} MiB")
    return 0


if __name__ == "__main__":
    sys.exit(main())
