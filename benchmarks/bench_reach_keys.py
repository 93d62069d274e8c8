# python benchmarks/bench_reach_keys.py CODE_DIR N: peak RSS of gc's two key closures (reach.Keys) grown to N keys, then Walk.result().
# Peak RSS of gc's two closures at 10M objects: reach and kept grown key by key, then result().
import resource, sys
import numpy as np
sys.path.insert(0, sys.argv[1])
from ledger.store import reach as R
def hwm():
    for l in open("/proc/self/status"):
        if l.startswith("VmHWM"): return int(l.split()[1]) // 1024
N = int(sys.argv[2])
keys = np.random.default_rng(0).integers(1, 2**63, N, dtype=np.uint64)
w = R.Walk(store=None)
base = hwm()
for at in range(0, N, 100_000):
    for k in keys[at:at + 100_000].tolist():
        w.reach.add(k); w.kept.add(k)
walk = hwm()
out = w.result()
print(f"{sys.argv[1]}: start {base} MiB, after the walk {walk} MiB, after result() {hwm()} MiB; keys {len(out[0])}")
