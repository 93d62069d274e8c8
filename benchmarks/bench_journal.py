"""The journal at scale (issue 18, H18A's part): append, state read and verify on a synthetic
store of N records next to the same on a 100-record store, measured alternately in one run.

    .venv/bin/python benchmarks/bench_journal.py --records 1000000 [--dir /tmp/bench-journal] [--repeats 3]

Figures (each min / median / max over the repeats; ratio = big median / small median):
  append        one transaction (journal append + refs.json; the DuckDB index is deferred, its
                sync is H18B's figure) — peer: a bare write+fsync of a line of the same size to
                a file of the same size (the floor any append-only log pays)
  state         Store.open(...).state with refs.json current
  state-cold    the same with refs.json deleted (the fold of the whole journal), then
  state-warm    the next read, from the refs.json the cold read wrote
  verify        incremental verify after one new record
  verify-full   verify --full, as µs per record (wall, and CPU: the machine may be shared) —
                peers (CPU): the bytes hashed with BLAKE3 (b3sum's work) and each line parsed by
                json.loads (the floor of any checker of this format in Python). On the 100-record
                store the per-record figure is its fixed cost divided by 100: read the big one.
Stores are built once with benchmarks/synth_journal.py and reused (the benchmark appends to them).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from pathlib import Path

import blake3

from benchmarks.synth_journal import build
from ledger.store import Store
from ledger.store.verify import verify


def _store(base: Path, n: int) -> Path:
    root = base / f"s{n}" / ".ledger"
    if not (root / "journal").exists():
        build(base / f"s{n}", n)
        s = Store.open(root)
        with s.index_deferred():  # a first writer re-checks the synthetic appends once
            with s.transaction("t") as tx:
                tx.payload["warm"] = 1
    return root


def _tx(root: Path) -> float:
    s = Store.open(root)
    t = time.perf_counter()
    with s.index_deferred():
        with s.transaction("t") as tx:
            tx.payload["bench"] = 1
        t1 = time.perf_counter()
        # Leave the index behind, as a crash inside index_deferred would (rule 8): its sync is
        # H18B's figure, and on a synthetic store whose index never saw the records it would
        # be a whole rebuild.
        s._index_deferred += 1
    s._index_deferred -= 1
    assert not [w for w in s.warnings if "re-checked" in w], s.warnings
    return t1 - t


def _bare_append(root: Path) -> float:
    scratch = root.parent / "bare-log"
    if not scratch.exists() or scratch.stat().st_size < (root / "journal").stat().st_size:
        with open(root / "journal", "rb") as src, open(scratch, "wb") as dst:
            while chunk := src.read(16 << 20):
                dst.write(chunk)
    line = (root / "journal").read_bytes()[-400:].split(b"\n")[-2] + b"\n"
    t = time.perf_counter()
    fd = os.open(scratch, os.O_WRONLY | os.O_APPEND)
    try:
        os.write(fd, line)
        os.fsync(fd)
    finally:
        os.close(fd)
    return time.perf_counter() - t


def _state(root: Path) -> float:
    t = time.perf_counter()
    Store.open(root).state
    return time.perf_counter() - t


def _state_cold(root: Path) -> tuple[float, float, float]:
    (root / "refs.json").unlink()
    c = time.process_time()
    cold = _state(root)
    return cold, time.process_time() - c, _state(root)


def _verify(root: Path, full: bool) -> tuple[float, float, int]:
    s = Store.open(root)
    t, c = time.perf_counter(), time.process_time()
    rep = verify(s, full=full)
    dt, dc = time.perf_counter() - t, time.process_time() - c
    assert not rep.errors, rep.errors[:3]
    return dt, dc, rep.stats["checked"]


def _peers_full(root: Path) -> tuple[float, float]:
    """CPU seconds of the two floors (the machine is shared: CPU time is the steadier figure)."""
    c = time.process_time()
    h = blake3.blake3(max_threads=1)
    with open(root / "journal", "rb") as f:
        while chunk := f.read(16 << 20):
            h.update(chunk)
    hashed = time.process_time() - c
    c = time.process_time()
    with open(root / "journal", "rb") as f:
        for line in f:
            json.loads(line)
    return hashed, time.process_time() - c


def _fmt(xs, unit="s", scale=1.0):
    xs = [x * scale for x in xs]
    return f"{min(xs):.4g} / {statistics.median(xs):.4g} / {max(xs):.4g} {unit}"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--records", type=int, default=1_000_000)
    ap.add_argument("--dir", default="/tmp/bench-journal")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--full-repeats", type=int, default=1)
    a = ap.parse_args()
    base = Path(a.dir)
    base.mkdir(parents=True, exist_ok=True)
    small, big = _store(base, 100), _store(base, a.records)
    res: dict[str, dict[str, list]] = {}

    def add(name, which, v):
        res.setdefault(name, {}).setdefault(which, []).append(v)

    for _ in range(a.repeats):
        for which, root in (("small", small), ("big", big)):  # alternating
            add("append", which, _tx(root))
            add("append-peer", which, _bare_append(root))
            add("state", which, _state(root))
            cold, cold_cpu, warm = _state_cold(root)
            add("state-cold", which, cold)
            add("state-cold cpu", which, cold_cpu)
            add("state-warm", which, warm)
            _verify(root, full=False)  # the watermark at the head
            _tx(root)
            add("verify", which, _verify(root, full=False)[0])
    for _ in range(a.full_repeats):
        for which, root in (("small", small), ("big", big)):
            dt, dc, n = _verify(root, full=True)
            add("verify-full/rec", which, dt / n)
            add("verify-full cpu/rec", which, dc / n)
            hashed, parsed = _peers_full(root)
            recs = Store.open(root).state.seq
            add("peer-b3/rec", which, hashed / recs)
            add("peer-json/rec", which, parsed / recs)

    print(f"journal at scale: {a.records:,} records vs 100 (min / median / max; ratio of medians)")
    for name, by in res.items():
        us = name.endswith("/rec")
        sm, bg = by["small"], by["big"]
        ratio = statistics.median(bg) / statistics.median(sm) if statistics.median(sm) else float("nan")
        unit, scale = ("µs", 1e6) if us else ("s", 1.0)
        print(f"  {name:16s} 100: {_fmt(sm, unit, scale):34s} {a.records:,}: {_fmt(bg, unit, scale):34s} ×{ratio:.2f}")


if __name__ == "__main__":
    main()
