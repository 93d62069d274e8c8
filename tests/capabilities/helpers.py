"""Shared pieces for the capability tests: writing a capability (WAT + manifest) to disk, and
proving that the store did not change."""

from __future__ import annotations

import json
import os
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples" / "capabilities"

# WASI errno values (preview1) the sandbox answers with.
EBADF, ELOOP, ENOTSUP, EPERM, ENOTCAPABLE = 8, 32, 58, 63, 76


def _toml_value(v) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, (int, float)):
        return repr(v)
    if isinstance(v, str):
        return json.dumps(v)
    if isinstance(v, list):
        return "[" + ", ".join(_toml_value(x) for x in v) + "]"
    if isinstance(v, dict):
        return "{" + ", ".join(f"{k} = {_toml_value(x)}" for k, x in v.items()) + "}"
    raise TypeError(v)


def manifest_toml(name: str, exports: dict, tests: list[dict], handles=(), limits: dict | None = None,
                  description: str = "") -> str:
    """exports: {name: (params, results)}; tests: [{"name", "export", "args", "expect"|"trap"}]."""
    out = [f"name = {_toml_value(name)}", f"description = {_toml_value(description)}",
           f"handles = {_toml_value(list(handles))}"]
    if limits:
        out.append("[limits]")
        out += [f"{k} = {_toml_value(v)}" for k, v in limits.items()]
    for ename, (params, results) in exports.items():
        out += ["[[exports]]", f"name = {_toml_value(ename)}", f"params = {_toml_value(list(params))}",
                f"results = {_toml_value(list(results))}"]
    for t in tests:
        out.append("[[tests]]")
        out += [f"{k} = {_toml_value(v)}" for k, v in t.items()]
    return "\n".join(out) + "\n"


def write_cap(dir: Path, name: str, wat: str, exports: dict, tests: list[dict], handles=(),
              limits: dict | None = None) -> tuple[Path, Path]:
    d = Path(dir) / f"cap-{name}"
    d.mkdir(parents=True, exist_ok=True)
    src = d / f"{name}.wat"
    src.write_text(wat)
    man = d / f"{name}.toml"
    man.write_text(manifest_toml(name, exports, tests, handles, limits))
    return src, man


def store_snapshot(store) -> dict:
    """Every file under .ledger with its size and content hash: equal snapshots = untouched store."""
    import blake3

    snap = {}
    for dirpath, _, files in os.walk(store.root):
        for f in files:
            p = Path(dirpath) / f
            snap[str(p.relative_to(store.root))] = (p.stat().st_size, blake3.blake3(p.read_bytes()).hexdigest())
    return snap


# --- WAT building blocks ------------------------------------------------------------------------
WASI = "wasi_snapshot_preview1"

IMPORT_PATH_OPEN = f'''(import "{WASI}" "path_open"
    (func $path_open (param i32 i32 i32 i32 i32 i64 i64 i32 i32) (result i32)))'''

ADDER_WAT = '(module (func (export "add") (param i32 i32) (result i32) (i32.add (local.get 0) (local.get 1))))'
ADDER_EXPORTS = {"add": (["i32", "i32"], ["i32"])}
ADDER_TESTS = [{"name": "2+3", "export": "add", "args": [2, 3], "expect": [5]}]


def open_module(path: str, *, dirfd: int = 3, rights: int = 2, oflags: int = 0) -> str:
    """A module whose `errno` export returns path_open's errno for `path` (relative to `dirfd`),
    and whose `open` export traps (like a Rust panic) unless the open succeeds."""
    data = path.encode()
    hexed = "".join("\\%02x" % b for b in data)
    return f'''(module
  {IMPORT_PATH_OPEN}
  (memory (export "memory") 1)
  (data (i32.const 64) "{hexed}")
  (func $try (result i32)
    (call $path_open (i32.const {dirfd}) (i32.const 0) (i32.const 64) (i32.const {len(data)})
      (i32.const {oflags}) (i64.const {rights}) (i64.const 0) (i32.const 0) (i32.const 0)))
  (func (export "errno") (result i32) (call $try))
  (func (export "open") (result i32)
    (if (i32.ne (call $try) (i32.const 0)) (then unreachable))
    (i32.const 1)))'''
