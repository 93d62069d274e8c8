"""Rule 20's index identity (docs/store-format.md): a clean verify records which index file it
read (`[dev, inode, size, mtime_ns, ctime_ns]` of index.duckdb and of its WAL), the meta it read
and whether the row checks ran; the next verify takes those answers instead of opening DuckDB only
while index.duckdb is still that very file. An index changed, replaced or rebuilt after the
watermark is read again; a racy one (changed within RACY_NS of the look) is not vouched for;
`--full` always reads it. And verify imports numpy only once it holds _SET_MAX ids: neither
shortcut changes an answer."""

import json
import os
import random
import subprocess
import sys
import time

import duckdb
import pytest

from ledger.store import Store
from ledger.store import verify as V
from tests.conftest import ledger_cmd
from tests.store.test_append_cache import _store  # a store of n small transactions

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
MARGIN = 0.05   # the racy margin these tests use (the real one, 2 s, would make every test wait)


@pytest.fixture
def short_racy(monkeypatch):
    monkeypatch.setattr(V, "RACY_NS", int(MARGIN * 1e9))


def _settle():
    time.sleep(MARGIN * 1.5)   # the index's last change is now older than the racy margin


def _append(s, n=1):
    for i in range(n):
        with Store.open(s.root).transaction("t") as tx:
            tx.payload["j"] = i


def _watermark(s):
    return json.loads(s.root.joinpath(*V.WATERMARK).read_bytes())


def _no_index_reads(monkeypatch):
    """Any read of index.duckdb fails the test (the answers must come from the watermark)."""
    def refuse(*a, **k):
        raise AssertionError("the index was opened")
    for name in ("indexed_meta", "journal_row_counts", "sparse_rows_problem"):
        monkeypatch.setattr(V.index, name, refuse)


def _answers(rep) -> dict:
    j = rep.to_json()
    j["stats"] = {k: v for k, v in j["stats"].items() if k != "index"}
    return j


def test_an_unchanged_index_is_not_opened_again_and_gives_the_same_answers(tmp_path, short_racy, monkeypatch):
    s = _store(tmp_path)
    _settle()
    first = V.verify(Store.open(s.root), read_data=True)
    assert first.ok and first.stats["index"] == "read"
    entry = _watermark(s)["index"]
    assert entry["checks"] == "rows" and entry["meta"]["seq"] == 6 and entry["meta"]["head"] == s.state.head
    assert entry["identity"][0] == V._identity_of(s.root / "index.duckdb")
    with monkeypatch.context() as m:
        _no_index_reads(m)
        again = V.verify(Store.open(s.root), read_data=True)
        assert again.stats["index"] == "unchanged" and _answers(again) == _answers(first)
        inc = V.verify(Store.open(s.root))             # the incremental verify takes it too
        assert inc.ok and inc.stats["index"] == "unchanged"
        full = None
        with pytest.raises(AssertionError, match="opened"):
            full = V.verify(Store.open(s.root), full=True)   # --full trusts no cache
    assert full is None
    assert _watermark(s)["index"] == entry               # carried forward while the file is the same
    full = V.verify(Store.open(s.root), full=True)
    assert full.stats["index"] == "read" and _answers(full) == _answers(first)


def test_an_index_changed_after_the_watermark_is_read_again(tmp_path, short_racy):
    s = _store(tmp_path)
    _settle()
    assert V.verify(Store.open(s.root), read_data=True).stats["index"] == "read"
    old = _watermark(s)["index"]["identity"]
    _append(s)                                            # a commit syncs the index in place
    assert V._IndexSeen.take(s.root).identity != old
    rep = V.verify(Store.open(s.root), read_data=True)
    assert rep.ok and rep.stats["index"] == "read"


def test_a_replaced_or_rebuilt_index_is_read_again(tmp_path, short_racy):
    s = _store(tmp_path)
    other = _store(tmp_path / "other")                    # another store, the same number of records
    _settle()
    assert V.verify(Store.open(s.root), read_data=True).ok
    Store.open(s.root).rebuild_index()                    # a new file renamed into place
    _settle()
    rep = V.verify(Store.open(s.root), read_data=True)
    assert rep.ok and rep.stats["index"] == "read"
    assert V.verify(Store.open(s.root), read_data=True).stats["index"] == "unchanged"
    idx = s.root / "index.duckdb"
    data = (other.root / "index.duckdb").read_bytes()
    idx.unlink()
    idx.write_bytes(data)                                 # another store's index copied in
    rep = V.verify(Store.open(s.root), read_data=True)
    assert rep.stats["index"] == "read"
    assert any(e["what"] == "index" and "another store" in e["message"] for e in rep.errors), rep.errors


def test_a_row_deleted_after_the_watermark_is_found_by_read_data(tmp_path, short_racy):
    s = _store(tmp_path)
    _settle()
    assert V.verify(Store.open(s.root), read_data=True).stats["index"] == "read"
    con = duckdb.connect(str(s.root / "index.duckdb"))
    con.execute("DELETE FROM journal WHERE seq = 3")
    con.close()
    rep = V.verify(Store.open(s.root), read_data=True)
    assert rep.stats["index"] == "read"
    assert any(e["what"] == "index" and "rows" in e["message"] for e in rep.errors), rep.errors
    assert "index" not in _watermark(s) or _watermark(s)["index"]["identity"] != \
        V._IndexSeen.take(s.root).identity            # (no clean verify: the old watermark stays)


def test_an_incremental_verify_does_not_vouch_for_the_row_checks(tmp_path, short_racy, monkeypatch):
    s = _store(tmp_path)
    assert V.verify(Store.open(s.root)).ok                # full (first), while the index is racy
    assert "index" not in _watermark(s)
    _settle()
    _append(s, 0)
    rep = V.verify(Store.open(s.root))                    # incremental: reads meta, no row checks
    assert rep.stats["mode"] == "incremental" and _watermark(s)["index"]["checks"] == "meta"
    with monkeypatch.context() as m:
        _no_index_reads(m)
        assert V.verify(Store.open(s.root)).stats["index"] == "unchanged"
    rep = V.verify(Store.open(s.root), read_data=True)    # the row checks never ran on this file
    assert rep.ok and rep.stats["index"] == "read" and _watermark(s)["index"]["checks"] == "rows"


def test_a_racy_index_is_not_vouched_for(tmp_path):
    s = _store(tmp_path)                                  # the real margin: just written, so racy
    rep = V.verify(Store.open(s.root), read_data=True)
    assert rep.ok and rep.stats["index"] == "read" and "index" not in _watermark(s)
    assert V._IndexSeen.take(s.root).racy


def test_an_index_with_a_wal_beside_it_or_of_another_ledger_is_read_again(tmp_path, short_racy):
    s = _store(tmp_path)
    _settle()
    assert V.verify(Store.open(s.root), read_data=True).ok
    w = _watermark(s)
    w["index"]["code"] = [w["index"]["code"][0] - 1, w["index"]["code"][1]]   # another INDEX_VERSION's
    s.root.joinpath(*V.WATERMARK).write_text(json.dumps(w))
    assert V.verify(Store.open(s.root), read_data=True).stats["index"] == "read"
    _settle()
    assert V.verify(Store.open(s.root), read_data=True).stats["index"] == "unchanged"
    before = V._IndexSeen.take(s.root).identity
    (s.root / "index.duckdb.wal").write_bytes(b"")         # what DuckDB reads with the file is part of it
    assert V._IndexSeen.take(s.root).identity != before
    assert V.verify(Store.open(s.root), read_data=True).stats["index"] == "read"


def test_a_forged_identity_hides_no_more_than_a_forged_watermark(tmp_path, short_racy):
    """What the identity does not catch, as rule 20 says: a forger who deletes an index row and then
    writes the changed file's identity into the watermark (which anyone who can write cache/ can)
    makes a verify without --full skip the row checks, as a forged watermark makes it skip records;
    `verify --full` reads the index and finds the row."""
    s = _store(tmp_path)
    _settle()
    assert V.verify(Store.open(s.root), read_data=True).ok
    con = duckdb.connect(str(s.root / "index.duckdb"))
    con.execute("DELETE FROM journal WHERE seq = 3")
    con.close()
    w = _watermark(s)
    w["index"]["identity"] = V._IndexSeen.take(s.root).identity
    s.root.joinpath(*V.WATERMARK).write_text(json.dumps(w))
    assert V.verify(Store.open(s.root), read_data=True).ok            # the forged claim is believed
    rep = V.verify(Store.open(s.root), full=True)
    assert any(e["what"] == "index" and "rows" in e["message"] for e in rep.errors), rep.errors


@pytest.mark.parametrize("bad", [None, [], [[1, 2, 3]], "x", {"seq": "6"}])
def test_a_malformed_index_entry_is_not_used(tmp_path, short_racy, bad):
    s = _store(tmp_path)
    _settle()
    assert V.verify(Store.open(s.root), read_data=True).ok
    w = _watermark(s)
    if isinstance(bad, dict):
        w["index"]["meta"].update(bad)
    else:
        w["index"]["identity" if bad != "x" else "checks"] = bad
    s.root.joinpath(*V.WATERMARK).write_text(json.dumps(w))
    rep = V.verify(Store.open(s.root), read_data=True)
    assert rep.ok and rep.stats["index"] == "read"


# --- the ids already checked: a set, then numpy runs -----------------------------------------------

def test_seen_answers_as_a_set_across_its_growth(monkeypatch):
    monkeypatch.setattr(V, "_SET_MAX", 50)
    monkeypatch.setattr(V, "_RUN_MAX", 64)
    rnd = random.Random(18)
    seen, truth = V._Seen(), set()
    for step in range(40):
        probe = [rnd.randrange(-2**63, 2**63) for _ in range(20)] + rnd.sample(sorted(truth), min(20, len(truth)))
        assert list(seen.contains(probe)) == [k in truth for k in probe], step
        assert seen.contains_all(probe) == all(k in truth for k in probe)
        new = {rnd.randrange(-2**63, 2**63) for _ in range(rnd.choice((1, 7, 30)))} - truth
        seen.add(new)
        truth |= new
    assert seen.small is None and len(seen.runs) > 1       # grew past the set into several runs


_PROBE = """
import sys
from ledger.store import verify as V
V.RACY_NS = {racy}
V._SET_MAX = {set_max}
from ledger.cli import main
sys.argv = ["ledger", "verify", "--read-data"]
try:
    main.main()
except SystemExit as e:
    assert not e.code, e.code
print("MODULES", "numpy" in sys.modules, "duckdb" in sys.modules, file=sys.stderr)
"""


def _probe(root, set_max=4096):
    env = {**os.environ, "PYTHONPATH": ROOT}
    r = subprocess.run([sys.executable, "-c", _PROBE.format(racy=int(MARGIN * 1e9), set_max=set_max)],
                       cwd=root, env=env, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    line = [ln for ln in r.stderr.splitlines() if ln.startswith("MODULES")][-1]
    return r.stdout, line.split()[1:] == ["True", "True"], line.split()[1:]


def test_a_small_stores_read_data_verify_imports_neither_numpy_nor_duckdb(tmp_path):
    _store(tmp_path, n=3)
    for i in range(3):
        (tmp_path / f"f{i}.bin").write_bytes(os.urandom(5000))
        ledger_cmd("add", str(tmp_path / f"f{i}.bin"), cwd=tmp_path, check=True)
    _settle()
    out1, _, mods1 = _probe(tmp_path)                     # reads the index (DuckDB), records its identity
    assert mods1 == ["False", "True"], mods1
    out2, _, mods2 = _probe(tmp_path)
    assert mods2 == ["False", "False"], mods2             # numpy: fewer than _SET_MAX ids; DuckDB: unchanged
    assert out1 == out2 and out1.startswith("clean:"), (out1, out2)
    out3, _, mods3 = _probe(tmp_path, set_max=2)          # more ids than the set holds: numpy, same answer
    assert mods3 == ["True", "False"] and out3 == out1, (mods3, out3)
