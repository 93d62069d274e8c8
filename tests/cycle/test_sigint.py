"""Ctrl-C during a real `ledger run` under a pty: exit 130, one line saying what was kept and how
to resume, and the next `ledger run` resumes from what the interrupted one committed."""

import json
import os
import pty
import select
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import ledger_cmd

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
SLOW_SPEC = """
[data]
steps = 400
micro_batch = 8
[train]
checkpoint_every = 20
"""


def _prepared(tmp_path):
    from ledger import experience
    from ledger.cycle import ensure_genesis, load_spec
    from ledger.gate import seal as seallib
    from ledger.store import Store

    s = Store.init(tmp_path)
    ensure_genesis(s, load_spec(None))
    seallib.seal(s, EXAMPLES / "suite")
    experience.record(s, experience.parse_turns((EXAMPLES / "turns.jsonl").read_text()))
    spec = tmp_path / "slow.toml"
    spec.write_text(SLOW_SPEC)
    return s, spec


def _run_under_pty(args, cwd, until: str, timeout: float = 300):
    """Start the CLI on a pty; once `until` appears in its output, press Ctrl-C (the terminal
    sends SIGINT to the foreground process group). Returns (exit code, output)."""
    master, slave = pty.openpty()
    env = {**os.environ, "OMP_NUM_THREADS": "1", "COLUMNS": "100"}
    env.pop("LEDGER_DIR", None)
    p = subprocess.Popen([sys.executable, "-m", "ledger.cli.main", *args], cwd=cwd, stdin=slave, stdout=slave,
                         stderr=slave, env=env, start_new_session=True)
    os.close(slave)
    out = b""
    sent = False
    deadline = time.monotonic() + timeout
    try:
        while time.monotonic() < deadline:
            r, _, _ = select.select([master], [], [], 0.5)
            if r:
                try:
                    chunk = os.read(master, 65536)
                except OSError:
                    break
                if not chunk:
                    break
                out += chunk
            if not sent and until.encode() in out:
                time.sleep(3)  # well inside training: a checkpoint or two committed
                os.killpg(p.pid, signal.SIGINT)  # what the terminal does on Ctrl-C
                sent = True
            if p.poll() is not None and not r:
                break
        rc = p.wait(timeout=60)
    finally:
        os.close(master)
        if p.poll() is None:
            p.kill()
    return rc, out.decode(errors="replace"), sent


@pytest.mark.slow
def test_ctrl_c_during_training_exits_130_and_the_next_run_resumes(tmp_path):
    store, spec = _prepared(tmp_path)
    rc, out, sent = _run_under_pty(["run", "--spec", spec], tmp_path, until="train")
    assert sent, out
    assert rc == 130, out
    last = [line for line in out.replace("\r", "").splitlines() if line.strip()][-2:]
    assert any("interrupted" in line for line in last), out
    assert any("ledger run" in line for line in last), out  # how to resume
    kinds = [json.loads(line)["kind"] for line in (tmp_path / ".ledger" / "journal").read_text().splitlines()]
    assert "export" in kinds and "commit" not in kinds and "refusal" not in kinds
    p = ledger_cmd("run", "--spec", spec, "--json", cwd=tmp_path, timeout=900)
    assert p.returncode in (0, 3), p.stderr
    res = json.loads(p.stdout)
    assert res["stages"]["export"]["reused"] is True  # the interrupted cycle's export, resumed
