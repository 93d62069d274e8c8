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
    full = re.compile(bench_floors.usual_line_pattern()).fullmatch
    assert full(bad) is None
    with pytest.raises(BadInput):
        scan.check_line(bad)
    # the per-length template learned from the good line refuses the edited one of the same length
    same_length = bad[:len(line)] if len(bad) >= len(line) else bad + b" " * (len(line) - len(bad))
    proved = bench_floors.templated(line + b"\n" + same_length + b"\n", full)
    assert proved.tolist() == [True, False]


def test_the_template_checks_the_hash_of_every_line_it_proves(store):
    line = _record_lines(store, 1)[0]
    at = line.find(b'"id":"b3:') + 9
    wrong = line[:at] + (b"0" if line[at:at + 1] != b"0" else b"1") + line[at + 1:]   # another id, still hex
    full = re.compile(bench_floors.usual_line_pattern()).fullmatch
    assert full(wrong)
    assert bench_floors.templated(line + b"\n" + wrong + b"\n", full).tolist() == [True, False]


def test_the_bench_measures_every_part_and_its_columnar_proof_agrees_with_the_regex(store):
    _record_lines(store, 40)
    parts = bench_floors.measure(store.root.parent, n_lines=10_000, n_objects=100)   # SystemExit if they disagree
    assert parts["_n"] >= 40 and parts["_objects"] >= 40
    assert parts["_shaped"] > 0.5
    for name in ("lines and chain", "values", "proof: whole-line regex", "proof: RE2 over the column",
                 "lines, chain and proof: templated", "object", "index row"):
        assert parts[name] > 0, name
    floors = bench_floors.floors(parts)
    assert floors["verify --full"][0] > floors["any pass"][0]


def test_every_single_byte_edit_the_template_proves_is_a_line_check_line_accepts(store):
    # Each position of a real line, each byte value but the newline; the edited line's id member is
    # then set to its true hash, so only the proof decides. A mutant the template passes must be a
    # line the store accepts with the same fields' layout (the template is not the check itself).
    from blake3 import blake3

    line = _record_lines(store, 1)[0]
    at = line.find(b',"id":"')
    mutants = []
    for i in range(len(line)):
        if at <= i < at + 75:
            continue   # the id member is recomputed below
        for b in range(256):
            if b != 10 and b != line[i]:
                m = line[:i] + bytes([b]) + line[i + 1:]
                h = blake3(m[:at])
                h.update(m[at + 75:])
                mutants.append(m[:at + 10] + h.hexdigest().encode() + m[at + 74:])
    full = re.compile(bench_floors.usual_line_pattern()).fullmatch
    proved = bench_floors.templated(b"".join(x + b"\n" for x in [line, *mutants]), full)
    assert proved[0]
    passed = [m for m, ok in zip(mutants, proved[1:].tolist()) if ok]
    assert passed, "some digit edits keep a line usual"
    for m in passed:
        assert scan.check_line(m)["kind"] == "record"
