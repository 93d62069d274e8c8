"""Well-chained records with bad meaning (issue 17; docs/store-format.md, "Record schemas").

Each record here hashes to its id and names the previous record correctly: only its payload is
wrong in type or meaning. `verify` must name the record by seq and exit 4; no command may die
with an internal error (exit 1) on it. The last test is a hypothesis fuzzer over such journals."""

from __future__ import annotations

import contextlib
import io
import shutil
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ledger import experience, generations, records
from ledger.cli import main as cli
from ledger.errors import BadInput, JournalCorrupt
from ledger.image import context as ctxlib
from ledger.store import Store, canonical
from ledger.store.journal import record_id
from tests.conftest import ledger_cmd

# Commands that read the journal and must each end in 0 or a typed error, never 1.
READERS = [["verify"], ["log"], ["log", "--json"], ["gens"], ["gc"], ["index", "rebuild"],
           ["query", "select count(*) from journal"], ["show", "HEAD"]]


def _base(tmp_path: Path) -> Store:
    """A small store written by real code: init, add (with a name ref), two generations, turns,
    an outcome and an export."""
    s = Store.init(tmp_path)
    (tmp_path / "f.txt").write_text("hello")
    from ledger.store.add import add_path

    add_path(s, tmp_path / "f.txt", name="f")
    for note in ("first", "second"):
        with s.transaction("genesis" if note == "first" else "commit") as tx:
            generations.new_generation(tx, s, note=note)
            if note == "second":
                tx.payload.update({"cycle": 1, "verdict_name": "Accept"})
    experience.record(s, experience.parse_turns('{"situation": "s1", "action": "a1"}\n'
                                                '{"situation": "s2", "action": "a2"}', "turns"))
    experience.attach_outcome(s, "t1", "it worked")
    experience.export(s)
    return s


def _rechain(root: Path, recs: list[dict]) -> None:
    """Write `recs` as the journal, each re-hashed and chained to the one before (so the chain is
    valid), and drop the caches a hand edit would leave stale (refs.json and the index may go)."""
    prev, lines = None, []
    for n, r in enumerate(recs, 1):
        r = {**r, "seq": n, "prev": prev}
        r["id"] = record_id(r)
        prev = r["id"]
        lines.append(canonical.dumps(r) + b"\n")
    (root / ".ledger" / "journal").write_bytes(b"".join(lines))
    for cache in ("refs.json", "index.duckdb", "index.duckdb.wal"):
        (root / ".ledger" / cache).unlink(missing_ok=True)


def _records(s: Store) -> list[dict]:
    return [dict(r) for r in s.journal.scan().records]


def _append(s: Store, kind: str, payload: dict, inputs=(), outputs=()) -> int:
    recs = _records(s)
    recs.append({"seq": 0, "prev": None, "time": recs[-1]["time"], "kind": kind, "inputs": list(inputs),
                 "outputs": list(outputs), "actor": "forger", "payload": payload})
    _rechain(s.root.parent, recs)
    return len(recs)


def _blob(s: Store, data: bytes = b"not a generation") -> str:
    with s.transaction("add") as tx:
        oid = tx.put_bytes(data)
        tx.outputs.append(oid)
        tx.payload.update({"path": "/x", "kind": "blob", "size": len(data)})
    return oid


def _no_internal_errors(root: Path, commands=READERS):
    out = {}
    for args in commands:
        p = ledger_cmd(*args, cwd=root)
        assert p.returncode != 1, (args, p.returncode, p.stdout, p.stderr)
        assert "Traceback" not in p.stderr and "internal error" not in p.stderr, (args, p.stderr)
        out[" ".join(args)] = p
    return out


def _verify_names(root: Path, seq: int, *words: str):
    p = ledger_cmd("verify", cwd=root)
    assert p.returncode == 4, (p.stdout, p.stderr)
    text = " ".join((p.stdout + p.stderr).split())  # rich wraps long lines
    assert f"record {seq}" in text, text
    for w in words:
        assert w in text, (w, text)
    return p


# --- the named cases ----------------------------------------------------------------------------
def test_refs_given_as_a_list(tmp_path):
    s = _base(tmp_path)
    seq = _append(s, "add", {"path": "/y", "kind": "blob", "size": 1, "refs": ["HEAD"]})
    _verify_names(tmp_path, seq, "payload.refs must be an object")
    out = _no_internal_errors(tmp_path)
    assert out["log"].returncode == 0 and f" {seq} " in out["log"].stdout  # the record is shown, not hidden
    for cmd in ("gens", "index rebuild"):
        assert out[cmd].returncode == 4 and f"record {seq}" in out[cmd].stderr, out[cmd].stderr
    # a write on top of it is refused as corruption, and nothing is appended
    (tmp_path / "g.txt").write_text("more")
    p = ledger_cmd("add", "g.txt", cwd=tmp_path)
    assert p.returncode == 4 and f"record {seq}" in p.stderr
    assert len(_records(Store.open(tmp_path))) == seq


def test_head_moved_to_an_object_that_is_not_a_generation(tmp_path):
    s = _base(tmp_path)
    blob = _blob(s)
    seq = _append(s, "rollback", {"head": 0, "from": 1, "to": 0, "reason": "", "refs": {"HEAD": blob}}, inputs=[blob])
    _verify_names(tmp_path, seq, "HEAD is not a generation", "not a 'generation' object")
    _no_internal_errors(tmp_path, READERS + [["rollback"]])
    p = ledger_cmd("rollback", cwd=tmp_path)
    assert p.returncode == 4 and "not a generation manifest" in p.stderr


def test_head_moved_to_a_generation_that_does_not_exist(tmp_path):
    """A generation manifest that is stored but that no gen-N ref names (gen-7 was never made)."""
    s = _base(tmp_path)
    with s.transaction("add") as tx:
        ghost = tx.put_json({"kind": "generation", "n": 7, "parent": None, "base": None, "adapter": None,
                             "capabilities": {}, "kernels": {}, "receipt": None, "verdict": None, "note": "ghost"})
        tx.outputs.append(ghost)
        tx.payload.update({"path": "/ghost", "kind": "generation", "size": 1})
    seq = _append(s, "rollback", {"head": 7, "from": 1, "to": 7, "reason": "", "refs": {"HEAD": ghost}})
    p = _verify_names(tmp_path, seq, "HEAD is not a generation")
    assert ghost[:12] in p.stdout + p.stderr
    _no_internal_errors(tmp_path)


def test_head_moved_to_an_id_that_is_not_stored(tmp_path):
    s = _base(tmp_path)
    gone = "b3:" + "e" * 64
    seq = _append(s, "rollback", {"head": 0, "from": 1, "to": 0, "reason": "", "refs": {"HEAD": gone}})
    p = _verify_names(tmp_path, seq, "HEAD is not a generation")
    assert "missing" in p.stdout + p.stderr
    _no_internal_errors(tmp_path)


def test_generation_ref_to_an_object_of_the_wrong_kind(tmp_path):
    s = _base(tmp_path)
    blob = _blob(s)
    seq = _append(s, "commit", {"generation": 9, "cycle": 2, "verdict_name": "Accept", "refs": {"gen-9": blob}})
    _verify_names(tmp_path, seq, "ref gen-9 names", "not a 'generation' object")
    _no_internal_errors(tmp_path)


def test_payload_field_of_the_wrong_type_or_meaning(tmp_path):
    s = _base(tmp_path)
    seq = _append(s, "export", {"dataset": "b3:not-hex", "first": 5, "last": 2})
    _verify_names(tmp_path, seq, "payload.dataset must be a b3: id")
    _no_internal_errors(tmp_path)
    recs = _records(Store.open(tmp_path))
    recs[-1]["payload"] = {"dataset": recs[5]["outputs"][0] if recs[5]["outputs"] else "b3:" + "a" * 64,
                           "first": 5, "last": 2}
    _rechain(tmp_path, recs)
    _verify_names(tmp_path, seq, "payload.last (2) is before payload.first (5)")


def test_named_object_of_the_wrong_kind(tmp_path):
    """`record.turns` must name a turns batch: a blob there is named by verify, and the index
    (whose turns table it would feed) is still rebuilt."""
    s = _base(tmp_path)
    blob = _blob(s)
    seq = _append(s, "record", {"turns": blob, "first": 3, "count": 1})
    _verify_names(tmp_path, seq, "payload.turns names", "not a 'turns' object")
    out = _no_internal_errors(tmp_path)
    assert out["index rebuild"].returncode == 0


def test_counters_that_are_not_integers(tmp_path):
    s = _base(tmp_path)
    seq = _append(s, "record", {"turns": _records(s)[5]["payload"].get("turns", "b3:" + "a" * 64), "first": 3,
                                "count": 1, "counters": {"turns": "1"}})
    _verify_names(tmp_path, seq, "payload.counters")
    _no_internal_errors(tmp_path)


def test_the_good_base_store_is_clean(tmp_path):
    """The cases above start from a store verify calls clean: their faults are the forged records."""
    _base(tmp_path)
    p = ledger_cmd("verify", cwd=tmp_path)
    assert p.returncode == 0, p.stdout + p.stderr


# --- the fuzzer ---------------------------------------------------------------------------------
JSON = st.recursive(st.none() | st.booleans() | st.integers(-2**70, 2**70)
                    | st.floats(allow_nan=False, allow_infinity=False) | st.text(max_size=12)
                    | st.just("b3:" + "a" * 64) | st.just("t1") | st.just("HEAD"),
                    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3),
                    max_leaves=8)
KEYS = st.sampled_from(["refs", "counters", "objects", "first", "last", "count", "turns", "dataset", "turn",
                        "outcome", "time", "path", "kind", "size", "name", "generation", "head", "from", "to",
                        "format", "cycle", "verdict_name", "receipt", "verdict", "x"])
MUTATION = st.one_of(
    st.tuples(st.just("set"), KEYS, JSON),
    st.tuples(st.just("drop"), KEYS, st.none()),
    st.tuples(st.just("kind"), st.sampled_from(sorted(records.KINDS) + ["t", ""]), st.none()),
    st.tuples(st.just("payload"), st.just(None), JSON),
    st.tuples(st.just("refs"), st.sampled_from(["HEAD", "gen-0", "gen-5", "suite", "name/f"]),
              st.sampled_from([None, "b3:" + "a" * 64, "nope"])),
)


# and a few commands whose domain code reads payload fields (cycle, runs, diff, report, export)
FUZZ_MORE = [["runs"], ["diff", "gen-0", "gen-1"], ["export"], ["report", "--out", "report.html"]]


def _run(root: Path, args: list[str]) -> tuple[int, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = cli.main(["--store", str(root), *args])
        except SystemExit as e:  # typer's own exits (usage)
            code = e.code if isinstance(e.code, int) else 2
    return code, out.getvalue() + err.getvalue()


@pytest.fixture(scope="module")
def base_store(tmp_path_factory):
    d = tmp_path_factory.mktemp("ill-formed-base")
    s = _base(d)
    # turns waiting for an export, so `export` reads the record and outcome payloads too
    experience.record(s, experience.parse_turns('{"situation": "s3", "action": "a3"}', "turns"))
    experience.attach_outcome(s, "t3", "later")
    return d


@settings(max_examples=50, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_fuzz_mutated_payloads_never_give_internal_errors(base_store, tmp_path_factory, data):
    root = tmp_path_factory.mktemp("fuzz")
    shutil.copytree(base_store / ".ledger", root / ".ledger")
    recs = _records(Store.open(root))
    seq = data.draw(st.integers(2, len(recs)), label="seq")
    what, key, value = data.draw(MUTATION, label="mutation")
    rec = recs[seq - 1]
    payload = dict(rec["payload"])
    if what == "set":
        payload[key] = value
    elif what == "drop":
        payload.pop(key, None)
    elif what == "kind":
        rec["kind"] = key
    elif what == "payload":
        payload = value if isinstance(value, dict) else {"value": value}
    elif what == "refs":
        payload["refs"] = {**(payload.get("refs") if isinstance(payload.get("refs"), dict) else {}), key: value}
    rec["payload"] = payload
    if not isinstance(rec["payload"], dict) or not rec["kind"]:
        rec["kind"] = rec["kind"] or "t"  # parse_line's own rules (an object payload) are not this test's subject
    _rechain(root, recs)
    try:
        schema_ok = rec["kind"] not in records.KINDS or records.parse(rec) is not None
    except BadInput:
        schema_ok = False
    for args in READERS + FUZZ_MORE:
        code, text = _run(root, args)
        assert code in (0, 2, 3, 4, 5), (args, code, text, rec)
        assert "internal error" not in text, (args, text, rec)
        if args == ["verify"] and not schema_ok:
            assert code == 4 and f"record {seq}" in " ".join(text.split()), (text, rec)


def test_domain_readers_refuse_an_ill_formed_record_as_corruption(tmp_path):
    """`export` reads outcome and record payloads (experience.turns_between): an outcome record
    without its outcome is JournalCorrupt naming it (exit 4), not a KeyError (exit 1)."""
    _base(tmp_path)
    (tmp_path / "turns.jsonl").write_text('{"situation": "s3", "action": "a3"}\n')
    assert ledger_cmd("record", "turns.jsonl", cwd=tmp_path).returncode == 0
    seq = _append(Store.open(tmp_path), "outcome", {"turn": "t3", "time": "2026-01-01T00:00:00.000000Z"})
    _verify_names(tmp_path, seq, "payload.outcome is missing")
    p = ledger_cmd("export", cwd=tmp_path)
    assert p.returncode == 4 and f"journal record {seq} is ill-formed" in p.stderr, p.stderr


@pytest.mark.parametrize("kind", ["judge", "record", "export", "train", "reproduce", "outcome", "commit", "refusal",
                                  "rollback", "seal", "track", "image"])
def test_every_reader_command_on_fields_of_the_wrong_type(tmp_path, kind):
    """Every field a reader might use, each of a wrong type, in a record of `kind`: no command
    exits 1 (`report` once did, on a turns batch whose `first` was a string)."""
    s = _base(tmp_path)
    seq = _append(s, kind, {"verdict": 5, "receipt": [1], "cycle": "x", "first": "a", "last": [], "turns": 3,
                            "turn": 5, "dataset": 1, "count": "z", "from": "q", "comparison": 3, "of": [],
                            "outcome": 7, "plan": 1, "learner_view": 2, "generation": "g", "head": "h",
                            "context": 9, "run": 4, "suite": 1, "event": 2})
    _verify_names(tmp_path, seq, "is ill-formed")
    _no_internal_errors(tmp_path, [["log"], ["gens"], ["index", "rebuild"], ["runs"],
                                   ["report", "-o", str(tmp_path / "r.html")]])


def test_the_learn_cycle_refuses_an_ill_formed_cycle_record(tmp_path):
    """`ledger run` looks for an unfinished cycle (cycle.open_cycle): an export whose cycle is a
    list was an unhashable-type crash (exit 1); now it is JournalCorrupt naming the record."""
    s = _base(tmp_path)
    dataset = next(r for r in _records(s) if r["kind"] == "export")["payload"]["dataset"]
    seq = _append(s, "export", {"dataset": dataset, "first": 1, "last": 2, "cycle": [1]})
    p = ledger_cmd("run", cwd=tmp_path)
    assert p.returncode == 4 and f"journal record {seq} is ill-formed" in p.stderr, p.stderr
    _verify_names(tmp_path, seq, "payload.cycle must be an integer")


def test_gc_refuses_before_removing_anything(tmp_path):
    """gc judges reachability from the fold: on a record it cannot fold it refuses (exit 4)
    before it removes a file, rather than remove and then fail to record it."""
    s = _base(tmp_path)
    loose, _ = s.objects.put_bytes(b"no record reaches me")
    seq = _append(s, "add", {"path": "/y", "kind": "blob", "size": 1, "refs": ["HEAD"]})
    p = ledger_cmd("gc", "--prune", cwd=tmp_path)
    assert p.returncode == 4 and f"record {seq}" in p.stderr, p.stderr
    assert Store.open(tmp_path).objects.has(loose)


def test_request_lookup_refuses_an_ill_formed_batch(tmp_path):
    """The image's exactly-once lookup (image/context.find_request) read `requests` as given: a
    string there matched a request id as a substring and named a wrong turn. Now it is typed."""
    s = _base(tmp_path)
    turns = next(r for r in _records(s) if r["kind"] == "record")["payload"]["turns"]
    seq = _append(s, "record", {"turns": turns, "first": 3, "count": 1, "requests": "r1r2"})
    with pytest.raises(JournalCorrupt, match=f"journal record {seq} is ill-formed: .*requests"):
        ctxlib.find_request(Store.open(tmp_path), "r2")
    with pytest.raises(JournalCorrupt):
        ctxlib.recent_requests(Store.open(tmp_path))
