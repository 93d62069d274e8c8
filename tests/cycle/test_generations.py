import json
import signal

import pytest

from ledger import generations as G
from ledger.errors import BadInput
from ledger.store import Store
from tests.conftest import ledger_cmd
from tests.reliability.helpers import assert_consistent


def _three_gens(tmp_path):
    s = Store.init(tmp_path)
    for i in range(3):
        with s.transaction("commit") as tx:
            G.new_generation(tx, s, note=f"g{i}")
    return s


def test_rollback_twice_and_undo(tmp_path):
    s = _three_gens(tmp_path)
    assert G.head(s).n == 2
    assert G.rollback(s)["to"] == "gen-1"
    assert G.rollback(s)["to"] == "gen-0"
    with pytest.raises(BadInput):
        G.rollback(s)  # gen-0 has no parent
    assert G.rollback(s, undo=True)["to"] == "gen-1"
    assert G.rollback(s, "gen-2")["to"] == "gen-2"  # a rollback rolled back
    assert G.numbers(s) == [0, 1, 2]  # nothing deleted
    assert_consistent(s.root)


def test_rollback_cli_and_gens(tmp_path):
    _three_gens(tmp_path)
    p = ledger_cmd("rollback", "--json", "--reason", "bad gen", cwd=tmp_path, check=True)
    assert json.loads(p.stdout)["to"] == "gen-1"
    rows = json.loads(ledger_cmd("gens", "--json", cwd=tmp_path, check=True).stdout)
    assert [r["name"] for r in rows if r["head"]] == ["gen-1"]
    assert len(rows) == 3
    p = ledger_cmd("rollback", "gen-7", cwd=tmp_path)
    assert p.returncode == 2


def test_crash_during_rollback(tmp_path):
    s = _three_gens(tmp_path)
    trace = tmp_path / "trace"
    probe = Store.init(tmp_path / "probe")
    for i in range(2):
        with probe.transaction("commit") as tx:
            G.new_generation(tx, probe)
    ledger_cmd("rollback", cwd=tmp_path / "probe", env={"LEDGER_FAULT_TRACE": str(trace)}, check=True)
    npoints = len(trace.read_text().splitlines())
    for n in range(1, npoints + 1):
        pre = G.head(Store.open(s.root))
        p = ledger_cmd("rollback", "gen-2" if pre.n != 2 else "gen-1", cwd=tmp_path, env={"LEDGER_FAULT_AT": str(n)})
        assert p.returncode == -signal.SIGKILL
        store = assert_consistent(s.root)
        now = G.head(store)
        assert now.n in (pre.n, 1 if pre.n == 2 else 2)
    assert_consistent(s.root)


def test_gens_lists_the_newest_by_default_and_heads_always_and_says_what_it_left_out(tmp_path):
    s = _three_gens(tmp_path)           # gen-0 .. gen-2
    for i in range(3, 6):
        with s.transaction("commit") as tx:
            G.new_generation(tx, s, note=f"g{i}")
    G.rollback(s, "gen-1")             # HEAD is an old generation now
    rows = json.loads(ledger_cmd("gens", "-n", "2", "--json", cwd=tmp_path, check=True).stdout)
    assert [r["name"] for r in rows] == ["gen-1", "gen-4", "gen-5"]          # the newest two, and HEAD's
    assert [r["name"] for r in rows if r["head"]] == ["gen-1"]
    every = json.loads(ledger_cmd("gens", "--all", "--json", cwd=tmp_path, check=True).stdout)
    assert [r["name"] for r in every] == [f"gen-{i}" for i in range(6)]
    text = ledger_cmd("gens", "-n", "2", cwd=tmp_path, check=True).stdout
    assert "3 older generations not shown" in text and "--all" in text
    assert "older" not in ledger_cmd("gens", cwd=tmp_path, check=True).stdout   # 6 <= the default 20
    assert ledger_cmd("gens", "-n", "-1", cwd=tmp_path).returncode == 2
