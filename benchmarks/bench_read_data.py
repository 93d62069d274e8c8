"""`ledger verify --read-data` of one large chunked object beside `b3sum` of the same bytes, and
optionally beside an older ledger's verify of the same store, alternating (the order rotates each
round), wall and CPU (user + sys, from rusage) min / median / max (issue 18; docs/store-format.md C12).

    .venv/bin/python benchmarks/bench_read_data.py --size-gib 8 --repeat 5
    git archive 92fa2c2 ledger | tar -x -C /tmp/old && \\
        .venv/bin/python benchmarks/bench_read_data.py --size-gib 2 --repeat 6 --old-tree /tmp/old

The object is one random file added with `ledger add` (stored as chunks in one pack); the source is
deleted after the add and `b3sum` hashes the pack file — the object's bytes plus its pages and the
pack's trailer (~0.05 % more) — so only the store needs the page cache and both read warm pages.
`--old-tree DIR` runs `python -m ledger.cli.main` with DIR first on PYTHONPATH (a `git archive` of an
older commit's `ledger/`) on a hard-linked copy of the store, so each tree keeps its own watermark. The
first verify of each tree after the add is run once untimed (it reads the index and records its
identity, rule 20) and printed apart; the rounds are the verifies after it. Target: verify --read-data >= 0.9x b3sum's throughput.

Where no `b3sum` is on PATH (this project's 2-core machines have no crate registry to build it
from) the peer is its equivalent, and is labelled so: the same Rust crate (`blake3`, which the
Python package binds) hashing the file the way b3sum does by default — memory-mapped, on every
core (`update_mmap` with `max_threads=AUTO`) — plus a Python start (~0.02 s) that b3sum has not.
`--peer b3sum` insists on the binary.
"""

from __future__ import annotations

import argparse
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PY = sys.executable
LEDGER = [PY, "-m", "ledger.cli.main"]


# b3sum's default way, in the crate it is built on: the file memory-mapped, hashed on every core
B3SUM_EQUIVALENT = ("import sys, blake3; h = blake3.blake3(max_threads=blake3.blake3.AUTO); "
                    "h.update_mmap(sys.argv[1]); print(h.hexdigest(), sys.argv[1])")


def timed(cmd, cwd, env) -> tuple[float, float]:
    """Wall and CPU seconds (user + sys of the children) of one command."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t = time.perf_counter()
    subprocess.run(cmd, cwd=cwd, env=env, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    wall = time.perf_counter() - t
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return wall, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def mmm(xs) -> str:
    return f"{min(xs):.2f} / {statistics.median(xs):.2f} / {max(xs):.2f}"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--size-gib", type=float, default=2.0)
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--old-tree", type=Path, help="an older ledger/ (git archive) to run beside this one")
    ap.add_argument("--work", type=Path, default=Path(tempfile.gettempdir()) / "ledger-bench-read-data")
    ap.add_argument("--peer", choices=("auto", "b3sum", "blake3-mmap"), default="auto",
                    help="b3sum itself, its equivalent (module doc), or b3sum where it is on PATH (default)")
    a = ap.parse_args(argv)
    peer = a.peer if a.peer != "auto" else ("b3sum" if shutil.which("b3sum") else "blake3-mmap")
    if peer == "b3sum" and not shutil.which("b3sum"):
        raise SystemExit("no b3sum on PATH: install it, or use --peer blake3-mmap (module doc)")
    shutil.rmtree(a.work, ignore_errors=True)
    a.work.mkdir(parents=True)
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
    src, store = a.work / "src.bin", a.work / "store"
    try:
        with open(src, "wb") as f:
            left = int(a.size_gib * (1 << 30))
            while left:
                n = min(left, 64 << 20)
                f.write(os.urandom(n))
                left -= n
        store.mkdir()
        subprocess.run(LEDGER + ["init"], cwd=store, env=env, check=True, stdout=subprocess.DEVNULL)
        subprocess.run(LEDGER + ["add", str(src)], cwd=store, env=env, check=True, stdout=subprocess.DEVNULL)
        src.unlink()
        packs = sorted((store / ".ledger" / "packs").rglob("*"))
        packs = [p for p in packs if p.is_file()]
        assert len(packs) == 1, packs
        peer_cmd = ["b3sum", str(packs[0])] if peer == "b3sum" else [PY, "-c", B3SUM_EQUIVALENT, str(packs[0])]
        cmds = {"b3sum": (peer_cmd, store, env),
                "ledger verify --read-data": (LEDGER + ["verify", "--read-data"], store, env)}
        if a.old_tree:
            # the old tree verifies a store of its own, its files hard links of this one's (the
            # same pack pages): each tree's verify then finds the watermark it wrote itself
            # (an older ledger's watermark records no index identity, rule 20)
            old_store = a.work / "store-old"
            subprocess.run(["cp", "-al", str(store), str(old_store)], check=True)
            cmds["old ledger verify --read-data"] = (LEDGER + ["verify", "--read-data"], old_store,
                                                     {**env, "PYTHONPATH": str(a.old_tree.resolve())})
        subprocess.run(["cat", str(packs[0])], stdout=subprocess.DEVNULL, check=True)   # warm
        # The first verify after the add reads the index (DuckDB) and records its identity in the
        # watermark, if the index is older than verify's racy margin (2 s); the timed rounds are
        # the verifies after it (an unchanged index is not opened again). Shown apart.
        time.sleep(2.1)
        first = {k: timed(*v) for k, v in cmds.items() if k != "b3sum"}
        res: dict[str, list] = {k: [] for k in cmds}
        load = os.getloadavg()
        order = list(cmds)
        for r in range(a.repeat):
            for k in order[r % len(order):] + order[:r % len(order)]:
                res[k].append(timed(*cmds[k]))
        print(f"peer: {'b3sum' if peer == 'b3sum' else 'b3sum-equivalent (blake3 update_mmap, all cores; module doc)'}")
        print(f"one {a.size_gib:g} GiB chunked object, {a.repeat} rounds (min / median / max); "
              f"load average {load[0]:.2f} before, {os.getloadavg()[0]:.2f} after")
        for k, (w, c) in first.items():
            print(f"  first {k} after the add (untimed rounds): wall {w:.2f} s  CPU {c:.2f} s")
        bw = statistics.median(w for w, _ in res["b3sum"])
        bc = statistics.median(c for _, c in res["b3sum"])
        for k, v in res.items():
            w, c = [x for x, _ in v], [x for _, x in v]
            ratio = "" if k == "b3sum" else \
                f"  = {bw / statistics.median(w):.2f}x b3sum wall, {bc / statistics.median(c):.2f}x CPU"
            print(f"  {k:30s} wall {mmm(w)} s  CPU {mmm(c)} s{ratio}")
    finally:
        shutil.rmtree(a.work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
