"""The journal scanner's per-line check, and what the whole-history passes read off a checked line.

Every pass over the whole journal (`verify --full`, `index rebuild`, a first `gc` or `report`)
spends its time per record, in CPython: parsing the line, checking it is canonical, hashing it
for the chain. This module is the one place that work is done, as fast as it is done anywhere
here; `journal.parse_line` is `check_line`, so `Journal.scan`, `stream` and `backwards` (every
reader) run it. A scan's block of many usual lines is proved at once instead (store/blockcheck.py:
the same answer per line, held to check_line's by tests/store/test_blockcheck.py).

API (stable; other passes may call it):

  check_line(line: bytes) -> dict
      The record of one journal line (without its newline), or BadInput. Checks, in order:
      the line is canonical JSON (canonical.loads(strict=True): orjson's round trip proves it,
      Python's encoder decides what orjson cannot, see canonical._fast_strict), it is an object
      of exactly the nine record fields, each of its type (seq >= 1, prev null or an id, inputs
      and outputs lists of ids, kind and actor strings, time journal.now's form, payload an
      object), and the line hashes to its id. The chain (seq one more, prev the last id) is the caller's: Journal._walk.

  payload_bytes(line: bytes) -> bytes
      The payload member's value exactly as the line holds it, for a line `check_line`
      accepted: the canonical JSON of the payload (the index stores it as the payload's text).

  without_collector() / collect_young()
      A pass over every record runs inside `with without_collector():` and calls
      `collect_young()` at each batch it flushes (see the docstring).

A pass reads the lines with `Journal.scan(..., each=fn, lines=True)`: `fn(rec, line)` gets each
record checked by check_line and chained, with its exact bytes.

The rule that makes hashing the bytes sound (docs/store-format.md, "Canonical lines"): a record's
id is the hash of the canonical form of its eight other fields; a line that is canonical holds
that form as its bytes with the `,"id":"…"` member cut out (keys are sorted and "actor" is the only
key before "id"). So the id is checked by hashing two slices of the line, never by encoding the
record again, and only after the line was found canonical: a line that is not canonical is refused
before its hash is looked at, by every reader, whatever the pass.
"""

from __future__ import annotations

import gc
import re
from contextlib import contextmanager

from blake3 import blake3

from ledger.errors import BadInput
from ledger.store import canonical
from ledger.store.ids import ID_RE, PREFIX

_KEYS = frozenset(("seq", "prev", "time", "kind", "inputs", "outputs", "actor", "payload", "id"))
_ID = ID_RE.match
_ID_MEMBER = b',"id":"'
PAYLOAD_MEMBER = b',"payload":'
PREV_MEMBER = b',"prev":'

# journal.now's form, each field in its range (no lookaround: RE2 takes it too); day 29-31 is
# then checked against the month
TIME_RE = re.compile(r"(?:[1-9][0-9]{3}|0[1-9][0-9]{2}|00[1-9][0-9]|000[1-9])-(?:0[1-9]|1[0-2])-(?:0[1-9]|[12][0-9]|3[01])"
                     r"T(?:[01][0-9]|2[0-3]):[0-5][0-9]:[0-5][0-9]\.[0-9]{6}Z")
MONTH_DAYS = (0, 31, 29, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31)


def time_ok(t: str) -> bool:
    """Whether `t` is a record time as journal.now writes it: YYYY-MM-DDTHH:MM:SS.ffffffZ, a real
    UTC instant (no leap second, year 1 to 9999). Anything else was written by something other
    than ledger, and the index could not hold it (its journal.time is a TIMESTAMP): a line with
    another time is refused like one with a bad seq (docs/store-format.md, "Canonical lines")."""
    if TIME_RE.fullmatch(t) is None:
        return False
    day = int(t[8:10])
    if day <= 28:
        return True
    year, month = int(t[:4]), int(t[5:7])
    leap = year % 4 == 0 and (year % 100 != 0 or year % 400 == 0)
    return day <= MONTH_DAYS[month] and (month != 2 or day == 29 and leap)


def _ids(values) -> bool:
    for x in values:
        if type(x) is not str or _ID(x) is None:
            return False
    return True


def check_line(line: bytes) -> dict:
    """Decode one journal line and check that it is canonical, well-typed and names itself
    correctly (see the module doc). Raises BadInput."""
    rec = canonical.loads(line, strict=True)
    if type(rec) is not dict or rec.keys() != _KEYS:
        raise BadInput("journal record has the wrong fields")
    seq, prev = rec["seq"], rec["prev"]
    if not (type(seq) is int and seq >= 1):
        raise BadInput("journal record has a bad seq")
    if not (prev is None or (type(prev) is str and _ID(prev) is not None)):
        raise BadInput("journal record has a bad prev")
    inputs, outputs = rec["inputs"], rec["outputs"]
    if not (type(rec["kind"]) is str and type(rec["actor"]) is str and type(rec["time"]) is str
            and type(rec["payload"]) is dict and type(inputs) is list and type(outputs) is list
            and _ids(inputs) and _ids(outputs)):
        raise BadInput("journal record has ill-typed fields")
    if not time_ok(rec["time"]):
        raise BadInput("journal record has a bad time (not YYYY-MM-DDTHH:MM:SS.ffffffZ, a real UTC instant)")
    # The line is canonical (checked above), so the canonical form of the fields other than `id`
    # is the line without its `,"id":"…"` member: hash that rather than encode the record again.
    # "actor" is the only key that sorts before "id", and a canonical JSON string holds no bare
    # quote, so the first `,"id":"` of the line is the record's own id member.
    rid = rec["id"]
    at = line.find(_ID_MEMBER)
    if not (type(rid) is str and _ID(rid) is not None and at >= 0 and line[at + 7:at + 74] == rid.encode()
            and line[at + 74:at + 75] == b'"'):
        raise BadInput("journal record does not hash to its id")
    h = blake3(line[:at])
    h.update(line[at + 75:])
    if PREFIX + h.hexdigest() != rid:
        raise BadInput("journal record does not hash to its id")
    return rec


def payload_bytes(line: bytes) -> bytes:
    """The payload's canonical JSON as the line holds it (a line check_line accepted).

    Its keys are sorted: actor, id, inputs, kind, outputs, payload, prev, seq, time. Before the
    payload only strings and lists of ids, after it null or an id, an integer and a string; and
    `,"` occurs in no canonical JSON string (a quote inside one is escaped). So the first
    `,"payload":` is the member's start, and the last `,"prev":` its end (a payload may hold a
    key "prev" of its own, never after the top-level one)."""
    start = line.find(PAYLOAD_MEMBER) + len(PAYLOAD_MEMBER)
    return line[start:line.rfind(PREV_MEMBER)]


@contextmanager
def without_collector():
    """Run a whole-history pass without the cyclic collector; the caller collects the young
    generation at each batch it flushes (`collect_young`).

    A pass allocates a few dicts, lists and tuples per record and frees them by reference
    count; the collector would still traverse the young ones every few hundred allocations (and
    now and then everything the interpreter holds): 10-30% of a pass's CPU. Records hold no
    cycles; a cycle made by anything on the way still goes at the next batch."""
    collecting = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if collecting:
            gc.enable()


def collect_young() -> None:
    """Collect the youngest generation (what a batch made), when the collector is off for a pass."""
    if not gc.isenabled():
        gc.collect(0)
