"""Bad input found by a sweep of the real CLI (session 9, helper HFZ): each case once exited 1
(internal error), hung, wrote into the store before refusing, or replaced a special file. The
house rule: bad input gets a typed error with its documented exit code and changes nothing."""

from __future__ import annotations

import hashlib
import os
import stat
from pathlib import Path

import pytest

from tests.conftest import ledger_cmd

ROOT = Path(__file__).resolve().parents[2]


def _no_internal(p, code=2):
    assert p.returncode == code, (p.returncode, p.stdout[-500:], p.stderr[-1500:])
    assert "internal error" not in p.stderr and "Traceback" not in p.stderr, p.stderr


def _state(store: Path) -> dict:
    """What a refused command must leave as it was: the journal, refs and every object file."""
    led = store / ".ledger"
    out = {}
    for p in sorted(led.rglob("*")):
        rel = p.relative_to(led)
        if rel.parts[0] in ("cache", "tmp") or rel.name.startswith("index.duckdb"):
            continue
        if p.is_file() and not p.is_symlink():
            out[str(rel)] = hashlib.sha256(p.read_bytes()).hexdigest()
    return out




@pytest.fixture
def store(tmp_path):
    ledger_cmd("init", tmp_path, check=True)
    return tmp_path


def _named_blob(store, tmp_path):
    (tmp_path / "in.txt").write_text("hello\n")
    ledger_cmd("--store", store, "add", "--name", "hello", tmp_path / "in.txt", check=True)


# --- init on something that is not a folder --------------------------------------------------------
def _special(tmp_path: Path, kind: str) -> Path:
    p = tmp_path / kind
    if kind == "file":
        p.write_text("x")
    elif kind == "fifo":
        os.mkfifo(p)
    elif kind == "loop":
        os.symlink(tmp_path / "loop-b", p)
        os.symlink(p, tmp_path / "loop-b")
    elif kind == "dangling":
        os.symlink(tmp_path / "nowhere", p)
    elif kind == "under-a-file":
        (tmp_path / "f").write_text("x")
        p = tmp_path / "f" / "sub"
    return p


@pytest.mark.parametrize("kind", ["file", "fifo", "loop", "dangling", "under-a-file"])
def test_init_on_a_path_that_is_not_a_folder_is_bad_input(tmp_path, kind):
    p = _special(tmp_path, kind)
    r = ledger_cmd("init", p, timeout=60)
    _no_internal(r)
    assert str(p) in r.stderr


# --- checkout / report / bundle create to a path under a file --------------------------------------
def test_checkout_into_a_path_under_a_file_is_bad_input(store, tmp_path):
    (tmp_path / "f").write_text("x")
    (tmp_path / "d").mkdir()
    (tmp_path / "d" / "in.txt").write_text("hello\n")
    ledger_cmd("--store", store, "add", "--name", "folder", tmp_path / "d", check=True)
    r = ledger_cmd("--store", store, "checkout", "folder", tmp_path / "f" / "sub")   # a tree: mkdir under a file
    _no_internal(r)


def test_report_to_a_path_under_a_file_is_bad_input(store, tmp_path):
    (tmp_path / "f").write_text("x")
    r = ledger_cmd("--store", store, "report", "-o", tmp_path / "f" / "r.html")
    _no_internal(r)


@pytest.mark.parametrize("where", ["under-a-file", "empty"])
def test_bundle_create_to_a_bad_path_is_bad_input(store, tmp_path, where):
    _named_blob(store, tmp_path)
    out = str(tmp_path / "f" / "b.bundle") if where == "under-a-file" else ""
    (tmp_path / "f").write_text("x")
    r = ledger_cmd("--store", store, "bundle", "create", "-o", out, "hello", cwd=tmp_path)
    _no_internal(r)


# --- an output that is a FIFO (or a device: `-o /dev/null` as root replaced /dev/null) -------------
@pytest.mark.parametrize("command", [["report", "-o"], ["bundle", "create", "hello", "-o"]])
def test_an_output_that_is_a_special_file_is_never_replaced(store, tmp_path, command):
    _named_blob(store, tmp_path)
    fifo = tmp_path / "out"
    os.mkfifo(fifo)
    r = ledger_cmd("--store", store, *command, fifo, timeout=60)
    _no_internal(r)
    assert stat.S_ISFIFO(os.lstat(fifo).st_mode), "the FIFO was replaced by a regular file"


# --- target and spec files that are not UTF-8 TOML, or nested past the parser's depth ---------------
@pytest.mark.parametrize("content", [b"\xff\xfe\x00garbage", b"a = " + b"[" * 5000 + b"]" * 5000 + b"\n"])
def test_targets_file_that_is_not_toml_is_a_spec_error(store, tmp_path, content):
    f = tmp_path / "t.toml"
    f.write_bytes(content)
    r = ledger_cmd("--store", store, "targets", "--targets", f)
    _no_internal(r)


def test_a_spec_nested_past_the_parsers_depth_is_a_spec_error(store, tmp_path):
    f = tmp_path / "deep.toml"
    f.write_text("a = " + "[" * 5000 + "]" * 5000 + "\n")
    r = ledger_cmd("--store", store, "compile", f)
    _no_internal(r)


# --- record: JSONL a json.loads ValueError without .msg, or nested past the recursion limit ---------
@pytest.mark.parametrize("line", [
    '{"situation": "s", "action": "a", "time": ' + "9" * 5000 + '}',   # int too long to convert
    '{"situation": ' + "[" * 100000 + "]" * 100000 + '}',               # past the recursion limit
])
def test_record_of_a_line_json_cannot_take_is_bad_input(store, tmp_path, line):
    f = tmp_path / "turns.jsonl"
    f.write_text(line + "\n")
    before = _state(store)
    r = ledger_cmd("--store", store, "record", f)
    _no_internal(r)
    assert "line 1" in r.stderr
    assert _state(store) == before


# --- import-base of a GGUF whose header the gguf reader chokes on -----------------------------------
def test_import_base_of_a_truncated_gguf_is_bad_input(store, tmp_path):
    pytest.importorskip("gguf")
    f = tmp_path / "m.gguf"
    f.write_bytes(b"GGUF\x03\x00\x00\x00" + b"\xff" * 16)
    r = ledger_cmd("--store", store, "import-base", f)
    _no_internal(r)


# --- seconds that are not a number --------------------------------------------------------------------
@pytest.mark.parametrize("command", [["act", "--timeout", "nan", "hi"], ["outcome", "--timeout", "nan", "rq-1", "v"],
                                     ["act", "--timeout", "-1", "hi"]])
def test_a_timeout_that_is_not_a_positive_number_is_bad_input(store, command):
    r = ledger_cmd("--store", store, *command, timeout=30)
    _no_internal(r)
    assert "--timeout" in r.stderr


# --- demo --dir a file ---------------------------------------------------------------------------------
def test_demo_dir_that_is_a_file_is_bad_input(tmp_path):
    f = tmp_path / "f"
    f.write_text("x")
    r = ledger_cmd("demo", "--tiny", "--dir", f, timeout=60)
    _no_internal(r)
    assert f.read_text() == "x"


# --- compile --explain a bad ref: refused before the plan is committed --------------------------------
@pytest.mark.parametrize("explain", ["gen-999", "gen-0"])
def test_compile_explain_of_a_bad_ref_writes_nothing(store, explain):
    before = _state(store)
    r = ledger_cmd("--store", store, "compile", "--explain", explain, ROOT / "examples" / "tiny.toml")
    _no_internal(r)
    assert _state(store) == before


# --- reproduce with tolerances that are not finite, non-negative numbers -----------------------------
@pytest.mark.parametrize("opt", [["--loss-tol", "nan"], ["--weight-tol", "inf"], ["--loss-tol", "-1"]])
def test_reproduce_with_a_bad_tolerance_is_refused_before_it_runs(store, opt):
    before = _state(store)
    r = ledger_cmd("--store", store, "reproduce", *opt, "b3:" + "0" * 64, timeout=60)
    _no_internal(r)
    assert opt[0] in r.stderr
    assert _state(store) == before


# --- spec and key files that are FIFOs: refused, never waited on --------------------------------------
@pytest.mark.parametrize("command", [["compile"], ["targets", "--targets"], ["key", "trust"]])
def test_a_fifo_given_as_an_input_file_does_not_hang(store, tmp_path, command):
    fifo = tmp_path / "in.toml"
    os.mkfifo(fifo)
    r = ledger_cmd("--store", store, *command, fifo, timeout=30)
    _no_internal(r)


# --- query (ledger/store/index.py, owned elsewhere this session) --------------------------------------
@pytest.mark.parametrize("sql", ["", "  ", "/* only a comment */"])
def test_query_of_empty_sql_is_bad_input_or_no_rows(store, sql):
    # an empty SQL string read cur.description of None (AttributeError, exit 1)
    r = ledger_cmd("--store", store, "query", sql)
    _no_internal(r, 0 if sql.strip() else 2)


@pytest.mark.parametrize("sql", ["COPY journal TO '{out}'", "EXPORT DATABASE '{out}'", "SELECT * FROM read_csv('{secret}')",
                                 "ATTACH '{out}' AS x", "SET enable_external_access = true"])
def test_query_reads_and_writes_no_file(store, tmp_path, sql):
    # 'read-only SQL' ran COPY ... TO and EXPORT DATABASE (DuckDB's external access was on),
    # writing files anywhere, and could read any file
    out, secret = tmp_path / "leak", tmp_path / "secret.csv"
    secret.write_text("password\nhunter2\n")
    r = ledger_cmd("--store", store, "query", sql.format(out=out, secret=secret))
    assert r.returncode == 2 and not out.exists() and "hunter2" not in r.stdout, (r.stdout, r.stderr)
    _no_internal(r)


# --- remote add with an empty URL or path (it meant the current folder), or a file as its folder --
@pytest.mark.parametrize("url", ["", "file://", "FILE"])
def test_remote_add_of_an_empty_or_file_path_is_bad_input(store, tmp_path, url):
    f = tmp_path / "a-file"
    f.write_text("x")
    before = _state(store)
    r = ledger_cmd("--store", store, "remote", "add", "origin", str(f) if url == "FILE" else url, cwd=tmp_path)
    _no_internal(r)
    assert _state(store) == before


def test_a_capability_manifest_that_is_a_fifo_does_not_hang(store, tmp_path):
    fifo = tmp_path / "m.toml"
    os.mkfifo(fifo)
    r = ledger_cmd("--store", store, "capability", "add", "-m", fifo,
                   ROOT / "examples" / "capabilities" / "adder.wat", timeout=30)
    _no_internal(r)


# --- run / serve --learn: a bad --target or --spec is refused at the start, not at the first cycle ---
@pytest.mark.parametrize("command", [["run", "--target", "no-such-target"],
                                     ["serve", "--learn", "--target", "no-such-target"],
                                     ["serve", "--learn", "--detach", "--spec", "BAD"]])
def test_a_learn_cycles_bad_target_or_spec_is_refused_at_the_start(store, tmp_path, command):
    bad = tmp_path / "bad.toml"
    bad.write_text("[model\n")
    before = _state(store)
    r = ledger_cmd("--store", store, *[str(bad) if a == "BAD" else a for a in command], timeout=60)
    _no_internal(r)
    assert "no-such-target" in r.stderr or "not valid TOML" in r.stderr
    assert _state(store) == before


def test_a_spec_path_that_is_a_folder_gets_a_hint_about_files(store, tmp_path):
    r = ledger_cmd("--store", store, "compile", tmp_path)
    _no_internal(r)
    assert "fix the field named above" not in r.stderr


# --- add --name: '' was accepted (exit 0) and silently stored no name; gen-N / HEAD was stored as
# name/gen-N, which the generation shadows for ever (the hint then listed 'gen-1, gen-1') --------
@pytest.mark.parametrize("name", ["", "HEAD", "gen-0", "gen-7"])
def test_add_with_an_empty_or_shadowed_name_is_bad_input(store, tmp_path, name):
    f = tmp_path / "in.txt"
    f.write_text("hello\n")
    before = _state(store)
    r = ledger_cmd("--store", store, "add", "--name", name, f)
    _no_internal(r)
    assert _state(store) == before


def test_add_with_the_name_of_an_existing_ref_is_bad_input(tmp_path):
    """`suite` once a suite is sealed: `show suite` answers the ref first, never name/suite."""
    from pathlib import Path as P

    ledger_cmd("init", cwd=tmp_path, check=True)
    ledger_cmd("seal", P(__file__).resolve().parents[2] / "examples" / "suite", cwd=tmp_path, check=True)
    f = tmp_path / "in.txt"
    f.write_text("hello\n")
    before = _state(tmp_path)
    r = ledger_cmd("add", "--name", "suite", f, cwd=tmp_path)
    _no_internal(r)
    assert "already names a ref" in r.stderr and _state(tmp_path) == before


@pytest.mark.parametrize("n", ["0", "-3", "99999999999999999999999"])
def test_runs_limit_out_of_range_is_bad_input_with_its_own_message(store, n):
    # the huge one reached DuckDB and came back as its raw "Conversion Error" (exit 2, no hint of ours)
    r = ledger_cmd("--store", store, "runs", "-n", n)
    _no_internal(r)
    assert "--limit must be a positive number" in r.stderr and "Conversion Error" not in r.stderr, r.stderr


@pytest.mark.parametrize("situation, extra", [("s", ["--max-new", "0"]), ("s", ["--max-new", "100"]), ("", [])])
def test_act_with_bad_input_says_so_before_it_looks_for_an_image(store, situation, extra):
    # it was checked by the image only: with none serving, it said "no image is serving" (exit 3)
    r = ledger_cmd("--store", store, "act", situation, *extra)
    _no_internal(r)
    assert "no image" not in r.stderr, r.stderr

