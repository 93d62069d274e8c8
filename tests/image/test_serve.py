"""A served image end to end: act (generated, given calls, refusals), exactly-once retries,
turn ids and outcomes, the context across a restart, a rollback observed between requests, and a
generation committed while serving."""

import json

import pytest

from ledger import generations
from ledger.errors import BadInput, ImageUnavailable, Locked
from ledger.image import keeper
from ledger.store import Store
from tests.conftest import ledger_cmd


def test_round_trip_and_exactly_once(served):
    st = served.start()
    s = Store.open(served.project)
    head = generations.head(s)
    assert st["state"] == "serving" and st["generation"] == head.id and st["gen"] == 2
    assert st["sandbox"]["sandboxed"] and st["sandbox"]["landlock_abi"] >= 1 and not st["sandbox"]["network"]

    r = served.act("user: what is 3 plus 4?", max_new=6, request_id="gen-1st", wait_recorded=True)
    t = r["turn"]
    assert r["ok"] and not r["duplicate"] and r["turn_id"] == "t1"
    assert t["source"] == "model" and t["generation"] == head.id and t["gen"] == 2 and len(t["action"].encode()) <= 6 * 3
    assert t["latency_ms"] > 0 and r["record_ms"] >= 0

    r = served.act("user: what is 3 plus 4?", action="call adder.add(3, 4)", request_id="call-1", wait_recorded=True)
    assert (r["turn"]["kind"], r["turn"]["outcome"], r["turn"]["refusal"], r["turn_id"]) == ("call", "7", False, "t2")
    assert r["turn"]["call"]["results"] == ["7"]
    r = served.act("user: please delete /etc/passwd", action="refuse: deleting system files is not permitted")
    assert r["turn"]["kind"] == "refusal" and r["turn"]["refusal"] and r["turn_id"] is None   # not waited for
    r = served.act("user: multiply 2 by 3", action="call calc.mul(2, 3)", wait_recorded=True)
    assert r["turn"]["outcome"].startswith("error: no capability named 'calc'")

    # a retry with the same id is answered with the first turn and records nothing
    again = served.act("user: what is 3 plus 4?", action="call adder.add(3, 4)", request_id="call-1", wait_recorded=True)
    assert again["duplicate"] and again["turn_id"] == "t2" and again["turn"]["outcome"] == "7"
    rows = served.turns()
    assert [r[0] for r in rows] == ["t1", "t2", "t3", "t4"]
    assert rows[1][1:5] == ("user: what is 3 plus 4?", "call adder.add(3, 4)", "7", False)
    assert rows[2][4] is True and all(r[5] == head.id for r in rows)

    # the CLI client, and ground truth attached later by request id
    p = ledger_cmd("act", "user: what is 5 plus 6?", "--action", "call adder.add(5, 6)", "--json", cwd=served.project, check=True)
    assert json.loads(p.stdout)["turn_id"] == "t5"
    p = ledger_cmd("outcome", "gen-1st", "whatever the user wanted", "--json", *WAIT, cwd=served.project, check=True)
    assert json.loads(p.stdout)["turn"] == "t1"
    q = Store.open(served.project).query("select turn, outcome from outcomes")[1]
    assert q == [("t1", "whatever the user wanted")]
    p = ledger_cmd("act", "user: hi", "--max-new", "99", cwd=served.project)
    assert p.returncode == 2 and "max_new" in p.stderr

    # a second keeper is refused; the status says what is served
    with pytest.raises(Exception) as ei:
        keeper.serve(Store.open(served.project))
    assert isinstance(ei.value, Locked)
    p = ledger_cmd("serve", "--detach", cwd=served.project)
    assert p.returncode == 5 and "already serving" in p.stderr
    p = ledger_cmd("image", "status", "--json", cwd=served.project, check=True)
    st = json.loads(p.stdout)
    assert st["running"] and st["context"]["counters"]["turns"] == 5 and st["context"]["cursor"]["turn"] == 5


def test_context_is_restored_not_replayed(served):
    served.start()
    for i in range(3):
        served.act(f"user: what is {i} plus 1?", action=f"call adder.add({i}, 1)", request_id=f"q{i}")
    served.stop()
    s = Store.open(served.project)
    events = [r["payload"]["event"] for r in s.journal.records() if r["kind"] == "image"]
    assert events == ["start", "stop"]
    stopped_ctx = s.state.refs["image/context"]
    ctx1 = json.loads(ledger_cmd("image", "status", "--json", cwd=served.project, check=True).stdout)
    assert ctx1 == {"running": False}
    st = served.start()
    c = st["context"]
    assert c["counters"]["turns"] == 3 and c["counters"]["calls"] == 3 and c["counters"]["starts"] == 2
    assert c["cursor"]["turn"] == 3 and c["previous"] is not None
    # restored from the ref written by the stop record: the start record names it
    start = [r for r in Store.open(served.project).journal.records() if r["kind"] == "image"][-1]
    assert start["payload"]["event"] == "start" and start["payload"]["restored"] == stopped_ctx
    # request ids recorded before the restart are still known
    r = served.act("user: what is 1 plus 1?", action="call adder.add(1, 1)", request_id="q1")
    assert r["duplicate"] and r["turn_id"] == "t2" and len(served.turns()) == 3


# While an image serves, its commits hold the store lock for a moment every 0.25 s at most:
# other writers wait for it (--wait) instead of failing fast.
WAIT = ("--wait", "30")


def test_rollback_and_new_generation_while_serving(served):
    served.start()
    s = Store.open(served.project)
    g1, g2 = generations.load(s, "gen-1"), generations.load(s, "gen-2")
    sit = "user: what is 3 plus 4?"
    a2 = served.act(sit, max_new=12)["turn"]
    assert a2["generation"] == g2.id
    ledger_cmd("rollback", "gen-1", *WAIT, cwd=served.project, check=True)
    a1 = served.act(sit, max_new=12)["turn"]
    assert a1["generation"] == g1.id and a1["gen"] == 1
    assert a1["action"] != a2["action"], "gen-1 has no adapter: the weights switched"
    ledger_cmd("rollback", "gen-0", *WAIT, cwd=served.project, check=True)
    t0 = served.act(sit, action="call adder.add(3, 4)")["turn"]
    assert t0["gen"] == 0 and t0["outcome"].startswith("error: no capability named 'adder'")
    ledger_cmd("rollback", "--undo", *WAIT, cwd=served.project, check=True)     # back to gen-1
    assert served.act(sit, action="call adder.add(3, 4)")["turn"]["outcome"] == "7"
    pid = served.status()["image_pid"]
    assert pid == served.image_pid, "rollbacks switch in place, without a restart"

    # a generation committed after the image started: it restarts on it; the client never notices
    from tests.capabilities.helpers import ADDER_EXPORTS, ADDER_TESTS, ADDER_WAT, write_cap

    src, man = write_cap(served.project, "plus", ADDER_WAT, ADDER_EXPORTS, ADDER_TESTS)
    ledger_cmd("capability", "add", src, "--manifest", man, *WAIT, cwd=served.project, check=True)
    t = served.act(sit, action="call plus.add(3, 4)")["turn"]
    assert t["outcome"] == "7" and t["gen"] == 3
    st = served.status()
    assert st["image_pid"] != pid and st["gen"] == 3
    recs = [r["payload"] for r in Store.open(served.project).journal.records() if r["kind"] == "image"]
    assert [p["event"] for p in recs] == ["start", "restart"]
    ctx = st["context"]
    assert ctx["counters"]["switches"] >= 4 and ctx["grants"] == {"adder": [], "plus": []}


def test_bad_requests_record_nothing(served):
    served.start()
    from ledger.image import protocol

    sock = protocol.image_socket(served.root)
    r = protocol.request(sock, {"op": "act", "id": "x", "situation": "s", "max_new": 0})
    assert not r["ok"] and r["error"]["type"] == "BadInput" and not r["retry"]
    r = protocol.request(sock, {"op": "nope", "id": "y"})
    assert not r["ok"] and "unknown op" in r["error"]["message"]
    with pytest.raises(BadInput):
        served.act("x" * 500)                     # too long for the model's 128 positions
    assert protocol.request(sock, {"op": "ping"})["pong"]
    assert served.turns() == []
    served.stop()
    with pytest.raises(ImageUnavailable):
        served.act("user: hi")


def test_pause_holder_gone_resumes_and_sigterm_stops(served):
    """A client that paused the image and died (a killed `ledger run`) does not leave it stopped;
    a foreground `ledger serve` stops cleanly on SIGTERM."""
    import os
    import signal
    import subprocess
    import sys
    import time

    from ledger.image import protocol

    served.start()
    first = served.image_pid
    s = protocol._connect(protocol.control_socket(served.root), 30)
    s.sendall(protocol.encode({"op": "pause"}))
    assert protocol.decode(protocol.LineReader(s).read_line())["paused"]
    assert served.status()["state"] == "paused"
    s.close()                                                # gone without "resume"
    deadline = time.monotonic() + 60
    while served.status().get("state") != "serving":
        assert time.monotonic() < deadline
        time.sleep(0.1)
    assert served.status()["image_pid"] != first
    assert served.act("user: hi", action="refuse: no")["turn"]["refusal"]
    served.stop()

    p = subprocess.Popen([sys.executable, "-m", "ledger.cli.main", "serve"], cwd=served.project,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 120
        while served.status().get("state") != "serving":
            assert p.poll() is None and time.monotonic() < deadline, p.stderr.read() if p.poll() is not None else ""
            time.sleep(0.1)
        served.act("user: hi", action="refuse: no")
        p.send_signal(signal.SIGTERM)
        assert p.wait(60) == 0
    finally:
        if p.poll() is None:
            p.kill()
    events = [r["payload"]["event"] for r in Store.open(served.project).journal.records() if r["kind"] == "image"]
    assert events == ["start", "pause", "resume", "stop", "start", "stop"]
    assert len(served.turns()) == 2 and not served.status()["running"]
    assert not os.path.exists(protocol.image_socket(served.root))
