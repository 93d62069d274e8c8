#!/usr/bin/env python3
"""Launch a few decode kernels a few times each, for Nsight Compute to read their counters
(issue 20, session 9): where the x16 kernels' time goes (occupancy, stalls, DRAM throughput).

    ncu --clock-control none --kernel-name regex:decode_linear_x16 --launch-skip 1 --launch-count 8 \\
        --section SpeedOfLight --section Occupancy --section WarpStateStats \\
        python3 benchmarks/kernels/ncu_probe.py KERNEL:NxK:NW,U,RT,S ...

Each argument is launched twice (the first launch of a configuration loads it; ncu's
--launch-skip / --launch-count pick what it profiles). Nothing is timed here: ncu serialises
and replays every profiled launch, so its durations are its own.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from ledger.kernels import harness as H  # noqa: E402
from ledger.kernels import runtime as R  # noqa: E402
from ledger.kernels import specs as S  # noqa: E402


def main(argv: list[str]) -> int:
    info = R.device_info()
    arch = f"sm_{info['cc'][0]}{info['cc'][1]}"
    for arg in argv:
        name, nk, cfg = arg.split(":")
        n, k = (int(v) for v in nk.split("x"))
        spec = S.get(name)
        sh = S.Shape(1, n, k, 16 if spec.lora else 0)
        op = R.DecodeLinear(R.load(H.build(name, arch)), spec, sh, R.random_device_inputs(spec, sh, 1),
                            tuple(int(v) for v in cfg.split(",")))
        for _ in range(2):
            op()
        R.cupy().cuda.Device().synchronize()
        print(f"{arg}: {op.entry} grid {op.grid} block {op.block}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
