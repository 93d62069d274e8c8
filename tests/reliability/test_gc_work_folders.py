"""gc and training work folders under tmp/ (issue 17): a live run's folder is kept (its
process holds a flock on it), a killed run's is removed, and the removal is recorded."""

import json
import os
import signal
import subprocess
import sys

from ledger.store import Store
from tests.conftest import ledger_cmd

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

HOLD = """
import sys, time
from ledger.store import Store
s = Store.open(sys.argv[1])
work = s.work_folder("train")
(work / "out").mkdir()
(work / "out" / "weights.bin").write_bytes(b"w" * 1000)
print(work.name, flush=True)
time.sleep(120)
"""


def _start_run(root):
    p = subprocess.Popen([sys.executable, "-c", HOLD, str(root)], stdout=subprocess.PIPE, text=True, cwd=REPO)
    return p, p.stdout.readline().strip()


def test_gc_keeps_live_and_removes_dead_work_folders(tmp_path):
    s = Store.init(tmp_path)
    live, live_name = _start_run(s.root)
    dead, dead_name = _start_run(s.root)
    try:
        dead.send_signal(signal.SIGKILL)   # a killed training run leaves its folder behind
        dead.wait()
        # a leftover file and a link in tmp/ are removed without being followed
        (tmp_path / "outside").write_text("keep me")
        (s.root / "tmp" / "stray-link").symlink_to(tmp_path / "outside")
        seq = Store.open(s.root).state.seq

        p = ledger_cmd("gc", "--json", cwd=tmp_path)
        assert p.returncode == 0, p.stderr
        dry = json.loads(p.stdout)
        assert dry["work_folders_dead"] == [dead_name] and dry["work_folders_live"] == [live_name]
        assert (s.root / "tmp" / dead_name).is_dir()    # dry run touches nothing

        p = ledger_cmd("gc", "--prune", "--json", cwd=tmp_path)
        assert p.returncode == 0, p.stderr
        out = json.loads(p.stdout)
        assert out["work_folders_removed"] == [dead_name] and out["work_folders_live"] == [live_name]
        assert not (s.root / "tmp" / dead_name).exists()
        assert (s.root / "tmp" / live_name / "out" / "weights.bin").read_bytes() == b"w" * 1000
        assert (tmp_path / "outside").read_text() == "keep me" and not os.path.lexists(s.root / "tmp" / "stray-link")
        recs = Store.open(s.root).journal.records()
        assert recs[-1]["seq"] == seq + 1 and recs[-1]["kind"] == "gc"
        assert recs[-1]["payload"]["work_folders_removed"] == [dead_name]
        assert ledger_cmd("verify", cwd=tmp_path).returncode == 0
    finally:
        live.kill()
        live.wait()
    # once its run is gone, the folder is dead too
    p = ledger_cmd("gc", "--prune", "--json", cwd=tmp_path)
    assert p.returncode == 0 and json.loads(p.stdout)["work_folders_removed"] == [live_name]


def test_gc_with_nothing_to_remove_records_nothing(tmp_path):
    s = Store.init(tmp_path)
    before = s.journal.path.read_bytes()
    assert ledger_cmd("gc", "--prune", cwd=tmp_path).returncode == 0
    assert s.journal.path.read_bytes() == before


def test_discarded_work_folder_is_gone_and_unlocked(tmp_path):
    s = Store.init(tmp_path)
    work = s.work_folder("dpo")
    (work / "x").write_text("x")
    s.discard_work_folder(work)
    assert not work.exists() and not s._work_locks
