"""The strict canonical check's orjson path (canonical._fast_strict) and the journal scanner's
line check (store/scan.py): the fast path never accepts what Python's encoder, the definition,
would refuse, and never refuses what it accepts (docs/store-format.md, "Canonical lines")."""

from __future__ import annotations

import json
import math
import random

import orjson
import pytest
from blake3 import blake3
from hypothesis import given, settings
from hypothesis import strategies as st

from ledger.errors import BadInput
from ledger.store import canonical, scan
from ledger.store.journal import make_record

_PY = json.JSONEncoder(sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False)


def _reference(data: bytes):
    """Python's answer alone (a str input never takes the orjson path): value, or the BadInput."""
    try:
        return ("ok", canonical.loads(data.decode("utf-8"), strict=True))
    except (BadInput, UnicodeDecodeError) as e:
        return ("refused", type(e).__name__)


def _answer(data: bytes):
    try:
        return ("ok", canonical.loads(data, strict=True))
    except BadInput as e:
        return ("refused", "BadInput" if isinstance(e, BadInput) else type(e).__name__)


def _same(data: bytes) -> None:
    a, r = _answer(data), _reference(data)
    assert a[0] == r[0], (data, a, r)
    if a[0] == "ok":
        # same value and same types (1 and 1.0 are equal in Python but not the same JSON)
        assert _PY.encode(a[1]) == _PY.encode(r[1]), data


def test_every_code_point_is_encoded_as_pythons_encoder_does():
    # what _fast_strict relies on: orjson writes every string as Python's encoder does
    cps = [c for c in range(0x110000) if not 0xD800 <= c <= 0xDFFF]
    for i in range(0, len(cps), 4096):
        s = "".join(map(chr, cps[i:i + 4096]))
        assert orjson.dumps(s) == _PY.encode(s).encode(), hex(cps[i])
        for c in cps[i:i + 64]:  # control characters, escapes, one at a time at each block's start
            assert orjson.dumps(chr(c)) == _PY.encode(chr(c)).encode(), hex(c)
    for c in range(0x20):
        assert orjson.dumps(chr(c)) == _PY.encode(chr(c)).encode(), hex(c)


def test_floats_of_every_magnitude_are_accepted_only_in_pythons_form():
    rnd = random.Random(18)
    seen_orjson_only = 0
    for _ in range(200_000):
        e = rnd.randint(-325, 308)
        x = rnd.uniform(1, 10) * 10.0 ** e if -300 < e < 300 else float(f"{rnd.uniform(1, 10):.17f}e{e}")
        if rnd.random() < 0.3 and math.isfinite(x):
            x = round(x, rnd.randint(0, 17))
        x = -x if rnd.random() < 0.5 else x
        if not math.isfinite(x):
            continue
        py = _PY.encode({"x": x}).encode()
        assert canonical.loads(py, strict=True) == {"x": x}
        oj = orjson.dumps({"x": x})
        if oj != py:
            seen_orjson_only += 1
            # orjson's own form of the same value is not canonical: refused, as Python refuses it
            with pytest.raises(BadInput):
                canonical.loads(oj, strict=True)
    assert seen_orjson_only > 100  # the range where the two differ (1e-10 .. 1e-4) was exercised


@pytest.mark.parametrize("text", [
    b'{"a":0.00001}', b'{"a":1e-7}', b'{"a":1e-05}', b'{"a":1E5}', b'{"a":1.0E+5}', b'{"a":1e16}', b'{"a":1e+16}',
    b'{"a":18446744073709551615}', b'{"a":18446744073709551616}', b'{"a":-9223372036854775809}',
    b'{"a":123456789012345678901234567890}', b'{"a":-0}', b'{"a":-0.0}', b'{"a":100.0}', b'{"a":1.50}',
    b'{"a":1,"a":1}', b'{"a":1,"a":2}', b'{"b":1,"a":2}', b'{"a": 1}', b' {"a":1}', b'{"a":1}\n',
    b'{"a":"\\u00e9"}', '{"a":"\u00e9"}'.encode(), b'{"a":"\\ud800"}', b'{"a":"\\/"}', b'{"a":"\\u001f"}',
    b'{"a":"\\u001F"}', b'{"a":"\x7f"}', b'\xef\xbb\xbf{"a":1}', b'{"a":NaN}', b'{"a":Infinity}',
    b'{"\xef\xbf\xbf":1,"\xf0\x90\x80\x80":2}', b'{"\xf0\x90\x80\x80":2,"\xef\xbf\xbf":1}', b'{"a":"\xff"}',
    b'[' * 2000 + b']' * 2000, b'null', b'true', b'"x"', b'[]', b'{}', b'{"":{"":[]}}',
])
def test_edge_inputs_get_pythons_answer(text):
    _same(text)


_json = st.recursive(
    st.none() | st.booleans() | st.integers(min_value=-(2 ** 70), max_value=2 ** 70)
    | st.floats(allow_nan=False, allow_infinity=False) | st.text(max_size=12),
    lambda kids: st.lists(kids, max_size=4) | st.dictionaries(st.text(max_size=6), kids, max_size=4),
    max_leaves=20)


@settings(max_examples=400, deadline=None)
@given(_json)
def test_any_value_in_either_encoders_form_gets_pythons_answer(value):
    _same(_PY.encode(value).encode())
    try:
        oj = orjson.dumps(value, option=orjson.OPT_SORT_KEYS)
    except orjson.JSONEncodeError:  # an integer beyond 64 bits
        return
    _same(oj)
    _same(orjson.dumps(value))  # insertion order: unsorted keys are refused by both


def _line(rec: dict) -> bytes:
    return canonical.dumps(rec)


def test_check_line_refuses_a_line_that_hashes_but_is_not_canonical():
    # A forger can write a line whose bytes minus the id member hash to the id it names, in a
    # form ledger never writes (a space): the canonical check refuses it before the hash matters.
    rec = make_record(1, None, "add", [], [], "me", {"path": "a"})
    line = _line(rec)
    assert scan.check_line(line) == rec
    bad = line.replace(b'"path":"a"', b'"path": "a"')
    at = bad.find(b',"id":"')
    body = bad[:at] + bad[at + 75:]
    forged = bad[:at + 7] + ("b3:" + blake3(body).hexdigest()).encode() + bad[at + 74:]
    with pytest.raises(BadInput, match="canonical"):
        scan.check_line(forged)


def test_check_line_refuses_each_kind_of_damage():
    rec = make_record(3, "b3:" + "0" * 64, "record", ["b3:" + "1" * 64], [], "me", {"x": 1})
    scan.check_line(_line(rec))
    for field, value in (("seq", 0), ("seq", True), ("prev", "b3:xyz"), ("inputs", ["nope"]), ("outputs", [1]),
                         ("kind", 5), ("payload", []), ("id", "b3:" + "2" * 64)):
        bad = dict(rec, **{field: value})
        with pytest.raises(BadInput):
            scan.check_line(_line(bad))
    with pytest.raises(BadInput, match="wrong fields"):
        scan.check_line(_line({**rec, "extra": 1}))


_payload = st.recursive(
    st.none() | st.integers(-10, 10) | st.text(alphabet=',":prev\\{}[] é', max_size=10),
    lambda kids: st.lists(kids, max_size=3) | st.dictionaries(st.sampled_from(["prev", "seq", "payload", "id", "a"]),
                                                                 kids, max_size=3),
    max_leaves=12)


@settings(max_examples=300, deadline=None)
@given(st.dictionaries(st.sampled_from(["prev", "payload", "time", "id", "x"]), _payload, max_size=4),
       st.text(alphabet=',":payload\\ ', max_size=10))
def test_payload_bytes_is_the_payloads_canonical_json(payload, actor):
    rec = make_record(7, "b3:" + "a" * 64, "k", [], [], actor, payload)
    line = _line(rec)
    assert scan.check_line(line) == rec
    assert scan.payload_bytes(line) == canonical.dumps(payload)
