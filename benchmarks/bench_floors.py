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
  whole column at once (C++, no Python object per line: the columnar bound);
- hold the record's values (`values`, orjson.loads): the folds of verify and report and the
  index's rows are made of them (a columnar proof still needs them for those);

and, by the pass's own rules:

- `verify --full` and the first `gc` open each object a record names (`object`: open, fstat,
  read, close of the store's own object files, warm page cache), and gc hashes what it reads
  (rule 22: children only from bytes that hash to the id; `object hash`);
- `index rebuild` appends each record's journal row to DuckDB (`index row`: Arrow batches of
  5,000 rows of the journal table's columns, as the rebuild appends them, then a CHECKPOINT).

Each part is the best of 5 rounds of CPU time (process_time), in us a record. The floor of a
pass is the sum of its parts; the pass's measured figure (bench_scale.py, RESULTS.md) is above
its floor by what the pass does besides. This is an analysis, not a contest: there is no peer
program that does a pass's work, so none is timed beside it.
"""

from __future__ import annotations

import argparse
import gc
import os
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
    plain = rb'"[ !#-\[\]-~]*"'
    oid = rb'"b3:[0-9a-f]{64}"'
    ids = rb'\[(?:' + oid + rb'(?:,' + oid + rb')*)?\]'
    shape = records.Record.LINE_SHAPE[0].pattern
    return (rb'\{"actor":' + plain + rb',"id":' + oid + rb',"inputs":' + ids + rb',"kind":"record","outputs":'
            + ids + shape + rb'(?:null|' + oid + rb'),"seq":[1-9][0-9]{0,17},"time":' + plain + rb'\}')


def measure(store: Path, n_lines: int, n_objects: int) -> dict[str, float]:
    import re

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
            h.hexdigest()
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


def _object_file(store: Path, oid: str) -> Path | None:
    hexd = oid[3:]
    for suffix in ("", ".z", ".c"):
        p = store / ".ledger" / "objects" / hexd[:2] / (hexd[2:] + suffix)
        if p.exists():
            return p
    return None


def floors(parts: dict[str, float]) -> dict[str, tuple[float, str]]:
    common = parts["lines and chain"] + parts["_proof"]
    # with the values: the parse-based proof holds them already; a regex proof must parse too
    valued = parts["lines and chain"] + min(parts["proof: parse, re-encode and compare"],
                                            parts["_proof"] + parts["values"])
    return {
        "any pass": (common, "lines and chain + proof"),
        "verify --full": (common + parts["object"], "lines and chain + proof + object"),
        "index rebuild": (valued + parts["index row"], "lines and chain + proof with values + index row"),
        "first report": (valued, "lines and chain + proof with values"),
        "first gc": (common + parts["object"] + parts["object hash"], "lines and chain + proof + object + object hash"),
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
