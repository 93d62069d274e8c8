"""Image benchmarks (issue 10), each figure beside its peer's, measured in the same run.

    .venv/bin/python benchmarks/bench_image.py [--requests 300] [--clients 8]

1. Request latency through a running image (`ledger serve`: client -> Unix socket -> Landlock-
   confined image -> act -> turn fsynced in the image's buffer -> reply), p50 / p99:
     one-token action   the model generates one byte (max_new = 1) with the tiny built-in base
                        and a LoRA adapter merged in
     capability call    the action `call adder.add(3, 4)` (given by the client, so that the call
                        path is measured without depending on what the tiny model says) runs in
                        the wasm sandbox with the generation's grants
     48-byte action     the model generates up to 48 bytes
   Peers, in this process with nothing recorded: the same decoder and the same act code called
   directly (the floor the server adds to), the transformers + peft decoder for one byte, and
   `ledger.capabilities.registry.call` for the capability.
2. Recording overhead per turn (target <= 1 ms p50): appending a turn to the image's buffer,
   (a) fdatasync per turn, (b) one fdatasync per 8 turns (group commit: what a round of 8
   concurrent requests costs per turn), (c) written to the OS only (--durability os); the share
   the server reports per turn (record_ms) for 1 client and for --clients concurrent clients.
   Peers: the store's own `record` transaction per turn (objects, journal fsync, refs, DuckDB
   index) and SQLite (WAL, synchronous=FULL) inserting and committing one row per turn.
3. The keeper's commit of a batch from the buffer into the journal (one `record` transaction):
   per batch and per turn at batch sizes 1, 8, 64.

Work files go to benchmarks/_work/image (gitignored).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sqlite3
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
WORK = ROOT / "benchmarks" / "_work" / "image"
sys.path.insert(0, str(ROOT))

SIT = "user: what is 3 plus 4?"
CALL = "call adder.add(3, 4)"
TURN = {"situation": SIT, "action": CALL, "outcome": "7", "refusal": False, "time": "2026-01-01T00:00:00.000000Z",
        "generation": "b3:" + "0" * 64, "latency_ms": 1.234, "request": "r-bench", "source": "given"}


def pct(samples, q) -> float:
    s = sorted(samples)
    return s[min(len(s) - 1, int(round(q * (len(s) - 1))))]


def row(label: str, ms: list[float], note: str = "") -> str:
    return f"| {label} | {pct(ms, 0.5):.3f} | {pct(ms, 0.99):.3f} | {len(ms)} | {note} |"


def build(root: Path):
    """The image tests' store (gen-0, the adder capability, gen-1 with a random adapter, a
    sealed suite): the benchmark serves exactly what the tests serve."""
    from ledger.store import Store
    from tests.image.conftest import build_template

    return Store.open(build_template(root))


def timed(fn, n):
    out = []
    for _ in range(n):
        t0 = time.perf_counter()
        fn()
        out.append((time.perf_counter() - t0) * 1e3)
    return out


def bench_requests(s, n: int, clients: int) -> tuple[list[str], dict]:
    from ledger.image import protocol, server

    lines, raw = [], {}
    server.start_detached(s.root, ["--durability", "fsync"])
    try:
        sock = protocol.image_socket(s.root)

        def act(i, **kw):
            r = protocol.request(sock, {"op": "act", "id": f"r{i}-{time.monotonic_ns()}", "situation": SIT, **kw})
            assert r["ok"], r
            return r

        for i in range(10):
            act(i, max_new=1)
            act(i, action=CALL)
        rec = {"one": [], "call": []}
        for name, kw in (("one", {"max_new": 1}), ("call", {"action": CALL}), ("full", {"max_new": 48})):
            ms = []
            for i in range(n if name != "full" else max(20, n // 5)):
                t0 = time.perf_counter()
                r = act(i, **kw)
                ms.append((time.perf_counter() - t0) * 1e3)
                rec.setdefault(name, []).append(r["record_ms"])
            raw[name] = ms
        lines.append(row("image: one-token action (model, max_new 1)", raw["one"]))
        lines.append(row("image: capability call `call adder.add(3, 4)`", raw["call"]))
        lines.append(row("image: 48-byte action (model)", raw["full"], "tokens generated vary"))
        raw["record_1"] = rec["one"] + rec["call"]

        # concurrent clients: one fdatasync per round of requests
        shares, lat = [], []
        lock = threading.Lock()

        def client(c):
            for i in range(max(10, n // clients)):
                t0 = time.perf_counter()
                r = act(f"c{c}-{i}", action=CALL)
                with lock:
                    lat.append((time.perf_counter() - t0) * 1e3)
                    shares.append(r["record_ms"])

        th = [threading.Thread(target=client, args=(c,)) for c in range(clients)]
        t0 = time.perf_counter()
        for t in th:
            t.start()
        for t in th:
            t.join()
        wall = time.perf_counter() - t0
        raw["record_c"], raw["lat_c"] = shares, lat
        raw["throughput_c"] = len(lat) / wall
        st = server.status(s.root)
        raw["sandbox"] = st["sandbox"]
        raw["decoder"] = st["decoder"]
    finally:
        server.stop(s.root)
    return lines, raw


def bench_peers(s, n: int) -> list[str]:
    import tempfile

    from ledger import generations
    from ledger.capabilities import registry
    from ledger.image import act as actlib
    from ledger.image.generate import Model

    g = generations.head(s)
    lines = []
    work = Path(tempfile.mkdtemp(dir=WORK))
    import torch

    torch.set_num_threads(1)
    for dec in ("ledger", "transformers"):
        m = Model(s, g.base, work / dec, adapters=[g.adapter], decoder=dec)
        m.use(g.adapter)
        for _ in range(5):
            m.generate(SIT, 1)
        ms = timed(lambda: m.generate(SIT, 1), n if dec == "ledger" else max(50, n // 3))
        lines.append(row(f"peer, in process: {dec} decoder, one byte", ms, "no socket, nothing recorded"))
        if dec == "ledger":
            ms = timed(lambda: m.generate(SIT, 48), max(20, n // 5))
            lines.append(row("peer, in process: ledger decoder, 48 bytes", ms, "no socket, nothing recorded"))
    for _ in range(5):
        actlib.perform(s, g, CALL)
    lines.append(row("peer, in process: the image's act code, `call adder.add(3, 4)`", timed(lambda: actlib.perform(s, g, CALL), n), ""))
    lines.append(row("peer, in process: `registry.call(adder, add, 3, 4)`", timed(lambda: registry.call(s, "adder", "add", ["3", "4"]), n), ""))
    shutil.rmtree(work, ignore_errors=True)
    return lines


def bench_recording(s, n: int) -> tuple[list[str], dict]:
    from ledger import experience
    from ledger.image import spool

    d = WORK / "spool"
    shutil.rmtree(d, ignore_errors=True)
    d.mkdir(parents=True)
    w = spool.SpoolWriter(d, "b" * 16)
    meta = {"kind": "call", "error": False, "gen": 2}

    def one_sync():
        w.append(TURN, meta)
        w.sync()

    a = timed(one_sync, n)
    groups = []
    for _ in range(max(10, n // 8)):
        t0 = time.perf_counter()
        for _ in range(8):
            w.append(TURN, meta)
        w.sync()
        groups.append((time.perf_counter() - t0) * 1e3 / 8)
    c = timed(lambda: w.append(TURN, meta), n)
    w.close()
    lines = [row("buffer append + fdatasync, per turn", a),
             row("buffer append, one fdatasync per 8 turns, per turn", groups, "group commit"),
             row("buffer append, no fsync (--durability os), per turn", c)]

    # peers
    turn = experience.parse_turns(json.dumps({k: v for k, v in TURN.items()}))
    rec = timed(lambda: experience.record(s, turn), max(15, n // 20))
    db = sqlite3.connect(str(WORK / "peer.sqlite"))
    db.execute("PRAGMA journal_mode=WAL")
    db.execute("PRAGMA synchronous=FULL")
    db.execute("CREATE TABLE IF NOT EXISTS turns (situation TEXT, action TEXT, outcome TEXT, refusal INT, time TEXT, "
               "generation TEXT, latency REAL, request TEXT)")

    def sql():
        db.execute("INSERT INTO turns VALUES (?,?,?,?,?,?,?,?)", (SIT, CALL, "7", 0, TURN["time"], TURN["generation"], 1.2, "r"))
        db.commit()

    q = timed(sql, n)
    db.close()
    lines += [row("peer: the store's `record` transaction, one turn", rec, "objects + journal fsync + refs + DuckDB index"),
              row("peer: SQLite WAL synchronous=FULL, insert + commit one row", q)]
    return lines, {"fsync": a, "group8": groups, "os": c, "record_tx": rec, "sqlite": q}


def bench_fold(s, reps: int) -> list[str]:
    from ledger import experience

    lines = []
    for k in (1, 8, 64):
        turns = experience.parse_turns("\n".join(json.dumps({**TURN, "request": f"f{k}-{i}"}) for i in range(k)))

        def extra(tx, first, k=k):
            tx.payload["requests"] = [t["request"] for t in turns]

        ms = timed(lambda: experience.record(s, turns, actor="image", extra=extra), reps)
        lines.append(f"| keeper commit of a batch of {k} | {pct(ms, 0.5):.1f} | {pct(ms, 0.99):.1f} | {reps} | "
                     f"{pct(ms, 0.5) / k:.2f} ms per turn at p50 |")
    return lines


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--requests", type=int, default=300)
    ap.add_argument("--clients", type=int, default=8)
    ns = ap.parse_args()
    shutil.rmtree(WORK, ignore_errors=True)
    WORK.mkdir(parents=True)
    t0 = time.time()
    s = build(WORK / "store")
    print(f"# bench_image: load average {os.getloadavg()[0]:.1f} at start, {os.cpu_count()} CPUs")
    header = "| what | p50 ms | p99 ms | n | note |\n|---|---|---|---|---|"
    lines, raw = bench_requests(s, ns.requests, ns.clients)
    print("\n## requests\n" + header)
    print("\n".join(lines + bench_peers(s, ns.requests)))
    print(f"\nimage: decoder {raw['decoder']}; sandbox {json.dumps({k: raw['sandbox'][k] for k in ('sandboxed', 'landlock_abi', 'grants')})}")
    print(f"{ns.clients} concurrent clients, `call adder.add(3, 4)`: latency p50 {pct(raw['lat_c'], .5):.2f} ms, "
          f"p99 {pct(raw['lat_c'], .99):.2f} ms, {raw['throughput_c']:.0f} requests/s")
    rec_lines, rec = bench_recording(s, ns.requests)
    print("\n## recording overhead per turn\n" + header)
    print("\n".join(rec_lines))
    print(row("server-reported share per turn, 1 client (write + its own fdatasync)", raw["record_1"]))
    print(row(f"server-reported share per turn, {ns.clients} concurrent clients", raw["record_c"], "one fdatasync per round"))
    print("\n## keeper: buffer -> journal\n" + header)
    print("\n".join(bench_fold(s, 10)))
    print(f"\nload average {os.getloadavg()[0]:.1f} at the end; {time.time() - t0:.0f} s in all")
    return 0


if __name__ == "__main__":
    sys.exit(main())
