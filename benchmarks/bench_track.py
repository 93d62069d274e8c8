"""What logging a metric costs a training loop (issue 19: <= 20 us per call, buffered, flushed in
transactions), next to the peers a user would pick: MLflow's asynchronous logging
(`mlflow.log_metric(..., synchronous=False)`, its fastest mode) and DVCLive (`log_metric` +
`next_step`, one step per call, as a training loop uses it).

    .venv/bin/python benchmarks/bench_track.py [--peers PYTHON] [--calls N] [--rounds R]

The peers live in their own environment (they pull in dependencies ledger does not want):
`python3 -m venv /tmp/peers && /tmp/peers/bin/pip install mlflow-skinny sqlalchemy alembic dvclive`, then pass
`--peers /tmp/peers/bin/python`. Rounds alternate ledger, MLflow, DVCLive; each figure is the
wall time of N calls divided by N, including every flush the tool does while the loop runs and
the final one (the run's end), reported as min / median / max over the rounds.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

PEER = textwrap.dedent("""
    import json, os, sys, tempfile, time
    which, n = sys.argv[1], int(sys.argv[2])
    d = tempfile.mkdtemp(prefix="peer-")
    os.chdir(d)
    if which == "mlflow":
        import mlflow
        mlflow.set_tracking_uri("sqlite:///" + d + "/mlflow.db")  # MLflow 3's default backend
        mlflow.start_run()
        t = time.perf_counter()
        for i in range(n):
            mlflow.log_metric("loss", 1.0 / (i + 1), step=i, synchronous=False)
        mlflow.end_run()  # waits for the queued metrics to be written
        dt = time.perf_counter() - t
    else:
        from dvclive import Live
        live = Live(d + "/dvclive", save_dvc_exp=False)
        t = time.perf_counter()
        for i in range(n):
            live.log_metric("loss", 1.0 / (i + 1))
            live.next_step()
        live.end()
        dt = time.perf_counter() - t
    print(json.dumps({"us_per_call": dt / n * 1e6}))
""")


def ledger_round(n: int) -> float:
    import ledger
    from ledger.store import Store

    with tempfile.TemporaryDirectory(prefix="bench-track-") as d:
        store = Store.init(d)
        t = time.perf_counter()
        with ledger.track("bench", params={"lr": 1e-3}, store=store) as run:
            for i in range(n):
                run.log(i, loss=1.0 / (i + 1))
        return (time.perf_counter() - t) / n * 1e6


def peer_round(python: str, which: str, n: int) -> float:
    p = subprocess.run([python, "-c", PEER, which, str(n)], capture_output=True, text=True, timeout=3600)
    if p.returncode != 0:
        raise SystemExit(f"{which} failed:\n{p.stderr[-2000:]}")
    return json.loads(p.stdout.strip().splitlines()[-1])["us_per_call"]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--peers", help="python of an environment with mlflow-skinny and dvclive")
    ap.add_argument("--calls", type=int, default=100_000)
    ap.add_argument("--peer-calls", type=int, default=5_000, help="DVCLive writes per step: fewer calls")
    ap.add_argument("--rounds", type=int, default=5)
    a = ap.parse_args()
    res: dict[str, list[float]] = {"ledger": [], "mlflow-async": [], "dvclive": []}
    for _ in range(a.rounds):
        res["ledger"].append(ledger_round(a.calls))
        if a.peers:
            res["mlflow-async"].append(peer_round(a.peers, "mlflow", a.peer_calls))
            res["dvclive"].append(peer_round(a.peers, "dvclive", a.peer_calls))
    print(f"{'tool':14} {'us/call min':>12} {'median':>10} {'max':>10}")
    for k, v in res.items():
        if v:
            print(f"{k:14} {min(v):12.2f} {statistics.median(v):10.2f} {max(v):10.2f}")
    print(json.dumps({k: v for k, v in res.items() if v}), file=sys.stderr)


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    main()
