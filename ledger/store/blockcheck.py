"""check_line's proof for a whole block of journal lines at once, for the usual lines of a kind.

A whole-history pass (`verify --full`, `index rebuild`, a first `gc` or `report`) runs check_line
on every line: ~13 us a line, most of a pass. Nearly every line of a long journal is a turn batch
written by `ledger record` or the image, and lines of one kind and one length nearly always share
one layout. So a block of lines is checked in bulk (issue 18; benchmarks/bench_floors.py measured
it at ~2.3 us a line, "templated"):

1. the block's lines are grouped by length;
2. in each group, a line of a kind with KindHooks.line_tokens is matched against the whole-line
   pattern of that kind (the envelope below, then the kind's tokens): the sample;
3. the sample's per-byte template is learned: every byte literal except the variable parts,
   which may vary within their class at a fixed width — hex digits of an id, digits of an integer
   (never a leading zero; one digit is 0-9 only where the token allows 0), digits of the time;
4. every line of the group is compared with the template in numpy, and hashed without its id
   member, the digest compared with its id (as check_line does);
5. lines no template passed get a new sample, up to TEMPLATES a group; the rest are not proved,
   nor are groups of fewer than MIN_GROUP lines (check_line costs them less than a template).

Why a line a template passes is one check_line accepts: the template is the whole-line pattern
with every repeat count fixed and some classes narrowed (the actor exact, the time's non-digits
exact), so the line matches the pattern; the pattern is canonical JSON of the nine fields in
sorted order, each of its type (strings of printable ASCII without quote or backslash are their
own canonical form; integers without leading zeros; ids), and step 4 is check_line's id check.
tests/store/test_blockcheck.py holds it to check_line: every single-byte edit of a real line that
a template passes is a line check_line accepts, and the records are equal.

API:

  prove(data: bytes) -> bytes | None
      A flag per whole line of `data` (each line ending in a newline; bytes after the last one
      are ignored): 1 where the line is proved (check_line would accept it and give the record
      orjson.loads gives), 0 where it must take check_line's path. None when the block has fewer
      than MIN_LINES lines: the bulk check is for passes, and a short read never imports numpy.

The chain (seq one more, prev the last id) is still the caller's: Journal._walk.
"""

from __future__ import annotations

import itertools
import re
import struct

from blake3 import blake3

from ledger.store import schema

MIN_LINES = 4096        # below this a block takes check_line's path line by line
TEMPLATES = 16          # samples tried per length group (a miss costs one compare of the rest)
MIN_GROUP = 8           # fewer lines left in a group than this: check_line is cheaper than a template
ROWS = 2048             # lines compared at once: temporaries of a few MiB

_PLAIN = rb'([ !#-\[\]-~]*)'                                 # a string that is its own canonical form
_IDS = rb'((?:"b3:[0-9a-f]{64}"(?:,"b3:[0-9a-f]{64}")*)?)'   # a list's members, each an id
_HEX_IN = re.compile(rb'b3:([0-9a-f]{64})')
_KIND_AT = b'],"kind":"'
_ID_MEMBER = b',"id":"'

# the variable parts of the envelope, in the order of the whole-line pattern's groups
_ACTOR, _ID, _IDLIST, _PREV, _TIME = "actor", "id", "ids", "prev", "time"
_patterns: dict[str, tuple | None] = {}


def _whole_line(kind: str) -> tuple | None:
    """(pattern, the part each group is) of kind's usual whole line, or None if it has none."""
    if kind in _patterns:
        return _patterns[kind]
    hooks = schema.hooks(kind)
    tokens = hooks.line_tokens if hooks is not None else None
    found = None
    if tokens is not None and re.fullmatch(rb'[a-z][a-z0-9_.:-]*', kind.encode()):
        parts = [_ACTOR, _ID, _IDLIST, _IDLIST]
        pattern = [rb'\{"actor":"', _PLAIN, rb'","id":"(b3:[0-9a-f]{64})","inputs":\[', _IDS,
                   rb'\],"kind":"', re.escape(kind.encode()), rb'","outputs":\[', _IDS, rb'\]']
        for t in tokens:
            if type(t) is bytes:
                pattern.append(re.escape(t))
            else:
                pattern.append(b"(" + schema.TOKEN_PATTERNS[t] + b")")
                parts.append(t)
        pattern.append(rb'(null|"b3:[0-9a-f]{64}"),"seq":(' + schema.TOKEN_PATTERNS[schema.POSITIVE]
                       + rb'),"time":"' + _PLAIN + rb'"\}')
        parts += [_PREV, schema.POSITIVE, _TIME]
        found = (re.compile(b"".join(pattern)), tuple(parts))
    _patterns[kind] = found
    return found


def _template(np, line: bytes):
    """(lo1, span1, lo2, span2, id offset) for lines of `line`'s layout, or None if `line` is
    not a usual line of its kind. A byte b passes at a column if 0 <= b - lo <= span in either
    try: the second try differs from the first only at hex columns (a-f instead of 0-9)."""
    at = line.find(_KIND_AT)
    if at < 0:
        return None
    end = line.find(b'"', at + len(_KIND_AT))
    kind = line[at + len(_KIND_AT):end].decode("ascii", "replace")
    whole = _whole_line(kind)
    m = whole[0].fullmatch(line) if whole is not None else None
    if m is None:
        return None
    lo1 = np.frombuffer(line + b"\n", np.uint8).copy()
    sp1 = np.zeros(len(lo1), np.uint8)
    hexcols: list[int] = []

    def hex_at(a: int, b: int) -> None:
        lo1[a:b], sp1[a:b] = 0x30, 9
        hexcols.extend(range(a, b))

    def digits_at(a: int, b: int, zero: bool) -> None:
        lo1[a:b], sp1[a:b] = 0x30, 9
        if not (zero and b - a == 1):       # no leading zero; a lone 0 only where the part allows it
            lo1[a], sp1[a] = 0x31, 8

    for g, part in enumerate(whole[1], start=1):
        a, b = m.span(g)
        value = m[g]
        if part in (_ID, schema.HEX_ID):
            hex_at(a + 3, b)
        elif part in (_IDLIST, _PREV):
            for h in _HEX_IN.finditer(value):
                hex_at(a + h.start(1), a + h.end(1))
        elif part in (schema.COUNT, schema.POSITIVE):
            digits_at(a, b, part == schema.COUNT)
        elif part == _TIME:
            for d in re.finditer(rb'[0-9]', value):
                lo1[a + d.start()], sp1[a + d.start()] = 0x30, 9
        # _ACTOR: exact
    lo2, sp2 = lo1.copy(), sp1.copy()
    lo2[hexcols], sp2[hexcols] = 0x61, 5
    return lo1, sp1, lo2, sp2, line.find(_ID_MEMBER)


def _passes(np, window, rows, template):
    """Which of `rows` (line starts, one width) the template passes and hash to their ids. Only
    the lines the template passes are hashed: a line another template is for costs a compare."""
    lo1, sp1, lo2, sp2, at = template
    width = len(lo1)
    x = window[rows]
    v = x - lo1                      # in place from here: fewer temporaries
    ok = v <= sp1
    np.subtract(x, lo2, out=v)
    ok |= v <= sp2
    ok = ok.all(axis=1)
    x = x[ok]
    stripped = np.concatenate((x[:, :at], x[:, at + 75:width - 1]), axis=1).tobytes()
    digests = np.frombuffer(b"".join(map(blake3.digest, itertools.starmap(
        blake3, struct.iter_unpack(f"{width - 76}s", stripped)))), np.uint8).reshape(-1, 32)
    hexd = x[:, at + 10:at + 74]
    nibbles = (hexd & 0x0F) + 9 * (hexd >> 6)           # '0'-'9' -> 0-9, 'a'-'f' -> 10-15
    ok[ok] = (((nibbles[:, 0::2] << 4) | nibbles[:, 1::2]) == digests).all(axis=1)
    return ok


def prove(data: bytes) -> bytes | None:
    """See the module doc."""
    if data.count(b"\n") < MIN_LINES:
        return None
    import numpy as np  # only for a pass: ~60 ms to import

    a = np.frombuffer(data, np.uint8)
    ends = np.flatnonzero(a == 10)
    starts = np.concatenate(([0], ends[:-1] + 1))
    lens = ends - starts + 1
    proved = np.zeros(len(ends), bool)
    order = np.argsort(lens, kind="stable")
    cuts = np.flatnonzero(np.diff(lens[order])) + 1
    for group in np.split(order, cuts):
        if len(group) < MIN_GROUP:
            continue
        width = int(lens[group[0]])
        window = np.lib.stride_tricks.sliding_window_view(a, width)
        left = group
        for _ in range(TEMPLATES):
            sample = left[0]
            s = int(starts[sample])
            template = _template(np, data[s:s + width - 1])
            if template is not None:
                for k in range(0, len(left), ROWS):
                    rows = left[k:k + ROWS]
                    proved[rows] = _passes(np, window, starts[rows], template)
                left = left[~proved[left]]
            if len(left) and left[0] == sample:
                left = left[1:]      # not usual, or not hashing to its id: check_line says which
            if len(left) < MIN_GROUP:
                break
    return proved.tobytes()
