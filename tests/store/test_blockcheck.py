"""store/blockcheck.py proves whole blocks of usual journal lines at once (issue 18): a line it
proves must be one check_line accepts, with the record check_line gives, and a scan must read the
same records and report the same damage whether or not lines take the bulk path; a run of proved
lines read as columns must hold its records' values, and a fold of runs (the report's) must end as
the fold record by record (docs/store-format.md, "Lines proved in bulk")."""

from __future__ import annotations

import dataclasses
import random
import re

import numpy as np
import orjson
import pytest
from blake3 import blake3

from ledger import records
from ledger.errors import BadInput
from ledger.store import Store, blockcheck, canonical, journal, schema
from ledger.store.scan import check_line

ID_AT = b',"id":"'


def _lines(n: int, seed: int = 0, put=None) -> list[bytes]:
    """n chained journal lines as `ledger record` and the image write them: an init record, turn
    batches of a few sizes from two actors, and now and then an outcome (a kind without tokens).
    With `put` (a store's put_bytes), each batch names a real turns object of its recorded size;
    else random ids."""
    rng = random.Random(seed)
    recs = [journal.make_record(1, None, "init", [], [], "root@vm", {"format": 2})]
    first = 1
    for seq in range(2, n + 1):
        prev = recs[-1]["id"]
        if seq % 97 == 0:
            rec = journal.make_record(seq, prev, "outcome", [], [], "agent",
                                      {"turn": f"t{max(first - 1, 1)}", "outcome": "ok", "time": "2026-12-03T00:00:00Z"})
        else:
            oid, size = "b3:" + rng.randbytes(32).hex(), rng.randrange(100, 100_000)
            count = rng.choice([1, 2, 2, 2, 3, 10])
            if put is not None:
                batch = {"kind": "turns", "first": first, "turns": [{"id": f"t{first + i}", "situation": "x" * rng.randrange(30)}
                                                                    for i in range(count)]}
                data = canonical.dumps(batch)
                oid, size = put(data)[0], len(data)
            written = [oid, size, "turns"]
            if seq % 23 == 0:   # now and then the object written is not the batch named (gc's named ids)
                other = canonical.dumps({"kind": "turns", "first": 0, "turns": [], "seq": seq})
                written = [put(other)[0] if put is not None else "b3:" + rng.randbytes(32).hex(), len(other), "turns"]
            payload = {"count": count, "counters": {"turns": count}, "first": first,
                       "objects": [written], "turns": oid}
            # now and then other envelope lists: an input, a second output, none (Run.envelope_lists)
            inputs = ["b3:" + rng.randbytes(32).hex()] if seq % 13 == 0 else []
            outputs = [oid, "b3:" + rng.randbytes(32).hex()] if seq % 17 == 0 else [] if seq % 19 == 0 else [oid]
            rec = journal.make_record(seq, prev, "record", inputs, outputs, rng.choice(["root@vm", "image"]), payload)
            first += count
        recs.append(rec)
    return [canonical.dumps(r) for r in recs]


def _flags(data: bytes) -> bytes | None:
    block = blockcheck.prove(data)
    return None if block is None else block.flags


def _block(lines: list[bytes]) -> bytes:
    return b"".join(x + b"\n" for x in lines)


def _rehash(line: bytes) -> bytes:
    """`line` with its id member set to the hash of the rest: only the proof then decides."""
    at = line.find(ID_AT)
    h = blake3(line[:at])
    h.update(line[at + 75:])
    return line[:at + 10] + h.hexdigest().encode() + line[at + 74:]


def _single_byte_edits(line: bytes) -> list[bytes]:
    """Every edit of one byte of `line` outside its id member (any value but the newline), rehashed."""
    at = line.find(ID_AT)
    out = []
    for i in range(len(line)):
        if at <= i < at + 75:
            continue
        for b in range(256):
            if b != 10 and b != line[i]:
                out.append(_rehash(line[:i] + bytes([b]) + line[i + 1:]))
    return out


def test_every_proved_line_is_the_record_check_line_gives():
    lines = _lines(6000)
    proved = _flags(_block(lines))
    assert proved is not None and len(proved) == len(lines)
    batches = [i for i, x in enumerate(lines) if b'"kind":"record"' in x]
    assert sum(proved[i] for i in batches) >= 0.95 * len(batches)
    for line, ok in zip(lines, proved):
        if ok:
            assert orjson.loads(line) == check_line(line)
    # kinds without line tokens always take check_line's path
    assert not any(proved[i] for i, x in enumerate(lines) if b'"kind":"record"' not in x)


def test_every_single_byte_edit_a_template_proves_is_a_line_check_line_accepts():
    line = _lines(3)[2]
    mutants = _single_byte_edits(line)
    proved = _flags(_block([line, *mutants]))
    assert proved[0]
    passed = [m for m, ok in zip(mutants, proved[1:]) if ok]
    assert len(passed) > 1000, "hex and digit edits keep a line usual"
    for m in passed:
        assert orjson.loads(m) == check_line(m)
    # and the edits of every kind the check must refuse were in the mix, unproved
    refused = [m for m, ok in zip(mutants, proved[1:]) if not ok]
    assert any(b'"count":0' in m or b'"first":0' in m for m in refused)


def test_the_edit_test_has_teeth_a_template_allowing_leading_zeros_is_caught(monkeypatch):
    # A template that let the first digit of a multi-digit integer be 0 would prove non-canonical
    # lines: the check above must see that, or it proves nothing about the real template.
    real = blockcheck._template

    def lax(np_, line):
        t = real(np_, line)
        if t is None:
            return None
        lo1, sp1, lo2, sp2 = t.lo1.copy(), t.sp1.copy(), t.lo2.copy(), t.sp2.copy()
        for lo, sp in ((lo1, sp1), (lo2, sp2)):
            lead = (lo == 0x31) & (sp == 8)
            lo[lead], sp[lead] = 0x30, 9
        return dataclasses.replace(t, lo1=lo1, sp1=sp1, lo2=lo2, sp2=sp2)

    monkeypatch.setattr(blockcheck, "_template", lax)
    line = _lines(3)[2]
    mutants = _single_byte_edits(line)
    proved = _flags(_block([line, *mutants]))
    bad = 0
    for m, ok in zip(mutants, proved[1:]):
        if ok:
            try:
                check_line(m)
            except BadInput:
                bad += 1
    assert bad > 0


def test_a_line_that_does_not_hash_to_its_id_is_not_proved():
    lines = _lines(5000)
    i = 2500
    assert b'"kind":"record"' in lines[i]
    at = lines[i].find(ID_AT) + 10
    wrong = lines[i][:at] + (b"0" if lines[i][at:at + 1] != b"0" else b"1") + lines[i][at + 1:]
    with pytest.raises(BadInput):
        check_line(wrong)
    good = _flags(_block(lines))
    bad = _flags(_block(lines[:i] + [wrong] + lines[i + 1:]))
    assert good[i] == 1 and bad[i] == 0
    assert bad[:i] + bad[i + 1:] == good[:i] + good[i + 1:]


def test_a_short_block_is_not_proved_in_bulk():
    lines = _lines(blockcheck.MIN_LINES - 1)
    assert _flags(_block(lines)) is None
    assert _flags(_block(lines + _lines(blockcheck.MIN_LINES + 1)[-1:])) is not None


def _flip_digit(line: bytes) -> bytes:
    """`line` with the first digit of its batch's size changed: still usual, no longer its hash."""
    at = line.find(b'",', line.find(b'"objects":[["')) + 2
    return line[:at] + (b"7" if line[at:at + 1] != b"7" else b"8") + line[at + 1:]


DAMAGE = {
    "intact": lambda ls: ls,
    "a digit changed mid-journal": lambda ls: ls[:5001] + [_flip_digit(ls[5001])] + ls[5002:],
    "a byte that breaks the JSON mid-journal": lambda ls: ls[:7001] + [ls[7001].replace(b"{", b"[", 1)] + ls[7002:],
    "a record missing (a seq skip)": lambda ls: ls[:6000] + ls[6001:],
    "a record rehashed, its successor's prev stale": lambda ls: ls[:4500] + [_rehash(_flip_digit(ls[4500]))] + ls[4501:],
    "a torn tail": lambda ls: ls + [ls[-1][:100]],
}


def _damaged_store(tmp_path, monkeypatch, damage: str):
    """A store whose journal is 12,000 lines with `damage` done to them, read in blocks of ~5000
    lines: the first two hold more than MIN_LINES lines (bulk), the last fewer, and the
    boundaries fall inside lines. (store, lines)"""
    lines = DAMAGE[damage](_lines(12_000))
    data = _block(lines)
    if damage == "a torn tail":
        data = data[:-1]
    store = Store.init(tmp_path)
    store.journal.path.write_bytes(data)
    monkeypatch.setattr(journal, "SCAN_BLOCK", len(data) * 5000 // len(lines) + 17)
    return store, lines


@pytest.mark.parametrize("damage", DAMAGE)
def test_a_scan_reads_the_same_with_and_without_the_bulk_path(tmp_path, monkeypatch, damage):
    store, lines = _damaged_store(tmp_path, monkeypatch, damage)
    real, bulk = blockcheck.prove, []

    def spy(block):
        proof = real(block)
        bulk.append(0 if proof is None else sum(proof.flags))
        return proof

    def fields(sc):
        return sc.records, sc.end, sc.torn, sc.broken_at, sc.problem, sc.last_seq, sc.last_id

    monkeypatch.setattr(blockcheck, "prove", spy)
    fast = fields(journal.Journal(store.root).scan())
    monkeypatch.setattr(blockcheck, "prove", lambda block: None)
    slow = fields(journal.Journal(store.root).scan())
    assert fast == slow
    assert bulk[0] > 4000, "the bulk path was taken"
    if damage == "intact":
        assert len(fast[0]) == 12_000 and fast[3] is None and bulk[-1] == 0   # and the line path
    elif damage == "a torn tail":
        assert len(fast[0]) == 12_000 and fast[2] == lines[-1][:100] and fast[3] is None
    else:
        assert fast[3] is not None and fast[4]


def test_the_templates_are_learned_from_whole_line_matches_only():
    # an actor holding a quote's escape is canonical JSON but not a plain string: such a line is
    # never a sample, so it and its look-alikes go to check_line
    lines = _lines(5000)
    odd = [journal.make_record(5001, orjson.loads(lines[-1])["id"], "record", [], [], 'a\\"b',
                               orjson.loads(lines[-1])["payload"])]
    line = canonical.dumps(odd[0])
    assert check_line(line)
    proved = _flags(_block(lines + [line]))
    assert proved[-1] == 0
    assert np.frombuffer(proved, np.uint8)[:-1].sum() > 4000


def _runs(block: blockcheck.Block):
    """Every run of the block, in order, with the index of its first line."""
    i, n = 0, len(block.flags)
    while i < n:
        if block.flags[i] and block.run_kind(i):
            run = block.run(i)
            yield i, run
            i += len(run)
        else:
            i += 1


def test_a_runs_columns_are_the_values_of_its_records():
    lines = _lines(6000)
    block = blockcheck.prove(_block(lines))
    seen = lists = 0
    for i, run in _runs(block):
        assert run.kind == "record"
        firsts, counts, turns = records.read_batch_run(run)
        for k in range(len(run)):
            rec = check_line(lines[i + k])
            p = records.read(rec)
            assert (int(run.seq[k]), run.id(k), "b3:" + run.prevs[k].tobytes().decode()) == \
                (rec["seq"], rec["id"], rec["prev"])
            assert (int(firsts[k]), int(counts[k]), turns(k)) == (p.first, p.count, p.turns)
            assert run.line(k) == lines[i + k] and run.time(k) == rec["time"]
            assert run.listed(k) == (rec["inputs"], rec["outputs"])
            # the kind's LineFields are the whole of what verify reads from the payload
            h = schema.hooks(run.kind)
            f, pay = h.line_fields, rec["payload"]

            def part(p):
                return run.hex_id(p, k) if run.tokens[p] == schema.HEX_ID else int(run.parts[p][k])
            assert pay["objects"] == [[part(i), part(z), kind] for i, z, kind in f.objects]
            assert pay["counters"] == {name: part(p) for name, p in f.counters}
            assert "refs" not in pay and "chunk_lists" not in pay and "name" not in pay
            assert h.object_kinds(pay) == {key: (part(p), kind) for key, p, kind in f.named}
            lists += bool(rec["inputs"]) or len(rec["outputs"]) != 1
        assert run.end == sum(len(x) + 1 for x in lines[:i + len(run)])
        seen += len(run)
    assert seen >= 0.95 * sum(b'"kind":"record"' in x for x in lines)
    assert lists > 500   # lines of other lists were in the runs (their own templates)
    # a run chains from the record before it, and says where the chain breaks
    i, run = max(_runs(block), key=lambda r: len(r[1]))
    before = check_line(lines[i - 1])
    assert run.chained(before["seq"] + 1, before["id"]) == len(run)
    assert run.chained(before["seq"] + 2, before["id"]) == 0
    assert run.chained(before["seq"] + 1, None) == 0
    bad = dataclasses.replace(run, seq=run.seq.copy())
    bad.seq[3] += 1
    assert bad.chained(before["seq"] + 1, before["id"]) == 3


@pytest.mark.parametrize("damage", DAMAGE)
def test_a_scan_with_bulk_runs_reads_every_record_once_and_the_same_damage(tmp_path, monkeypatch, damage):
    store, _ = _damaged_store(tmp_path, monkeypatch, damage)
    j = journal.Journal(store.root)
    want = j.scan()
    got, runs = [], []

    def run_rows(run):
        runs.append(len(run))
        got.extend(check_line(run.line(k)) for k in range(len(run)))

    sc = j.scan(keep=False, each=got.append, bulk={"record": run_rows})
    assert got == want.records
    assert (sc.end, sc.torn, sc.broken_at, sc.problem, sc.last_seq, sc.last_id) == \
        (want.end, want.torn, want.broken_at, want.problem, want.last_seq, want.last_id)
    assert sum(runs) > 4000


def test_the_reports_fold_of_bulk_runs_is_its_fold_record_by_record(tmp_path, monkeypatch):
    from ledger.report import model

    store = Store.init(tmp_path)
    store.journal.path.write_bytes(_block(_lines(20_000)))
    fast = model._Fold()
    sc = store.journal.scan(keep=False, each=lambda r, line: fast.add(store, r, line), lines=True,
                            bulk={"record": fast.add_batches})
    assert sc.broken_at is None
    slow = model._Fold()
    monkeypatch.setattr(blockcheck, "prove", lambda block: None)
    store.journal.scan(keep=False, each=lambda r, line: slow.add(store, r, line), lines=True)
    assert vars(fast) == vars(slow)
    assert slow.turns_total > 20_000 and len(slow.outcomes) > 0 and slow.counts["outcome"] == 206


def _big_counts(n: int) -> list[bytes]:
    """n chained lines whose batches from 2000 to 2009 each count 10**18 - 1 turns (the most a
    COUNT holds): a run's counts then add up past 2**63 (helper-43's counterexample)."""
    recs = [journal.make_record(1, None, "init", [], [], "root@vm", {"format": 2})]
    first = 1
    for seq in range(2, n + 1):
        oid = "b3:" + blake3(str(seq).encode()).hexdigest()
        count = 10**18 - 1 if 2000 <= seq < 2010 else 2
        payload = {"count": count, "counters": {"turns": count}, "first": first,
                   "objects": [[oid, 500, "turns"]], "turns": oid}
        recs.append(journal.make_record(seq, recs[-1]["id"], "record", [], [oid], "root@vm", payload))
        first += 2     # payload.first stays within 64 bits (the schema's bound)
    return [canonical.dumps(r) for r in recs]


def test_the_reports_fold_of_runs_adds_counts_exactly(tmp_path, monkeypatch):
    from ledger.report import model

    store = Store.init(tmp_path)
    store.journal.path.write_bytes(_block(_big_counts(5000)))
    fast, slow = model._Fold(), model._Fold()
    store.journal.scan(keep=False, each=lambda r, line: fast.add(store, r, line), lines=True,
                       bulk={"record": fast.add_batches})
    monkeypatch.setattr(blockcheck, "prove", lambda block: None)
    store.journal.scan(keep=False, each=lambda r, line: slow.add(store, r, line), lines=True)
    assert vars(fast) == vars(slow)
    assert fast.turns_total == 10 * (10**18 - 1) + 2 * 4989 > 2**63


def test_a_scan_from_a_seq_no_line_can_hold_reports_the_break_with_or_without_bulk(tmp_path, monkeypatch):
    # a start past any proved seq (from the API, or a saved state naming one) is a broken chain,
    # as without bulk, never an overflow in the columns' compare
    lines = _lines(6000)
    store = Store.init(tmp_path)
    store.journal.path.write_bytes(_block(lines))
    start = sum(len(x) + 1 for x in lines[:2])
    prev = check_line(lines[1])["id"]
    for seq in (2**63, 2**70, 10**18, 0):
        got = []
        fast = store.journal.scan(start, seq, prev, keep=False, each=got.append, bulk={"record": got.append})
        slow = journal.Journal(store.root)
        with monkeypatch.context() as m:
            m.setattr(blockcheck, "prove", lambda block: None)
            want = slow.scan(start, seq, prev, keep=False)
        assert got == [] and fast.broken_at == want.broken_at == seq and fast.problem == want.problem


def _verify_store(tmp_path, damage: str):
    """A store of 6000 records naming real turns objects (and, now and then, inputs and second
    outputs that are missing), with `damage` done to its objects or caches. (store, lines)"""
    store = Store.init(tmp_path)
    lines = _lines(6000, put=store.objects.put_bytes)
    store.journal.path.write_bytes(_block(lines))
    for cache in ("refs.json", "index.duckdb", "index.duckdb.wal"):   # of the journal init wrote
        (store.root / cache).unlink(missing_ok=True)
    recs = [orjson.loads(x) for x in lines]
    batches = [r for r in recs if r["kind"] == "record"]
    if damage == "an object of another size":
        # one a record with an input names, and one a record naming it alone writes (a run's
        # rows of these two shapes take different ways to the objects' batch)
        alone = next(r for r in batches[4500:] if not r["inputs"] and r["outputs"] == [r["payload"]["turns"]]
                     and r["payload"]["objects"][0][0] == r["payload"]["turns"])
        for r in (batches[4000], alone):
            path = store.objects.path(r["payload"]["turns"])
            path.chmod(0o644)
            path.write_bytes(path.read_bytes() + b" ")
    elif damage == "an object missing":
        store.objects.path(batches[2500]["payload"]["turns"]).unlink()
    elif damage == "links for the objects records name first, two a record":
        # each record that names an input names it before its turns object, and finds both damaged:
        # a run must examine, so report, them in the line path's order (inputs first)
        for r in batches:
            if r["inputs"]:
                for oid in (r["inputs"][0], r["payload"]["turns"]):
                    path = store.objects.path(oid)
                    path.parent.mkdir(parents=True, exist_ok=True)
                    path.unlink(missing_ok=True)
                    path.symlink_to("/etc/hostname")
    elif damage in ("refs.json at a record in a run", "refs.json at a record in a run, wrong"):
        # the fold's state at a seq inside a run (verify compares a cache's state with it)
        at = recs[3000]
        turns = sum(r["payload"]["count"] for r in recs[:3001] if r["kind"] == "record")
        turns += damage.endswith("wrong")
        cache = {"seq": at["seq"], "head": at["id"], "refs": {}, "counters": {"turns": turns},
                 "offset": sum(len(x) + 1 for x in lines[:3001]), "store": store.store_id}
        (store.root / "refs.json").write_bytes(canonical.dumps(cache))
    return store, lines


VERIFY_DAMAGE = ("intact", "an object of another size", "an object missing", "refs.json at a record in a run",
                 "refs.json at a record in a run, wrong", "links for the objects records name first, two a record")


def _spy(monkeypatch, owner, name) -> list:
    """Wrap owner.name, whose last argument is a Run, and list the length of each run it is given:
    the proof that a bulk path was taken, not only that its answers match the line path's."""
    real, lengths = getattr(owner, name), []

    def spy(*args):
        lengths.append(len(args[-1]))
        return real(*args)

    monkeypatch.setattr(owner, name, spy)
    return lengths


@pytest.mark.parametrize("damage", VERIFY_DAMAGE)
def test_verify_reports_the_same_with_and_without_bulk_runs(tmp_path, monkeypatch, damage):
    from ledger.store import verify

    store, lines = _verify_store(tmp_path, damage)
    refs = store.root / "refs.json"
    cache = refs.read_bytes() if refs.exists() else None

    def report():
        # each verify from the same files: the caches a verify moves aside or writes put back
        refs.unlink(missing_ok=True)
        if cache is not None:
            refs.write_bytes(cache)
        (store.root / "cache" / "verified.json").unlink(missing_ok=True)
        for aside in store.tmp.glob("refs-rejected-*"):
            aside.unlink()
        rep = verify.verify(Store.open(tmp_path), full=True).to_json()
        return orjson.loads(re.sub(rb"refs-rejected-[0-9a-f]+", b"refs-rejected-X", orjson.dumps(rep)))

    runs = _spy(monkeypatch, verify._RecordChecks, "add_run")
    fast = report()
    assert sum(runs) > 5000, "the bulk path was taken"
    monkeypatch.setattr(verify._RecordChecks, "bulk", lambda self: {})
    proved = report()        # proved lines, record by record
    monkeypatch.setattr(blockcheck, "prove", lambda block: None)
    slow = report()          # every line through check_line
    assert fast == proved == slow
    errors = {e["what"] for e in fast["errors"]}
    missing = sum(1 for x in lines if b'"kind":"record"' in x and (b'"inputs":["' in x or b'"]],' in x))
    assert fast["stats"]["records"] == 6000 and missing > 250
    want = {"intact": set(), "an object of another size": {"corrupt"}, "an object missing": set(),
            "refs.json at a record in a run": set(), "refs.json at a record in a run, wrong": {"refs-cache"},
            "links for the objects records name first, two a record": {"corrupt"}}[damage]
    assert errors - {"missing"} == want, fast["errors"][:3]


def test_an_index_rebuilt_with_bulk_runs_is_the_index_rebuilt_line_by_line(tmp_path, monkeypatch):
    from ledger.store import index

    store, lines = _verify_store(tmp_path, "intact")
    # the first 1000 records projected whole (the eager part: line by line), then batches of 700
    # records, so runs and the line path's rows share batches
    monkeypatch.setattr(index, "REBUILD_EAGER", 1000)
    monkeypatch.setattr(index, "BATCH_RECORDS", 700)
    def rebuilt():
        Store.open(tmp_path).rebuild_index()
        Store.open(tmp_path).query("SELECT count(*) FROM turns")   # the deferred turns filled
        order = {t: [r[0] for r in index.query(store.root, f"SELECT seq FROM {t} ORDER BY rowid")[1]]
                 for t in ("journal", "objects")}
        return index.dump(store.root), order, index.indexed_meta(store.root)

    made = _spy(monkeypatch, index, "_run_tables")
    fast = rebuilt()
    assert sum(made) > 4000, "rows were made from runs"
    monkeypatch.setattr(blockcheck, "prove", lambda block: None)
    slow = rebuilt()
    assert fast == slow
    tables, order, meta = fast
    turns = sum(orjson.loads(x)["payload"]["count"] for x in lines if b'"kind":"record"' in x)
    assert (len(tables["journal"]), len(tables["objects"]), len(tables["turns"])) == (6000, 5938, turns)
    assert all(seqs == sorted(seqs) for seqs in order.values()), "rows appended in journal order"
    assert meta["seq"] == 6000


def test_gcs_walk_of_bulk_runs_is_its_walk_line_by_line(tmp_path, monkeypatch):
    from ledger.store import gc, reach

    store, lines = _verify_store(tmp_path, "intact")
    store.objects.put_bytes(b'{"kind":"turns","turns":[]}')   # reached by no record
    def walk():
        for saved in (store.root / "cache").glob("reach.*"):
            saved.unlink()   # gc's saved state: each walk from record 1
        s = Store.open(tmp_path)
        w = gc._walk(s)
        reached, not_kept, inputs = w.result()
        saved = (store.root / "cache" / "reach.bin").read_bytes()
        return ([a.tolist() for a in (reached, not_kept, inputs)], sorted(w.unresolved), sorted(w.special), saved,
                gc.plan(s).to_json())

    walked = _spy(monkeypatch, reach, "run_ids")
    fast = walk()
    assert sum(walked) > 5000, "runs were walked whole"
    monkeypatch.setattr(blockcheck, "prove", lambda block: None)
    slow = walk()
    assert fast == slow
    assert len(fast[0][0]) > 5900 and len(fast[0][2]) > 400 and len(fast[4]["unreachable"]) == 1
