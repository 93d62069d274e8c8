"""Peak RSS of gc's closures (ledger/store/reach.py), grown to N reached keys as a first gc's walk
grows them, then Walk.result() (what the saved state is made from).

    OMP_NUM_THREADS=1 python benchmarks/bench_reach_keys.py CODE_DIR N

CODE_DIR is a checkout (or a `git archive` of a commit) whose ledger package is measured. The walk
goes through Walk._grow, as gc's does, with every object a leaf already opened (the memo), so only
the closures' own memory and time are measured: each "record" reaches 10,000 objects and the
policy keeps all but 1 % of them (superseded training state, as on a real store)."""

from __future__ import annotations

import sys
import time

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
    leaf = reach.Node()
    start = hwm_mib()
    t0 = time.process_time()
    per = 10_000
    for at in range(0, n, per):
        ids = [f"b3:{k:016x}" + "0" * 48 for k in keys[at:at + per].tolist()]
        w._grow(ids, ids[: per - per // 100], dict.fromkeys(ids, leaf))
    walk = hwm_mib()
    out = w.result()
    cpu = time.process_time() - t0
    print(f"{code}: start {start} MiB, after the walk {walk} MiB, after result() {hwm_mib()} MiB; "
          f"reached {len(out[0])}, not kept {len(out[1])}; {cpu:.1f} s CPU ({cpu / n * 1e6:.2f} us a key)")


if __name__ == "__main__":
    main()
