"""SIGKILL at every fault point of `add` (objects, journal append, caches, index)."""

import signal

from ledger.store import Store
from tests.conftest import ledger_cmd
from tests.reliability.helpers import assert_consistent


def _fault_points(tmp_path, args, cwd):
    trace = tmp_path / "trace"
    p = ledger_cmd(*args, cwd=cwd, env={"LEDGER_FAULT_TRACE": str(trace)})
    assert p.returncode == 0, p.stderr
    return [line.split()[1] for line in trace.read_text().splitlines()]


def test_sigkill_at_every_fault_point_of_add(tmp_path):
    work = tmp_path / "w"
    work.mkdir()
    (work / "data.bin").write_bytes(b"x" * 100_000)
    Store.init(work)
    # Learn the fault points on a throwaway copy, then kill at each one in turn.
    probe = tmp_path / "probe"
    probe.mkdir()
    (probe / "data.bin").write_bytes(b"x" * 100_000)
    Store.init(probe)
    points = _fault_points(tmp_path, ["add", "data.bin", "--name", "d"], probe)
    assert {"object.before-fsync", "object.before-rename", "tx.before-append", "journal.torn",
            "tx.committed", "index.before-sync"} <= set(points)
    n = 0
    while True:
        n += 1
        pre = Store.open(work).state.head
        (work / "data.bin").write_bytes(b"y" * 1000 + str(n).encode())  # new content each time
        p = ledger_cmd("add", "data.bin", "--name", "d", cwd=work, env={"LEDGER_FAULT_AT": str(n)})
        if p.returncode == 0:
            break
        assert p.returncode == -signal.SIGKILL, p.stderr
        store = assert_consistent(work / ".ledger")
        post = store.state.head
        # The head is exactly the pre- or the post-transaction head (one record at most).
        assert post == pre or store.journal.records()[-1]["prev"] == pre
        assert n < 50
    assert n > len(set(points)) - 1
    assert_consistent(work / ".ledger")


def test_crash_after_commit_before_index(tmp_path):
    Store.init(tmp_path)
    (tmp_path / "f").write_text("hello")
    points = []
    trace = tmp_path / "trace"
    ledger_cmd("add", "f", cwd=tmp_path, env={"LEDGER_FAULT_TRACE": str(trace)}, check=True)
    points = [line.split()[1] for line in trace.read_text().splitlines()]
    n = points.index("tx.committed") + 1
    (tmp_path / "f").write_text("hello again")
    p = ledger_cmd("add", "f", cwd=tmp_path, env={"LEDGER_FAULT_AT": str(n)})
    assert p.returncode == -signal.SIGKILL
    store = Store.open(tmp_path)
    assert store.state.seq == 3  # committed
    # A reader's query catches the index up; the result equals a rebuild.
    q = ledger_cmd("query", "select count(*) as n from journal", "--json", cwd=tmp_path, check=True)
    assert '"n": 3' in q.stdout
    assert_consistent(store.root)
