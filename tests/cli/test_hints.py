"""Hints fit the mistake (issue 19): no stock phrase where something specific can be said."""

import pytest

from ledger.errors import BadInput
from ledger.store import Store
from tests.conftest import ledger_cmd


@pytest.mark.parametrize("sql,hint", [
    ("selec 1", "does not parse"),
    ("select * from nope", "tables: journal"),
    ("select nope from journal", "tables: journal"),
    ("delete from journal", "read-only"),
])
def test_query_hints_name_the_kind_of_mistake(tmp_path, sql, hint):
    Store.init(tmp_path)
    p = ledger_cmd("query", sql, cwd=tmp_path)
    assert p.returncode == 2 and hint in p.stderr.splitlines()[-1], p.stderr


def test_a_bad_input_without_its_own_hint_points_at_the_commands_help(tmp_path):
    from ledger.cli.main import _command_path, _specific_hint

    assert _command_path(["--store", "x", "bundle", "create", "--json", "HEAD"]) == "ledger bundle create"
    assert _command_path(["diff", "a", "b"]) == "ledger diff"
    assert _command_path(["nonsense"]) == "ledger"
    stock = BadInput("bad")
    assert _specific_hint(stock, ["seal", "dir"]) == "see `ledger seal --help` for what it accepts"
    own = BadInput("bad", "give a folder")
    assert _specific_hint(own, ["seal", "dir"]) == "give a folder"
    assert "check the input named above" not in ledger_cmd("runs", "--limit", "0", cwd=tmp_path).stderr
