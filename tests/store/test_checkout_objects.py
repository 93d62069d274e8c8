"""`ledger checkout` writes back any tree or file, byte-exact and verified; nothing is overwritten."""

import os

from ledger.store import Store
from tests.conftest import ledger_cmd


def _add(root, path):
    p = ledger_cmd("--store", root, "add", path, "--json")
    assert p.returncode == 0, p.stderr
    import json

    return json.loads(p.stdout)["id"]


def test_a_tree_and_a_file_round_trip(tmp_path):
    store = Store.init(tmp_path / "s")
    src = tmp_path / "data"
    (src / "sub").mkdir(parents=True)
    (src / "a.txt").write_text("alpha")
    (src / "sub" / "b.bin").write_bytes(os.urandom(70_000))
    tree = _add(store.root, src)
    p = ledger_cmd("--store", store.root, "checkout", tree, tmp_path / "out", "--json")
    assert p.returncode == 0, p.stderr
    assert (tmp_path / "out" / "a.txt").read_text() == "alpha"
    assert (tmp_path / "out" / "sub" / "b.bin").read_bytes() == (src / "sub" / "b.bin").read_bytes()
    blob = _add(store.root, src / "sub" / "b.bin")
    p = ledger_cmd("--store", store.root, "checkout", blob[:14], tmp_path / "b.bin")
    assert p.returncode == 0, p.stderr
    assert (tmp_path / "b.bin").read_bytes() == (src / "sub" / "b.bin").read_bytes()


def test_nothing_is_overwritten(tmp_path):
    store = Store.init(tmp_path / "s")
    f = tmp_path / "f.txt"
    f.write_text("mine")
    blob = _add(store.root, f)
    p = ledger_cmd("--store", store.root, "checkout", blob, f)
    assert p.returncode == 2 and "exists" in p.stderr and f.read_text() == "mine"
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "x").write_text("x")
    tree = _add(store.root, tmp_path / "full")
    p = ledger_cmd("--store", store.root, "checkout", tree, tmp_path / "full")
    assert p.returncode == 2 and "not an empty folder" in p.stderr
    os.symlink(tmp_path / "elsewhere", tmp_path / "link")
    p = ledger_cmd("--store", store.root, "checkout", tree, tmp_path / "link")
    assert p.returncode == 2 and not (tmp_path / "elsewhere").exists()
