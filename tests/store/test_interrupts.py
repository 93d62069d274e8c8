"""Rule 24 (docs/store-format.md): a Ctrl-C is never swallowed. DuckDB turns the KeyboardInterrupt
of a SIGINT that lands during a query into RuntimeError('Query interrupted'); the index's broad
`except Exception` (an unreadable index is a cache to rebuild or walk around) then carried on, and
a `ledger run` pressed Ctrl-C in trained 400/400 steps, judged and committed (exit 0)."""

import json
import os
import signal
import subprocess
import sys
import threading

import pytest

from ledger import errors
from ledger.store import Store, index
from tests.conftest import ledger_cmd

# Seconds of work. DuckDB notices a SIGINT at once or only when the query ends (both were seen):
# either way it raises its RuntimeError, so the query is long enough to be running at 0.1 s and
# short enough that its end is near.
LONG_QUERY = "SELECT sum(i * j) FROM range(40000) t(i), range(40000) s(j)"


def _sigint_after(seconds: float) -> threading.Timer:
    t = threading.Timer(seconds, lambda: os.kill(os.getpid(), signal.SIGINT))
    t.start()
    return t


def test_a_query_interrupted_by_sigint_raises_keyboard_interrupt(tmp_path):
    """(a) At the DuckDB boundary: the interrupted query gives the KeyboardInterrupt back."""
    con = index._connect(tmp_path / "x.duckdb", read_only=False)
    try:
        t = _sigint_after(0.1)
        with pytest.raises(KeyboardInterrupt) as e:
            con.execute(LONG_QUERY).fetchall()
        t.join()
        assert isinstance(e.value.__cause__, RuntimeError)   # what DuckDB raised in its place
    finally:
        con.close()


def test_duckdb_alone_swallows_the_keyboard_interrupt(tmp_path):
    """Why (a) exists: the bare DuckDB connection raises an ordinary exception instead. If a
    DuckDB release stops doing this, the wrapper is no longer needed (and this test says so)."""
    import duckdb

    con = duckdb.connect()
    try:
        t = _sigint_after(0.1)
        with pytest.raises(Exception) as e:
            con.execute(LONG_QUERY).fetchall()
        t.join()
        assert not isinstance(e.value, KeyboardInterrupt) and index._is_interrupt(e.value)
    finally:
        con.close()


class _InterruptedConnection:
    """A DuckDB connection at the moment a SIGINT lands in its query: what DuckDB raises."""

    def execute(self, *args, **kwargs):
        raise RuntimeError("Query interrupted")


class _Broken:
    def execute(self, *args, **kwargs):
        raise RuntimeError("Catalog Error: Table with name meta does not exist!")


def test_the_index_does_not_take_an_interrupted_query_for_a_damaged_index():
    """The broad handler behind (a): _layout_problem calls an unreadable meta table damage
    ("the caller rebuilds or walks"); an interrupted read of it is a Ctrl-C, not damage."""
    assert index._layout_problem(index._Connection(_Broken())) == "unreadable (RuntimeError)"   # real damage still reads as such
    with pytest.raises(KeyboardInterrupt):
        index._layout_problem(index._Connection(_InterruptedConnection()))


def test_no_transaction_appends_once_a_ctrl_c_was_noted(tmp_path, monkeypatch):
    """(b) A Ctrl-C that something swallowed still stops the next commit, and nothing of it is
    visible: the journal is byte-identical."""
    from ledger import experience

    s = Store.init(tmp_path)
    turns = experience.parse_turns('{"situation": "s", "action": "a"}\n')
    journal = (s.root / "journal").read_bytes()
    monkeypatch.setattr(errors, "_interrupt_requested", True)
    with pytest.raises(KeyboardInterrupt):
        experience.record(s, turns)
    assert (s.root / "journal").read_bytes() == journal
    monkeypatch.setattr(errors, "_interrupt_requested", False)
    experience.record(s, turns)   # the store is usable as soon as the request is gone
    assert (s.root / "journal").read_bytes() != journal


# The CLI's own entry with a Ctrl-C that a library swallowed before the command ran: the
# process's handler notes it, the simulated library drops the KeyboardInterrupt, the command
# runs on. (c) The command's transaction refuses and the CLI exits 130 saying what was kept.
SWALLOWED = """
import os, signal, sys
from ledger import errors
from ledger.cli import main
errors.install_interrupt_handler()
try:
    os.kill(os.getpid(), signal.SIGINT)
except KeyboardInterrupt:
    pass   # what DuckDB (or any library that checks for signals) does with it
sys.argv = ["ledger", *sys.argv[1:]]
main.entry()
"""


def _swallowed(tmp_path, *args, input=None):
    env = {k: v for k, v in os.environ.items() if k != "LEDGER_DIR"}
    return subprocess.run([sys.executable, "-c", SWALLOWED, *args], cwd=tmp_path, env=env, input=input,
                          capture_output=True, text=True, timeout=120)


def test_a_swallowed_ctrl_c_stops_the_next_commit_and_exits_130(tmp_path):
    ledger_cmd("init", cwd=tmp_path, check=True)
    p = _swallowed(tmp_path, "record", "-", input='{"situation": "s", "action": "a"}\n')
    assert p.returncode == 130, (p.stdout, p.stderr)
    assert p.stderr.splitlines()[0] == ("error: interrupted: the store keeps everything up to journal record 1 "
                                        "(init); nothing after it was written"), p.stderr
    recs = json.loads(ledger_cmd("log", "--json", cwd=tmp_path, check=True).stdout)
    assert [r["kind"] for r in recs] == ["init"]


def test_a_command_that_finished_after_a_swallowed_ctrl_c_exits_130(tmp_path):
    """(c) A reader that ran to its end on a swallowed Ctrl-C does not exit 0 as if it was never pressed."""
    ledger_cmd("init", cwd=tmp_path, check=True)
    p = _swallowed(tmp_path, "log", "--json")
    assert p.returncode == 130, (p.stdout, p.stderr)
    assert json.loads(p.stdout)[0]["kind"] == "init"   # its answer stands, stdout one JSON document
    assert p.stderr.startswith("error: interrupted: the store keeps everything up to journal record 1 (init)")


def test_a_command_that_failed_after_a_swallowed_ctrl_c_exits_130_after_its_own_error(tmp_path):
    """(c) `record -` whose stdin then ends empty: its own error is printed, and the exit is 130, not 2."""
    ledger_cmd("init", cwd=tmp_path, check=True)
    p = _swallowed(tmp_path, "record", "-", input="")
    assert p.returncode == 130, (p.stdout, p.stderr)
    lines = p.stderr.splitlines()
    assert lines[0] == "error: stdin: no turns" and lines[2].startswith("error: interrupted: "), p.stderr


def test_the_handler_is_installed_only_over_pythons_default():
    """A parent that made SIGINT ignored (nohup-like) or a program with its own handler keeps it."""
    code = ("import signal; from ledger import errors\n"
            "signal.signal(signal.SIGINT, signal.SIG_IGN); errors.install_interrupt_handler()\n"
            "assert signal.getsignal(signal.SIGINT) is signal.SIG_IGN\n"
            "signal.signal(signal.SIGINT, signal.default_int_handler); errors.install_interrupt_handler()\n"
            "assert signal.getsignal(signal.SIGINT) is errors._note_interrupt\n")
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)


# Ctrl-C while the CLI's own modules load: an import hook raises where SIGINT's KeyboardInterrupt
# would (the first ~50 ms of every command), then the CLI runs as `python -m ledger.cli.main`.
DURING_IMPORT = """
import runpy, sys
class CtrlC:
    def find_spec(self, name, path=None, target=None):
        if name == "ledger.cli.adding":
            raise KeyboardInterrupt
sys.meta_path.insert(0, CtrlC())
sys.argv = ["ledger", *sys.argv[1:]]
runpy.run_module("ledger.cli.main", run_name="__main__")
"""


@pytest.mark.parametrize("json_mode", [False, True])
def test_a_ctrl_c_while_the_cli_loads_is_an_interrupt_not_a_traceback(tmp_path, json_mode):
    p = subprocess.run([sys.executable, "-c", DURING_IMPORT, "log", *(["--json"] if json_mode else [])], cwd=tmp_path,
                       capture_output=True, text=True, timeout=60)
    assert p.returncode == 130, (p.stdout, p.stderr)
    assert p.stderr == "error: interrupted: nothing was written\nhint: run the same command again\n"
    assert (json.loads(p.stdout)["error"] == "Interrupted") if json_mode else p.stdout == ""
