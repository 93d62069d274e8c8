"""A synthetic store with a long journal, for the history-at-scale figures (issue 18).

`build(dir, n)` makes a real store (`Store.init`) and then appends n well-chained records
straight to its journal, the way years of image turns would: mostly `record` batches (each
naming a `turns` object, counting turns), `outcome` records, and now and then an `add` that
moves a named ref. The records meet their kinds' schemas, so `verify` checks them as it checks
real ones; the objects they name exist (a pool of distinct `turns` objects, reused), so verify's
structural pass finds nothing missing. Caches (refs.json, index) are left as a fresh store
has them, behind the journal: the benchmark decides which caches exist.

    .venv/bin/python benchmarks/synth_journal.py /tmp/big 1000000

H18B's benchmarks/bench_scale.py may call `build` for its stores.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

from ledger.store import Store, canonical
from ledger.store.ids import hash_bytes

POOL = 2000  # distinct turns objects the records reuse


def _line(body: dict) -> tuple[bytes, str]:
    rid = hash_bytes(canonical.dumps(body))
    body["id"] = rid
    return canonical.dumps(body) + b"\n", rid


def build(dir: str | Path, n: int, pool: int = POOL) -> Path:
    """A store at dir/.ledger whose journal holds `n` records after `init` (n + 1 in all)."""
    s = Store.init(dir)
    objs = []
    for i in range(pool):
        batch = {"kind": "turns", "turns": [{"id": f"t{i}", "situation": f"s{i}", "action": "a", "outcome": "ok",
                                             "time": "2026-01-01T00:00:00.000000Z"}]}
        oid, _ = s.objects.put_bytes(canonical.dumps(batch))
        objs.append((oid, len(canonical.dumps(batch))))
    blob, _ = s.objects.put_bytes(b"synthetic blob")
    st = s.state
    seq, prev = st.seq, st.head
    actor = "synth@bench"
    buf = []
    turns = 0
    with open(s.journal.path, "ab") as f:
        for i in range(n):
            seq += 1
            t = f"2026-01-01T00:00:{i % 60:02d}.{i % 1_000_000:06d}Z"
            r = i % 10
            if r < 6:
                oid, size = objs[i % pool]
                payload = {"turns": oid, "first": turns + 1, "count": 1, "counters": {"turns": 1},
                           "objects": [[oid, size, "turns"]]}
                turns += 1
                body = {"seq": seq, "prev": prev, "time": t, "kind": "record", "inputs": [], "outputs": [oid],
                        "actor": actor, "payload": payload}
            elif r < 9 or turns == 0:
                body = {"seq": seq, "prev": prev, "time": t, "kind": "outcome", "inputs": [], "outputs": [],
                        "actor": actor, "payload": {"turn": f"t{max(turns, 1)}", "outcome": "good", "time": t}}
            else:
                payload = {"path": f"data/{i}.bin", "size": 14, "name": f"n{i % 97}",
                           "refs": {f"name/n{i % 97}": blob}, "objects": [[blob, 14, "blob"]]}
                body = {"seq": seq, "prev": prev, "time": t, "kind": "add", "inputs": [], "outputs": [blob],
                        "actor": actor, "payload": payload}
            line, prev = _line(body)
            buf.append(line)
            if len(buf) >= 4096:
                f.write(b"".join(buf))
                buf.clear()
        f.write(b"".join(buf))
        f.flush()
        os.fsync(f.fileno())
    return s.root


if __name__ == "__main__":
    t0 = time.perf_counter()
    root = build(sys.argv[1], int(sys.argv[2]))
    print(f"{root}: {int(sys.argv[2]) + 1} records, {(root / 'journal').stat().st_size / 2**20:.1f} MiB "
          f"in {time.perf_counter() - t0:.1f} s")
