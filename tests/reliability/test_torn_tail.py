"""Truncate the last record at every byte offset; append garbage."""

from ledger.store import Store
from ledger.store.verify import verify


def _store_with_records(tmp_path, n=3):
    s = Store.init(tmp_path)
    for i in range(n):
        with s.transaction("t") as tx:
            tx.refs[f"name/r{i}"] = tx.put_bytes(f"r{i}".encode())
    return s


def _caches_before_last_record(tmp_path, n=3):
    """A store whose caches are as a crash in the last append leaves them: written for the
    record before (a torn append never reached its cache updates)."""
    s = _store_with_records(tmp_path, n - 1)
    saved = {name: (s.root / name).read_bytes() for name in ("index.duckdb", "refs.json")}
    with s.transaction("t") as tx:
        tx.refs[f"name/r{n - 1}"] = tx.put_bytes(f"r{n - 1}".encode())
    for name, data in saved.items():
        (s.root / name).write_bytes(data)
    return s


def test_truncate_at_every_offset(tmp_path):
    s = _caches_before_last_record(tmp_path)
    data = s.journal.path.read_bytes()
    lines = data.splitlines(keepends=True)
    last_start = len(data) - len(lines[-1])
    prev_state = None
    for cut in range(last_start, len(data)):
        s.journal.path.write_bytes(data[:cut])
        (s.root / "refs.json").unlink(missing_ok=True)
        st = Store.open(s.root).state
        assert st.seq == len(lines) - 1  # opens at the last whole record
        assert "name/r2" not in st.refs  # never replays a partial record
        prev_state = prev_state or st
        assert st == prev_state
        rep = verify(Store.open(s.root))
        assert rep.ok
        if cut > last_start:
            assert any(w["what"] == "journal-tail" for w in rep.warnings)
    # The next writer moves the torn tail aside and appends on a record boundary.
    s.journal.path.write_bytes(data[:last_start + 10])
    (s.root / "refs.json").unlink(missing_ok=True)
    w = Store.open(s.root)
    with w.transaction("after"):
        pass
    assert any("torn" in m for m in w.warnings)
    recs = Store.open(s.root).journal.records()
    assert recs[-1]["kind"] == "after" and recs[-1]["seq"] == len(lines)
    assert verify(Store.open(s.root)).ok
    assert list(s.root.glob("journal.torn-*"))


def test_garbage_appended(tmp_path):
    s = _store_with_records(tmp_path)
    head = s.state.head
    with open(s.journal.path, "ab") as f:
        f.write(b"\x00\xffgarbage{not json}\n")
    st = Store.open(s.root).state
    assert st.head == head
    rep = verify(Store.open(s.root))
    assert rep.ok and rep.warnings
    with Store.open(s.root).transaction("t"):
        pass
    assert verify(Store.open(s.root)).ok


def test_damaged_last_record_is_not_a_torn_tail(tmp_path):
    """With refs.json gone (a cache), an edited last record is still told from a torn append:
    the index says it was committed. verify exits 4 and writers refuse; nothing is dropped."""
    from tests.conftest import ledger_cmd

    s = _store_with_records(tmp_path)
    data = s.journal.path.read_bytes()
    edited = data[:-20] + (b"x" if data[-20:-19] != b"x" else b"y") + data[-19:]
    s.journal.path.write_bytes(edited)
    (s.root / "refs.json").unlink()
    p = ledger_cmd("verify", cwd=tmp_path)
    assert p.returncode == 4 and "committed" in p.stderr + p.stdout, p.stderr
    (tmp_path / "f").write_text("x")
    p = ledger_cmd("add", "f", cwd=tmp_path)
    assert p.returncode == 4, p.stderr
    assert s.journal.path.read_bytes() == edited and not list(s.root.glob("journal.torn-*"))
