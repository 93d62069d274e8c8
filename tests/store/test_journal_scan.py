"""The journal is read a block at a time (bounded memory): records, the end offset, a torn tail
and a broken chain come out the same whatever the block size, including blocks smaller than a
record and boundaries inside a line."""

import pytest

from ledger.errors import JournalCorrupt
from ledger.store import Store, journal


def _store(tmp_path, n=12):
    s = Store.init(tmp_path)
    for i in range(n):
        with s.transaction("t") as tx:
            tx.payload["i"] = "x" * (i * 37)
    return s


def _scan(s, block, monkeypatch, **kw):
    monkeypatch.setattr(journal, "SCAN_BLOCK", block)
    got = []
    sc = s.journal.scan(keep=False, each=got.append, **kw)
    return got, sc


@pytest.mark.parametrize("block", [1, 7, 100, 1000, 1 << 20])
def test_any_block_size_reads_the_same(tmp_path, monkeypatch, block):
    s = _store(tmp_path)
    want = [journal.parse_line(x) for x in s.journal.path.read_bytes().splitlines()]
    got, sc = _scan(s, block, monkeypatch)
    assert got == want and sc.end == s.journal.path.stat().st_size and not sc.torn
    assert (sc.last_seq, sc.last_id) == (want[-1]["seq"], want[-1]["id"])
    monkeypatch.setattr(journal, "SCAN_BLOCK", block)
    assert list(s.journal.stream()) == want


@pytest.mark.parametrize("block", [1, 50, 1 << 20])
def test_torn_tail_and_broken_chain_whatever_the_block(tmp_path, monkeypatch, block):
    s = _store(tmp_path)
    data = s.journal.path.read_bytes()
    s.journal.path.write_bytes(data + b'{"seq":14,"half')
    got, sc = _scan(s, block, monkeypatch)
    assert len(got) == 13 and sc.torn == b'{"seq":14,"half' and sc.broken_at is None and sc.end == len(data)
    lines = data.splitlines(keepends=True)
    lines[4] = lines[4].replace(b'"i":"xxx', b'"i":"yyy')
    s.journal.path.write_bytes(b"".join(lines))
    got, sc = _scan(s, block, monkeypatch)
    assert len(got) == 4 and sc.broken_at == 5 and sc.end == sum(map(len, lines[:4]))
    with pytest.raises(JournalCorrupt, match="broken at record 5"):
        list(s.journal.stream())


def test_scan_from_an_offset_continues_the_chain(tmp_path):
    s = _store(tmp_path)
    recs = s.journal.records()
    lines = s.journal.path.read_bytes().splitlines(keepends=True)
    off = sum(map(len, lines[:6]))
    sc = s.journal.scan(off, 7, recs[5]["id"])
    assert sc.records == recs[6:]
    assert s.journal.record_before(off) == recs[5]
    assert s.journal.scan(off, 7, recs[4]["id"]).broken_at == 7  # the wrong predecessor
