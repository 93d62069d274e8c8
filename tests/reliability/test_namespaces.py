"""The lock across PID namespaces, and compare-and-append when the lock is broken anyway.

Two containers sharing a store see each other's pids as meaningless numbers (issue 17): the
lock must be the kernel's (an OFD lock), and the journal append must check that the file still
ends where the writer read it, so that nothing can fork the chain.
"""

import json
import os
import shutil
import subprocess
import sys

import pytest

from ledger.errors import JournalConflict
from ledger.store import Store
from ledger.store.verify import verify
from tests.conftest import ledger_cmd

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _unshare_ok() -> str | None:
    if shutil.which("unshare") is None:
        return "unshare(1) is not installed"
    p = subprocess.run(["unshare", "--pid", "--fork", "true"], capture_output=True, text=True)
    if p.returncode != 0:
        return f"unshare --pid is not permitted here: {p.stderr.strip()}"
    return None


WRITER = r"""
set -u
ok=0; locked=0; other=0
for i in $(seq 1 $N); do
  echo "$TAG $i" > "$WORK/$TAG-$i"
  "$PY" -m ledger.cli.main --store "$STORE" add "$WORK/$TAG-$i" > /dev/null 2>> "$WORK/$TAG.err"
  rc=$?
  if [ $rc -eq 0 ]; then ok=$((ok+1)); elif [ $rc -eq 5 ]; then locked=$((locked+1)); else other=$((other+1)); fi
done
echo "{\"ok\": $ok, \"locked\": $locked, \"other\": $other}"
"""


@pytest.mark.skipif(_unshare_ok() is not None, reason=str(_unshare_ok()))
def test_two_writers_in_different_pid_namespaces(tmp_path):
    s = Store.init(tmp_path)
    n = 12
    env = {**os.environ, "N": str(n), "WORK": str(tmp_path), "PY": sys.executable, "STORE": str(s.root),
           "LEDGER_LOCK_WAIT": "30", "PYTHONPATH": REPO}
    for k in ("LEDGER_FAULT_AT", "LEDGER_FAULT_ERRNO", "LEDGER_DEBUG"):
        env.pop(k, None)
    procs = [subprocess.Popen(["unshare", "--pid", "--fork", "--mount-proc", "sh", "-c", WRITER],
                              env={**env, "TAG": tag}, stdout=subprocess.PIPE, text=True, cwd=REPO)
             for tag in ("a", "b")]
    outs = [json.loads(p.communicate(timeout=600)[0]) for p in procs]
    assert all(o["other"] == 0 for o in outs), [(tmp_path / f"{t}.err").read_text() for t in "ab"]
    committed = sum(o["ok"] for o in outs)
    assert committed == 2 * n, outs   # LEDGER_LOCK_WAIT: every writer waits its turn, none is lost
    recs = Store.open(s.root).journal.records()
    seqs = [r["seq"] for r in recs]
    assert seqs == list(range(1, len(recs) + 1))          # no duplicate seq, no gap
    assert len([r for r in recs if r["kind"] == "add"]) == committed  # no lost update
    rep = verify(Store.open(s.root), read_data=True)
    assert rep.ok, rep.errors
    p = ledger_cmd("verify", cwd=tmp_path)
    assert p.returncode == 0, p.stderr


@pytest.mark.skipif(_unshare_ok() is not None, reason=str(_unshare_ok()))
def test_lock_held_in_another_pid_namespace_is_live(tmp_path):
    from tests.reliability.test_locks import hold_lock

    s = Store.init(tmp_path)
    holder = hold_lock(s.root, prefix=("unshare", "--pid", "--fork", "--mount-proc"))
    try:
        raw = (s.root / "lock").read_bytes()
        assert json.loads(raw)["pid"] < 10  # a pid of the other namespace: meaningless here
        p = ledger_cmd("unlock", cwd=tmp_path)
        assert p.returncode == 5 and "live" in p.stderr
        (tmp_path / "f").write_text("x")
        p = ledger_cmd("add", "f", cwd=tmp_path)
        assert p.returncode == 5, p.stderr
        assert (s.root / "lock").read_bytes() == raw and Store.open(s.root).state.seq == 1
    finally:
        holder.kill()
        holder.wait()


def test_broken_lock_cannot_fork_the_chain(tmp_path):
    """Even with the lock file removed under a holder, two writers cannot both append after
    the same record: the second to commit finds the journal moved and commits nothing."""
    s = Store.init(tmp_path)
    a, b = Store.open(s.root), Store.open(s.root)
    with pytest.raises(JournalConflict):
        with a.transaction("first") as tx:
            tx.payload["who"] = "a"
            (s.root / "lock").unlink()   # the lock is broken by hand while a works
            with b.transaction("second") as tx2:
                tx2.payload["who"] = "b"
    recs = Store.open(s.root).journal.records()
    assert [(r["seq"], r["kind"]) for r in recs] == [(1, "init"), (2, "second")]
    assert verify(Store.open(s.root)).ok
    # and the store goes on
    with Store.open(s.root).transaction("third"):
        pass
    assert Store.open(s.root).state.seq == 3


def test_journal_rewritten_to_same_length_is_refused(tmp_path):
    """The check is against the file's current tail, not just its length."""
    s = Store.init(tmp_path)
    with s.transaction("one") as tx:
        tx.payload["x"] = 1
    a = Store.open(s.root)
    with pytest.raises(JournalConflict):
        with a.transaction("two"):
            data = s.journal.path.read_bytes()
            # swap the last record for another of the same length (a different writer's record)
            last = data.rstrip(b"\n").rsplit(b"\n", 1)[1]
            rec = json.loads(last)
            rec["payload"]["x"] = 2
            from ledger.store import canonical
            from ledger.store.journal import record_id

            rec["id"] = record_id(rec)
            new = canonical.dumps(rec)
            assert len(new) == len(last)
            s.journal.path.write_bytes(data[: len(data) - len(last) - 1] + new + b"\n")
    assert len(Store.open(s.root).journal.records()) == 2
