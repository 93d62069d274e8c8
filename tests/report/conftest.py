"""Fixtures for the report and terminal tests.

`demo_store` is the real `ledger demo --tiny` store (an Accept, a refusal, two rollbacks), built once
per test run: under pytest-xdist the workers share it through a file lock in the common base
temp folder, so the ~2 minute demo runs once, not once per worker. Tests must not write to it;
the one that writes works on a copy (`reproduced`).
"""

from __future__ import annotations

import fcntl
import json
import shutil

import pytest

from tests.conftest import ledger_cmd


@pytest.fixture(scope="session")
def demo_store(tmp_path_factory, worker_id):
    base = tmp_path_factory.getbasetemp()
    shared = base.parent if worker_id != "master" else base
    root = shared / "report-demo"
    done = shared / "report-demo.json"
    with open(shared / "report-demo.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            if not done.exists():
                p = ledger_cmd("demo", "--tiny", "--dir", root, "--json", cwd=shared, check=True, timeout=900)
                done.write_text(p.stdout)
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)
    story = json.loads(done.read_text())
    assert story["verify"] is True
    return root




@pytest.fixture(scope="session")
def reproduced(demo_store, tmp_path_factory):
    """A copy of the demo store in which the last receipt's dataset was lost, then reproduced:
    the reproduce answers MissingInputs and commits a comparison object. -> (root, rid, output)"""
    from ledger.store import Store

    dst = tmp_path_factory.mktemp("reproduced") / "demo"
    shutil.copytree(demo_store, dst)
    s = Store.open(dst)
    rid = [r for r in s.journal.records() if r["kind"] == "train"][-1]["payload"]["receipt"]
    s.object_path(s.get_json(rid)["dataset"]).unlink()
    p = ledger_cmd("reproduce", rid, "--json", cwd=dst)
    assert p.returncode == 3, p.stderr
    return dst, rid, json.loads(p.stdout)
