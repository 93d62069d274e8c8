"""Stale locks: dead pids, reused pids, other hosts, old times, half-written lock files."""

import json
import os
import socket
import subprocess
import sys
import time

from ledger.store import Store
from tests.conftest import ledger_cmd


def _dead_pid():
    p = subprocess.Popen([sys.executable, "-c", "pass"])
    p.wait()
    return p.pid


def _write_lock(root, **kw):
    info = {"pid": os.getpid(), "host": socket.gethostname(), "time": time.time(), "start": None}
    info.update(kw)
    (root / "lock").write_text(json.dumps(info))


def test_unlock_clears_dead_pid(tmp_path):
    s = Store.init(tmp_path)
    _write_lock(s.root, pid=_dead_pid())
    p = ledger_cmd("unlock", "--json", cwd=tmp_path, check=True)
    assert json.loads(p.stdout)["cleared"] is True
    assert not (s.root / "lock").exists()


HOLD = """
import sys, time
from pathlib import Path
from ledger.store.lock import Lock
lock = Lock(Path(sys.argv[1]))
lock.acquire()
print("held", flush=True)
time.sleep(120)
"""


def hold_lock(root, prefix=()):
    """A process (optionally wrapped by `prefix`, e.g. unshare) that holds the store lock."""
    p = subprocess.Popen([*prefix, sys.executable, "-c", HOLD, str(root)], stdout=subprocess.PIPE, text=True,
                         cwd=os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
    assert p.stdout.readline().strip() == "held"
    return p


def test_unlock_never_clears_live(tmp_path):
    s = Store.init(tmp_path)
    live = hold_lock(s.root)
    try:
        before = (s.root / "lock").read_bytes()
        p = ledger_cmd("unlock", cwd=tmp_path)
        assert p.returncode == 5 and "live" in p.stderr
        assert (s.root / "lock").read_bytes() == before
        # writers fail fast with exit 5 while it is held
        (tmp_path / "f").write_text("x")
        p = ledger_cmd("add", "f", cwd=tmp_path)
        assert p.returncode == 5 and "locked" in p.stderr
        assert Store.open(s.root).state.seq == 1
    finally:
        live.kill()
        live.wait()
    # the kernel dropped the lock with its holder: the next writer goes ahead
    assert ledger_cmd("add", "f", cwd=tmp_path).returncode == 0


def test_live_holder_with_a_lying_lock_file_is_live(tmp_path):
    """Liveness is never judged from the pid: a holder whose file names a dead pid (as a pid
    from another PID namespace looks here) keeps its lock."""
    s = Store.init(tmp_path)
    live = hold_lock(s.root)
    try:
        _write_lock_inplace(s.root, pid=_dead_pid(), host="other-container")
        p = ledger_cmd("unlock", cwd=tmp_path)
        assert p.returncode == 5 and "live" in p.stderr
        assert (s.root / "lock").exists()
    finally:
        live.kill()
        live.wait()


def _write_lock_inplace(root, **kw):
    # rewrite the content of the held file (same inode, so the holder's kernel lock stays)
    info = {"pid": os.getpid(), "host": socket.gethostname(), "time": time.time(), "start": None}
    info.update(kw)
    with open(root / "lock", "r+b") as f:
        f.truncate(0)
        f.write(json.dumps(info).encode())


def test_reused_pid_is_dead(tmp_path):
    s = Store.init(tmp_path)
    _write_lock(s.root, pid=os.getppid(), start="1")  # our parent, but not the process that locked
    p = ledger_cmd("unlock", "--json", cwd=tmp_path, check=True)
    assert json.loads(p.stdout)["cleared"] is True


def test_other_host_on_local_fs_is_judged_by_the_kernel(tmp_path):
    # a container on this host writes its own host name; on a local filesystem the free
    # kernel lock says its holder is gone
    s = Store.init(tmp_path)
    _write_lock(s.root, host="some-other-host", pid=1)
    p = ledger_cmd("unlock", "--json", cwd=tmp_path, check=True)
    assert json.loads(p.stdout)["cleared"] is True


def test_other_host_on_network_fs_needs_force(tmp_path):
    from ledger.store.lock import Lock

    s = Store.init(tmp_path)
    _write_lock(s.root, host="some-other-host", pid=1)
    lock = Lock(s.root, network_fs=True)
    assert lock.break_if_dead() == (False, lock.read()) and lock.read().status() == "foreign"
    assert (s.root / "lock").exists()
    cleared, _ = lock.break_if_dead(force_foreign=True)
    assert cleared and not (s.root / "lock").exists()


def test_half_written_lock_is_judged_by_the_kernel(tmp_path):
    # an empty lock file with a free kernel lock: its creator died between create and write
    # (one that is merely slow loses the file and starts over, see lock.py)
    s = Store.init(tmp_path)
    (s.root / "lock").write_text("")
    with Store.open(s.root).transaction("t"):
        pass
    assert Store.open(s.root).state.seq == 2
    assert not (s.root / "lock").exists()


def test_writer_clears_dead_holder_itself(tmp_path):
    s = Store.init(tmp_path)
    _write_lock(s.root, pid=_dead_pid())
    w = Store.open(s.root)
    with w.transaction("t"):
        pass
    assert any("dead" in m for m in w.warnings)
