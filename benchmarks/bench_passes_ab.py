"""The whole-history passes of two source trees on one store, alternating (issue 18).

Each command is a fresh CLI process of each tree in turn (PYTHONPATH set to the tree; the order
flips every round), under /usr/bin/time: wall, CPU (user + system) and peak RSS. gc's and the
report's saved states are removed before every run, so each of them is a first run. Use it to put
a change's figures next to the code before it, measured in the same run:

    git archive <old> | tar -x -C /tmp/before && python -m compileall -q /tmp/before/ledger
    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/bench_passes_ab.py STORE --before /tmp/before --repeat 2

STORE is a working copy (the passes write their caches into it), e.g. a `cp -a` of a
`bench_scale.py --build-only` store. Prints every run, then min/median/max a command and tree.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
COMMANDS = {"verify-full": ["verify", "--full"], "gc": ["gc"], "report": ["report", "-o", "{tmp}/report.html"],
            "index-rebuild": ["index", "rebuild"]}
SAVED_STATES = ("reach.bin", "reach.seal", "report.json")   # bench_scale.SAVED_STATES


def run(tree: Path, argv: list[str], store: Path) -> tuple[float, float, float, int]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("LEDGER_")}
    env.update(OMP_NUM_THREADS="1", PYTHONPATH=str(tree))
    fd, ru = tempfile.mkstemp(prefix="bench-ab-")
    os.close(fd)
    try:
        p = subprocess.run(["/usr/bin/time", "-f", "%e %U %S %M", "-o", ru, sys.executable, "-m", "ledger.cli.main",
                            *argv], cwd=store, env=env, capture_output=True)
        wall, user, sys_, kib = map(float, Path(ru).read_text().split("\n")[-2].split())
    finally:
        os.unlink(ru)
    return wall, user + sys_, kib / 1024, p.returncode


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("store", type=Path)
    ap.add_argument("--before", type=Path, required=True, help="the older source tree")
    ap.add_argument("--after", type=Path, default=ROOT, help="the newer one (default: this checkout)")
    ap.add_argument("--repeat", type=int, default=2)
    ap.add_argument("--only", default=",".join(COMMANDS))
    a = ap.parse_args(argv)
    trees = {"before": a.before.resolve(), "after": a.after.resolve()}
    names = a.only.split(",")
    res: dict[tuple[str, str], list[tuple[float, float, float]]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(a.repeat):
            for name in names:
                for label in ("before", "after") if r % 2 == 0 else ("after", "before"):
                    for f in SAVED_STATES:
                        (a.store / ".ledger" / "cache" / f).unlink(missing_ok=True)
                    argv_ = [x.replace("{tmp}", tmp) for x in COMMANDS[name]]
                    wall, cpu, rss, rc = run(trees[label], argv_, a.store)
                    if rc != 0:
                        raise SystemExit(f"{name} of {label} exited {rc}")
                    res.setdefault((name, label), []).append((wall, cpu, rss))
                    print(f"  {name} {label}: {wall:.2f} s wall, {cpu:.2f} s CPU, {rss:.0f} MiB", flush=True)
    with open(a.store / ".ledger" / "journal", "rb") as f:
        records = sum(chunk.count(b"\n") for chunk in iter(lambda: f.read(8 << 20), b""))
    for (name, label), v in res.items():
        w, c = sorted(x[0] for x in v), sorted(x[1] for x in v)
        print(f"{name:14} {label:7} wall {w[0]:.2f}/{statistics.median(w):.2f}/{w[-1]:.2f} s  "
              f"CPU {c[0]:.2f}/{statistics.median(c):.2f}/{c[-1]:.2f} s  RSS {max(x[2] for x in v):.0f} MiB  "
              f"{1e6 * statistics.median(w) / records:.2f} us/record wall")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
