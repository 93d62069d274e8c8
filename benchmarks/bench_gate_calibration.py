"""Gate calibration end to end (docs/gate.md, "Why gate/2"; issue 16).

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/bench_gate_calibration.py --twins 40

Seed-twins of the test world's incumbent A (the same data and recipe, other seeds) and planted
gaming, every one judged through the real gate on a real store (tests/gate/calibration.py):
training, the sealed suite, the scorer, the journal, the budget, the contamination check.
Targets: Accept <= 5% and GamedTheEvaluator <= 5% over the twins (95% Wilson intervals
printed), every planted case refused with the right verdict, the positive control accepted.
`--suite 30x8` uses a 30 scored + 8 canary suite instead of the demo's 10 + 4.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests.gate.calibration

from tests.gate import calibration as C  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--twins", type=int, default=40)
    ap.add_argument("--first-seed", type=int, default=1)
    ap.add_argument("--suite", default="10x4", help="scored x canary documents (10x4 is the demo suite)")
    ap.add_argument("--no-planted", action="store_true")
    ap.add_argument("--no-dpo", action="store_true")
    ap.add_argument("--json", type=Path, help="write every case here")
    a = ap.parse_args()
    n_s, n_k = map(int, a.suite.split("x"))
    work = Path(tempfile.mkdtemp(prefix="bench-gate-cal-"))
    t0 = time.perf_counter()
    try:
        cal = C.build(work, n_scored=n_s, n_canary=n_k, budget_runs=a.twins + 20)
        print(f"world built in {time.perf_counter() - t0:.0f} s", flush=True)
        for c in C.twins_iter(cal, range(a.first_seed, a.first_seed + a.twins)):
            print(f"  {c.name:>14}: {c.verdict:17} mean dS {c.mean_s:+.4f}  mean dK {c.mean_k:+.4f} "
                  f"({c.canaries_worse} worse)  {c.seconds:.1f} s", flush=True)
        if not a.no_planted:
            for c in C.planted(cal, dpo=not a.no_dpo):
                ms = "" if c.mean_s is None else f"mean dS {c.mean_s:+.4f}  mean dK {c.mean_k:+.4f}"
                print(f"  {c.name}: {c.verdict} {c.reasons} {ms} -> {'right' if c.right else 'WRONG'}", flush=True)
        s = C.summary(cal.cases)
        for c in cal.cases:
            if c.name.startswith("control"):
                print(f"  {c.name}: {c.verdict} (mean dS {c.mean_s:+.4f}) -> {'right' if c.right else 'WRONG'}")
        lo, hi = s["accept_ci95"]
        glo, ghi = s["gamed_ci95"]
        print(f"suite {a.suite}; twins {s['twins']}: Accept {s['accept']}/{s['twins']} = {s['accept_rate']:.1%} "
              f"(95% CI {lo:.1%}–{hi:.1%}); GamedTheEvaluator {s['gamed']}/{s['twins']} = {s['gamed_rate']:.1%} "
              f"(95% CI {glo:.1%}–{ghi:.1%}); verdicts {s['twin_verdicts']}")
        print(f"twin mean canary delta: {s['twin_mean_canary_delta']}")
        pr = C.pair_rates(cal)
        s["ordered_pairs"] = pr
        print(f"all {pr['pairs']} ordered twin pairs (gate rules on recorded losses): Accept {pr['accept_rate']:.1%} "
              f"(95% CI {pr['accept_ci95'][0]:.1%}–{pr['accept_ci95'][1]:.1%}), GamedTheEvaluator {pr['gamed_rate']:.1%} "
              f"(95% CI {pr['gamed_ci95'][0]:.1%}–{pr['gamed_ci95'][1]:.1%}); {pr['verdicts']}")
        print(f"planted: {s['planted_right']}/{s['planted']} refused with the right verdict; "
              f"control right: {s['control_right']}; wall {time.perf_counter() - t0:.0f} s")
        if a.json:
            a.json.write_text(json.dumps({"summary": s, "cases": [c.to_json() for c in cal.cases]}, indent=1))
        ok = (s["accept_rate"] <= 0.05 and s["gamed_rate"] <= 0.05 and s["planted_right"] == s["planted"]
              and s["control_right"] and pr["accept_rate"] <= 0.05 and pr["gamed_rate"] <= 0.05)
        return 0 if ok else 1
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
