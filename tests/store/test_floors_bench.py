"""benchmarks/bench_floors.py measures the per-record floor of the whole-history passes (issue 18):
its "proof" parts stand for check_line's canonical and type checks, so they must recognise exactly
the lines `ledger record` writes, and nothing the store would refuse."""

from __future__ import annotations

import json
import re

import pytest

from benchmarks import bench_floors
from ledger import experience
from ledger.demo.story import good_turns
from ledger.errors import BadInput
from ledger.store import scan


def _record_lines(store, batches: int) -> list[bytes]:
    for i in range(batches):
        experience.record(store, experience.parse_turns("\n".join(json.dumps(t) for t in good_turns(2, i))))
    lines = (store.root / "journal").read_bytes().split(b"\n")[:-1]
    return [line for line in lines if b'"kind":"record"' in line]


def test_the_usual_line_pattern_matches_every_turn_batch_line_ledger_writes(store):
    lines = _record_lines(store, 6)
    full = re.compile(bench_floors.usual_line_pattern()).fullmatch
    assert len(lines) == 6
    assert all(full(line) for line in lines)


@pytest.mark.parametrize("edit", [
    lambda s: s.replace(b'{"actor":', b'{ "actor":', 1),                      # insignificant space
    lambda s: s.replace(b'"count":2', b'"count":02', 1),                       # a leading zero
    lambda s: s.replace(b'"actor":"', b'"actor":"\\u0041', 1),                 # an escape Python would not write
    lambda s: s.replace(b'"kind":"record","outputs"', b'"outputs"', 1),       # a key missing
    lambda s: s.replace(b'"count":2', b'"count":2.0', 1),                      # a float for an integer
    lambda s: s[:-1] + b',"x":1}',                                            # a key after "time"
])
def test_a_line_the_pattern_refuses_is_one_check_line_refuses_too(store, edit):
    line = _record_lines(store, 1)[0]
    bad = edit(line)
    assert bad != line
    assert re.compile(bench_floors.usual_line_pattern()).fullmatch(bad) is None
    with pytest.raises(BadInput):
        scan.check_line(bad)


def test_the_bench_measures_every_part_and_its_columnar_proof_agrees_with_the_regex(store):
    _record_lines(store, 40)
    parts = bench_floors.measure(store.root.parent, n_lines=10_000, n_objects=100)   # SystemExit if they disagree
    assert parts["_n"] >= 40 and parts["_objects"] >= 40
    assert parts["_shaped"] > 0.5
    for name in ("lines and chain", "values", "proof: whole-line regex", "proof: RE2 over the column",
                 "object", "index row"):
        assert parts[name] > 0, name
    floors = bench_floors.floors(parts)
    assert floors["verify --full"][0] > floors["any pass"][0]
