"""A capability's manifest: what it exports, which handles it asks for, its tests, its limits.

Written by people as TOML (examples/capabilities/*.toml), stored as canonical JSON so that the
same manifest has the same id everywhere. Parsing validates everything up front and raises
`SpecError` (exit 2) naming the field, so admission and calls never meet a half-valid manifest.

    name = "adder"
    description = "adds two i32"
    handles = [{kind = "dir", path = "data", mode = "ro"}, {kind = "stdout"}]
    [[exports]]
    name = "add"
    params = ["i32", "i32"]
    results = ["i32"]
    [limits]                     # optional; defaults below, host maxima enforced
    fuel = 100_000_000
    time_ms = 2000
    memory_mib = 64
    [[tests]]
    name = "two plus three"
    export = "add"
    args = [2, 3]
    expect = [5]                 # or: trap = "INTEGER_DIVISION_BY_ZERO"
"""

from __future__ import annotations

import math
import re
import struct
import tomllib
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath

from ledger.errors import BadInput, SpecError
from ledger.store import canonical, fsio
from ledger.store.ids import hash_bytes

MAX_MANIFEST_FILE = 1 << 20   # a manifest is a few KiB of TOML; more is refused unread

MANIFEST_VERSION = 1
NAME_RE = re.compile(r"^[a-z][a-z0-9_-]{0,63}$")
EXPORT_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_.$-]{0,127}$")
VALTYPES = ("i32", "i64", "f32", "f64")
HANDLE_KINDS = ("dir", "stdout", "stderr")
MODES = ("ro", "rw")

# Defaults are small on purpose: a capability is a function, not a service. Maxima protect the
# host from a manifest that asks for absurd budgets (the manifest is input, not authority).
DEFAULT_FUEL = 100_000_000
DEFAULT_TIME_MS = 2_000
DEFAULT_MEMORY_MIB = 64
MAX_FUEL = 100_000_000_000
MAX_TIME_MS = 60_000
MAX_MEMORY_MIB = 1024
MAX_TESTS = 256


@dataclass(frozen=True, order=True)
class Handle:
    """One piece of authority: a directory (read-only or read-write), or stdout / stderr."""
    kind: str
    path: str | None = None
    mode: str | None = None

    def to_json(self) -> dict:
        return {"kind": self.kind} if self.kind != "dir" else {"kind": "dir", "path": self.path, "mode": self.mode}

    def __str__(self) -> str:
        return self.kind if self.kind != "dir" else f"dir:{self.path}:{self.mode}"

    @classmethod
    def from_json(cls, d, where: str = "handle") -> "Handle":
        if not isinstance(d, dict):
            raise SpecError(f"{where}: expected a table like {{kind = \"dir\", path = \"data\", mode = \"ro\"}}, got {d!r}")
        kind = d.get("kind")
        if kind not in HANDLE_KINDS:
            raise SpecError(f"{where}: kind must be one of {', '.join(HANDLE_KINDS)}, got {kind!r}")
        extra = set(d) - ({"kind", "path", "mode"} if kind == "dir" else {"kind"})
        if extra:
            raise SpecError(f"{where}: unknown keys {sorted(extra)} for a {kind} handle")
        if kind != "dir":
            return cls(kind)
        mode = d.get("mode", "ro")
        if mode not in MODES:
            raise SpecError(f"{where}: mode must be \"ro\" or \"rw\", got {mode!r}")
        return cls("dir", normalize_path(d.get("path"), where), mode)

    @classmethod
    def parse(cls, text: str) -> "Handle":
        """The command-line form: `dir:PATH[:ro|:rw]`, `stdout`, `stderr`."""
        if not isinstance(text, str) or not text:
            raise BadInput(f"bad handle {text!r}", "write dir:PATH:ro, dir:PATH:rw, stdout or stderr")
        kind, _, rest = text.partition(":")
        if kind != "dir":
            if rest or kind not in HANDLE_KINDS:
                raise BadInput(f"bad handle {text!r}", "write dir:PATH:ro, dir:PATH:rw, stdout or stderr")
            return cls(kind)
        mode = "ro"
        if rest.endswith((":ro", ":rw")):
            rest, mode = rest[:-3], rest[-2:]
        try:
            return cls("dir", normalize_path(rest, f"handle {text!r}"), mode)
        except SpecError as e:
            raise BadInput(
                e.message, "write dir:PATH:ro with PATH relative to the project (the folder holding .ledger)"
            ) from None


def normalize_path(p, where: str) -> str:
    """A relative POSIX path below the project root, without `..`; `.` is the root itself."""
    if not isinstance(p, str) or not p.strip():
        raise SpecError(f"{where}: a dir handle needs a path")
    if "\0" in p or "\\" in p:
        raise SpecError(f"{where}: path {p!r} has a NUL or backslash")
    pp = PurePosixPath(p)
    if pp.is_absolute():
        raise SpecError(f"{where}: path {p!r} must be relative to the project (the folder holding .ledger)")
    parts = [x for x in pp.parts if x != "."]
    if ".." in parts:
        raise SpecError(f"{where}: path {p!r} must not contain '..'")
    return "/".join(parts) or "."


@dataclass(frozen=True)
class Export:
    name: str
    params: tuple[str, ...]
    results: tuple[str, ...]

    def to_json(self) -> dict:
        return {"name": self.name, "params": list(self.params), "results": list(self.results)}

    def signature(self) -> str:
        return f"({', '.join(self.params)}) -> ({', '.join(self.results)})"


@dataclass(frozen=True)
class Test:
    name: str
    export: str
    args: tuple
    expect: tuple | None = None   # exact results, or
    trap: str | None = None       # the trap code the call must end in (e.g. UNREACHABLE)

    def to_json(self) -> dict:
        d = {"name": self.name, "export": self.export, "args": list(self.args)}
        if self.trap is not None:
            d["trap"] = self.trap
        else:
            d["expect"] = list(self.expect)
        return d


@dataclass(frozen=True)
class Limits:
    fuel: int = DEFAULT_FUEL
    time_ms: int = DEFAULT_TIME_MS
    memory_bytes: int = DEFAULT_MEMORY_MIB << 20

    def to_json(self) -> dict:
        return {"fuel": self.fuel, "time_ms": self.time_ms, "memory_bytes": self.memory_bytes}

    def override(self, fuel: int | None = None, time_ms: int | None = None) -> "Limits":
        """The same limits with a caller's fuel / time, still within the host maxima."""
        f = self.fuel if fuel is None else fuel
        t = self.time_ms if time_ms is None else time_ms
        _bounded("fuel", f, 1, MAX_FUEL, BadInput)
        _bounded("time limit (ms)", t, 1, MAX_TIME_MS, BadInput)
        return Limits(f, t, self.memory_bytes)


def _bounded(what, v, lo, hi, err=SpecError):
    if isinstance(v, bool) or not isinstance(v, int) or not lo <= v <= hi:
        raise err(f"{what} must be an integer in [{lo}, {hi}], got {v!r}")
    return v


@dataclass(frozen=True)
class Manifest:
    name: str
    description: str
    exports: tuple[Export, ...]
    handles: tuple[Handle, ...]
    tests: tuple[Test, ...]
    limits: Limits = field(default_factory=Limits)

    def to_json(self) -> dict:
        return {"kind": "capability-manifest", "version": MANIFEST_VERSION, "name": self.name,
                "description": self.description, "exports": [e.to_json() for e in self.exports],
                "handles": [h.to_json() for h in self.handles], "tests": [t.to_json() for t in self.tests],
                "limits": self.limits.to_json()}

    @property
    def id(self) -> str:
        return hash_bytes(canonical.dumps(self.to_json()))

    def export(self, name: str) -> Export:
        for e in self.exports:
            if e.name == name:
                return e
        raise BadInput(f"capability {self.name!r} declares no export {name!r}",
                       f"declared exports: {', '.join(e.name for e in self.exports) or 'none'}")


def load(path: str | Path) -> Manifest:

    p = Path(path)
    try:
        data = tomllib.loads(fsio.read_user_file(p, MAX_MANIFEST_FILE).decode("utf-8"))
    except FileNotFoundError:
        raise BadInput(f"manifest {p} does not exist") from None
    except tomllib.TOMLDecodeError as e:   # before ValueError, which it is
        raise SpecError(f"manifest {p} is not valid TOML: {e}") from None
    except (OSError, UnicodeDecodeError, ValueError, fsio.NotRegular) as e:   # a FIFO is refused, not waited on
        raise BadInput(f"cannot read manifest {p}: {e}") from None
    except RecursionError:   # arrays nested thousands deep
        raise SpecError(f"manifest {p} is not valid TOML: nested too deeply to parse") from None
    return from_json(data, where=str(p))


def from_json(d, where: str = "manifest") -> Manifest:
    """Validate a manifest (parsed TOML or stored JSON). Every fault names its field."""
    if not isinstance(d, dict):
        raise SpecError(f"{where}: expected a table")
    d = {k: v for k, v in d.items() if k not in ("kind", "version")} if d.get("kind") == "capability-manifest" else dict(d)
    extra = set(d) - {"name", "description", "exports", "handles", "tests", "limits"}
    if extra:
        raise SpecError(f"{where}: unknown keys {sorted(extra)}")
    name = d.get("name")
    if not isinstance(name, str) or not NAME_RE.match(name):
        raise SpecError(f"{where}: name must match {NAME_RE.pattern}, got {name!r}")
    desc = d.get("description", "")
    if not isinstance(desc, str):
        raise SpecError(f"{where}: description must be a string")

    exports = []
    raw_exports = d.get("exports")
    if not isinstance(raw_exports, list) or not raw_exports:
        raise SpecError(f"{where}: declare at least one [[exports]] table (name, params, results)")
    for i, e in enumerate(raw_exports):
        w = f"{where}: exports[{i}]"
        if not isinstance(e, dict) or set(e) - {"name", "params", "results"}:
            raise SpecError(f"{w}: expected a table with name, params, results")
        ename = e.get("name")
        if not isinstance(ename, str) or not EXPORT_RE.match(ename):
            raise SpecError(f"{w}: bad export name {ename!r}")
        params, results = e.get("params", []), e.get("results", [])
        for what, ts in (("params", params), ("results", results)):
            if not isinstance(ts, list) or any(t not in VALTYPES for t in ts):
                raise SpecError(f"{w}: {what} must be a list of {', '.join(VALTYPES)}, got {ts!r}")
        if any(x.name == ename for x in exports):
            raise SpecError(f"{w}: export {ename!r} is declared twice")
        exports.append(Export(ename, tuple(params), tuple(results)))
    by_name = {e.name: e for e in exports}

    raw_handles = d.get("handles", [])
    if not isinstance(raw_handles, list):
        raise SpecError(f"{where}: handles must be a list of tables")
    handles = tuple(sorted({Handle.from_json(h, f"{where}: handles[{i}]") for i, h in enumerate(raw_handles)}))

    raw_limits = d.get("limits", {})
    if not isinstance(raw_limits, dict) or set(raw_limits) - {"fuel", "time_ms", "memory_mib", "memory_bytes"}:
        raise SpecError(f"{where}: [limits] takes fuel, time_ms and memory_mib")
    mem = raw_limits.get("memory_bytes")
    if mem is None:
        mem = _bounded(f"{where}: limits.memory_mib", raw_limits.get("memory_mib", DEFAULT_MEMORY_MIB), 1, MAX_MEMORY_MIB) << 20
    limits = Limits(fuel=_bounded(f"{where}: limits.fuel", raw_limits.get("fuel", DEFAULT_FUEL), 1, MAX_FUEL),
                    time_ms=_bounded(f"{where}: limits.time_ms", raw_limits.get("time_ms", DEFAULT_TIME_MS), 1, MAX_TIME_MS),
                    memory_bytes=_bounded(f"{where}: limits.memory", mem, 1 << 16, MAX_MEMORY_MIB << 20))

    tests = []
    raw_tests = d.get("tests")
    if not isinstance(raw_tests, list) or not raw_tests:
        raise SpecError(
            f"{where}: declare at least one [[tests]] table: admission runs them, and an untested capability is never admitted"
        )
    if len(raw_tests) > MAX_TESTS:
        raise SpecError(f"{where}: at most {MAX_TESTS} tests")
    for i, t in enumerate(raw_tests):
        w = f"{where}: tests[{i}]"
        if not isinstance(t, dict) or set(t) - {"name", "export", "args", "expect", "trap"}:
            raise SpecError(f"{w}: expected a table with name, export, args and expect (or trap)")
        tname = t.get("name", f"test {i}")
        if not isinstance(tname, str) or not tname:
            raise SpecError(f"{w}: name must be a non-empty string")
        ex = by_name.get(t.get("export"))
        if ex is None:
            raise SpecError(f"{w} ({tname!r}): export {t.get('export')!r} is not declared in [[exports]]")
        args = t.get("args", [])
        if not isinstance(args, list) or len(args) != len(ex.params):
            raise SpecError(f"{w} ({tname!r}): {ex.name} takes {len(ex.params)} args {ex.signature()}, got {args!r}")
        args = tuple(coerce(v, ty, f"{w} ({tname!r}) args[{j}]") for j, (v, ty) in enumerate(zip(args, ex.params)))
        if ("expect" in t) == ("trap" in t):
            raise SpecError(f"{w} ({tname!r}): give exactly one of expect = [...] or trap = \"CODE\"")
        if "trap" in t:
            if not isinstance(t["trap"], str) or not re.match(r"^[A-Z_]+$", t["trap"]):
                raise SpecError(f"{w} ({tname!r}): trap must be a trap code like \"UNREACHABLE\"")
            tests.append(Test(tname, ex.name, args, trap=t["trap"]))
            continue
        expect = t["expect"]
        if not isinstance(expect, list):
            expect = [expect]
        if len(expect) != len(ex.results):
            raise SpecError(f"{w} ({tname!r}): {ex.name} returns {len(ex.results)} values {ex.signature()}, expected {expect!r}")
        expect = tuple(coerce(v, ty, f"{w} ({tname!r}) expect[{j}]") for j, (v, ty) in enumerate(zip(expect, ex.results)))
        tests.append(Test(tname, ex.name, args, expect=expect))
    if len({t.name for t in tests}) != len(tests):
        raise SpecError(f"{where}: test names must be unique")
    return Manifest(name, desc, tuple(exports), handles, tuple(tests), limits)


# --- values --------------------------------------------------------------------------------
_INT_RANGE = {"i32": 32, "i64": 64}


def coerce(v, ty: str, where: str, err=SpecError):
    """A JSON/TOML number as a wasm value of type `ty` (ints wrap to signed; f32 is rounded)."""
    if ty in _INT_RANGE:
        bits = _INT_RANGE[ty]
        if isinstance(v, bool) or not isinstance(v, int) or not -(1 << (bits - 1)) <= v < (1 << bits):
            raise err(f"{where}: {v!r} is not an {ty}")
        return v - (1 << bits) if v >= (1 << (bits - 1)) else v
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        raise err(f"{where}: {v!r} is not an {ty}")
    f = float(v)
    if not math.isfinite(f):
        raise err(f"{where}: {v!r} is not finite (manifests are canonical JSON, which has no NaN or infinity)")
    if ty == "f32":
        try:
            f = struct.unpack("<f", struct.pack("<f", f))[0]
        except OverflowError:
            raise err(f"{where}: {v!r} is out of range for f32") from None
    return f


def parse_arg(text: str, ty: str, where: str):
    """A command-line argument as a wasm value of type `ty` (decimal or 0x hex ints; floats)."""
    try:
        v = int(text, 0) if ty in _INT_RANGE else float(text)
    except ValueError:
        raise BadInput(f"{where}: {text!r} is not an {ty}") from None
    if ty not in _INT_RANGE and not math.isfinite(v):
        return struct.unpack("<f", struct.pack("<f", v))[0] if ty == "f32" else v
    return coerce(v, ty, where, BadInput)
