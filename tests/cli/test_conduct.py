"""What every command does the same way, through the real CLI (ledger/cli/main.py's docstring):
--version, errors under --json, Ctrl-C, and finding the store."""

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from tests.conftest import ledger_cmd


def test_version():
    from importlib.metadata import version

    p = ledger_cmd("--version")
    assert p.returncode == 0 and p.stdout == f"ledger {version('ledger')}\n" and p.stderr == ""


@pytest.mark.parametrize("args, code, error", [
    (("show", "nosuch"), 2, "UnknownRef"),                  # a LedgerError
    (("log", "-n", "many"), 2, "UsageError"),               # a click usage error
    (("rollback", "gen-7"), 2, "UnknownRef"),
])
def test_json_errors_are_one_object_on_stdout(tmp_path, args, code, error):
    ledger_cmd("init", cwd=tmp_path, check=True)
    p = ledger_cmd(*args, "--json", cwd=tmp_path)
    assert p.returncode == code, p.stderr
    err = json.loads(p.stdout)
    assert set(err) == {"exit_code", "error", "message", "hint"}
    assert (err["exit_code"], err["error"]) == (code, error) and err["message"] and err["hint"]
    assert err["message"] in p.stderr            # the same line for a person, on stderr
    plain = ledger_cmd(*args, cwd=tmp_path)      # without --json stdout stays empty
    assert plain.returncode == code and plain.stdout == ""


def test_json_error_after_an_answer_keeps_stdout_one_document(tmp_path):
    """A command that printed its answer and then fails (unlock of a live lock) leaves stdout as
    that one JSON answer; the error goes to stderr."""
    ledger_cmd("init", cwd=tmp_path, check=True)
    holder = subprocess.Popen([sys.executable, "-c", (
        "import sys, time; from ledger.store import Store\n"
        "s = Store.open(sys.argv[1])\n"
        "with s.locked():\n    print('held', flush=True); time.sleep(60)\n"), str(tmp_path)],
        stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        p = ledger_cmd("unlock", "--json", cwd=tmp_path)
        assert p.returncode == 5, p.stderr
        body = json.loads(p.stdout)                  # exactly one document
        assert body["cleared"] is False and body["holder"]["status"] == "live"
        assert "held by a live process" in p.stderr
    finally:
        holder.kill()
        holder.wait()


def test_the_store_is_found_from_any_subfolder(tmp_path):
    ledger_cmd("init", cwd=tmp_path, check=True)
    deep = tmp_path / "a" / "b"
    deep.mkdir(parents=True)
    (deep / "f.txt").write_text("x")
    p = ledger_cmd("add", "f.txt", "--json", cwd=deep, check=True)
    oid = json.loads(p.stdout)["id"]
    for where in (tmp_path, tmp_path / ".ledger"):   # both forms --store names
        q = ledger_cmd("--store", where, "show", oid, "--json", cwd="/", check=True)
        assert json.loads(q.stdout)["id"] == oid
    recs = json.loads(ledger_cmd("log", "--json", cwd=tmp_path / "a", check=True).stdout)
    assert [r["kind"] for r in recs] == ["init", "add"]
    help_text = " ".join(ledger_cmd("--help").stdout.split())
    assert "a folder holding .ledger/, or the .ledger folder itself" in help_text and "or any parent" in help_text


def test_no_store_here_or_above(tmp_path):
    lone = tmp_path / "lone"
    lone.mkdir()
    p = ledger_cmd("log", cwd=lone)
    assert p.returncode == 2 and "no ledger store in" in p.stderr and "any folder above it" in p.stderr


def test_ctrl_c_exits_130_saying_what_was_kept(tmp_path):
    """SIGINT while `ledger record -` waits on stdin: exit 130 (not 0), one line naming the last
    committed record, and the store is whole."""
    ledger_cmd("init", cwd=tmp_path, check=True)
    ledger_cmd("record", "-", cwd=tmp_path, check=True, input='{"situation": "s", "action": "a"}\n')
    env = {k: v for k, v in os.environ.items() if k != "LEDGER_DIR"}
    p = subprocess.Popen([sys.executable, "-m", "ledger.cli.main", "record", "-"], cwd=tmp_path, env=env,
                         stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    time.sleep(1.5)            # it is reading stdin now
    p.send_signal(signal.SIGINT)
    out, err = p.communicate(timeout=60)
    assert p.returncode == 130, (out, err)
    first = err.splitlines()[0]
    assert first == "error: interrupted: the store keeps everything up to journal record 2 (record); nothing " \
                    "after it was written", err
    recs = json.loads(ledger_cmd("log", "--json", cwd=tmp_path, check=True).stdout)
    assert [r["kind"] for r in recs] == ["init", "record"]
    assert ledger_cmd("record", "-", cwd=tmp_path, input='{"situation": "t", "action": "b"}\n').returncode == 0
