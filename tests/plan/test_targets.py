import pytest

from ledger.errors import SpecError, UnknownRef
from ledger.plan import targets


def test_builtin_profiles():
    t = targets.builtin()
    assert {"cpu", "h200", "a100-40gb", "rtx3070-8gb"} <= set(t)
    assert t["rtx3070-8gb"].memory_bytes == 8 << 30 and t["rtx3070-8gb"].device == "cuda"
    assert t["cpu"].cc is None and t["h200"].cc == (9, 0)
    assert len({x.id for x in t.values()}) == len(t)


def test_user_file_adds_and_overrides(tmp_path):
    f = tmp_path / "t.toml"
    f.write_text('[cpu]\ndevice = "cpu"\nmemory_bytes = 1024\ndtypes = ["fp32"]\n'
                 '[l4]\ndevice = "cuda"\nmemory_bytes = 24000000000\ndtypes = ["bf16"]\ncompute_capability = "8.9"\n')
    t = targets.available(f)
    assert t["cpu"].memory_bytes == 1024 and t["cpu"].id != targets.builtin()["cpu"].id
    assert targets.get("l4", f).cc == (8, 9)
    with pytest.raises(UnknownRef):
        targets.get("tpu", f)


@pytest.mark.parametrize("text,field", [
    ('[x]\ndevice = "cpu"\nmemory_bytes = 1\ndtypes = ["fp32"]\ncolour = 1\n', "x.colour"),
    ('[x]\ndevice = "tpu"\nmemory_bytes = 1\ndtypes = ["fp32"]\n', "x.device"),
    ('[x]\ndevice = "cuda"\nmemory_bytes = 1\ndtypes = ["fp32"]\n', "x.compute_capability"),
    ('[x]\ndevice = "cpu"\nmemory_bytes = "lots"\ndtypes = ["fp32"]\n', "x.memory_bytes"),
])
def test_bad_user_targets(tmp_path, text, field):
    f = tmp_path / "t.toml"
    f.write_text(text)
    with pytest.raises(SpecError) as e:
        targets.available(f)
    assert e.value.details["field"] == field
