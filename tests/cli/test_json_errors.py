"""Every command's error under --json is one JSON object on stdout with its exit code, message
and a hint naming that command's help (issue 19), never text only, never exit 1."""

import json

import pytest

from ledger.cli import catalog
from tests.conftest import ledger_cmd


def _error(p):
    lines = [line for line in p.stdout.splitlines() if line.strip()]
    assert len(lines) == 1, p.stdout
    body = json.loads(lines[0])
    assert set(body) >= {"error", "exit_code", "message", "hint"}
    assert body["exit_code"] == p.returncode
    return body


@pytest.mark.parametrize("command", sorted(catalog.COMMANDS))
def test_a_usage_error_is_json_and_names_the_command(command, tmp_path):
    p = ledger_cmd(command, "--json", "--no-such-option", cwd=tmp_path)
    assert p.returncode == 2, (p.stdout, p.stderr)
    body = _error(p)
    assert body["error"] == "UsageError" and f"ledger {command}" in body["hint"]


@pytest.mark.parametrize("args", [["log"], ["gens"], ["verify"], ["runs"], ["show", "HEAD"], ["gc"],
                                  ["query", "select 1"]])
def test_no_store_is_a_json_error(args, tmp_path):
    p = ledger_cmd("--store", tmp_path / "nowhere", *args, "--json", cwd=tmp_path)
    body = _error(p)
    assert p.returncode == 2 and body["error"] == "NotAStore"


def test_an_unknown_command_suggests_the_close_one(tmp_path):
    p = ledger_cmd("lgo", cwd=tmp_path)
    assert p.returncode == 2 and "Did you mean 'log'?" in p.stderr
