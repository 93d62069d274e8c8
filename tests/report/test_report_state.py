"""Rule 23 (docs/store-format.md): the report's saved state. A report folds only the records
after the state it saved last and gives exactly the model a fold from record 1 gives; a state
of another store, of another history or that does not hash to its digest is not used (the
report says why and folds everything)."""

from __future__ import annotations

import json
import shutil

import pytest

from ledger.report import model as reportmodel
from ledger.store import Store, canonical
from ledger.store.ids import hash_bytes


def _state(root):
    return root / ".ledger" / "cache" / "report.json"


def _fresh(root) -> reportmodel.Report:
    _state(root).unlink(missing_ok=True)
    s = Store.open(root)
    m = reportmodel.gather(s)
    assert not s.warnings
    return m


@pytest.fixture
def demo_copy(demo_store, tmp_path):
    dst = tmp_path / "demo"
    shutil.copytree(demo_store, dst)
    _state(dst).unlink(missing_ok=True)
    return dst


def test_a_report_from_its_saved_state_equals_a_fold_from_record_1(demo_copy):
    """The state saved at every kind of record boundary (inside a cycle, between cycles, right
    after a rollback), then the rest of the journal appended: the incremental model is the
    full one."""
    lines = (demo_copy / ".ledger" / "journal").read_bytes().splitlines(keepends=True)
    want = _fresh(demo_copy)
    kinds = [json.loads(x)["kind"] for x in lines]
    cuts = sorted({1, len(lines) // 3, len(lines) // 2, len(lines) - 1}
                  | {i + 1 for i, k in enumerate(kinds) if k in ("judge", "rollback", "train")})
    journal = demo_copy / ".ledger" / "journal"
    for cut in cuts:
        journal.write_bytes(b"".join(lines[:cut]))
        (demo_copy / ".ledger" / "refs.json").unlink(missing_ok=True)
        s = Store.open(demo_copy)
        s.warnings.clear()
        part = reportmodel.gather(s)                          # folds records 1..cut and saves
        assert part.seq == cut
        with open(journal, "ab") as f:                        # the rest arrives by appends
            f.write(b"".join(lines[cut:]))
        s2 = Store.open(demo_copy)
        got = reportmodel.gather(s2)
        assert not [w for w in s2.warnings if "report" in w], (cut, s2.warnings)
        assert got == want, f"state saved at record {cut} ({kinds[cut - 1]}) gave another model"
        _state(demo_copy).unlink()


def _rewrite_state(root, change) -> None:
    w = json.loads(_state(root).read_bytes())
    change(w)
    _state(root).write_bytes(canonical.dumps(w))


@pytest.mark.parametrize("what,change,why", [
    ("another store's", lambda w: w.update(store="store-" + "0" * 32), "another store"),
    ("edited, digest kept", lambda w: w["fold"].update(turns_total=w["fold"]["turns_total"] + 1), "digest"),
    ("edited, digest recomputed, at a record the journal does not hold there",
     lambda w: (w.update(offset=w["offset"] - 1), w.update(digest=hash_bytes(canonical.dumps(w["fold"])))),
     "no longer holds its record"),
    ("not JSON", None, "unreadable"),
])
def test_a_state_that_is_not_this_journals_is_not_used(demo_copy, what, change, why):
    want = _fresh(demo_copy)
    if change is None:
        _state(demo_copy).write_bytes(b"{not json")
    else:
        _rewrite_state(demo_copy, change)
    s = Store.open(demo_copy)
    got = reportmodel.gather(s)
    assert got == want
    assert any("report's saved state was not used" in w and why in w for w in s.warnings), (what, s.warnings)
