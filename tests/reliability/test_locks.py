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


def test_unlock_never_clears_live(tmp_path):
    s = Store.init(tmp_path)
    live = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        from ledger.store.lock import _proc_start

        _write_lock(s.root, pid=live.pid, time=0.0, start=_proc_start(live.pid))  # very old time, live pid
        p = ledger_cmd("unlock", cwd=tmp_path)
        assert p.returncode == 5 and "live" in p.stderr
        assert (s.root / "lock").exists()
        # writers fail fast with exit 5 while it is held
        (tmp_path / "f").write_text("x")
        p = ledger_cmd("add", "f", cwd=tmp_path)
        assert p.returncode == 5 and "locked" in p.stderr
    finally:
        live.kill()
        live.wait()


def test_reused_pid_is_dead(tmp_path):
    s = Store.init(tmp_path)
    _write_lock(s.root, pid=os.getppid(), start="1")  # our parent, but not the process that locked
    p = ledger_cmd("unlock", "--json", cwd=tmp_path, check=True)
    assert json.loads(p.stdout)["cleared"] is True


def test_other_host_needs_force(tmp_path):
    s = Store.init(tmp_path)
    _write_lock(s.root, host="some-other-host", pid=1)
    p = ledger_cmd("unlock", cwd=tmp_path)
    assert p.returncode == 5 and "another host" in p.stderr
    assert (s.root / "lock").exists()
    p = ledger_cmd("unlock", "--force-other-host", cwd=tmp_path, check=True)
    assert not (s.root / "lock").exists()


def test_half_written_lock(tmp_path):
    from ledger.errors import Locked
    import pytest

    s = Store.init(tmp_path)
    (s.root / "lock").write_text("")
    # fresh: its creator may be between create and write, so it counts as held
    with pytest.raises(Locked):
        with Store.open(s.root).transaction("t"):
            pass
    old = time.time() - 60
    os.utime(s.root / "lock", (old, old))
    with Store.open(s.root).transaction("t"):
        pass
    assert Store.open(s.root).state.seq == 2


def test_writer_clears_dead_holder_itself(tmp_path):
    s = Store.init(tmp_path)
    _write_lock(s.root, pid=_dead_pid())
    w = Store.open(s.root)
    with w.transaction("t"):
        pass
    assert any("dead" in m for m in w.warnings)
