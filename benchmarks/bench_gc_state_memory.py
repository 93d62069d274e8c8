"""Peak RSS of `gc` from its saved reach state (docs/store-format.md rule 22) at N reachable keys.

Synthetic: the keys are random and the store is tiny, so what is measured is what the saved state
costs gc to load, grow by one record, save again and judge a listing with — the part of gc whose
memory grows with history (a real store adds one fan-out directory's listing at a time). Each step
is its own process, so a step's peak RSS is its own:

    python benchmarks/bench_gc_state_memory.py DIR 10000000 make         # a store whose state holds N keys
    python benchmarks/bench_gc_state_memory.py DIR 10000000 grow         # append one record (no gc)
    python benchmarks/bench_gc_state_memory.py DIR 10000000 after-a-record
    python benchmarks/bench_gc_state_memory.py DIR 10000000 nothing-new
"""
import os
import resource
import shutil
import sys

import numpy as np

from ledger.store import Store, gc, gcstate


def main(root: str, n: int, step: str) -> None:
    if step == "make":
        shutil.rmtree(root, ignore_errors=True)
        os.makedirs(root)
        s = Store.init(root)
        keys = np.unique(np.random.default_rng(0).integers(0, 2**63, n, dtype=np.uint64))
        empty = np.empty(0, np.uint64)
        why = gcstate.save(s, s.state, os.path.getsize(s.journal.path), keys, empty, empty, (), ())
        print("made", len(keys), "keys" if why is None else f"keys, not saved: {why}")
        return
    if step == "grow":
        with Store.open(root).transaction("t") as tx:
            tx.payload["x"] = "b3:" + os.urandom(32).hex()   # a new root (missing: unresolved)
        return
    s = Store.open(root)
    p = gc.plan(s)
    print(step, "reachable", p.reachable, "peak RSS MiB", round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
          s.warnings)


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]), sys.argv[3])
