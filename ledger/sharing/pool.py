"""Moving many objects: batches, a small thread pool, and the progress protocol.

Shared by push (outbound) and admit/fetch (inbound). Transfers are I/O bound (disk,
network), so a few threads suffice; a batch is the unit made durable together (durable.py)
and so also the granularity at which an interrupted transfer resumes.
"""

from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor, as_completed
from typing import Protocol

JOBS = 4                 # concurrent transfers: I/O bound (disk, network), not CPU bound
BATCH_BYTES = 256 << 20  # objects made durable together (durable.py); also the resume granularity


class Progress(Protocol):
    """What a transfer reports as it goes (the CLI draws bars from it)."""

    def start(self, label: str, objects: int, nbytes: int) -> None: ...
    def advance(self, objects: int = 0, nbytes: int = 0) -> None: ...
    def finish(self) -> None: ...


class NullProgress:
    """Progress that reports nothing (library use, --json)."""

    def start(self, label, objects, nbytes): pass
    def advance(self, objects=0, nbytes=0): pass
    def finish(self): pass


def batch_objects() -> int:
    """Objects per durable batch. LEDGER_SHARE_BATCH overrides it (the crash tests use tiny
    batches so that a kill lands between batches as well as inside one)."""
    v = os.environ.get("LEDGER_SHARE_BATCH")
    return max(1, int(v)) if v and v.isdigit() else 1000


def batches(ids, sizes):
    """Split ids into batches of at most batch_objects() objects and ~BATCH_BYTES bytes."""
    cap, out, cur, nbytes = batch_objects(), [], [], 0
    for oid in ids:
        if cur and (len(cur) >= cap or nbytes + sizes[oid] > BATCH_BYTES):
            out.append(cur)
            cur, nbytes = [], 0
        cur.append(oid)
        nbytes += sizes[oid]
    if cur:
        out.append(cur)
    return out


def run_all(fn, items, jobs: int):
    """Run fn over items on a small pool; the first failure cancels the rest and is raised."""
    if jobs <= 1 or len(items) <= 1:
        return [fn(i) for i in items]
    out = []
    with ThreadPoolExecutor(jobs) as pool:
        futs = [pool.submit(fn, i) for i in items]
        try:
            for f in as_completed(futs):
                out.append(f.result())
        except BaseException:
            for f in futs:
                f.cancel()
            raise
    return out
