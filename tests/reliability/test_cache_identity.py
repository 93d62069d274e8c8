"""Caches know whose they are: the index and refs.json record the store's id and the last
record they project, so a copy from another store is recognised (issue 17)."""

import json
import shutil

from ledger.store import Store, canonical, index
from tests.conftest import ledger_cmd


def _two_stores(tmp_path):
    a_dir, b_dir = tmp_path / "a", tmp_path / "b"
    a_dir.mkdir()
    b_dir.mkdir()
    a, b = Store.init(a_dir), Store.init(b_dir)
    for i in range(3):
        (a_dir / f"f{i}").write_text(f"a{i}" * (i + 1))
        assert ledger_cmd("add", f"f{i}", cwd=a_dir).returncode == 0
    for i in range(3):
        (b_dir / f"g{i}").write_text(f"different b{i}")
        assert ledger_cmd("add", f"g{i}", cwd=b_dir).returncode == 0
    assert a.refresh().seq == b.refresh().seq == 4
    return a, b


def test_store_has_an_id_and_caches_carry_it(tmp_path):
    s = Store.init(tmp_path)
    sid = s.store_id
    assert sid and sid.startswith("store-")
    assert json.loads((s.root / "refs.json").read_bytes())["store"] == sid
    assert index.indexed_meta(s.root)["store"] == sid


def test_store_without_id_is_migrated(tmp_path):
    s = Store.init(tmp_path)
    cfg = json.loads((s.root / "config").read_bytes())
    del cfg["id"]
    (s.root / "config").write_bytes(canonical.dumps(cfg) + b"\n")
    assert Store.open(s.root).store_id is None
    (tmp_path / "f").write_text("x")
    assert ledger_cmd("add", "f", cwd=tmp_path).returncode == 0
    sid = Store.open(s.root).store_id
    assert sid and json.loads((s.root / "refs.json").read_bytes())["store"] == sid
    assert index.indexed_meta(s.root)["store"] == sid
    assert ledger_cmd("verify", cwd=tmp_path).returncode == 0


def test_index_copied_from_another_store_is_detected_and_rebuilt(tmp_path):
    a, b = _two_stores(tmp_path)
    truth = index.dump(b.root)
    journal = b.journal.path.read_bytes()
    shutil.copyfile(a.root / "index.duckdb", b.root / "index.duckdb")
    p = ledger_cmd("verify", cwd=b.root.parent)
    assert p.returncode == 4 and "index" in p.stderr + p.stdout
    assert b.journal.path.read_bytes() == journal
    # a query does not answer from the foreign index: it is rebuilt first
    p = ledger_cmd("query", "SELECT count(*) AS n FROM journal WHERE kind = 'add'", "--json", cwd=b.root.parent)
    assert p.returncode == 0, p.stderr
    assert index.dump(b.root) == truth
    assert ledger_cmd("verify", cwd=b.root.parent).returncode == 0


def test_index_of_another_store_same_history_position_is_rebuilt_by_a_writer(tmp_path):
    a, b = _two_stores(tmp_path)
    shutil.copyfile(a.root / "index.duckdb", b.root / "index.duckdb")
    (b.root.parent / "h").write_text("new")
    assert ledger_cmd("add", "h", cwd=b.root.parent).returncode == 0
    s = Store.open(b.root)
    assert s.index_current()
    got = index.dump(s.root)
    s.rebuild_index()
    assert index.dump(s.root) == got


def test_refs_cache_copied_from_another_store_is_ignored(tmp_path):
    a, b = _two_stores(tmp_path)
    shutil.copyfile(a.root / "refs.json", b.root / "refs.json")
    st = Store.open(b.root).state
    assert st.head == b.journal.records()[-1]["id"]
    # with the store id removed too, the journal's record at its offset still gives it away
    c = json.loads((a.root / "refs.json").read_bytes())
    del c["store"]
    (b.root / "refs.json").write_bytes(canonical.dumps(c))
    st = Store.open(b.root).state
    assert st.head == b.journal.records()[-1]["id"]
