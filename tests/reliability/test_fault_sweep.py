"""The fault catalogue swept (issue 17): every injected fault and hostile file, then every
store command through the real CLI. Each must end in a typed error with its documented exit
code (or succeed): never exit 1 (an internal error), never hang. The one exception is disk
full: StorageIOError is exit 6 (the environment failed), and then its message must be the typed one.
"""

import json
import os
import shutil
import subprocess

import pytest

from ledger.store import Store, canonical
from ledger.store.ids import hex_of
from tests.conftest import ledger_cmd

TIMEOUT = 60


def _obj(root, oid):
    h = hex_of(oid)
    return root / "objects" / h[:2] / h[2:]


def _replace(p, make):
    if os.path.lexists(p):
        if os.path.isdir(p) and not os.path.islink(p):
            shutil.rmtree(p)
        else:
            os.chmod(p, 0o644) if not os.path.islink(p) else None
            os.unlink(p)
    make(p)


def _fifo(p):
    os.mkfifo(p)


def _dir(p):
    os.mkdir(p)


def _dangling(p):
    os.symlink("/nonexistent/ledger-sweep", p)


def _other_store(tmp_path):
    other = tmp_path / "other"
    other.mkdir()
    o = Store.init(other)
    for i in range(2):
        with o.transaction("t") as tx:
            tx.refs[f"name/o{i}"] = tx.put_bytes(f"other {i}".encode())
    return o


def _journal_edit_last(root, tmp_path):
    data = (root / "journal").read_bytes()
    (root / "journal").write_bytes(data[:-30] + b"Z" + data[-29:])
    (root / "refs.json").unlink()


CASES = {
    "object-dir": lambda r, t, oid: _replace(_obj(r, oid), _dir),
    "object-fifo": lambda r, t, oid: _replace(_obj(r, oid), _fifo),
    "object-dangling-link": lambda r, t, oid: _replace(_obj(r, oid), _dangling),
    "object-truncated": lambda r, t, oid: (os.chmod(_obj(r, oid), 0o644), open(_obj(r, oid), "r+b").truncate(2)),
    "object-missing": lambda r, t, oid: (os.chmod(_obj(r, oid), 0o644), os.unlink(_obj(r, oid))),
    "fanout-dir-is-file": lambda r, t, oid: _replace(_obj(r, oid).parent, lambda p: open(p, "wb").close()),
    "lock-dangling-link": lambda r, t, oid: _dangling(r / "lock"),
    "lock-dir": lambda r, t, oid: _dir(r / "lock"),
    "lock-fifo": lambda r, t, oid: _fifo(r / "lock"),
    "lock-huge-pid": lambda r, t, oid: (r / "lock").write_text('{"pid": 1' + "0" * 40 + ', "host": "x", "time": 1e9}'),
    "lock-garbage": lambda r, t, oid: (r / "lock").write_bytes(b"\xff\x00{"),
    "tmp-deleted": lambda r, t, oid: shutil.rmtree(r / "tmp"),
    "tmp-is-a-file": lambda r, t, oid: (shutil.rmtree(r / "tmp"), (r / "tmp").write_text("x")),
    "journal-fifo": lambda r, t, oid: _replace(r / "journal", _fifo),
    "journal-dangling-link": lambda r, t, oid: _replace(r / "journal", _dangling),
    "journal-torn": lambda r, t, oid: open(r / "journal", "ab").write(b'{"seq": 99, "pr'),
    "journal-garbage-line": lambda r, t, oid: open(r / "journal", "ab").write(b"\x00\xff not json\n"),
    "journal-last-record-edited": lambda r, t, oid: _journal_edit_last(r, t),
    "journal-truncated-to-zero": lambda r, t, oid: open(r / "journal", "wb").close(),
    "refs-json-fifo": lambda r, t, oid: _replace(r / "refs.json", _fifo),
    "refs-json-garbage": lambda r, t, oid: (r / "refs.json").write_bytes(b'{"seq": "x", "refs": [1]}'),
    "refs-json-other-store": lambda r, t, oid: shutil.copyfile(_other_store(t).root / "refs.json", r / "refs.json"),
    "index-garbage": lambda r, t, oid: (r / "index.duckdb").write_bytes(b"not a database" * 100),
    "index-fifo": lambda r, t, oid: _replace(r / "index.duckdb", _fifo),
    "index-other-store": lambda r, t, oid: shutil.copyfile(_other_store(t).root / "index.duckdb", r / "index.duckdb"),
    "stat-cache-entries-special": lambda r, t, oid: [(_replace(p, _fifo)) for p in (r / "cache" / "stat").iterdir()],
    "config-fifo": lambda r, t, oid: _replace(r / "config", _fifo),
    "config-garbage": lambda r, t, oid: (r / "config").write_bytes(b"\xff"),
    "config-another-format": lambda r, t, oid: (r / "config").write_bytes(canonical.dumps({"format": 99})),
}


def _commands(oid):
    return [("verify",), ("verify", "--read-data"), ("log", "-n", "3"), ("cat", oid), ("show", oid),
            ("gc",), ("gc", "--prune"), ("add", "new.txt"), ("query", "SELECT count(*) FROM journal"),
            ("unlock",), ("index", "rebuild")]


def _fresh(tmp_path):
    s = Store.init(tmp_path)
    (tmp_path / "a.txt").write_text("alpha")
    p = ledger_cmd("add", "a.txt", "--json", cwd=tmp_path, check=True)
    (tmp_path / "b.txt").write_text("bravo")
    ledger_cmd("add", "b.txt", cwd=tmp_path, check=True)
    (tmp_path / "new.txt").write_text("a new file")
    return s, json.loads(p.stdout)["id"]


def _check(tmp_path, case, cmd, env=None):
    try:
        p = ledger_cmd(*cmd, cwd=tmp_path, env=env, timeout=TIMEOUT)
    except subprocess.TimeoutExpired:
        pytest.fail(f"{case}: `ledger {' '.join(cmd)}` hung")
    where = f"{case}: `ledger {' '.join(cmd)}` -> {p.returncode}: {p.stderr.strip()[-400:]}"
    assert "internal error" not in p.stderr and "Traceback" not in p.stderr, where
    if env and "LEDGER_FAULT_ERRNO" in env and p.returncode == 6:
        assert "no space left" in p.stderr, where
    else:
        assert p.returncode in (0, 2, 3, 4, 5), where
    return p


@pytest.mark.parametrize("case", sorted(CASES))
def test_sweep_no_internal_errors(tmp_path, case):
    s, oid = _fresh(tmp_path)
    CASES[case](s.root, tmp_path, oid)
    for cmd in _commands(oid):
        _check(tmp_path, case, cmd)


@pytest.mark.parametrize("level", range(1, 8))
def test_sweep_disk_full_after_torn_tail(tmp_path, level):
    s, oid = _fresh(tmp_path)
    with open(s.root / "journal", "ab") as f:
        f.write(b'{"seq": 4, "torn')
    env = {"LEDGER_FAULT_ERRNO": f"ENOSPC:{level}"}
    for cmd in (("add", "new.txt"), ("gc", "--prune"), ("index", "rebuild"), ("verify",)):
        _check(tmp_path, f"ENOSPC:{level}", cmd, env)
    assert ledger_cmd("verify", cwd=tmp_path).returncode == 0
