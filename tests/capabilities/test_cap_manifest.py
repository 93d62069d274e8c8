"""Manifests: validated up front, every fault a SpecError naming its field; canonical ids."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ledger.capabilities import manifest
from ledger.capabilities.manifest import Handle, Limits
from ledger.errors import BadInput, LedgerError, SpecError
from ledger.store import canonical
from tests.capabilities.helpers import EXAMPLES, manifest_toml


def _m(**over):
    d = {"name": "adder", "exports": [{"name": "add", "params": ["i32", "i32"], "results": ["i32"]}],
         "tests": [{"name": "t", "export": "add", "args": [2, 3], "expect": [5]}]}
    d.update(over)
    return d


def test_examples_load_and_round_trip_through_canonical_json():
    for name in ("adder", "spin", "notes"):
        m = manifest.load(EXAMPLES / f"{name}.toml")
        j = m.to_json()
        again = manifest.from_json(canonical.loads(canonical.dumps(j)))
        assert again == m and again.id == m.id
        assert canonical.loads(canonical.dumps(j), strict=False) == j


def test_defaults_and_normalisation():
    m = manifest.from_json(_m(handles=[{"kind": "stdout"}, {"kind": "dir", "path": "./data/"}, {"kind": "stdout"}]))
    assert m.limits == Limits()
    assert m.handles == (Handle("dir", "data", "ro"), Handle("stdout"))   # sorted, de-duplicated, ro default
    assert m.tests[0].expect == (5,)


def test_values_are_coerced_by_type():
    m = manifest.from_json(_m(
        exports=[{"name": "f", "params": ["i32", "i64", "f32", "f64"], "results": ["i32"]}],
        tests=[{"name": "t", "export": "f", "args": [4294967295, -1, 0.1, 3], "expect": 7}]))
    a = m.tests[0].args
    assert a[0] == -1 and a[1] == -1 and a[2] != 0.1 and abs(a[2] - 0.1) < 1e-8 and a[3] == 3.0
    assert m.tests[0].expect == (7,)


@pytest.mark.parametrize("over, field", [
    ({"name": "Bad Name"}, "name"),
    ({"exports": []}, "[[exports]]"),
    ({"exports": [{"name": "add", "params": ["i128"], "results": []}]}, "exports[0]"),
    ({"tests": []}, "[[tests]]"),
    ({"tests": [{"name": "t", "export": "nope", "args": [], "expect": []}]}, "not declared"),
    ({"tests": [{"name": "t", "export": "add", "args": [1], "expect": [1]}]}, "takes 2 args"),
    ({"tests": [{"name": "t", "export": "add", "args": [1, 2], "expect": [1], "trap": "UNREACHABLE"}]}, "exactly one"),
    ({"tests": [{"name": "t", "export": "add", "args": [1, 2]}]}, "exactly one"),
    ({"tests": [{"name": "t", "export": "add", "args": [1 << 40, 2], "expect": [1]}]}, "not an i32"),
    ({"tests": [{"name": "t", "export": "add", "args": [1.5, 2], "expect": [1]}]}, "not an i32"),
    ({"tests": [{"name": "t", "export": "add", "args": [True, 2], "expect": [1]}]}, "not an i32"),
    ({"limits": {"fuel": 0}}, "limits.fuel"),
    ({"limits": {"fuel": 10 ** 12}}, "limits.fuel"),
    ({"limits": {"time_ms": 600_001}}, "limits.time_ms"),
    ({"limits": {"memory_mib": 4096}}, "limits.memory_mib"),
    ({"limits": {"stack": 1}}, "[limits]"),
    ({"handles": [{"kind": "net"}]}, "kind must be"),
    ({"handles": [{"kind": "dir", "path": "/etc"}]}, "relative"),
    ({"handles": [{"kind": "dir", "path": "a/../../b"}]}, "'..'"),
    ({"handles": [{"kind": "dir", "path": "data", "mode": "rwx"}]}, "mode"),
    ({"handles": [{"kind": "stdout", "path": "x"}]}, "unknown keys"),
    ({"extra": 1}, "unknown keys"),
])
def test_bad_manifests_name_the_field(over, field):
    with pytest.raises(SpecError) as ei:
        manifest.from_json(_m(**over))
    assert field in ei.value.message and ei.value.exit_code == 2


def test_non_finite_floats_are_refused(tmp_path):
    p = tmp_path / "m.toml"
    p.write_text(manifest_toml("f", {"f": (["f64"], ["f64"])}, [{"name": "t", "export": "f", "args": [1.0], "expect": [1.0]}])
                 .replace("expect = [1.0]", "expect = [nan]"))
    with pytest.raises(SpecError) as ei:
        manifest.load(p)
    assert "not finite" in ei.value.message


def test_load_errors(tmp_path):
    with pytest.raises(BadInput):
        manifest.load(tmp_path / "missing.toml")
    (tmp_path / "bad.toml").write_text("name = [")
    with pytest.raises(SpecError):
        manifest.load(tmp_path / "bad.toml")


def test_parse_arg():
    assert manifest.parse_arg("0x10", "i32", "a") == 16
    assert manifest.parse_arg("4294967295", "i32", "a") == -1
    assert manifest.parse_arg("-5", "i64", "a") == -5
    assert manifest.parse_arg("2.5", "f64", "a") == 2.5
    for bad, ty in (("1.5", "i32"), ("x", "f64"), (str(1 << 64), "i64"), ("1e40", "f32")):
        with pytest.raises(BadInput):
            manifest.parse_arg(bad, ty, "a")


def test_limits_override_stays_within_host_maxima():
    lim = Limits(fuel=10, time_ms=10)
    assert lim.override(fuel=5).fuel == 5 and lim.override(time_ms=7).time_ms == 7
    with pytest.raises(BadInput):
        lim.override(fuel=manifest.MAX_FUEL + 1)
    with pytest.raises(BadInput):
        lim.override(time_ms=0)


json_values = st.recursive(st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=8),
                           lambda c: st.lists(c, max_size=4) | st.dictionaries(st.text(max_size=8), c, max_size=4),
                           max_leaves=20)


@settings(max_examples=200, deadline=None)
@given(st.dictionaries(st.sampled_from(["name", "exports", "tests", "handles", "limits", "description", "x"]),
                       json_values, max_size=6))
def test_arbitrary_input_raises_only_typed_errors(d):
    try:
        manifest.from_json(d)
    except LedgerError:
        pass


@settings(max_examples=200, deadline=None)
@given(st.text(max_size=40))
def test_arbitrary_handle_text_raises_only_typed_errors(s):
    try:
        h = Handle.parse(s)
    except LedgerError:
        return
    assert Handle.parse(str(h)) == h


@settings(max_examples=300, deadline=None)
@given(st.text(max_size=30), st.sampled_from(["i32", "i64", "f32", "f64"]))
def test_arbitrary_call_arguments_raise_only_typed_errors(text, ty):
    try:
        manifest.parse_arg(text, ty, "arg")
    except LedgerError as e:
        assert e.exit_code == 2
