"""Rule 19 (docs/store-format.md): appends never rehash the journal. refs.json vouches for the
journal's bytes before its offset only while the journal file is exactly the one its last writer
left (device, inode, size, mtime, ctime; racy rule); anything else — truncated, replaced, edited
in place, a cache of another store, a racy cache — is noticed and the whole chain re-checked.
Readers fold from refs.json and write one when there is none."""

import json
import os
import shutil

import pytest

from ledger.errors import JournalCorrupt
from ledger.store import Store, journal
from ledger.store.journal import stat_identity


def _store(tmp_path, n=5):
    s = Store.init(tmp_path)
    for i in range(n):
        with s.transaction("t") as tx:
            tx.payload["i"] = i
    return s


@pytest.fixture
def parsed(monkeypatch):
    """Counts the journal lines parsed (each is one record read and rehashed)."""
    n = {"lines": 0}
    real = journal.parse_line

    def counting(line):
        n["lines"] += 1
        return real(line)
    monkeypatch.setattr(journal, "parse_line", counting)
    return n


def _one_tx(root):
    s = Store.open(root)
    with s.transaction("t") as tx:
        tx.payload["x"] = 1
    return s


def test_commit_records_the_journal_identity(tmp_path):
    s = _store(tmp_path)
    c = json.loads((s.root / "refs.json").read_bytes())
    assert c["journal"] == stat_identity(os.stat(s.journal.path))
    assert c["offset"] == s.journal.path.stat().st_size
    assert "digest" not in c  # nothing hashes the whole journal any more
    assert os.stat(s.root / "refs.json").st_mtime_ns > c["journal"][4]  # not racy


def test_append_reads_only_the_head(tmp_path, parsed):
    s = _store(tmp_path, 30)
    parsed["lines"] = 0
    s2 = _one_tx(s.root)
    # the head at the cached offset, the last line under the journal's lock, the index's tail read
    assert parsed["lines"] <= 4, parsed
    assert not s2.warnings


def test_truncated_journal_is_refused(tmp_path):
    s = _store(tmp_path)
    lines = s.journal.path.read_bytes().splitlines(keepends=True)
    s.journal.path.write_bytes(b"".join(lines[:-2]))
    with pytest.raises(JournalCorrupt, match="records were removed"):
        _one_tx(s.root)


def test_edit_in_place_of_the_same_length_is_noticed(tmp_path):
    """An edit that keeps the size (pwrite over a past record) changes ctime: the cache no
    longer vouches, the chain is re-checked and appends are refused."""
    s = _store(tmp_path)
    data = s.journal.path.read_bytes()
    at = data.index(b'"i":2')
    fd = os.open(s.journal.path, os.O_WRONLY)
    try:
        os.pwrite(fd, b'"i":7', at)
    finally:
        os.close(fd)
    assert s.journal.path.stat().st_size == len(data)
    with pytest.raises(JournalCorrupt, match="appends are refused"):
        _one_tx(s.root)


def test_journal_replaced_by_a_copy_is_rechecked(tmp_path, parsed):
    """The same bytes under another inode (restored from a backup): re-checked, then trusted."""
    s = _store(tmp_path, 8)
    copy = s.root / "journal.copy"
    shutil.copyfile(s.journal.path, copy)
    os.replace(copy, s.journal.path)
    parsed["lines"] = 0
    s2 = _one_tx(s.root)
    assert parsed["lines"] >= 9  # the whole chain
    assert any("re-checked the whole chain" in w for w in s2.warnings)
    parsed["lines"] = 0
    s3 = _one_tx(s.root)
    assert parsed["lines"] <= 4 and not s3.warnings


def test_cache_of_another_store_is_not_used(tmp_path):
    a = _store(tmp_path / "a", 6)
    b = _store(tmp_path / "b", 2)
    shutil.copyfile(a.root / "refs.json", b.root / "refs.json")
    s = _one_tx(b.root)
    recs = s.journal.records()
    assert [r["seq"] for r in recs] == list(range(1, 5)) and s.state.head == recs[-1]["id"]


def test_racy_cache_is_rechecked(tmp_path, parsed):
    """refs.json written within the journal's last timestamp tick vouches for nothing."""
    s = _store(tmp_path)
    c = json.loads((s.root / "refs.json").read_bytes())
    ctime = c["journal"][4]
    os.utime(s.root / "refs.json", ns=(ctime, ctime))
    parsed["lines"] = 0
    s2 = _one_tx(s.root)
    assert parsed["lines"] >= 6 and any("re-checked" in w for w in s2.warnings)


def test_crash_between_commit_and_cache_is_rechecked_once(tmp_path, parsed):
    """A writer that died after its append left refs.json one record behind: the next writer
    re-checks the chain and appends after the record the dead one committed."""
    s = _store(tmp_path)
    stale = (s.root / "refs.json").read_bytes()
    s = _one_tx(s.root)
    head = s.state.head
    (s.root / "refs.json").write_bytes(stale)
    s2 = _one_tx(s.root)
    assert s2.journal.records()[-1]["prev"] == head


def test_reader_writes_the_missing_cache(tmp_path, parsed):
    s = _store(tmp_path, 20)
    (s.root / "refs.json").unlink()
    parsed["lines"] = 0
    st = Store.open(s.root).state
    assert parsed["lines"] >= 21
    c = json.loads((s.root / "refs.json").read_bytes())
    assert (c["seq"], c["head"]) == (st.seq, st.head)
    assert c["journal"] == stat_identity(os.stat(s.journal.path))
    parsed["lines"] = 0
    assert Store.open(s.root).state == st
    assert parsed["lines"] <= 1  # the head at refs.json's offset
    # and the writer trusts what the reader wrote
    parsed["lines"] = 0
    assert not _one_tx(s.root).warnings and parsed["lines"] <= 4


def test_reader_leaves_no_partial_cache(tmp_path, monkeypatch):
    """A reader that cannot write refs.json leaves none (not a half-written one) and still reads."""
    s = _store(tmp_path)
    (s.root / "refs.json").unlink()

    def fail(*a, **k):
        raise OSError(28, "No space left on device")
    monkeypatch.setattr("ledger.store.fsio.write_all", fail)
    st = Store.open(s.root).state
    assert st.seq == 6 and not (s.root / "refs.json").exists()
    assert not list((s.root / "tmp").iterdir())


def test_reader_does_not_vouch_for_an_append_it_did_not_read(tmp_path, monkeypatch):
    """The identity a reader records is the one taken before its fold, and only if the fold
    reached that size: a commit during the fold leaves a cache that does not vouch."""
    s = _store(tmp_path)
    (s.root / "refs.json").unlink()
    r = Store.open(s.root)
    real = r.journal.identity
    calls = {"n": 0}

    def identity_then_commit():
        ident = real()
        if calls["n"] == 0:
            calls["n"] += 1
            _one_tx(s.root)   # another process commits right after the reader looked
            os.unlink(s.root / "refs.json")
        return ident
    monkeypatch.setattr(r.journal, "identity", identity_then_commit)
    r.state
    c = json.loads((s.root / "refs.json").read_bytes())
    assert c["seq"] == 7  # it folded what it read, including the new record
    assert c.get("journal") is None  # but vouches for nothing: the file grew after it looked


def test_store_from_before_rule_19_migrates_on_its_next_write(tmp_path, parsed):
    """A refs.json of the previous layout (a prefix digest, no journal identity) vouches for
    nothing: the first writer re-checks the chain once and writes one that vouches."""
    s = _store(tmp_path, 10)
    c = json.loads((s.root / "refs.json").read_bytes())
    del c["journal"]
    c["digest"] = "b3:" + "0" * 64
    (s.root / "refs.json").write_bytes(json.dumps(c).encode())
    parsed["lines"] = 0
    s2 = _one_tx(s.root)
    assert parsed["lines"] >= 11 and any("re-checked" in w for w in s2.warnings)
    c = json.loads((s.root / "refs.json").read_bytes())
    assert "digest" not in c and c["journal"] == stat_identity(os.stat(s.journal.path))
    parsed["lines"] = 0
    assert not _one_tx(s.root).warnings and parsed["lines"] <= 4


def test_reader_moves_a_far_behind_cache_to_the_head(tmp_path, monkeypatch, parsed):
    """Records appended by something that wrote no cache: the first reader folds them and moves
    refs.json to the head (vouching for nothing), so the next read is cheap."""
    monkeypatch.setattr("ledger.store.repo.READER_CACHE_GAP", 5)
    s = _store(tmp_path, 2)
    behind = (s.root / "refs.json").read_bytes()
    s = _store_more(s, 8)
    (s.root / "refs.json").write_bytes(behind)
    st = Store.open(s.root).state
    c = json.loads((s.root / "refs.json").read_bytes())
    assert (c["seq"], c["head"]) == (st.seq, st.head) and "journal" not in c
    parsed["lines"] = 0
    assert Store.open(s.root).state == st and parsed["lines"] <= 1
    w = _one_tx(s.root)  # the writer re-checks once (nothing vouched), then it vouches again
    assert any("re-checked" in x for x in w.warnings)


def _store_more(s, n):
    for i in range(n):
        with Store.open(s.root).transaction("t") as tx:
            tx.payload["more"] = i
    return s
