"""`ledger capability add | grant | call | list` through the real command-line entry point."""

from __future__ import annotations

import json

import pytest

from ledger.cli.main import main
from ledger.store import Store
from tests.capabilities.helpers import EXAMPLES
from tests.conftest import ledger_cmd


@pytest.fixture
def proj(tmp_path, monkeypatch):
    Store.init(tmp_path)
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("LEDGER_DIR", raising=False)
    return tmp_path


def run(capsys, *args):
    code = main([str(a) for a in args])
    out, err = capsys.readouterr()
    return code, out, " ".join(err.split())   # rich wraps long lines; compare words


def test_examples_in_a_real_process(proj):
    """What a user runs: adder admitted and called, spin refused with exit 3 naming the trap."""
    p = ledger_cmd("capability", "add", EXAMPLES / "adder.wat", "--manifest", EXAMPLES / "adder.toml", cwd=proj)
    assert p.returncode == 0, p.stderr
    assert "admitted adder" in p.stdout
    p = ledger_cmd("capability", "call", "adder", "add", "2", "3", cwd=proj)
    assert (p.returncode, p.stdout) == (0, "5\n"), p.stderr
    head = Store.open(proj).state.head
    p = ledger_cmd("capability", "add", EXAMPLES / "spin.wat", "--manifest", EXAMPLES / "spin.toml", cwd=proj)
    assert p.returncode == 3
    err = " ".join(p.stderr.split())
    assert "test 'returns zero' failed" in err and "ran out of fuel" in err and "[OUT_OF_FUEL]" in err
    assert "Traceback" not in p.stderr
    assert Store.open(proj).state.head == head


def test_call_parses_arguments_by_signature(proj, capsys):
    assert run(capsys, "capability", "add", EXAMPLES / "adder.wat", "-m", EXAMPLES / "adder.toml")[0] == 0
    assert run(capsys, "capability", "call", "adder", "add", "-7", "2")[1] == "-5\n"
    assert run(capsys, "capability", "call", "adder", "add", "--", "-7", "2")[1] == "-5\n"
    assert run(capsys, "capability", "call", "adder", "add", "0x7fffffff", "1")[1] == "-2147483648\n"
    assert run(capsys, "capability", "call", "adder", "add64", "4294967296", "4294967296")[1] == "8589934592\n"
    assert run(capsys, "capability", "call", "adder", "mean", "1", "2.5")[1] == "1.75\n"
    code, out, err = run(capsys, "capability", "call", "adder", "add", "1.5", "2")
    assert code == 2 and "not an i32" in err
    code, out, err = run(capsys, "capability", "call", "adder", "add", "1")
    assert code == 2 and "takes 2 arguments" in err
    code, out, err = run(capsys, "capability", "call", "adder", "sub", "1", "2")
    assert code == 2 and "declares no export 'sub'" in err
    code, out, err = run(capsys, "capability", "call", "nope", "add", "1", "2")
    assert code == 2 and "no capability named 'nope'" in err
    code, out, err = run(capsys, "capability", "call", "adder", "add", "2", "3", "--json")
    d = json.loads(out)
    assert code == 0 and d["values"] == [5] and d["results"] == ["5"] and d["fuel_used"] > 0


def test_call_limits_from_the_command_line(proj, capsys, tmp_path):
    wat = tmp_path / "loop.wat"
    wat.write_text('''(module (func (export "spin") (param $n i64) (result i64)
      (block (loop (br_if 1 (i64.eqz (local.get $n)))
        (local.set $n (i64.sub (local.get $n) (i64.const 1))) (br 0))) (local.get $n)))''')
    man = tmp_path / "loop.toml"
    man.write_text('name = "loop"\n[[exports]]\nname = "spin"\nparams = ["i64"]\nresults = ["i64"]\n'
                   '[[tests]]\nname = "zero"\nexport = "spin"\nargs = [0]\nexpect = [0]\n')
    assert run(capsys, "capability", "add", wat, "-m", man)[0] == 0
    code, out, err = run(capsys, "capability", "call", "loop", "spin", "100000", "--fuel", "1000")
    assert code == 3 and "out of fuel (limit 1000)" in err
    code, out, err = run(capsys, "capability", "call", "loop", "spin", str(1 << 60), "--fuel", str(10 ** 11),
                         "--timeout-ms", "100")
    assert code == 3 and "time limit" in err
    code, out, err = run(capsys, "capability", "call", "loop", "spin", "1", "--fuel", "0")
    assert code == 2


def test_grant_list_and_widening(proj, capsys):
    (proj / "data" / "sub").mkdir(parents=True)
    (proj / "data" / "notes.txt").write_text("one\ntwo\n")
    wat = proj / "probe.wat"
    wat.write_text('''(module (import "wasi_snapshot_preview1" "fd_prestat_get" (func $p (param i32 i32) (result i32)))
      (memory (export "memory") 1)
      (func (export "fd3") (result i32) (call $p (i32.const 3) (i32.const 0))))''')
    man = proj / "probe.toml"
    man.write_text('name = "probe"\nhandles = [{kind = "dir", path = "data", mode = "rw"}, {kind = "stdout"}]\n'
                   '[[exports]]\nname = "fd3"\nparams = []\nresults = ["i32"]\n'
                   '[[tests]]\nname = "nothing open"\nexport = "fd3"\nargs = []\nexpect = [8]\n')
    code, out, err = run(capsys, "capability", "add", wat, "-m", man, "--json")
    assert code == 0 and json.loads(out)["grants"] == [{"kind": "dir", "mode": "rw", "path": "data"}, {"kind": "stdout"}]
    assert run(capsys, "capability", "call", "probe", "fd3")[1] == "0\n"
    code, out, err = run(capsys, "capability", "grant", "probe", "dir:data/sub:ro")
    assert code == 0 and "now holds dir:data/sub:ro" in out
    code, out, err = run(capsys, "capability", "grant", "probe", "dir:data:ro")
    assert code == 3 and "widen" in err
    code, out, err = run(capsys, "capability", "grant", "probe", "stdout")
    assert code == 3
    code, out, err = run(capsys, "capability", "grant", "probe")
    assert code == 2 and "--none" in err
    assert run(capsys, "capability", "grant", "probe", "--none")[0] == 0
    assert run(capsys, "capability", "call", "probe", "fd3")[1] == "8\n"
    code, out, err = run(capsys, "capability", "list", "--json")
    d = json.loads(out)
    [c] = d["capabilities"]
    assert c["name"] == "probe" and c["grants"] == [] and c["admitted_in"] == 0 and d["generation"] == 2
    assert c["exports"] == [{"name": "fd3", "params": [], "results": ["i32"]}]
    code, out, err = run(capsys, "capability", "list", "--gen", "gen-1", "--json")
    assert json.loads(out)["capabilities"][0]["grants"] == [{"kind": "dir", "mode": "ro", "path": "data/sub"}]
    code, out, err = run(capsys, "capability", "list")
    assert code == 0 and "probe" in out and "gen-0" in out


def test_add_errors_are_typed(proj, capsys, tmp_path):
    code, out, err = run(capsys, "capability", "add", tmp_path / "nope.wat", "-m", EXAMPLES / "adder.toml")
    assert code == 2 and "does not exist" in err
    bad = tmp_path / "bad.wat"
    bad.write_text("(module (func (export \"add\")")
    code, out, err = run(capsys, "capability", "add", bad, "-m", EXAMPLES / "adder.toml")
    assert code == 2 and "bad.wat:1:29: invalid WAT: expected `)`" in err
    code, out, err = run(capsys, "capability", "add", tmp_path / "x.py", "-m", EXAMPLES / "adder.toml")
    assert code == 2
    code, out, err = run(capsys, "capability", "add", EXAMPLES / "adder.wat", "-m", EXAMPLES / "adder.toml",
                         "--grant", "stdout", "--no-grants")
    assert code == 2
    code, out, err = run(capsys, "capability", "list")
    assert code == 0 and "no capabilities" in out


def test_cli_module_does_not_import_wasmtime_at_start():
    import subprocess
    import sys

    code = ("import sys, ledger.cli.main; "
            "print('wasmtime' in sys.modules, 'ledger.capabilities.runtime' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.split() == ["False", "False"]


def test_rollback_command_removes_a_capability_like_an_adapter(proj, capsys):
    assert run(capsys, "capability", "add", EXAMPLES / "adder.wat", "-m", EXAMPLES / "adder.toml")[0] == 0
    wat = proj / "two.wat"
    wat.write_text('(module (func (export "two") (result i32) (i32.const 2)))')
    man = proj / "two.toml"
    man.write_text('name = "two"\n[[exports]]\nname = "two"\nparams = []\nresults = ["i32"]\n'
                   '[[tests]]\nname = "two"\nexport = "two"\nargs = []\nexpect = [2]\n')
    assert run(capsys, "capability", "add", wat, "-m", man)[0] == 0
    assert run(capsys, "capability", "call", "two", "two")[1] == "2\n"
    assert run(capsys, "rollback")[0] == 0
    code, out, err = run(capsys, "capability", "call", "two", "two")
    assert code == 2 and "no capability named 'two'" in err
    assert [c["name"] for c in json.loads(run(capsys, "capability", "list", "--json")[1])["capabilities"]] == ["adder"]
    assert run(capsys, "capability", "add", wat, "-m", man)[0] == 0
    assert run(capsys, "capability", "call", "two", "two")[1] == "2\n"
