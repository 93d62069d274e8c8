import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ledger.errors import SpecError
from ledger.plan import spec


def test_defaults_fill_a_closed_config():
    s = spec.parse("")
    assert set(s.config) == set(spec.SCHEMA)
    for sec, fields in spec.SCHEMA.items():
        assert set(s.config[sec]) == set(fields)
    assert s.config["lora"]["target_modules"] == sorted(spec.LLAMA_MODULES)


def test_same_meaning_same_id():
    a = spec.parse('[lora]\ntarget_modules = ["v_proj", "q_proj"]\nalpha = 16\n')
    b = spec.parse('lora.alpha = 16.0\nlora.target_modules = ["q_proj", "v_proj"]\n')
    assert a.id == b.id
    assert spec.parse("[lora]\nr = 4\n").id != a.id


@pytest.mark.parametrize("text,field,line", [
    ("[lora]\nr = 8\nbogus = 1\n", "lora.bogus", 3),
    ("\n\n[nope]\nx = 1\n", "nope", 3),
    ("[data]\nsteps = 'many'\n", "data.steps", 2),
    ("[optimizer]\nlr = true\n", "optimizer.lr", 2),
    ("[optimizer]\n\nbetas = [0.9]\n", "optimizer.betas", 3),
    ("[lora]\ntarget_modules = ['q_proj', 'lm_head']\n", "lora.target_modules", 2),
    ("[lora]\ndropout = 1.5\n", "lora.dropout", 2),
    ("[schedule]\nkind = 'exp'\n", "schedule.kind", 2),
    ("data.micro_batch = 0\n", "data.micro_batch", 1),
    ("[model]\nhidden = 64\nheads = 5\n", "model.heads", 3),
    ("[data]\nsteps = 10\n[budget]\nmax_steps = 5\n", "data.steps", 2),
])
def test_bad_fields_are_named_with_their_line(text, field, line):
    with pytest.raises(SpecError) as e:
        spec.parse(text)
    assert e.value.details["field"] == field
    assert e.value.details["line"] == line
    assert f"`{field}`" in e.value.message and f"line {line}" in e.value.message
    assert e.value.exit_code == 2


def test_invalid_toml_and_missing_file(tmp_path):
    with pytest.raises(SpecError):
        spec.parse("[lora\nr=1")
    with pytest.raises(SpecError):
        spec.load(tmp_path / "none.toml")


def test_overrides_are_validated_and_round_trip():
    s = spec.parse("")
    t = s.with_overrides({"train.threads": 2, "seeds.data": 3})
    assert t.config["train"]["threads"] == 2 and t.config["seeds"]["data"] == 3
    with pytest.raises(SpecError):
        s.with_overrides({"train.threads": "two"})
    assert spec.from_body(t.body()).id == t.id
    with pytest.raises(SpecError):
        spec.from_body({"kind": "spec", "config": {**t.config, "extra": {}}})


_values = st.one_of(st.none(), st.booleans(), st.integers(-10**12, 10**12), st.floats(allow_nan=True),
                    st.text(max_size=8), st.lists(st.one_of(st.integers(), st.text(max_size=4)), max_size=3))
_keys = st.sampled_from(sorted({k for f in spec.SCHEMA.values() for k in f} | {"zz", ""}))
_sections = st.sampled_from(sorted(spec.SCHEMA) + ["extra"])


@settings(max_examples=300, deadline=None)
@given(st.dictionaries(_sections, st.one_of(st.dictionaries(_keys, _values, max_size=4), _values), max_size=4))
def test_any_config_is_accepted_or_refused_with_a_spec_error(raw):
    try:
        s = spec.normalise(raw)
    except SpecError as e:
        assert e.exit_code == 2 and e.message
        return
    assert spec.from_body(s.body()).id == s.id


@settings(max_examples=200, deadline=None)
@given(st.text(max_size=200))
def test_any_text_parses_or_raises_spec_error(text):
    try:
        spec.parse(text)
    except SpecError:
        pass
