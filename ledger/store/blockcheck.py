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
   (never a leading zero; one digit is 0-9 only where the token allows 0), digits of the time
   (whose ranges, the month's days among them, are then checked on the digits: _times_ok);
4. every line of the group is compared with the template in numpy, and hashed without its id
   member, the digest compared with its id (as check_line does);
5. lines no template passed get a new sample, up to TEMPLATES a group; the rest are not proved,
   nor are groups of fewer than MIN_GROUP lines (check_line costs them less than a template).

Why a line a template passes is one check_line accepts: the template is the whole-line pattern
with every repeat count fixed and some classes narrowed (the actor exact, the time's non-digits
exact, its digits' ranges checked), so the line matches the pattern; the pattern is canonical JSON of the nine fields in
sorted order, each of its type (strings of printable ASCII without quote or backslash are their
own canonical form; integers without leading zeros; ids), and step 4 is check_line's id check.
tests/store/test_blockcheck.py holds it to check_line: every single-byte edit of a real line that
a template passes is a line check_line accepts, and the records are equal.

API:

  prove(data: bytes) -> Block | None
      None when the block has fewer than MIN_LINES lines: the bulk check is for passes, and a
      short read never imports numpy. Else a Block whose `flags` hold a byte per whole line of
      `data` (each line ending in a newline; bytes after the last one are ignored): 1 where the
      line is proved (check_line would accept it and give the record orjson.loads gives), 0
      where it must take check_line's path.

  Block.run_kind(i) -> str | None;  Block.run(i) -> Run
      A proved line whose prev is an id begins or continues a run: the lines up to the next one
      of another kind or not proved. `run` reads them as columns (seq, ids, prevs, each variable
      part of the kind's tokens, the envelope's inputs and outputs) straight from the template's
      fixed positions, for a fold that needs a few fields of many lines (Journal.scan's `bulk`).
      Run.chained(seq, prev) says how many of its first rows continue the chain; Run.head(m)
      keeps those.

The chain (seq one more, prev the last id) is still the caller's: Journal._walk, line by line
or, for a run handed over whole, with Run.chained.
"""

from __future__ import annotations

import itertools
import re
import struct
from dataclasses import dataclass, field

from blake3 import blake3

from ledger.store import scan, schema
from ledger.store.schema import HEX_ID

MIN_LINES = 4096        # below this a block takes check_line's path line by line
TEMPLATES = 16          # samples tried per length group (a miss costs one compare of the rest)
MIN_GROUP = 8           # fewer lines left in a group than this: check_line is cheaper than a template
_MASK = 1 << 20
ROWS = 512              # lines compared at once: temporaries of ~1 MiB (index rebuild peaks near 300 MiB)

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
                       + rb'),"time":"(' + scan.TIME_RE.pattern.encode() + rb')"\}')
        parts += [_PREV, schema.POSITIVE, _TIME]
        found = (re.compile(b"".join(pattern)), tuple(parts))
    _patterns[kind] = found
    return found


@dataclass(frozen=True, eq=False)
class _Template:
    """The per-byte template of one layout of a kind's usual line (see `_template`), and where
    its fields sit: spans [a, b) of the line, hex spans without their "b3:"."""
    kind: str
    lo1: object            # numpy uint8 arrays, one byte per column (the newline included)
    sp1: object
    lo2: object
    sp2: object
    at: int                # where the `,"id":"` member begins
    seq: tuple[int, int]
    prev: tuple[int, int] | None   # the previous record's id's hex, or None where prev is null
    time: tuple[int, int]
    parts: tuple[tuple[str, int, int], ...]   # (token, a, b) of each variable part of the kind's tokens
    lists: tuple[tuple[int, ...], tuple[int, ...]]   # where each id's hex begins: inputs, outputs
    actor: tuple[int, int]  # the texts of actor, time and payload (its canonical JSON, as
    payload: tuple[int, int]  # scan.payload_bytes slices it); time is `time` above


def _template(np, line: bytes) -> _Template | None:
    """The template for lines of `line`'s layout, or None if `line` is not a usual line of its
    kind. A byte b passes at a column if 0 <= b - lo <= span in either try: the second try
    differs from the first only at hex columns (a-f instead of 0-9)."""
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
    spans: dict[str, tuple[int, int] | None] = {}
    parts: list[tuple[str, int, int]] = []
    lists: list[tuple[int, ...]] = []

    def hex_at(a: int, b: int) -> None:
        lo1[a:b], sp1[a:b] = 0x30, 9
        hexcols.extend(range(a, b))

    def digits_at(a: int, b: int, zero: bool) -> None:
        lo1[a:b], sp1[a:b] = 0x30, 9
        if not (zero and b - a == 1):       # no leading zero; a lone 0 only where the part allows it
            lo1[a], sp1[a] = 0x31, 8

    tokens = len(whole[1]) - 3              # the kind's parts come before prev, seq and time
    for g, part in enumerate(whole[1], start=1):
        a, b = m.span(g)
        value = m[g]
        if part in (_ID, schema.HEX_ID):
            hex_at(a + 3, b)
            if part == schema.HEX_ID:
                parts.append((part, a + 3, b))
        elif part in (_IDLIST, _PREV):
            starts = []
            for h in _HEX_IN.finditer(value):
                hex_at(a + h.start(1), a + h.end(1))
                starts.append(a + h.start(1))
            if part == _IDLIST:
                lists.append(tuple(starts))
            if part == _PREV:
                spans["prev"] = (a + 4, b - 1) if value != b"null" else None
        elif part in (schema.COUNT, schema.POSITIVE):
            digits_at(a, b, part == schema.COUNT)
            if g <= tokens:
                parts.append((part, a, b))
            else:
                spans["seq"] = (a, b)
        elif part == _TIME:
            for d in re.finditer(rb'[0-9]', value):
                lo1[a + d.start()], sp1[a + d.start()] = 0x30, 9
            spans["time"] = (a, b)
        elif part == _ACTOR:
            spans["actor"] = (a, b)     # exact
    lo2, sp2 = lo1.copy(), sp1.copy()
    lo2[hexcols], sp2[hexcols] = 0x61, 5
    payload = (line.find(scan.PAYLOAD_MEMBER) + len(scan.PAYLOAD_MEMBER), line.rfind(scan.PREV_MEMBER))
    return _Template(kind, lo1, sp1, lo2, sp2, line.find(_ID_MEMBER), spans["seq"], spans["prev"], spans["time"],
                     tuple(parts), tuple(lists), spans["actor"], payload)


def _passes(np, window, rows, t: _Template):
    """Which of `rows` (line starts, one width) template `t` passes and hash to their ids. Only
    the lines the template passes are hashed: a line another template is for costs a compare."""
    at, width = t.at, len(t.lo1)
    x = window[rows]
    v = x - t.lo1                    # in place from here: fewer temporaries
    ok = v <= t.sp1
    np.subtract(x, t.lo2, out=v)
    ok |= v <= t.sp2
    ok = ok.all(axis=1)
    ok &= _times_ok(np, x, t.time[0])
    x = x[ok]
    stripped = np.concatenate((x[:, :at], x[:, at + 75:width - 1]), axis=1)   # unpacked as a buffer: no copy
    digests = np.frombuffer(b"".join(map(blake3.digest, itertools.starmap(
        blake3, struct.iter_unpack(f"{width - 76}s", stripped)))), np.uint8).reshape(-1, 32)
    hexd = x[:, at + 10:at + 74]
    nibbles = (hexd & 0x0F) + 9 * (hexd >> 6)           # '0'-'9' -> 0-9, 'a'-'f' -> 10-15
    ok[ok] = (((nibbles[:, 0::2] << 4) | nibbles[:, 1::2]) == digests).all(axis=1)
    return ok


def _times_ok(np, x, a: int):
    """Which rows' time, at column `a`, is one scan.time_ok accepts. The template fixed its
    layout (journal.now's) and made each of its digits a digit; what a template cannot say, the
    ranges (month 1-12, the month's days, hour <= 23, minute and second <= 59, year >= 1), is
    checked here, so a proved line is still one check_line accepts."""
    d = x[:, a:a + 19].astype(np.int32) - 48
    year = ((d[:, 0] * 10 + d[:, 1]) * 10 + d[:, 2]) * 10 + d[:, 3]
    month, day = d[:, 5] * 10 + d[:, 6], d[:, 8] * 10 + d[:, 9]
    leap = (year % 4 == 0) & ((year % 100 != 0) | (year % 400 == 0))
    days = np.array(scan.MONTH_DAYS)[np.clip(month, 0, 12)] - ((month == 2) & ~leap)
    return ((year >= 1) & (month >= 1) & (month <= 12) & (day >= 1) & (day <= days)
            & (d[:, 11] * 10 + d[:, 12] <= 23) & (d[:, 14] * 10 + d[:, 15] <= 59) & (d[:, 17] * 10 + d[:, 18] <= 59))


@dataclass(frozen=True, eq=False)
class Run:
    """Consecutive proved lines of one kind, their prev an id, as columns (Block.run). Row k is
    line `first + k` of the block: `seq[k]`, `ids[k]` and `prevs[k]` (64 hex bytes each), and one
    column per variable part of the kind's tokens, in their order (`parts[p]`: integers for COUNT
    and POSITIVE, 64 hex bytes a row for HEX_ID); the envelope's inputs and outputs on demand
    (envelope_lists: a fold that does not read them does not pay for them). Every value is the
    one check_line's record holds."""
    kind: str
    seq: object
    ids: object
    prevs: object
    parts: tuple
    block: Block
    first: int
    lines: object = None   # numpy: the block's line of each row, for a joined run (else first + k)
    lists: tuple | None = None   # a joined run's envelope_lists (else read from the block)

    def envelope_lists(self) -> tuple:
        """(inputs, outputs), each (offsets, hex): row k's ids are hex[offsets[k]:offsets[k + 1]],
        64 hex bytes each (flat, so a line of many ids costs its ids, not a row that wide for
        every line; hex may hold other rows' ids too)."""
        if self.lists is not None:
            return self.lists
        n = len(self.seq)
        return tuple((offsets[self.first:self.first + n + 1], hexes)
                     for offsets, hexes in self.block._envelope_lists(self.kind))

    def id_text(self) -> tuple:
        """The run's ids as text, for a fold that reads them row by row: ({part: text} for each
        HEX_ID part, 64 hex a row; then inputs and outputs, each (offsets from the run's first
        id, as a list; the text of the run's ids, 64 hex each))."""
        parts = {p: self.parts[p].tobytes().decode("ascii") for p, tok in enumerate(self.tokens)
                 if tok == HEX_ID}
        lists = []
        for offsets, hexes in self.envelope_lists():
            a, b = int(offsets[0]), int(offsets[-1])
            lists.append(((offsets - a).tolist(), hexes[a:b].tobytes().decode("ascii")))
        return parts, lists[0], lists[1]

    def _line_of(self, k):
        return self.first + k if self.lines is None else self.lines[k]

    def __len__(self) -> int:
        return len(self.seq)

    def id(self, k: int) -> str:
        return "b3:" + self.ids[k].tobytes().decode("ascii")

    def hex_id(self, part: int, k: int) -> str:
        """Part `part` (a HEX_ID) of row k as the payload holds it."""
        return "b3:" + self.parts[part][k].tobytes().decode("ascii")

    @property
    def tokens(self) -> tuple[str, ...]:
        """Each variable part's token (schema.HEX_ID, COUNT or POSITIVE), in the order of parts."""
        t = self.block.templates[int(self.block.template_of[self._line_of(0)])]
        return tuple(tok for tok, _, _ in t.parts)

    def listed(self, k: int) -> tuple[list[str], list[str]]:
        """Row k's inputs and outputs, as the record's lists hold them."""
        return tuple(["b3:" + hexes[j].tobytes().decode("ascii") for j in range(int(offsets[k]), int(offsets[k + 1]))]
                     for offsets, hexes in self.envelope_lists())

    def texts(self, what: str) -> tuple:
        """(starts, lengths): where each row's text of `what` lies in block.data — "actor",
        "time" (inside their quotes) or "payload" (its canonical JSON, scan.payload_bytes')."""
        import numpy as np

        b = self.block
        rows = slice(self.first, self.first + len(self.seq)) if self.lines is None else self.lines
        spans = np.array([getattr(t, what) for t in b.templates], np.int64).reshape(-1, 2)[b.template_of[rows]]
        return b.starts[rows] + spans[:, 0], spans[:, 1] - spans[:, 0]

    def line(self, k: int) -> bytes:
        b = self.block
        i = self._line_of(k)
        return b.data[int(b.starts[i]):int(b.ends[i])]

    def time(self, k: int) -> str:
        a, b = self.block.templates[int(self.block.template_of[self._line_of(k)])].time
        return self.line(k)[a:b].decode("ascii")

    @property
    def end(self) -> int:
        """The offset in the block just after the run's last line."""
        return int(self.block.ends[self._line_of(len(self.seq) - 1)]) + 1

    def chained(self, seq: int, prev: str | None) -> int:
        """How many of the first rows continue a chain whose next seq is `seq` after id `prev`."""
        import numpy as np

        n = len(self.seq)
        if not 1 <= seq < 10**18:
            return 0    # no proved seq (1 to 18 digits) is outside; and arange would overflow int64
        ok = self.seq == np.arange(seq, seq + n, dtype=np.int64)
        ok[0] &= prev is not None and self.prevs[0].tobytes() == prev[3:].encode()
        ok[1:] &= (self.prevs[1:] == self.ids[:-1]).all(axis=1)
        bad = np.flatnonzero(~ok)
        return int(bad[0]) if len(bad) else n

    def head(self, m: int) -> Run:
        """The first m rows."""
        lists = None if self.lists is None else tuple((o[:m + 1], h) for o, h in self.lists)
        return Run(self.kind, self.seq[:m], self.ids[:m], self.prevs[:m], tuple(c[:m] for c in self.parts),
                   self.block, self.first, None if self.lines is None else self.lines[:m], lists)


def joined(runs: list[Run]) -> Run:
    """Runs of one kind from one block as one Run of all their rows, in order (not a chain: for
    columns read at once, where a fold's cost is per call, not per row — the index's bulk)."""
    import numpy as np

    if len(runs) == 1:
        return runs[0]

    def lists(which):
        hexes = [r_[1][int(r_[0][0]):int(r_[0][-1])] for r_ in which]
        counts = np.concatenate([np.diff(r_[0]) for r_ in which])
        return np.concatenate(([0], np.cumsum(counts))), np.concatenate(hexes)

    first = runs[0]
    each = [r.envelope_lists() for r in runs]
    return Run(first.kind, np.concatenate([r.seq for r in runs]), np.concatenate([r.ids for r in runs]),
               np.concatenate([r.prevs for r in runs]),
               tuple(np.concatenate([r.parts[p] for r in runs]) for p in range(len(first.parts))),
               first.block, first.first,
               np.concatenate([np.arange(r.first, r.first + len(r)) if r.lines is None else r.lines for r in runs]),
               (lists([e[0] for e in each]), lists([e[1] for e in each])))


@dataclass(frozen=True, eq=False)
class Block:
    """What prove found in a block: `flags` (a byte per whole line, 1 where proved) and the
    templates that proved them, from which `run` reads a run of proved lines as columns."""
    flags: bytes
    data: bytes
    starts: object         # numpy: each line's offset in data, and its newline's
    ends: object
    template_of: object    # per line: the index of the template that proved it in templates, or -1
    templates: list
    run_to: object         # per line: where the run of lines of its kind (prev an id) ends
    columns: dict = field(default_factory=dict)   # kind -> its columns over the block (_columns; lists too)

    def run_kind(self, i: int) -> str | None:
        """The kind of proved line i's run, or None if it is in none (not proved, or prev null)."""
        t = int(self.template_of[i])
        return None if t < 0 or self.templates[t].prev is None else self.templates[t].kind

    def run(self, i: int) -> Run:
        """Lines i .. the end of line i's run, as columns (line i is in a run: run_kind)."""
        j = int(self.run_to[i])
        kind = self.templates[int(self.template_of[i])].kind
        seq, ids, prevs, parts = self._columns(kind)
        return Run(kind, seq[i:j], ids[i:j], prevs[i:j], tuple(c[i:j] for c in parts), self, i)

    def _columns(self, kind: str) -> tuple:
        """The columns of every line of the block that a template of `kind` (prev an id) proved,
        read once per kind (rows of other lines are left as zeros)."""
        got = self.columns.get(kind)
        if got is not None:
            return got
        import numpy as np

        a = np.frombuffer(self.data, np.uint8)
        n = len(self.template_of)
        mine = [(k, t) for k, t in enumerate(self.templates) if t.kind == kind and t.prev is not None]
        seq = np.zeros(n, np.int64)
        ids = np.zeros((n, 64), np.uint8)
        prevs = np.zeros((n, 64), np.uint8)
        parts = [np.zeros((n, 64), np.uint8) if tok == schema.HEX_ID else np.zeros(n, np.int64)
                 for tok, _, _ in mine[0][1].parts]
        for k, t in mine:
            sel = np.flatnonzero(self.template_of == k)
            x = np.lib.stride_tricks.sliding_window_view(a, len(t.lo1))[self.starts[sel]]
            seq[sel] = _number(np, x, t.seq)
            ids[sel] = x[:, t.at + 10:t.at + 74]
            prevs[sel] = x[:, t.prev[0]:t.prev[1]]
            for col, (tok, p, q) in zip(parts, t.parts):
                col[sel] = x[:, p:q] if tok == schema.HEX_ID else _number(np, x, (p, q))
        got = self.columns[kind] = (seq, ids, prevs, parts)
        return got

    def _envelope_lists(self, kind: str) -> tuple:
        """Run.envelope_lists of every line of the block a template of `kind` proved (read once
        per kind; other lines have none)."""
        got = self.columns.get((kind, "lists"))
        if got is None:
            import numpy as np

            a = np.frombuffer(self.data, np.uint8)
            mine = [(k, t) for k, t in enumerate(self.templates) if t.kind == kind and t.prev is not None]
            got = self.columns[(kind, "lists")] = tuple(self._lists(np, a, mine, w) for w in (0, 1))
        return got

    def _lists(self, np, a, mine: list, w: int) -> tuple:
        """(offsets, hex) of list `w` (0 inputs, 1 outputs) of every line `mine` proved."""
        counts = np.zeros(len(self.template_of), np.int64)
        for k, t in mine:
            counts[self.template_of == k] = len(t.lists[w])
        offsets = np.concatenate(([0], np.cumsum(counts)))
        hexes = np.zeros((int(offsets[-1]), 64), np.uint8)
        for k, t in mine:
            sel = np.flatnonzero(self.template_of == k)
            for j, p in enumerate(t.lists[w]):
                hexes[offsets[sel] + j] = np.lib.stride_tricks.sliding_window_view(a, 64)[self.starts[sel] + p]
        return offsets, hexes


def _number(np, x, span: tuple[int, int]):
    """The integers written in columns [a, b) of rows x (digits only, proved)."""
    a, b = span
    digits = x[:, a:b].astype(np.int64) - 0x30
    return digits @ (np.int64(10) ** np.arange(b - a - 1, -1, -1, dtype=np.int64))


def prove(data: bytes) -> Block | None:
    """See the module doc."""
    if data.count(b"\n") < MIN_LINES:
        return None
    import numpy as np  # only for a pass: ~60 ms to import

    a = np.frombuffer(data, np.uint8)
    # the newlines found a MiB at a time: a mask of the whole block would add its size to the
    # pass's peak memory (index rebuild's is near the 300 MiB target)
    ends = np.concatenate([np.flatnonzero(a[k:k + _MASK] == 10) + k for k in range(0, len(a), _MASK)])
    starts = np.concatenate(([0], ends[:-1] + 1))
    lens = ends - starts + 1
    template_of = np.full(len(ends), -1, np.int32)
    templates: list[_Template] = []
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
                templates.append(template)
                for k in range(0, len(left), ROWS):
                    rows = left[k:k + ROWS]
                    template_of[rows[_passes(np, window, starts[rows], template)]] = len(templates) - 1
                left = left[template_of[left] < 0]
            if len(left) and left[0] == sample:
                left = left[1:]      # not usual, or not hashing to its id: check_line says which
            if len(left) < MIN_GROUP:
                break
    # runs: consecutive lines proved by templates of one kind whose prev is an id
    kinds = {k: n for n, k in enumerate(sorted({t.kind for t in templates}))}
    code = np.array([kinds[t.kind] if t.prev is not None else -1 for t in templates] + [-1], np.int32)
    line_code = code[template_of]           # -1 (the last entry) for lines no template proved
    change = np.flatnonzero(np.diff(line_code)) + 1
    bounds = np.concatenate((change, [len(ends)]))
    run_to = bounds[np.searchsorted(bounds, np.arange(len(ends)), side="right")]
    return Block((template_of >= 0).tobytes(), data, starts, ends, template_of, templates, run_to)
