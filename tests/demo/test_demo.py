"""`ledger demo --tiny`: the whole story on the built-in tiny model, and a clean store after it
(the SmolLM2 story is tests/demo/test_demo_real.py)."""

import json

import pytest

from ledger.store import Store
from tests.conftest import ledger_cmd

pytestmark = pytest.mark.slow


def test_demo_story(tmp_path):
    # a relative --dir, as `make demo` uses: children run elsewhere, paths must still resolve
    p = ledger_cmd("demo", "--tiny", "--dir", "d", "--json", cwd=tmp_path, check=True, timeout=600)
    story = json.loads(p.stdout)
    assert story["model"] == "builtin:tiny-llama" and "hint" not in story  # asked for: no hint
    assert story["cycle1"]["verdict"] == "Accept" and story["cycle1"]["generation"] == "gen-1"
    assert story["cycle2"]["verdict"] != "Accept" and story["cycle2"]["reasons"]
    assert story["cycle2"]["generation"] == "gen-1"  # the refusal left HEAD where it was
    assert story["rollback"] == ["gen-0", "gen-1"]
    assert story["verify"] is True
    s = Store.open(tmp_path / "d")
    kinds = [r["kind"] for r in s.journal.records()]
    assert kinds.count("refusal") == 1 and kinds.count("commit") == 1 and kinds.count("rollback") == 2
    # an unrelated folder is never clobbered
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "precious.txt").write_text("x")
    p = ledger_cmd("demo", "--tiny", "--dir", tmp_path / "mine", cwd=tmp_path)
    assert p.returncode == 2 and (tmp_path / "mine" / "precious.txt").exists()


def test_demo_folder_is_rebuilt_only_if_it_is_a_demo(tmp_path):
    from ledger.demo.story import MARKER, _prepare

    d = _prepare(tmp_path / "d")
    (d / "junk").write_text("old run")
    assert (d / MARKER).exists()
    d = _prepare(tmp_path / "d")
    assert not (d / "junk").exists()


def test_relative_store_paths_work_for_children(tmp_path, monkeypatch):
    """`ledger demo --dir ledger-demo` and `--store rel/path` hand paths to sandboxed children
    running in other working directories: the store root must be absolute."""
    from ledger.store import Store

    monkeypatch.chdir(tmp_path)
    s = Store.init("rel")
    assert s.root.is_absolute()
    assert Store.open("rel").root == (tmp_path / "rel" / ".ledger")
