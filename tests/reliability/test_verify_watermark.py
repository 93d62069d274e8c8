"""Rule 20 (docs/store-format.md): verify is incremental from the watermark of the last clean
verify; `--full` checks everything. A watermark that does not match the journal is not used (and
verify says so); tampering after the watermark is found by either; tampering before it is found
by --full, and by the incremental verify too whenever refs.json shows the journal file changed
other than by an append."""

import json
import os
import tracemalloc

from ledger.store import Store, canonical
from ledger.store.journal import record_id
from ledger.store.verify import WATERMARK, verify
from tests.conftest import ledger_cmd


def _store(tmp_path, n=6):
    s = Store.init(tmp_path)
    for i in range(n):
        with s.transaction("t") as tx:
            tx.payload["i"] = i
    return s


def _append(s, n):
    for i in range(n):
        with Store.open(s.root).transaction("t") as tx:
            tx.payload["j"] = i


def _watermark(s):
    return json.loads(s.root.joinpath(*WATERMARK).read_bytes())


def _edit_in_place(s, old: bytes, new: bytes):
    """Rewrite a past record's payload (same length) and rehash it, as a forger would."""
    data = s.journal.path.read_bytes()
    lines = data.splitlines(keepends=True)
    k = next(i for i, ln in enumerate(lines) if old in ln)
    rec = json.loads(lines[k])
    rec["payload"] = json.loads(canonical.dumps(rec["payload"]).replace(old, new))
    rec["id"] = record_id(rec)
    lines[k] = canonical.dumps(rec) + b"\n"
    s.journal.path.write_bytes(b"".join(lines))
    return rec["seq"]


def test_first_verify_is_full_and_records_a_watermark(tmp_path):
    s = _store(tmp_path)
    rep = verify(Store.open(s.root))
    assert rep.ok and rep.stats["mode"] == "full" and rep.stats["checked"] == 7
    w = _watermark(s)
    assert (w["seq"], w["id"], w["offset"]) == (7, s.state.head, s.journal.path.stat().st_size)
    assert w["store"] == s.store_id and w["state_digest"].startswith("b3:")


def test_incremental_checks_only_the_records_after_the_watermark(tmp_path):
    s = _store(tmp_path)
    assert verify(Store.open(s.root)).ok
    _append(s, 3)
    rep = verify(Store.open(s.root))
    assert rep.ok and rep.stats["mode"] == "incremental"
    assert rep.stats["from_seq"] == 7 and rep.stats["checked"] == 3 and rep.stats["records"] == 10
    assert _watermark(s)["seq"] == 10
    full = verify(Store.open(s.root), full=True)
    assert full.ok and full.stats["mode"] == "full" and full.stats["checked"] == 10


def test_tamper_after_the_watermark_is_found_incrementally(tmp_path):
    s = _store(tmp_path)
    assert verify(Store.open(s.root)).ok
    _append(s, 4)
    (s.root / "refs.json").unlink()  # no other evidence: the incremental check itself finds it
    seq = _edit_in_place(s, b'"j":1', b'"j":8')
    assert seq == 9
    rep = verify(Store.open(s.root))
    assert rep.stats["mode"] == "incremental" and not rep.ok
    assert rep.errors[0]["seq"] == 10  # the record after the rehashed one no longer names it
    assert _watermark(s)["seq"] == 7  # a verify that found faults does not move the watermark


def test_tamper_before_the_watermark_is_found_by_full(tmp_path):
    """The documented limit: without refs.json's evidence, incremental does not re-read records
    before the watermark; --full does."""
    s = _store(tmp_path)
    assert verify(Store.open(s.root)).ok
    (s.root / "refs.json").unlink()
    _edit_in_place(s, b'"i":3', b'"i":1')  # record 5; the watermark is record 7
    rep = verify(Store.open(s.root))
    # record 6 no longer chains to the rewritten record 5, but the watermark's own bytes and id
    # are unchanged: the incremental check is clean
    assert rep.ok and rep.stats["mode"] == "incremental" and rep.stats["checked"] == 0
    full = verify(Store.open(s.root), full=True)
    assert not full.ok and full.errors[0]["seq"] == 6
    p = ledger_cmd("verify", "--full", cwd=s.root.parent)
    assert p.returncode == 4 and "record 6" in p.stdout


def test_tamper_before_the_watermark_is_found_when_refs_json_shows_it(tmp_path):
    """refs.json at the journal's end, but the file is no longer the one its last writer left:
    the incremental verify says so and checks everything."""
    s = _store(tmp_path)
    assert verify(Store.open(s.root)).ok
    _edit_in_place(s, b'"i":3', b'"i":1')
    rep = verify(Store.open(s.root))
    assert rep.stats["mode"] == "full" and not rep.ok and rep.errors[0]["seq"] == 6
    assert any("changed since its last commit" in w["message"] for w in rep.warnings)


def test_watermark_record_replaced_is_not_used(tmp_path):
    s = _store(tmp_path)
    assert verify(Store.open(s.root)).ok
    _edit_in_place(s, b'"i":5', b'"i":9')  # the watermark's own record (7) rewritten
    (s.root / "refs.json").unlink()
    rep = verify(Store.open(s.root))
    assert rep.stats["mode"] == "full"
    assert any("no longer holds its record 7" in w["message"] for w in rep.warnings)
    # a consistent rewrite of the last record: the chain holds; the index still has the old one
    assert [e["what"] for e in rep.errors] == ["index"]


def test_watermark_of_another_store_or_damaged_is_not_used(tmp_path):
    a = _store(tmp_path / "a")
    b = _store(tmp_path / "b")
    assert verify(Store.open(a.root)).ok
    b.root.joinpath(*WATERMARK).write_bytes(a.root.joinpath(*WATERMARK).read_bytes())
    rep = verify(Store.open(b.root))
    assert rep.stats["mode"] == "full" and any("another store" in w["message"] for w in rep.warnings)
    assert rep.ok
    w = _watermark(b)
    w["state"]["counters"]["forged"] = 1
    b.root.joinpath(*WATERMARK).write_bytes(canonical.dumps(w))
    rep = verify(Store.open(b.root))
    assert rep.stats["mode"] == "full" and any("digest" in w["message"] for w in rep.warnings)
    b.root.joinpath(*WATERMARK).write_bytes(b"{not json")
    rep = verify(Store.open(b.root))
    assert rep.stats["mode"] == "full" and any("unreadable" in w["message"] for w in rep.warnings)


def test_truncated_below_the_watermark_is_an_error(tmp_path):
    s = _store(tmp_path)
    assert verify(Store.open(s.root)).ok
    lines = s.journal.path.read_bytes().splitlines(keepends=True)
    s.journal.path.write_bytes(b"".join(lines[:-2]))
    rep = verify(Store.open(s.root))
    assert rep.stats["mode"] == "full" and not rep.ok
    assert "records were removed" in rep.errors[0]["message"]


def test_incremental_finds_missing_objects_of_new_records(tmp_path):
    s = _store(tmp_path)
    assert verify(Store.open(s.root)).ok
    with Store.open(s.root).transaction("t") as tx:
        oid = tx.put_bytes(b"new object")
        tx.outputs.append(oid)
    os.chmod(s.object_path(oid), 0o644)
    os.unlink(s.object_path(oid))
    rep = verify(Store.open(s.root))
    assert rep.stats["mode"] == "incremental" and not rep.ok
    assert any(e["what"] == "missing" and e["id"] == oid for e in rep.errors)


def test_cli_says_which_mode(tmp_path):
    s = _store(tmp_path)
    p = ledger_cmd("verify", cwd=s.root.parent)
    assert p.returncode == 0 and "7 records" in p.stdout
    _append(s, 2)
    p = ledger_cmd("verify", cwd=s.root.parent)
    assert p.returncode == 0 and "incremental" in p.stdout and "2 of them new" in p.stdout
    p = ledger_cmd("verify", "--full", "--json", cwd=s.root.parent)
    assert p.returncode == 0 and json.loads(p.stdout)["stats"]["mode"] == "full"


def _peak_verify(root):
    tracemalloc.start()
    rep = verify(Store.open(root), full=True)
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert rep.ok
    return peak


def test_full_verify_memory_does_not_grow_with_records(tmp_path, monkeypatch):
    """Streaming: 20x the records, the same distinct objects, about the same peak memory (the
    scan's read block made small, so both journals are many blocks long)."""
    from benchmarks.synth_journal import build
    monkeypatch.setattr("ledger.store.journal.SCAN_BLOCK", 64 << 10)
    small, big = build(tmp_path / "small", 500, pool=20), build(tmp_path / "big", 10_000, pool=20)
    p_small, p_big = _peak_verify(small), _peak_verify(big)
    assert p_big < p_small + (1 << 20), (p_small, p_big)
