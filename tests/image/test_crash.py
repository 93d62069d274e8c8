"""Turns are recorded exactly once across a SIGKILL of the server.

The keeper (and with it the image, which dies with its keeper) is killed while a request is in
flight: once after the turn is durable in the image's buffer but before the reply, once before
the turn is written at all. The server is restarted and the client retries with the same request
id. Each time the turn is in the journal exactly once, and the store verifies clean."""

import threading
import time

from ledger.errors import ImageUnavailable
from ledger.store import Store
from tests.reliability.helpers import assert_consistent

SIT = "user: what is 20 plus 22?"
CALL = "call adder.add(20, 22)"


def _held(served, point, rid):
    """Send request `rid` on a thread; return once the image is holding at `point`."""
    box = {}

    def client():
        try:
            box["reply"] = served.act(SIT, action=CALL, request_id=rid, timeout=120)
        except ImageUnavailable as e:
            box["error"] = e

    th = threading.Thread(target=client, daemon=True)
    th.start()
    marker = served.root / "run" / "image" / f"held-{point}"
    deadline = time.monotonic() + 60
    while not marker.exists():
        assert time.monotonic() < deadline, "the image never reached the hold point"
        time.sleep(0.02)
    return th, box


def _count(served, rid):
    return len(served.turns(f"situation = '{SIT}' and generation is not null")), \
        [r for r in Store.open(served.project).journal.records() if rid in (r["payload"].get("requests") or ())]


def test_sigkill_mid_request_records_exactly_once(served):
    # 1. killed after the turn is durable, before the reply
    served.start(LEDGER_IMAGE_HOLD="after-record")
    th, box = _held(served, "after-record", "once-1")
    served.kill()
    th.join(30)
    assert "reply" not in box and isinstance(box.get("error"), ImageUnavailable), "no reply was ever sent"
    assert served.turns() == []                         # buffered, not yet in the journal
    # 2. restarted (this time it will hold before recording): the buffer is committed first...
    served.start(LEDGER_IMAGE_HOLD="before-record")
    n, recs = _count(served, "once-1")
    assert n == 1 and len(recs) == 1
    # ...and the retry is answered from the journal, not executed again
    r = served.act(SIT, action=CALL, request_id="once-1", wait_recorded=True)
    assert r["duplicate"] and r["turn_id"] == "t1" and r["turn"]["outcome"] == "42"
    assert _count(served, "once-1")[0] == 1

    # 3. killed before the turn is written: nothing was recorded, so the retry records it
    th, box = _held(served, "before-record", "once-2")
    served.kill()
    th.join(30)
    served.start()
    assert len(served.turns()) == 1
    r = served.act(SIT, action=CALL, request_id="once-2", wait_recorded=True)
    assert not r["duplicate"] and r["turn_id"] == "t2"
    r = served.act(SIT, action=CALL, request_id="once-2", wait_recorded=True)
    assert r["duplicate"] and r["turn_id"] == "t2"
    assert [_count(served, rid)[1].__len__() for rid in ("once-1", "once-2")] == [1, 1]
    assert len(served.turns()) == 2
    served.stop()
    assert_consistent(served.root)
