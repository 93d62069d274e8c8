"""Peak RSS of gc's two key closures (ledger/store/reach.py Keys), grown key by key to N keys each
as a first gc's walk grows them, then Walk.result() (what the saved state is made from).

    OMP_NUM_THREADS=1 python benchmarks/bench_reach_keys.py CODE_DIR N

CODE_DIR is a checkout (or a `git archive` of a commit) whose ledger package is measured."""

from __future__ import annotations

import sys

import numpy as np


def hwm_mib() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM"):
                return int(line.split()[1]) // 1024
    return -1


def main() -> None:
    code, n = sys.argv[1], int(sys.argv[2])
    sys.path.insert(0, code)
    from ledger.store import reach

    keys = np.random.default_rng(0).integers(1, 2**63, n, dtype=np.uint64)
    w = reach.Walk(store=None)
    start = hwm_mib()
    for at in range(0, n, 100_000):
        for k in keys[at:at + 100_000].tolist():
            w.reach.add(k)
            w.kept.add(k)
    walk = hwm_mib()
    out = w.result()
    print(f"{code}: start {start} MiB, after the walk {walk} MiB, after result() {hwm_mib()} MiB; keys {len(out[0])}")


if __name__ == "__main__":
    main()
