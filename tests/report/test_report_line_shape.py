"""The report's fold takes a turn batch in its kind's usual line shape (records.Record.LINE_SHAPE)
without building its dataclass (ledger/report/model.py, _Fold.add): the fold MUST be the one the
typed read gives (docs/store-format.md rule 23)."""

from __future__ import annotations

import json

from ledger import records
from ledger.records import ABSENT
from ledger.report import model as reportmodel
from ledger.store import Store
from ledger.store import scan as scanner


def _fold(store, with_lines: bool) -> reportmodel._Fold:
    f = reportmodel._Fold()

    def each(rec, line):
        f.add(store, rec, line if with_lines else None)
    with scanner.without_collector():
        store.journal.scan(keep=False, each=each, lines=True)
    return f


def test_the_shaped_fold_equals_the_typed_fold(demo_store):
    s = Store.open(demo_store)
    assert _fold(s, True).to_json() == _fold(s, False).to_json()


def test_a_shaped_batch_line_reads_as_its_typed_payload(demo_store):
    """The premise: every record line the shape matches reads (records.read) to exactly the values
    the fold takes from the payload, with no refs; and the demo has such lines to test."""
    shaped = 0
    for line in (demo_store / ".ledger" / "journal").read_bytes().splitlines():
        rec = json.loads(line)
        batch = records.read_batch_line(rec, line)
        if batch is None:
            continue
        shaped += 1
        p = records.read(rec)
        assert (p.first, p.turns, p.count) == batch
        assert p.refs is ABSENT or not p.refs
    assert shaped > 0
