"""An unknown ref says what the user probably meant (issue 19: did-you-mean for refs)."""

import pytest

from ledger.errors import UnknownRef
from ledger.store import Store
from tests.conftest import ledger_cmd


def _named(store, *names):
    for n in names:
        with store.transaction("add") as tx:
            tx.refs[f"name/{n}"] = tx.put_bytes(n.encode())


@pytest.mark.parametrize("typed,meant", [("Base", "base"), ("base_weights", "base-weights"), ("bse", "base")])
def test_close_names_are_suggested(store, typed, meant):
    _named(store, "base", "base-weights", "tokenizer")
    with pytest.raises(UnknownRef) as e:
        store.resolve(typed)
    assert f"`{meant}`" in e.value.hint


def test_head_and_gen_before_any_generation_say_how_to_make_one(store):
    for typed in ("Head", "HEAD", "gen1", "gen-1"):
        with pytest.raises(UnknownRef) as e:
            store.resolve(typed)
        assert "ledger run" in e.value.hint


def test_the_cli_prints_the_suggestion(tmp_path):
    store = Store.init(tmp_path)
    _named(store, "adapter")
    p = ledger_cmd("--store", store.root, "show", "adaptr")
    assert p.returncode == 2
    assert "did you mean `adapter`?" in p.stderr
