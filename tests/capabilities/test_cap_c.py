"""C capabilities: clang --target=wasm32-wasi against wasi-libc (skipped, with the reason, where
that toolchain is not installed), and the clear error when it is missing."""

from __future__ import annotations

import pytest

from ledger.capabilities import admission, registry
from ledger.capabilities import compile as compile_mod
from ledger.capabilities.manifest import Handle
from ledger.errors import BadInput
from tests.capabilities.helpers import EXAMPLES


def _toolchain_or_skip():
    try:
        return compile_mod.c_toolchain()
    except BadInput as e:
        pytest.skip(f"C-to-wasm toolchain unavailable: {e.message} ({e.hint})")


def test_missing_toolchain_names_the_debian_packages(monkeypatch, tmp_path):
    monkeypatch.setattr(compile_mod.shutil, "which", lambda name: None)
    with pytest.raises(BadInput) as ei:
        compile_mod.compile_source(EXAMPLES / "notes.c")
    assert "clang is not installed" in ei.value.message
    assert "apt-get install clang lld wasi-libc libclang-rt-dev-wasm32" in ei.value.hint


def test_missing_wasi_libc_is_named(monkeypatch):
    _toolchain_or_skip()
    real = compile_mod._run

    def fake(cmd, what):
        if any("-print-file-name=libc.a" in c for c in cmd):
            return "libc.a\n"    # what clang prints when it cannot find the file
        return real(cmd, what)
    monkeypatch.setattr(compile_mod, "_run", fake)
    with pytest.raises(BadInput) as ei:
        compile_mod.compile_source(EXAMPLES / "notes.c")
    assert "wasi-libc" in ei.value.message and "wasi-libc" in ei.value.hint


def test_c_example_is_admitted_and_honours_its_grants(store, tmp_path):
    _toolchain_or_skip()
    a = admission.admit(store, EXAMPLES / "notes.c", EXAMPLES / "notes.toml")
    assert all(o.ok for o in a.outcomes) and len(a.outcomes) == 5
    ident = store.get_json(a.compiler)
    assert ident["tool"] == "clang" and ident["target"] == "wasm32-wasi" and "-mexec-model=reactor" in ident["flags"]
    assert len(ident["libc_blake3"]) == 64 and ident["version"].lower().startswith(("debian clang", "clang", "ubuntu clang"))
    assert store.get_bytes(a.source) == (EXAMPLES / "notes.c").read_bytes()
    assert a.grants == (Handle("dir", "data", "ro"), Handle("stdout"))

    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "notes.txt").write_text("one\ntwo\nthree\n")
    assert registry.call(store, "notes", "fib", ["50"]).values == (12586269025,)
    assert registry.call(store, "notes", "count_lines", []).values == (3,)
    r = registry.call(store, "notes", "greet", [])
    assert r.values == (16,) and r.stdout == b"hello from wasm\n"
    assert registry.call(store, "notes", "touch", []).values == (-1,)        # read-only grant
    assert not (tmp_path / "data" / "touched.txt").exists()
    registry.grant(store, "notes", [Handle("stdout")])
    assert registry.call(store, "notes", "count_lines", []).values == (-1,)  # folder dropped


def test_c_compilation_is_deterministic_and_errors_are_typed(tmp_path):
    _toolchain_or_skip()
    a = compile_mod.compile_source(EXAMPLES / "notes.c")
    copy = tmp_path / "elsewhere" / "renamed.c"
    copy.parent.mkdir()
    copy.write_bytes((EXAMPLES / "notes.c").read_bytes())
    b = compile_mod.compile_source(copy)
    assert a.wasm == b.wasm and a.compiler == b.compiler
    bad = tmp_path / "bad.c"
    bad.write_text("int f( {")
    with pytest.raises(BadInput) as ei:
        compile_mod.compile_source(bad)
    assert "clang bad.c failed" in ei.value.message and "error" in ei.value.details["stderr"]
