"""The wire protocol and the action grammar: validation, framing, typed errors across the wire."""

import pytest

from ledger.errors import BadInput, ImageUnavailable, InternalError, Locked
from ledger.image import act as actlib
from ledger.image import protocol


def test_act_request_validation():
    ok = protocol.parse_act({"op": "act", "id": "r-1", "situation": "user: hi"})
    assert ok == {"id": "r-1", "situation": "user: hi", "action": None, "max_new": 48, "wait_recorded": False}
    for bad in ({"op": "act", "id": "", "situation": "s"}, {"op": "act", "id": "a b", "situation": "s"},
                {"op": "act", "id": "x" * 65, "situation": "s"}, {"op": "act", "id": "r", "situation": " "},
                {"op": "act", "id": "r", "situation": "s", "max_new": 0},
                {"op": "act", "id": "r", "situation": "s", "max_new": 49},
                {"op": "act", "id": "r", "situation": "s", "max_new": True},
                {"op": "act", "id": "r", "situation": "s", "action": ""},
                {"op": "act", "id": "r", "situation": "s", "wait_recorded": 1},
                {"op": "act", "id": "r", "situation": "s", "extra": 1}):
        with pytest.raises(BadInput):
            protocol.parse_act(bad)


def test_framing_and_errors_round_trip():
    line = protocol.encode({"op": "ping", "id": "é"})
    assert line.endswith(b"\n") and line.count(b"\n") == 1
    assert protocol.decode(line[:-1]) == {"op": "ping", "id": "é"}
    for bad in (b"[1]", b"not json", b"\xff"):
        with pytest.raises(BadInput):
            protocol.decode(bad)
    r = protocol.LineReader(None)
    assert r.feed(b'{"a":1}\n{"b"') == [b'{"a":1}']
    assert r.feed(b":2}\n") == [b'{"b":2}']
    e = protocol.to_error(protocol.error("r", Locked("held", "wait")))
    assert isinstance(e, Locked) and e.message == "held" and e.hint == "wait" and e.exit_code == 5
    e = protocol.to_error({"ok": False, "error": {"type": "NoSuchThing", "message": "m"}})
    assert isinstance(e, InternalError)


def test_no_image_is_a_typed_refusal(tmp_path):
    with pytest.raises(ImageUnavailable) as ei:
        protocol.act(tmp_path / ".ledger", "user: hi", timeout=2)
    assert ei.value.exit_code == 3


@pytest.mark.parametrize("action,call", [
    ("call adder.add(3, 4)", actlib.Call("adder", "add", ("3", "4"))),
    ("call adder.add()", actlib.Call("adder", "add", ())),
    ('call weather.get("rome, italy")', actlib.Call("weather", "get", ("rome, italy",))),
    ("call a-b.c_d( 1 ,2 )  ", actlib.Call("a-b", "c_d", ("1", "2"))),
    ("refuse: no", None), ("hello", None), ("call adder", None), ("callx adder.add(1)", None),
])
def test_call_grammar(action, call):
    assert actlib.parse(action) == call


@pytest.mark.parametrize("bad", ["call a.b(1,,2)", 'call a.b("x)', "call a.b(1,)"])
def test_malformed_calls(bad):
    with pytest.raises(BadInput):
        actlib.parse(bad)
