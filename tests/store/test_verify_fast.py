"""verify --full's per-record and listing shortcuts give the answers of the paths they replace.

- KindHooks.scan (ledger/records.py `_scan_check`): the kind's checks without building its payload
  dataclass; its message and its object kinds must be from_payload's and object_kinds', for every
  kind and for payloads broken in every field.
- KindHooks.line_shape (a turn batch's usual bytes): where it matches a canonical line, the envelope,
  the kind's checks, find_ids and object_kinds must give what the shape claims;
- the listing's whole-directory shortcut (verify._groups `taken`): a fan-out directory of whole,
  reached objects is counted without judging each entry; anything else in it (a foreign name, a
  dangling object, a second copy) still gets its finding.
"""

from __future__ import annotations

import copy
import os

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ledger import records
from ledger.errors import BadInput
from ledger.store import Store, canonical, schema
from ledger.store.ids import find_ids, hash_bytes
from ledger.store.journal import record_id
from ledger.store.verify import verify
from tests.store.test_verify_scale import _append
from tests.test_records import EXAMPLES, i

# values a field may be broken into: of every JSON type, and near the edges of the checks
_VALUES = [None, True, False, 0, -1, 1, 2 ** 63, 1.5, float("inf"), "", " ", "x", "t0", "t7", i(40), "b3:" + "g" * 64,
           "run:" + "ab" * 32, [], [None], [i(41)], ["x", None], [1.5], {}, {"name": "n"}, {"a": 1.5},
           {"session": "s", "from": 1, "upto": 2}, {"name": "n", "version": 1}, [["a" * 64, 1, "r", "b" * 64]]]


def _expected(kind: str, payload: dict):
    try:
        p = records.KINDS[kind].from_payload(payload)
    except BadInput as e:
        return e.message, {}
    return None, p.object_kinds()


def _variants(kind: str):
    base = EXAMPLES[kind]
    yield base
    for key in base:
        if key in records.ENVELOPE:
            continue
        without = copy.deepcopy(base)
        del without[key]
        yield without
        for v in _VALUES:
            yield {**copy.deepcopy(base), key: copy.deepcopy(v)}
    yield {**copy.deepcopy(base), "from_a_newer_writer": [1.5, {"x": None}]}


@pytest.mark.parametrize("kind", sorted(records.KINDS))
def test_scan_check_answers_as_from_payload_for_every_kind_and_broken_field(kind):
    scan = schema.hooks(kind).scan
    assert scan is not None
    n = 0
    for payload in _variants(kind):
        if schema.envelope_problem(payload) is not None:
            continue   # scan's contract: the envelope was checked first (verify does)
        assert scan(payload) == _expected(kind, payload), payload
        n += 1
    assert n > len(EXAMPLES[kind])   # broken variants were compared, not only the example


def test_scan_check_names_a_missing_field_before_a_broken_one():
    # from_payload looks for every required key before checking any type: the same message
    p = {"turns": "not an id", "count": 2}          # `first` is missing, `turns` is ill-typed
    assert schema.hooks("record").scan(p)[0] == "record record: payload.first is missing"


def _blob(s: Store, data: bytes) -> str:
    oid = hash_bytes(data)
    path = s.objects.path(oid)
    path.parent.mkdir(exist_ok=True)
    path.write_bytes(data)
    os.chmod(path, 0o444)
    return oid


def test_a_directory_of_reached_whole_objects_is_counted_and_anything_else_in_it_is_still_judged(tmp_path):
    s = Store.init(tmp_path / "s")
    blobs = [f"blob {k}\n".encode() for k in range(1500)]   # ~6 objects in each fan-out directory
    ids = [_blob(s, b) for b in blobs]
    _append(s, [("add", {"objects": [[oid, len(b), "blob"] for oid, b in zip(ids, blobs)]}, [])])
    clean = verify(s, full=True)
    assert clean.ok, clean.errors
    total = clean.stats["objects"]
    assert total >= len(ids) and not any(x["what"] == "dangling" for x in clean.info)
    d = s.objects.path(ids[0]).parent
    # a foreign name beside reached objects: the directory is no longer plain, so it is judged
    (d / "not-an-object").write_bytes(b"x")
    rep = verify(s, full=True)
    assert any(e["what"] == "foreign-file" and "not-an-object" in e["message"] for e in rep.errors), rep.errors
    os.unlink(d / "not-an-object")
    # a dangling object (well named, no record reaches it) in a directory of reached ones
    dangling = _blob(s, b"nobody names this " + ids[0][3:5].encode() + b"\n")
    rep = verify(s, full=True)
    assert rep.ok and rep.stats["objects"] == total + 1
    assert any(x["what"] == "dangling" and dangling in x["ids"] for x in rep.info), rep.info
    os.unlink(s.objects.path(dangling))
    # a second copy (a compressed file beside the whole one) of a reached object is judged
    (d / (s.objects.path(ids[0]).name + ".z")).write_bytes(b"not a frame")
    rep = verify(s, full=True)
    assert any(e["what"] == "corrupt" and e["id"] == ids[0] for e in rep.errors), rep.errors
    # and a reached object's file replaced by a link is still found (by the journal pass)
    os.unlink(d / (s.objects.path(ids[0]).name + ".z"))
    victim = s.objects.path(ids[1])
    os.unlink(victim)
    os.symlink("/etc/hostname", victim)
    rep = verify(s, full=True)
    assert any(e["what"] == "corrupt" and e["id"] == ids[1] and "link" in e["message"] for e in rep.errors), rep.errors


def _line(payload: dict, outputs=()) -> bytes:
    body = {"seq": 7, "prev": i(60), "time": "2026-12-01T00:00:00.000000Z", "kind": "record", "inputs": [],
            "outputs": list(outputs), "actor": "t@h", "payload": payload}
    body["id"] = record_id(body)
    return canonical.dumps(body)


def _shape_claims(line: bytes, payload: dict):
    pattern, kinds = schema.hooks("record").line_shape
    m = pattern.match(line, line.find(b',"payload":'))
    if m is None:
        return None
    return {g.decode() for g in m.groups() if g and g.startswith(b"b3:")}, {k: (payload[k], w) for k, w in kinds}


def _general(payload: dict):
    problem = schema.envelope_problem(payload)
    return problem, (schema.hooks("record").scan(payload) if problem is None else None), find_ids(payload)


def test_a_turn_batch_as_its_writers_write_it_has_the_shape_and_the_shape_says_what_the_checks_say():
    payload = {"count": 2, "counters": {"turns": 2}, "first": 195557, "objects": [[i(61), 443, "turns"]], "turns": i(61)}
    ids, named = _shape_claims(_line(payload, [i(61)]), payload)
    assert (ids, named) == ({i(61)}, {"turns": (i(61), "turns")})
    assert _general(payload) == (None, (None, named), ids)
    # and verify takes it: a full verify of such records finds what the general path finds
    for broken in ({**payload, "first": 0}, {**payload, "count": -1}, {**payload, "turns": "b3:" + "A" * 64},
                   {**payload, "objects": [[i(61), -1, "turns"]]}, {**payload, "counters": {"turns": True}}):
        assert _shape_claims(_line(broken), broken) is None


_INTS = st.one_of(st.integers(-3, 3), st.integers(10 ** 17 - 2, 10 ** 19), st.integers(2 ** 63 - 2, 2 ** 63 + 1),
                  st.integers(-2 ** 63 - 1, -2 ** 63 + 1), st.sampled_from([True, False, None, 1.5, "1", [], {}]))
_IDS = st.sampled_from([i(62), i(63), "b3:" + "A" * 64, "b3:" + "a" * 63, "x", None, 3, ["b3:" + "b" * 64]])


@settings(max_examples=600, deadline=None)
@given(count=_INTS, turns=_INTS, first=_INTS, size=_INTS, oid=_IDS, tid=_IDS,
       okind=st.sampled_from(["turns", "blob", ""]),
       extra=st.sampled_from([{}, {"requests": ["r"]}, {"refs": {"x": i(64)}}, {"note": 1.5}, {"turns_hash": i(65)},
                              {"chunk_lists": []}, {"context": i(66)}]),
       counters=st.sampled_from(["turns", "other", None]))
def test_where_the_shape_matches_the_general_checks_agree(count, turns, first, size, oid, tid, okind, extra, counters):
    payload = {"count": count, "first": first, "objects": [[oid, size, okind]], "turns": tid, **extra}
    if counters is not None:
        payload["counters"] = {counters: turns}
    try:
        line = _line(payload)
    except BadInput:
        return   # not JSON a writer could write
    claims = _shape_claims(line, payload)
    if claims is None:
        return   # the general path checks it (what every other test of verify exercises)
    ids, named = claims
    assert _general(payload) == (None, (None, named), ids), payload
