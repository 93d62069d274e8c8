"""Actions run through the capability entry of the generation being served, with its grants."""

import pytest

from ledger import generations
from ledger.capabilities import admission
from ledger.image import act as actlib
from ledger.store import Store
from tests.image.conftest import ADDER


@pytest.fixture(scope="module")
def gen_store(tmp_path_factory):
    s = Store.init(tmp_path_factory.mktemp("act"))
    admission.admit(s, ADDER / "adder.wat", ADDER / "adder.toml")
    return s


def test_call_refusal_text_and_errors(gen_store):
    g = generations.head(gen_store)
    o = actlib.perform(gen_store, g, "call adder.add(3, 4)")
    assert (o.kind, o.outcome, o.refusal, o.error) == ("call", "7", False, False)
    assert o.call["results"] == ["7"] and o.call["fuel_used"] > 0
    assert actlib.perform(gen_store, g, "call adder.mean(1, 2)").outcome == "1.5"
    o = actlib.perform(gen_store, g, "refuse: deleting system files is not permitted")
    assert (o.kind, o.outcome, o.refusal) == ("refusal", "refused", True)
    assert actlib.perform(gen_store, g, "the answer is 7").to_json() == \
        {"kind": "text", "outcome": None, "refusal": False, "call": None, "error": False}
    for action, why in (("call calc.mul(2, 3)", "no capability named 'calc'"), ("call adder.add(1)", "takes 2 arguments"),
                        ("call adder.nope(1)", "nope"), ("call adder.add(x, 1)", "not an i32"),
                        ('call adder.add("a, 1)', "unterminated")):
        o = actlib.perform(gen_store, g, action)
        assert o.kind == "call" and o.error and o.outcome.startswith("error:") and why in o.outcome, (action, o.outcome)


def test_the_served_generation_decides_not_head(gen_store):
    """A generation without the capability cannot call it, even while HEAD has it."""
    with gen_store.transaction("commit") as tx:
        bare = generations.new_generation(tx, gen_store, capabilities={}, note="test: no capabilities")
    o = actlib.perform(gen_store, bare, "call adder.add(3, 4)")
    assert o.error and "no capability named 'adder'" in o.outcome
    old = generations.load(gen_store, "gen-0")
    assert actlib.perform(gen_store, old, "call adder.add(3, 4)").outcome == "7"
