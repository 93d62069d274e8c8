"""Cycle overhead (issue 5): wall time of one learn cycle minus the time spent inside training
(the child process) and scoring (both models on the suite), per stage.

    .venv/bin/python benchmarks/bench_cycle.py

Target: overhead <= 3% of the cycle on the demo configuration.
"""

from __future__ import annotations

import json
import shutil
import sys
import tempfile
import time
from pathlib import Path


def main() -> None:
    from ledger import experience
    from ledger.cycle import ensure_genesis, load_spec, run_cycle
    from ledger.demo.story import GOOD_TURNS, good_turns
    from ledger.gate import seal as seallib
    from ledger.options import LearnOptions
    from ledger.store import Store

    work = Path(tempfile.mkdtemp(prefix="bench-cycle-"))
    try:
        s = Store.init(work)
        ensure_genesis(s, load_spec(None))
        seallib.seal(s, seallib.write_demo_suite(work / "suite"))
        experience.record(s, experience.parse_turns("\n".join(json.dumps(t) for t in good_turns(GOOD_TURNS, 1))))
        t0 = time.perf_counter()
        res = run_cycle(s, LearnOptions(min_turns=1, min_hours=0))
        wall = time.perf_counter() - t0
        recs = {r["kind"]: r for r in s.journal.records()}
        receipt = s.get_json(res.receipt)
        # the training child's whole life (interpreter, imports, training, writing outputs)
        train_inside = receipt["sandbox"]["child_wall_s"]
        score_s = recs["judge"]["payload"]["score_s"]
        train_stage = res.stages["train"]["s"]
        judge_stage = res.stages["judge"]["s"]
        inside = train_inside + score_s
        overhead = wall - inside
        print(f"cycle {res.cycle}: {res.verdict}, wall {wall:.2f} s")
        for k, v in res.stages.items():
            print(f"  {k:8s} {v['s']:7.2f} s")
        print(f"  inside training child   {train_inside:7.2f} s  (train stage {train_stage:.2f} s: "
              f"+{train_stage - train_inside:.2f} s to materialise inputs, start the sandboxed child and ingest outputs)")
        print(f"  inside scoring          {score_s:7.2f} s  (judge stage {judge_stage:.2f} s)")
        print(f"  overhead                {overhead:7.2f} s = {100 * overhead / wall:.1f}% of the cycle (target <= 3%)")
        print(json.dumps({"wall_s": wall, "stages": {k: v["s"] for k, v in res.stages.items()}, "train_child_s": train_inside,
                          "score_s": score_s, "overhead_s": overhead, "overhead_pct": 100 * overhead / wall}))
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
