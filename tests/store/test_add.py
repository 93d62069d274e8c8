import json

from ledger.store import Store
from tests.conftest import ledger_cmd


def test_readd_unchanged_is_noop(tmp_path):
    Store.init(tmp_path)
    (tmp_path / "f").write_bytes(b"data" * 1000)
    a = json.loads(ledger_cmd("add", "f", "--json", cwd=tmp_path, check=True).stdout)
    b = json.loads(ledger_cmd("add", "f", "--json", cwd=tmp_path, check=True).stdout)
    assert a["id"] == b["id"] and not a["unchanged"] and b["unchanged"]
    assert Store.open(tmp_path).state.seq == 2  # no second record


def test_changed_file_is_rehashed(tmp_path):
    Store.init(tmp_path)
    f = tmp_path / "f"
    f.write_bytes(b"one")
    a = json.loads(ledger_cmd("add", "f", "--json", cwd=tmp_path, check=True).stdout)
    f.write_bytes(b"two")
    b = json.loads(ledger_cmd("add", "f", "--json", cwd=tmp_path, check=True).stdout)
    assert a["id"] != b["id"] and not b["unchanged"]


def test_uncommitted_object_is_not_unchanged(tmp_path):
    """An object left by a crashed transaction must not make a re-add look done."""
    s = Store.init(tmp_path)
    (tmp_path / "f").write_bytes(b"payload")
    try:
        with s.transaction("add") as tx:
            tx.put_file(tmp_path / "f")
            raise RuntimeError
    except RuntimeError:
        pass
    b = json.loads(ledger_cmd("add", "f", "--json", cwd=tmp_path, check=True).stdout)
    assert not b["unchanged"] and Store.open(tmp_path).state.seq == 2


def test_add_directory_and_name(tmp_path):
    Store.init(tmp_path)
    d = tmp_path / "d"
    d.mkdir()
    (d / "x").write_text("1")
    (d / "y").write_text("2")
    a = json.loads(ledger_cmd("add", "d", "--name", "dd", "--kind", "dataset", "--json", cwd=tmp_path,
                              check=True).stdout)
    assert a["kind"] == "dataset" and a["size"] == 2
    shown = json.loads(ledger_cmd("show", "dd", "--json", cwd=tmp_path, check=True).stdout)
    assert [e["path"] for e in shown["object"]["entries"]] == ["x", "y"]
    again = json.loads(ledger_cmd("add", "d", "--name", "dd", "--json", cwd=tmp_path, check=True).stdout)
    assert again["unchanged"]
    (d / "y").write_text("3")
    changed = json.loads(ledger_cmd("add", "d", "--name", "dd", "--json", cwd=tmp_path, check=True).stdout)
    assert not changed["unchanged"] and changed["id"] != a["id"]


def test_cli_errors_are_one_line(tmp_path):
    p = ledger_cmd("log", cwd=tmp_path)
    assert p.returncode == 2 and "no ledger store" in p.stderr and "Traceback" not in p.stderr
    Store.init(tmp_path)
    p = ledger_cmd("add", "missing-file", cwd=tmp_path)
    assert p.returncode == 2 and "does not exist" in p.stderr
    p = ledger_cmd("show", "zzzz", cwd=tmp_path)
    assert p.returncode == 2 and "hint:" in p.stderr
    p = ledger_cmd("query", "select * from nowhere", cwd=tmp_path)
    assert p.returncode == 2 and "query failed" in p.stderr
    p = ledger_cmd("nosuchcommand", cwd=tmp_path)
    assert p.returncode == 2
    p = ledger_cmd("show", "zzzz", cwd=tmp_path, env={"LEDGER_DEBUG": "1"})
    assert "Traceback" in p.stderr


def test_log_and_query_json(tmp_path):
    Store.init(tmp_path)
    for i in range(3):
        (tmp_path / f"f{i}").write_text(str(i))
        ledger_cmd("add", f"f{i}", cwd=tmp_path, check=True)
    log = json.loads(ledger_cmd("log", "-n", "2", "--json", cwd=tmp_path, check=True).stdout)
    assert [r["seq"] for r in log] == [3, 4]
    sql = "select kind, count(*) as n from journal group by kind order by kind"
    rows = json.loads(ledger_cmd("query", sql, "--json", cwd=tmp_path, check=True).stdout)
    assert rows == [{"kind": "add", "n": 3}, {"kind": "init", "n": 1}]
    csv = ledger_cmd("query", "select seq from journal order by seq", "--csv", cwd=tmp_path, check=True).stdout
    assert csv.split() == ["seq", "1", "2", "3", "4"]


def test_store_option_and_env(tmp_path):
    Store.init(tmp_path / "s")
    (tmp_path / "f").write_text("x")
    ledger_cmd("--store", tmp_path / "s", "add", "f", cwd=tmp_path, check=True)
    p = ledger_cmd("log", "--json", cwd="/", env={"LEDGER_DIR": str(tmp_path / "s")}, check=True)
    assert len(json.loads(p.stdout)) == 2


def test_cat_json(tmp_path):
    Store.init(tmp_path)
    (tmp_path / "t").write_text("héllo")
    (tmp_path / "b").write_bytes(b"\xff\x00")
    ledger_cmd("add", "t", "--name", "t", cwd=tmp_path, check=True)
    ledger_cmd("add", "b", "--name", "b", cwd=tmp_path, check=True)
    assert json.loads(ledger_cmd("cat", "t", "--json", cwd=tmp_path, check=True).stdout)["text"] == "héllo"
    assert json.loads(ledger_cmd("cat", "b", "--json", cwd=tmp_path, check=True).stdout)["base64"] == "/wA="
    assert ledger_cmd("cat", "t", cwd=tmp_path, check=True).stdout == "héllo"


def test_large_add_imports_duckdb_during_the_copy(tmp_path):
    """A large copy waits on the disk: DuckDB (needed for the index update at commit) is
    imported on a thread meanwhile; a small add, and a re-add, never import it early."""
    import subprocess
    import sys

    code = """
import sys, threading
from ledger.store import Store, index, repo
from ledger.store.add import add_path
repo.PRELOAD_INDEX_BYTES = 1 << 20
started = []
real = threading.Thread.start
def spy(self):
    started.append(self.name)
    return real(self)
threading.Thread.start = spy
s = Store.open(sys.argv[1])
assert "duckdb" not in sys.modules
add_path(s, sys.argv[2])
print(started.count("preload-duckdb"), index.indexed_seq(s.root) == s.state.seq)
"""
    small, big = tmp_path / "small.bin", tmp_path / "big.bin"
    small.write_bytes(b"x" * 1000)
    big.write_bytes(b"y" * (2 << 20))
    def run(store, f):
        Store.init(tmp_path / store)
        return subprocess.run([sys.executable, "-c", code, str(tmp_path / store), str(f)],
                              capture_output=True, text=True, check=True).stdout.split()

    assert run("a", small) == ["0", "True"]
    assert run("b", big) == ["1", "True"]


def test_a_link_to_a_folder_inside_an_added_folder_is_refused_not_left_out(tmp_path):
    """A link to a file was refused, while a link to a folder was left out of the tree without a word."""
    (tmp_path / "d").mkdir()
    (tmp_path / "d" / "a").write_text("hi\n")
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "s").write_text("outside\n")
    (tmp_path / "d" / "linkdir").symlink_to("../other")
    ledger_cmd("init", cwd=tmp_path, check=True)
    p = ledger_cmd("add", "d", cwd=tmp_path)
    assert p.returncode == 2 and "linkdir is a symbolic link, not a folder" in p.stderr, (p.returncode, p.stderr)
    assert [r["kind"] for r in json.loads(ledger_cmd("log", "--json", cwd=tmp_path, check=True).stdout)] == ["init"]
