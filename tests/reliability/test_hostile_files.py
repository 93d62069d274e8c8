"""Hostile files in and around the store (issue 17): every one ends in a typed error with its
exit code, nothing hangs, and the store is left as it was.

Each case is a function `case_*(tmp_path) -> None` that builds its fault, runs the real CLI
and asserts; `test_sweep_no_internal_errors` runs every case's commands again and fails on
any exit 1 (disk full is StorageIOError, exit 6 — the environment failed — and it must then be
the typed message, never "internal error").
"""

import json
import os
import shutil
import stat

import pytest

from ledger.store import Store
from ledger.store.add import add_path
from ledger.store.ids import hex_of
from tests.conftest import ledger_cmd

TIMEOUT = 60  # a hang fails the test instead of stalling the suite


def _run(tmp_path, *args, env=None):
    p = ledger_cmd(*args, cwd=tmp_path, env=env, timeout=TIMEOUT)
    assert "internal error" not in p.stderr, p.stderr
    return p


def snapshot(root):
    """What must not change: the journal, and every object file (type and bytes)."""
    objs = {}
    for dirpath, dirnames, filenames in os.walk(root / "objects"):
        for name in dirnames + filenames:
            p = os.path.join(dirpath, name)
            st = os.lstat(p)
            objs[os.path.relpath(p, root)] = (stat.S_IFMT(st.st_mode),
                                              open(p, "rb").read() if stat.S_ISREG(st.st_mode) else None)
    return (root / "journal").read_bytes(), objs


def _store(tmp_path):
    s = Store.init(tmp_path)
    (tmp_path / "a.txt").write_text("alpha")
    (tmp_path / "b.txt").write_text("bravo!")
    p = ledger_cmd("add", "a.txt", "--json", cwd=tmp_path, check=True)
    oid = json.loads(p.stdout)["id"]
    ledger_cmd("add", "b.txt", cwd=tmp_path, check=True)
    return s, oid


def _object_path(s, oid):
    h = hex_of(oid)
    return s.root / "objects" / h[:2] / h[2:]


# --- objects replaced by a directory or a FIFO ---------------------------------------------------
@pytest.mark.parametrize("kind", ["directory", "fifo", "symlink"])
def test_object_replaced_by_special_file(tmp_path, kind):
    s, oid = _store(tmp_path)
    p = _object_path(s, oid)
    os.chmod(p, 0o644)
    p.unlink()
    if kind == "directory":
        p.mkdir()
    elif kind == "fifo":
        os.mkfifo(p)
    else:
        (tmp_path / "elsewhere").write_text("alpha")
        p.symlink_to(tmp_path / "elsewhere")
    before = snapshot(s.root)
    r = _run(tmp_path, "verify", "--read-data")
    assert r.returncode == 4 and "not a stored file" in r.stdout + r.stderr
    r = _run(tmp_path, "cat", oid)
    assert r.returncode == 4 and "not a stored file" in r.stderr
    r = _run(tmp_path, "gc")
    assert r.returncode == 0
    r = _run(tmp_path, "gc", "--prune")
    assert r.returncode == 0  # the damaged object is reachable: gc keeps it (repair replaces it)
    assert snapshot(s.root) == before
    # a verified copy arriving by `add` replaces the damaged one atomically, and says so
    (tmp_path / "again.txt").write_text("alpha")
    r = _run(tmp_path, "add", "again.txt")
    assert r.returncode == 0 and "replaced the damaged copy" in r.stderr, r.stderr
    assert stat.S_ISREG(os.lstat(p).st_mode)
    assert _run(tmp_path, "verify", "--read-data").returncode == 0


def test_replace_damaged_primitive(tmp_path):
    from ledger.errors import CorruptObject

    s, oid = _store(tmp_path)
    p = _object_path(s, oid)
    os.chmod(p, 0o644)
    p.write_bytes(b"alphX")
    st = Store.open(s.root)
    with pytest.raises(CorruptObject):
        st.replace_damaged(oid, b"not alpha")   # a copy that does not hash to the id: nothing changes
    assert p.read_bytes() == b"alphX"
    assert st.replace_damaged(oid, b"alpha") is True
    assert p.read_bytes() == b"alpha" and not os.access(p, os.W_OK) or os.getuid() == 0
    assert st.replace_damaged(oid, b"alpha") is False      # intact now: nothing to do
    assert any("replaced the damaged copy" in w for w in st.warnings)
    # from a file, and for a missing object
    p.unlink()
    (tmp_path / "copy").write_bytes(b"alpha")
    assert st.replace_damaged(oid, tmp_path / "copy") is True
    assert Store.open(s.root).get_bytes(oid) == b"alpha"


# --- the lock path -------------------------------------------------------------------------------
@pytest.mark.parametrize("kind", ["dangling-symlink", "directory", "fifo"])
def test_lock_path_not_a_file(tmp_path, kind):
    s, _ = _store(tmp_path)
    lock = s.root / "lock"
    if kind == "dangling-symlink":
        lock.symlink_to(tmp_path / "no-such-file")
    elif kind == "directory":
        lock.mkdir()
    else:
        os.mkfifo(lock)
    before = snapshot(s.root)
    (tmp_path / "c.txt").write_text("charlie")
    r = _run(tmp_path, "add", "c.txt")
    assert r.returncode == 5 and "ledger unlock" in r.stderr, r.stderr   # blocks writers, says how to clear
    assert snapshot(s.root) == before
    r = _run(tmp_path, "unlock", "--json")
    assert r.returncode == 0 and json.loads(r.stdout)["cleared"] is True
    assert not os.path.lexists(lock)
    assert not (tmp_path / "no-such-file").exists()  # the link was removed, never followed
    assert _run(tmp_path, "add", "c.txt").returncode == 0


def test_lock_directory_with_content_is_not_removed(tmp_path):
    s, _ = _store(tmp_path)
    (s.root / "lock").mkdir()
    (s.root / "lock" / "precious").write_text("x")
    r = _run(tmp_path, "unlock")
    assert r.returncode == 5 and "by hand" in r.stderr
    assert (s.root / "lock" / "precious").exists()


@pytest.mark.parametrize("content", [b'{"pid": 99999999999999999999999999, "host": "h", "time": 1e400}',
                                     b'{"pid": "x"}', b"\xff\xfe garbage", b"[1,2]"])
def test_lock_file_with_garbage(tmp_path, content):
    s, _ = _store(tmp_path)
    (s.root / "lock").write_bytes(content)
    r = _run(tmp_path, "verify")
    assert r.returncode == 0
    (tmp_path / "c.txt").write_text("charlie")
    r = _run(tmp_path, "add", "c.txt")   # no one holds its kernel lock: the writer clears it
    assert r.returncode == 0, r.stderr
    (s.root / "lock").write_bytes(content)
    r = _run(tmp_path, "unlock", "--json")
    assert r.returncode == 0 and json.loads(r.stdout)["cleared"] is True


# --- names are bytes ----------------------------------------------------------------------------
def test_non_utf8_names_round_trip(tmp_path):
    from ledger.store import trees

    s = Store.init(tmp_path)
    d = tmp_path / "d"
    d.mkdir()
    names = [b"caf\xe9", b"\xff\xfe", b"ok.txt", b"100%", b"sp ace", "ünï".encode()]
    for i, n in enumerate(names):
        with open(os.path.join(os.fsencode(d), n), "wb") as f:
            f.write(b"x" * i)
    os.mkdir(os.path.join(os.fsencode(d), b"sub\x80"))
    with open(os.path.join(os.fsencode(d), b"sub\x80", b"in\x81"), "wb") as f:
        f.write(b"deep")
    r = _run(tmp_path, "add", "d", "--json")
    assert r.returncode == 0, r.stderr
    tree = json.loads(r.stdout)["id"]
    entries = trees.tree_entries(Store.open(s.root), tree)
    assert all(isinstance(e["path"], str) for e in entries)
    assert {e["path"] for e in entries if e.get("escaped")} == {"caf%E9", "%FF%FE", "sub%80/in%81"}
    out = tmp_path / "out"
    trees.materialise_tree(Store.open(s.root), tree, out)
    got = sorted(os.path.relpath(os.path.join(dp, f), os.fsencode(out))
                 for dp, _, fs in os.walk(os.fsencode(out)) for f in fs)
    assert got == sorted(names + [b"sub\x80/in\x81"])
    for i, n in enumerate(names):
        with open(os.path.join(os.fsencode(out), n), "rb") as f:
            assert f.read() == b"x" * i
    # a single file with such a name, too (the record escapes it)
    r = _run(tmp_path, "add", os.fsdecode(os.path.join(os.fsencode(d), b"caf\xe9")))
    assert r.returncode == 0
    assert _run(tmp_path, "verify", "--read-data").returncode == 0


# --- tmp/ deleted ---------------------------------------------------------------------------------
def test_deleted_tmp_is_noticed_and_recreated(tmp_path):
    s, _ = _store(tmp_path)
    shutil.rmtree(s.root / "tmp")
    r = _run(tmp_path, "verify")
    assert r.returncode == 0 and "tmp/ directory is missing" in r.stdout
    (tmp_path / "c.txt").write_text("charlie")
    r = _run(tmp_path, "add", "c.txt")
    assert r.returncode == 0, r.stderr
    assert (s.root / "tmp").is_dir()
    assert "missing" not in _run(tmp_path, "verify").stdout


# --- a folder whose files vanish mid-add ---------------------------------------------------------
def test_files_vanishing_mid_add(tmp_path, monkeypatch):
    from ledger.errors import BadInput
    from ledger.store import repo

    s = Store.init(tmp_path)
    d = tmp_path / "d"
    d.mkdir()
    for i in range(5):
        (d / f"f{i}").write_text(str(i) * 10)
    before = snapshot(s.root)
    real = repo.Transaction.put_file
    calls = []

    def put_and_delete_next(tx, path, *a, **kw):
        calls.append(path)
        if len(calls) == 2:
            (d / "f3").unlink()     # a file the walk listed goes away before it is read
        return real(tx, path, *a, **kw)

    monkeypatch.setattr(repo.Transaction, "put_file", put_and_delete_next)
    with pytest.raises(BadInput, match="vanished"):
        add_path(Store.open(s.root), d)
    assert snapshot(s.root)[0] == before[0]   # nothing recorded


def test_folder_vanishing_mid_add_cli(tmp_path):
    # a sub-folder that cannot be listed: the walk's error is bad input, never silently skipped
    s = Store.init(tmp_path)
    d = tmp_path / "d"
    (d / "sub").mkdir(parents=True)
    (d / "sub" / "f").write_text("x")
    os.chmod(d / "sub", 0)
    try:
        if os.getuid() == 0:
            pytest.skip("root reads a mode-000 folder")
        before = snapshot(s.root)
        r = _run(tmp_path, "add", "d")
        assert r.returncode == 2
        assert snapshot(s.root) == before
    finally:
        os.chmod(d / "sub", 0o755)


# --- disk full right after a torn tail -----------------------------------------------------------
def test_disk_full_after_torn_tail(tmp_path):
    s, _ = _store(tmp_path)
    with open(s.root / "journal", "ab") as f:
        f.write(b'{"seq": 4, "half a rec')
    before = snapshot(s.root)
    (tmp_path / "c.txt").write_text("charlie")
    for n in range(1, 6):
        r = ledger_cmd("add", "c.txt", cwd=tmp_path, env={"LEDGER_FAULT_ERRNO": f"ENOSPC:{n}"}, timeout=TIMEOUT)
        assert "internal error" not in r.stderr, (n, r.stderr)
        if r.returncode == 0:
            break
        assert r.returncode == 6 and "no space left" in r.stderr, (n, r.stderr)
        j, objs = snapshot(s.root)
        assert j.startswith(before[0][: len(before[0]) - 23])  # committed records untouched
    assert _run(tmp_path, "verify").returncode == 0


# --- an id that was never stored ------------------------------------------------------------------
def test_well_formed_id_not_stored_is_not_found(tmp_path):
    s, oid = _store(tmp_path)
    before = snapshot(s.root)
    ghost = "b3:" + "0" * 64
    for cmd in (("cat", ghost), ("show", ghost)):
        r = _run(tmp_path, *cmd)
        assert r.returncode == 2 and "not found" in r.stderr, (cmd, r.stderr)
    # but one the journal reaches and that is gone is corruption (exit 4)
    p = _object_path(s, oid)
    os.chmod(p, 0o644)
    p.unlink()
    r = _run(tmp_path, "cat", oid)
    assert r.returncode == 4 and "missing" in r.stderr
    assert snapshot(s.root)[0] == before[0]


# --- the journal itself replaced ------------------------------------------------------------------
@pytest.mark.parametrize("kind", ["fifo", "symlink"])
def test_journal_replaced_by_special_file(tmp_path, kind):
    s, _ = _store(tmp_path)
    j = s.root / "journal"
    saved = j.read_bytes()
    j.unlink()
    if kind == "fifo":
        os.mkfifo(j)
    else:
        (tmp_path / "j").write_bytes(saved)
        j.symlink_to(tmp_path / "j")
    (tmp_path / "new.txt").write_text("new")
    for cmd in (("verify",), ("log",), ("add", "new.txt")):
        r = _run(tmp_path, *cmd)
        assert r.returncode == 4, (cmd, r.returncode, r.stderr)
    assert os.path.islink(j) or stat.S_ISFIFO(os.lstat(j).st_mode)
