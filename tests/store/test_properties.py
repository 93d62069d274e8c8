"""Property tests over the decoders and canonical JSON: only typed ledger errors escape."""

from hypothesis import given, settings
from hypothesis import strategies as st

from ledger.errors import LedgerError
from ledger.store import canonical
from ledger.store.journal import Journal, parse_line

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False) | st.text(),
    lambda children: st.lists(children, max_size=5) | st.dictionaries(st.text(), children, max_size=5),
    max_leaves=30)


@given(json_values)
def test_canonical_roundtrip(v):
    b = canonical.dumps(v)
    assert canonical.dumps(canonical.loads(b, strict=True)) == b


@given(st.dictionaries(st.text(), st.integers(), max_size=8))
def test_canonical_is_order_independent(d):
    rev = dict(reversed(list(d.items())))
    assert canonical.dumps(d) == canonical.dumps(rev)


@given(st.binary(max_size=400))
def test_parse_line_only_typed_errors(b):
    try:
        parse_line(b)
    except LedgerError:
        pass


@given(st.binary(max_size=2000))
@settings(max_examples=100, deadline=None)
def test_journal_scan_any_bytes(tmp_path_factory, b):
    d = tmp_path_factory.mktemp("j")
    (d / "journal").write_bytes(b)
    s = Journal(d).scan()
    assert s.records == [] or all(r["seq"] >= 1 for r in s.records)
    Journal(d).tail(5)
