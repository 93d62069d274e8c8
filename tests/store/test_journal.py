import pytest

from ledger.errors import BadInput, JournalCorrupt, Locked
from ledger.store import Store
from ledger.store.journal import parse_line


def test_records_chain(store):
    for i in range(3):
        with store.transaction("t") as tx:
            tx.payload["i"] = i
    recs = store.journal.records()
    assert [r["seq"] for r in recs] == [1, 2, 3, 4]
    assert recs[0]["prev"] is None
    for a, b in zip(recs, recs[1:]):
        assert b["prev"] == a["id"]
    assert store.journal.tail(2) == recs[-2:]
    assert Store.open(store.root).state.head == recs[-1]["id"]


def test_exception_in_transaction_appends_nothing(store):
    head = store.state.head
    with pytest.raises(RuntimeError):
        with store.transaction("t") as tx:
            tx.put_bytes(b"orphan")
            raise RuntimeError("boom")
    assert Store.open(store.root).state.head == head
    assert not store.lock.path.exists()


def test_refs_fold_and_delete(store):
    with store.transaction("t") as tx:
        a = tx.put_bytes(b"a")
        tx.refs["name/a"] = a
    with store.transaction("t") as tx:
        tx.refs["name/a"] = None
    assert "name/a" not in Store.open(store.root).state.refs


def test_bad_ref_names_rejected(store):
    with pytest.raises(BadInput):
        with store.transaction("t") as tx:
            tx.refs["has space"] = None
    with pytest.raises(Exception):
        with store.transaction("t") as tx:
            tx.refs["x"] = "b3:" + "0" * 64  # not in the store
    assert store.state.seq == 1


def test_parse_line_rejects_wrong_id(store):
    line = store.journal.path.read_bytes().splitlines()[0]
    assert parse_line(line)["seq"] == 1
    with pytest.raises(BadInput):
        parse_line(line.replace(b'"init"', b'"init2"'))


def test_lock_is_exclusive(store):
    store.lock.acquire()
    try:
        other = Store.open(store.root)
        with pytest.raises(Locked) as e:
            with other.transaction("t"):
                pass
        assert e.value.exit_code == 5
    finally:
        store.lock.release()
    with Store.open(store.root).transaction("t"):
        pass


def test_refs_cache_is_rebuildable(store):
    with store.transaction("t") as tx:
        tx.refs["name/x"] = tx.put_bytes(b"x")
    before = Store.open(store.root).state
    (store.root / "refs.json").unlink()
    assert Store.open(store.root).state == before
    (store.root / "refs.json").write_text("{garbage")
    assert Store.open(store.root).state == before
    with Store.open(store.root).transaction("t"):
        pass
    assert Store.open(store.root).state.refs == before.refs


def test_unknown_format_refused(store):
    from ledger.errors import UnsupportedFormat

    (store.root / "config").write_text('{"format":99}')
    with pytest.raises(UnsupportedFormat):
        Store.open(store.root)


def test_transaction_sees_other_writers_commits(store):
    """No lost update: a Store object that folded its state earlier must append to the
    current head, and code inside the transaction must read current refs."""
    stale = Store.open(store.root)
    assert stale.state.seq == 1
    with Store.open(store.root).transaction("t") as tx:
        tx.refs["name/a"] = tx.put_bytes(b"a")
    with stale.transaction("t") as tx:
        assert "name/a" in stale.state.refs
        tx.payload["saw"] = stale.state.seq
    recs = Store.open(store.root).journal.records()
    assert recs[-1]["payload"]["saw"] == 2 and recs[-1]["seq"] == 3


def _many(store, n):
    for i in range(n):
        with store.transaction("t") as tx:
            tx.payload["note"] = "x" * 100 + str(i)  # ~400 bytes a record: n records span blocks
    return store.journal.records()


def test_backwards_reads_newest_first_across_blocks_and_skips_a_torn_tail(store):
    recs = _many(store, 400)  # > 64 KiB: the first block ends inside a record
    assert list(store.journal.backwards()) == recs[::-1]
    assert store.journal.tail(3) == recs[-3:] and store.journal.tail(10_000) == recs
    with open(store.journal.path, "ab") as f:
        f.write(b'{"seq": 402, "torn')
    assert next(store.journal.backwards()) == recs[-1]
    assert store.journal.tail(1) == recs[-1:]


def test_backwards_stops_at_damage_it_walks_over(store):
    """A search from the end that reaches a damaged or unlinked record raises (a strict
    reader); `tail` (for `log`) returns the whole records after the damage."""
    _many(store, 6)
    data = store.journal.path.read_bytes()
    lines = data.split(b"\n")
    lines[3] = lines[3].replace(b'"note":"x', b'"note":"y', 1)  # record 4 no longer hashes to its id
    store.journal.path.write_bytes(b"\n".join(lines))
    walked = []
    with pytest.raises(JournalCorrupt, match="before record 5"):
        for r in store.journal.backwards():
            walked.append(r["seq"])
    assert walked == [7, 6, 5]
    assert [r["seq"] for r in store.journal.tail(5)] == [5, 6, 7]
    del lines[3]  # a deleted record: every line parses, the chain does not link
    store.journal.path.write_bytes(b"\n".join(lines))
    with pytest.raises(JournalCorrupt, match="chain is broken before record 5"):
        list(store.journal.backwards())
