"""The per-record floor of each whole-history pass (issue 18's <= 5 us a record), measured on a store.

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/bench_floors.py STORE [--lines 200000] [--objects 20000]

`verify --full`, `index rebuild` and the first `report` and `gc` each walk every record of the
journal. Whatever else they do, each must, per record, in this process:

- hash the line for the chain (`chain`): the hash chain is the authority (issue 18), so a pass
  that trusts a line it did not hash trusts a file anyone can edit;
- prove the line canonical and its fields well-typed (`proof`): a non-canonical line has no
  well-defined id (docs/store-format.md, "Canonical lines"). The cheapest of three ways is taken:
  orjson's sorted re-encoding compared with the line (after the parse below), one Python regex
  of the usual turn-batch line (`fullmatch`), and the same regex through pyarrow's RE2 over the
  whole column at once (C++, no Python object per line). A fourth way does the chain and the proof
  together (`templated`, found by a helper attacking this bench's first figures): lines grouped by
  length, each length's usual layout as a per-byte template learned from one line the regex
  matches (literal bytes exact, hex digits, digits, no leading zero), every line of that length
  checked against it in numpy, and each line without its id member hashed, the digests compared
  with the ids decoded in bulk;
- hold the record's values (`values`, orjson.loads), where the pass works on Python values: the
  folds of verify and report and the index's rows are made of them today (a columnar fold could
  read the few fields it needs at the templates' fixed columns instead);

and, by the pass's own rules:

- `verify --full` and the first `gc` open each object a record names (`object`: open, fstat,
  read, close of the store's own object files, warm page cache), and gc hashes what it reads
  (rule 22: children only from bytes that hash to the id; `object hash`);
- `index rebuild` appends each record's journal row to DuckDB (`index row`: Arrow batches of
  5,000 rows of the journal table's columns, as the rebuild appends them, then a CHECKPOINT; in
  memory, the least DuckDB spends: the rebuild's file, compressed, costs about twice as much).

Each part is the best of 5 rounds of CPU time (process_time), in us a record. The floor of a
pass is the sum of its parts; the pass's measured figure (bench_scale.py, RESULTS.md) is above
its floor by what the pass does besides. This is an analysis, not a contest: there is no peer
program that does a pass's work, so none is timed beside it.
"""

from __future__ import annotations

import argparse
import gc
import os
import re
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

ROUNDS = 5
TARGET_US = 5.0


def best_us(fn, n: int) -> float:
    """The least CPU time of ROUNDS runs of fn(), in us per item of n."""
    best = float("inf")
    for _ in range(ROUNDS):
        t0 = time.process_time()
        fn()
        best = min(best, time.process_time() - t0)
    return best / n * 1e6


def usual_line_pattern() -> bytes:
    """The whole line of a turn batch as `ledger record` writes it, every field in its canonical
    form (the payload is records.Record.LINE_SHAPE's; strings printable ASCII without a quote or
    backslash, which are their own canonical encoding)."""
    from ledger import records
    from ledger.store import scan
    plain = rb'"[ !#-\[\]-~]*"'
    oid = rb'"b3:[0-9a-f]{64}"'
    ids = rb'\[(?:' + oid + rb'(?:,' + oid + rb')*)?\]'
    shape = records.Record.LINE_SHAPE[0].pattern
    return (rb'\{"actor":' + plain + rb',"id":' + oid + rb',"inputs":' + ids + rb',"kind":"record","outputs":'
            + ids + shape + rb'(?:null|' + oid + rb'),"seq":[1-9][0-9]{0,17},"time":"' + scan.TIME_RE.pattern.encode() + rb'"\}')


def measure(store: Path, n_lines: int, n_objects: int) -> dict[str, float]:
    import numpy as np
    import orjson
    import pyarrow as pa
    import pyarrow.compute as pc
    from blake3 import blake3

    from ledger.store import index as indexlib
    from ledger.store import scan

    with open(store / ".ledger" / "journal", "rb") as f:
        data = f.read(2048 * n_lines)   # more than n_lines of any usual size; cut at a line end below
    ends = np.flatnonzero(np.frombuffer(data, dtype=np.uint8) == 10)[:n_lines]
    data = data[:int(ends[-1]) + 1]
    lines = data.split(b"\n")[:-1]
    n = len(lines)
    parts: dict[str, float] = {}

    def chain():
        # the file's lines found and hashed in place (no line object but a memoryview slice each)
        view, start = memoryview(data), 0
        while True:
            end = data.find(b"\n", start)
            if end < 0:
                break
            at = data.find(b',"id":"', start, end)
            h = blake3(view[start:at])
            h.update(view[at + 75:end])
            if h.hexdigest().encode() != data[at + 10:at + 74]:
                raise SystemExit(f"a line at byte {start} does not hash to its id")
            start = end + 1
    parts["lines and chain"] = best_us(chain, n)
    values = list(map(orjson.loads, lines))
    parts["values"] = best_us(lambda: list(map(orjson.loads, lines)), n)
    sort = orjson.OPT_SORT_KEYS
    parts["proof: parse, re-encode and compare"] = parts["values"] + best_us(
        lambda: [orjson.dumps(v, option=sort) == line for v, line in zip(values, lines)], n)
    pattern = usual_line_pattern()
    full = re.compile(pattern).fullmatch
    shaped = sum(1 for line in lines if full(line))
    parts["proof: whole-line regex"] = best_us(lambda: [full(line) for line in lines], n)
    re2 = "^" + pattern.decode() + "\n$"

    def columnar():
        # the lines as one Arrow column over the file's own bytes (offsets from numpy, no copy;
        # each value keeps its newline), matched by RE2 in C++
        cut = np.flatnonzero(np.frombuffer(data, dtype=np.uint8) == 10)
        offsets = np.concatenate(([0], cut + 1)).astype(np.int32)
        column = pa.BinaryArray.from_buffers(pa.binary(), len(cut), [None, pa.py_buffer(offsets), pa.py_buffer(data)])
        return pc.match_substring_regex(column, re2)
    got = columnar()
    if pc.sum(got).as_py() != shaped:
        raise SystemExit(f"the columnar match found {pc.sum(got).as_py()} usual lines, the regex {shaped}")
    parts["proof: RE2 over the column"] = best_us(columnar, n)
    proof = min(v for k, v in parts.items() if k.startswith("proof"))
    proved = templated(data, full)
    if int(proved.sum()) != shaped:
        raise SystemExit(f"the templates proved {int(proved.sum())} usual lines, the regex {shaped}")
    parts["lines, chain and proof: templated"] = best_us(lambda: templated(data, full), n)

    # the object files the journal names (each record's objects entries), warm
    paths = []
    for v in values:
        for o in v["payload"].get("objects") or ():
            if isinstance(o, list) and o and isinstance(o[0], str):
                paths.append(_object_file(store, o[0]))
        if len(paths) >= n_objects:
            break
    paths = [p for p in paths if p is not None]

    def opened():
        for p in paths:
            fd = os.open(p, os.O_RDONLY | os.O_NOFOLLOW)
            try:
                os.fstat(fd)
                os.read(fd, 1 << 20)
            finally:
                os.close(fd)
    opened()
    parts["object"] = best_us(opened, len(paths))
    contents = [p.read_bytes() for p in paths]
    parts["object hash"] = best_us(lambda: [blake3(d).hexdigest() for d in contents], len(paths))

    import duckdb
    batch = 5000
    rows = [(v["seq"], v["id"], v["prev"], v["time"].rstrip("Z").replace("T", " "), v["kind"], v["actor"],
             v["inputs"], v["outputs"], scan.payload_bytes(line).decode()) for v, line in zip(values, lines)]
    cols = indexlib.COLUMNS["journal"]
    tables = [pa.table({c: [r[i] for r in rows[k:k + batch]] for i, c in enumerate(cols)})
              for k in range(0, len(rows), batch)]

    def appended():
        con = duckdb.connect(":memory:")
        con.execute(f"CREATE TABLE journal ({indexlib.SCHEMA['journal']})")
        for t in tables:
            con.execute("INSERT INTO journal SELECT * FROM t")
        con.execute("CHECKPOINT")
        con.close()
    parts["index row"] = best_us(appended, n)
    parts["_proof"] = proof
    parts["_shaped"] = shaped / n
    parts["_n"] = n
    parts["_objects"] = len(paths)
    return parts


_FIELDS = re.compile(
    rb'\{"actor":"[^"]*","id":"b3:(?P<id>[0-9a-f]{64})","inputs":\[(?P<inp>[^\]]*)\],"kind":"record",'
    rb'"outputs":\[(?P<out>[^\]]*)\],"payload":\{"count":(?P<z0>[0-9]+),"counters":\{"turns":(?P<z1>[0-9]+)\},'
    rb'"first":(?P<p0>[0-9]+),"objects":\[\["b3:(?P<h1>[0-9a-f]{64})",(?P<z2>[0-9]+),"turns"\]\],'
    rb'"turns":"b3:(?P<h2>[0-9a-f]{64})"\},"prev":(?P<prev>null|"b3:[0-9a-f]{64}"),"seq":(?P<p1>[0-9]+),'
    rb'"time":"(?P<t>[^"]*)"\}')
_HEX_IN = re.compile(rb'b3:([0-9a-f]{64})')


def _template(line: bytes, full):
    """Per-byte bounds (lo, span: a byte b passes if 0 <= b - lo <= span, in one of two tries) for
    lines of `line`'s layout, and the id member's offset; None unless the usual-line regex matches
    `line`. The template is the regex with every repeat count fixed and some classes narrowed (the
    actor and the time's non-digits exact), and the time's digits are then range-checked as the
    store's templates do (blockcheck._times_ok): a line it passes is one the regex matches."""
    import numpy as np

    if not full(line):
        return None
    m = _FIELDS.fullmatch(line)
    lo1 = np.frombuffer(line + b"\n", np.uint8).copy()
    sp1 = np.zeros(len(lo1), np.uint8)
    hexcols = []
    spans = [m.span(g) for g in ("id", "h1", "h2")]
    for g in ("inp", "out", "prev"):
        spans += [(m.start(g) + h.start(1), m.start(g) + h.end(1)) for h in _HEX_IN.finditer(m[g])]
    for a, b in spans:
        lo1[a:b], sp1[a:b] = 0x30, 9      # 0-9, or a-f in the second try
        hexcols.extend(range(a, b))
    for g, zero_ok in (("z0", True), ("z1", True), ("z2", True), ("p0", False), ("p1", False)):
        a, b = m.span(g)
        lo1[a:b], sp1[a:b] = 0x30, 9
        if not (zero_ok and b - a == 1):   # no leading zero; seq and first are >= 1
            lo1[a], sp1[a] = 0x31, 8
    a = m.start("t")
    for d in re.finditer(rb'[0-9]', m["t"]):
        lo1[a + d.start()], sp1[a + d.start()] = 0x30, 9
    lo2, sp2 = lo1.copy(), sp1.copy()
    lo2[hexcols], sp2[hexcols] = 0x61, 5
    return lo1, sp1, lo2, sp2, line.find(b',"id":"'), m.start("t")


def templated(data: bytes, full, rows_at_once: int = 2048):
    """Which lines of `data` (each ending in a newline) a per-length template proves usual and whose
    hash matches its id (a numpy bool array; the rest would take check_line's path)."""
    import itertools
    import struct

    import numpy as np
    from blake3 import blake3

    from ledger.store import blockcheck

    a = np.frombuffer(data, np.uint8)
    ends = np.flatnonzero(a == 10)
    starts = np.concatenate(([0], ends[:-1] + 1))
    lens = ends - starts + 1
    proved = np.zeros(len(ends), bool)
    order = np.argsort(lens, kind="stable")
    cuts = np.flatnonzero(np.diff(lens[order])) + 1
    for group in np.split(order, cuts):
        width = int(lens[group[0]])
        s = int(starts[group[0]])
        t = _template(data[s:s + width - 1], full)
        if t is None:
            continue
        lo1, sp1, lo2, sp2, at, time_at = t
        window = np.lib.stride_tricks.sliding_window_view(a, width)
        unpack = f"{width - 76}s"
        for k in range(0, len(group), rows_at_once):
            rows = group[k:k + rows_at_once]
            x = window[starts[rows]]
            v = x - lo1                    # in place from here: temporaries of 2048 rows cost ~1 us a line
            first = v <= sp1
            np.subtract(x, lo2, out=v)
            first |= v <= sp2
            ok = first.all(axis=1) & blockcheck._times_ok(np, x, time_at)
            stripped = np.concatenate((x[:, :at], x[:, at + 75:width - 1]), axis=1).tobytes()
            digests = np.frombuffer(b"".join(map(blake3.digest, itertools.starmap(
                blake3, struct.iter_unpack(unpack, stripped)))), np.uint8).reshape(-1, 32)
            hexd = x[:, at + 10:at + 74]
            nibbles = (hexd & 0x0F) + 9 * (hexd >> 6)
            ok &= (((nibbles[:, 0::2] << 4) | nibbles[:, 1::2]) == digests).all(axis=1)
            proved[rows] = ok
    return proved


def _object_file(store: Path, oid: str) -> Path | None:
    hexd = oid[3:]
    for suffix in ("", ".z", ".c"):
        p = store / ".ledger" / "objects" / hexd[:2] / (hexd[2:] + suffix)
        if p.exists():
            return p
    return None


def floors(parts: dict[str, float]) -> dict[str, tuple[float, str]]:
    common = min(parts["lines and chain"] + parts["_proof"], parts["lines, chain and proof: templated"])
    # with the values: the parse-based proof holds them already; a regex or template proof must parse too
    valued = min(parts["lines and chain"] + parts["proof: parse, re-encode and compare"], common + parts["values"])
    return {
        "any pass": (common, "lines, chain and proof, the cheaper way"),
        "verify --full": (common + parts["object"], "any pass + object"),
        "index rebuild": (valued + parts["index row"], "any pass with the values + index row"),
        "first report": (valued, "any pass with the values"),
        "first gc": (common + parts["object"] + parts["object hash"], "any pass + object + object hash"),
    }


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("store", type=Path)
    ap.add_argument("--lines", type=int, default=200_000)
    ap.add_argument("--objects", type=int, default=20_000)
    a = ap.parse_args(argv)
    print(f"load average before: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    gc.disable()   # as the passes run (store/scan.py, without_collector): records hold no cycles
    parts = measure(a.store, a.lines, a.objects)
    print(f"{parts['_n']:,} lines ({parts['_shaped']:.1%} of the usual turn-batch shape), "
          f"{parts['_objects']:,} object files; CPU, best of {ROUNDS}, us a record:")
    for k, v in parts.items():
        if not k.startswith("_"):
            print(f"  {k:32s} {v:6.2f}")
    print(f"  {'proof (the cheapest)':32s} {parts['_proof']:6.2f}")
    print(f"floors (target <= {TARGET_US:g} us a record):")
    for name, (us, how) in floors(parts).items():
        print(f"  {name:15s} {us:6.2f} us  = {how}{'' if us <= TARGET_US else '  (above the target)'}")
    print(f"load average after: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
