"""Edit, delete, reorder or duplicate a past record: verify names the first broken record and
appends are refused until it is resolved."""

import json

import pytest

from ledger.errors import JournalCorrupt
from ledger.store import Store, canonical
from ledger.store.journal import record_id
from ledger.store.verify import verify
from tests.conftest import ledger_cmd


def _store(tmp_path, n=6):
    s = Store.init(tmp_path)
    for i in range(n):
        with s.transaction("t") as tx:
            tx.payload["i"] = i
    return s


def _lines(s):
    return s.journal.path.read_bytes().splitlines(keepends=True)


def _check_refused(s, seq):
    rep = verify(Store.open(s.root))
    assert not rep.ok
    assert rep.errors[0]["seq"] == seq, rep.errors
    with pytest.raises(JournalCorrupt):
        with Store.open(s.root).transaction("t"):
            pass
    p = ledger_cmd("verify", cwd=s.root.parent)
    assert p.returncode == 4 and f"record {seq}" in p.stdout


def test_edit_payload(tmp_path):
    s = _store(tmp_path)
    lines = _lines(s)
    lines[3] = lines[3].replace(b'"i":2', b'"i":9')
    s.journal.path.write_bytes(b"".join(lines))
    _check_refused(s, 4)


def test_edit_and_rehash_record(tmp_path):
    """A forger who recomputes the edited record's own id still breaks the next link."""
    s = _store(tmp_path)
    lines = _lines(s)
    rec = json.loads(lines[2])
    rec["payload"]["i"] = 42
    rec["id"] = record_id(rec)
    lines[2] = canonical.dumps(rec) + b"\n"
    s.journal.path.write_bytes(b"".join(lines))
    _check_refused(s, 4)


def test_delete_middle(tmp_path):
    s = _store(tmp_path)
    lines = _lines(s)
    del lines[2]
    s.journal.path.write_bytes(b"".join(lines))
    _check_refused(s, 3)


def test_reorder(tmp_path):
    s = _store(tmp_path)
    lines = _lines(s)
    lines[2], lines[3] = lines[3], lines[2]
    s.journal.path.write_bytes(b"".join(lines))
    _check_refused(s, 3)


def test_duplicate(tmp_path):
    s = _store(tmp_path)
    lines = _lines(s)
    lines.insert(3, lines[2])
    s.journal.path.write_bytes(b"".join(lines))
    _check_refused(s, 4)


def test_delete_last_record_detected(tmp_path):
    s = _store(tmp_path)
    lines = _lines(s)
    s.journal.path.write_bytes(b"".join(lines[:-1]))
    rep = verify(Store.open(s.root))
    assert not rep.ok and "removed" in rep.errors[0]["message"]
    with pytest.raises(JournalCorrupt):
        with Store.open(s.root).transaction("t"):
            pass


def test_rewritten_history_detected(tmp_path):
    """Rewriting the whole chain consistently is caught against the last head seen."""
    s = _store(tmp_path, n=3)
    lines = [json.loads(line) for line in _lines(s)]
    prev = None
    out = []
    for rec in lines:
        if rec["seq"] == 2:
            rec["payload"]["i"] = 77
        rec["prev"] = prev
        rec["id"] = record_id(rec)
        prev = rec["id"]
        out.append(canonical.dumps(rec) + b"\n")
    s.journal.path.write_bytes(b"".join(out))
    rep = verify(Store.open(s.root))
    assert not rep.ok and "rewritten" in rep.errors[0]["message"]
    with pytest.raises(JournalCorrupt):
        with Store.open(s.root).transaction("t"):
            pass
