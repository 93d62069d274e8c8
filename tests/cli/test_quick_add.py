"""`ledger add FILE` runs without typer (ledger/cli/main.py `_quick`): the same answers, output
and errors as the typer command it stands for, and typer not imported."""

import subprocess
import sys

from tests.conftest import ledger_cmd

PROBE = ("import sys; from ledger.cli.main import main; rc = main(sys.argv[1:]); "
         "sys.stdout.write('typer imported: %s\\n' % ('typer' in sys.modules)); sys.exit(rc)")


def _probe(*args, cwd, env=None):
    return subprocess.run([sys.executable, "-c", PROBE, *map(str, args)], cwd=cwd, capture_output=True, text=True,
                          env=env)


def test_a_plain_add_answers_as_the_typer_command_without_importing_typer(tmp_path):
    ledger_cmd("init", cwd=tmp_path, check=True)
    f = tmp_path / "f.bin"
    f.write_bytes(b"x" * 5000)
    first = _probe("add", f, cwd=tmp_path)
    assert first.returncode == 0, first.stderr
    line, flag = first.stdout.splitlines()
    assert line.startswith("added b3:") and line.endswith("blob") and flag == "typer imported: False"
    again = _probe("add", f, cwd=tmp_path)
    assert again.stdout.splitlines() == [line.replace("added", "unchanged", 1), "typer imported: False"]
    typed = ledger_cmd("add", "--wait", "0", f, cwd=tmp_path)   # an option: the typer app's path
    assert typed.returncode == 0 and typed.stdout.splitlines() == [line.replace("added", "unchanged", 1)]


def test_a_plain_add_fails_as_the_typer_command_does(tmp_path):
    store = tmp_path / "s"
    store.mkdir()
    ledger_cmd("init", cwd=store, check=True)
    quick = _probe("add", tmp_path / "missing", cwd=store)
    typed = ledger_cmd("add", "--wait", "0", tmp_path / "missing", cwd=store)
    assert quick.returncode == typed.returncode == 2
    assert quick.stderr == typed.stderr and "missing" in quick.stderr and "ledger add --help" in quick.stderr
    elsewhere = tmp_path / "no-store"
    elsewhere.mkdir()
    (elsewhere / "g").write_bytes(b"y")
    quick = _probe("add", "g", cwd=elsewhere)
    typed = ledger_cmd("add", "--wait", "0", "g", cwd=elsewhere)
    assert quick.returncode == typed.returncode != 0 and quick.stderr == typed.stderr


def test_ledger_dir_names_the_store_for_a_plain_add(tmp_path):
    store, work = tmp_path / "s", tmp_path / "w"
    store.mkdir()
    work.mkdir()
    ledger_cmd("init", cwd=store, check=True)
    (work / "h").write_bytes(b"z" * 100)
    p = _probe("add", "h", cwd=work, env={**__import__("os").environ, "LEDGER_DIR": str(store)})
    assert p.returncode == 0 and p.stdout.startswith("added b3:"), p.stderr
    assert ledger_cmd("log", cwd=store, check=True).stdout.count("add") >= 1
