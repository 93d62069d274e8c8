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


STORE_PROBE = ("import sys; from ledger.cli.main import main; rc = main(sys.argv[1:]); "
               "sys.stdout.write('store opened: %s\\n' % ('ledger.store.repo' in sys.modules)); sys.exit(rc)")


def test_an_unchanged_file_is_answered_from_the_stat_cache_without_opening_the_store(tmp_path):
    """An unchanged re-add loads none of the store's modules beyond the stat cache's
    (ledger/store/statcache.py), with the line the whole add prints; a changed file, or a store
    this ledger must refuse, runs the whole add as before."""
    ledger_cmd("init", cwd=tmp_path, check=True)
    f = tmp_path / "f.bin"
    f.write_bytes(b"x" * 5000)
    first = ledger_cmd("add", f, cwd=tmp_path, check=True).stdout.strip()
    import time
    time.sleep(0.05)   # past the timestamp tick: an entry written within it is racy (rule 11)
    ledger_cmd("add", "--wait", "0", f, cwd=tmp_path, check=True)   # writes a non-racy entry
    run = lambda: subprocess.run([sys.executable, "-c", STORE_PROBE, "add", str(f)], cwd=tmp_path,  # noqa: E731
                                 capture_output=True, text=True)
    hit = run()
    assert hit.returncode == 0, hit.stderr
    assert hit.stdout.splitlines() == [first.replace("added", "unchanged", 1), "store opened: False"]
    f.write_bytes(b"y" * 5000)                              # changed: the whole add runs and records it
    miss = run()
    assert miss.returncode == 0 and miss.stdout.splitlines()[0].startswith("added b3:")
    assert miss.stdout.splitlines()[1] == "store opened: True"
    cfg = tmp_path / ".ledger" / "config"
    cfg.write_text(cfg.read_text().replace('"format":2', '"format":99'))
    refused = run()                                          # the whole add says why, as always
    assert refused.returncode != 0 and "format" in refused.stderr and "store opened: True" in refused.stdout
