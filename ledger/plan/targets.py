"""Target profiles as data: what a device offers a training run.

Built-in profiles live in targets.toml beside this module; a user file of the same shape adds
or overrides profiles. A target's identity is the hash of its definition, so a plan names the
exact profile it was proved against (a user redefining `cpu` gets a different plan id).
"""

from __future__ import annotations

import tomllib
from dataclasses import asdict, dataclass
from pathlib import Path

from ledger.errors import SpecError, UnknownRef
from ledger.plan.spec import DTYPES, line_of
from ledger.store import canonical, fsio
from ledger.store.ids import hash_bytes

MAX_TARGETS_FILE = 16 << 20   # a few KiB of TOML profiles; more is refused unread

BUILTIN_FILE = Path(__file__).with_name("targets.toml")
_FIELDS = {"device": str, "description": str, "memory_bytes": int, "dtypes": list,
           "compute_capability": str, "shared_memory_bytes": int}


@dataclass(frozen=True)
class Target:
    name: str
    device: str                 # "cpu" or "cuda"
    description: str
    memory_bytes: int
    dtypes: tuple[str, ...]
    compute_capability: str     # "" for CPUs
    shared_memory_bytes: int

    def body(self) -> dict:
        d = asdict(self)
        d["dtypes"] = list(self.dtypes)
        return {"kind": "target", **d}

    @property
    def id(self) -> str:
        return hash_bytes(canonical.dumps(self.body()))

    @property
    def cc(self) -> tuple[int, int] | None:
        if not self.compute_capability:
            return None
        major, minor = self.compute_capability.split(".")
        return int(major), int(minor)


def _parse(text: str, origin: str) -> dict[str, Target]:
    try:
        raw = tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise SpecError(f"{origin}: not valid TOML: {e}") from None
    except RecursionError:   # arrays nested thousands deep: tomllib recurses per level
        raise SpecError(f"{origin}: not valid TOML: nested too deeply to parse") from None
    out = {}
    for name, t in raw.items():
        def err(field: str, msg: str) -> SpecError:
            ln = line_of(text, f"{name}.{field}" if field else name)
            return SpecError(f"{origin}: target field `{name}.{field}`{f' (line {ln})' if ln else ''}: {msg}",
                             "fix the target profile", field=f"{name}.{field}", line=ln)
        if not isinstance(t, dict):
            raise err("", "each target is a table")
        for k, v in t.items():
            if k not in _FIELDS:
                raise err(k, f"unknown field; known: {', '.join(_FIELDS)}")
            if isinstance(v, bool) or not isinstance(v, _FIELDS[k]):
                raise err(k, f"must be {_FIELDS[k].__name__}, got {v!r}")
        optional = ("description", "compute_capability", "shared_memory_bytes")
        missing = [k for k in _FIELDS if k not in t and k not in optional]
        if missing:
            raise err(missing[0], "is required")
        if t["device"] not in ("cpu", "cuda"):
            raise err("device", "must be cpu or cuda")
        if t["memory_bytes"] <= 0:
            raise err("memory_bytes", "must be > 0")
        bad = [d for d in t["dtypes"] if d not in DTYPES]
        if bad:
            raise err("dtypes", f"unknown dtypes {bad}; known: {', '.join(DTYPES)}")
        cc = t.get("compute_capability", "")
        if t["device"] == "cuda":
            parts = cc.split(".")
            if len(parts) != 2 or not all(p.isdigit() for p in parts):
                raise err("compute_capability", f"a CUDA target needs major.minor, got {cc!r}")
        out[name] = Target(name=name, device=t["device"], description=t.get("description", ""),
                           memory_bytes=t["memory_bytes"], dtypes=tuple(t["dtypes"]),
                           compute_capability=cc, shared_memory_bytes=t.get("shared_memory_bytes", 0))
    return out


def builtin() -> dict[str, Target]:
    return _parse(BUILTIN_FILE.read_text(encoding="utf-8"), "built-in targets")


def available(extra: str | Path | None = None) -> dict[str, Target]:
    """Built-in profiles, then the user's file (which may override a built-in name)."""
    out = builtin()
    if extra is not None:
        p = Path(extra)
        try:
            text = fsio.read_user_file(p, MAX_TARGETS_FILE).decode("utf-8")
        except (OSError, UnicodeDecodeError, ValueError, fsio.NotRegular) as e:   # a FIFO is refused, not waited on
            raise SpecError(f"cannot read targets file {p}: {e}", "give the path of a TOML file of target profiles") from None
        out.update(_parse(text, str(p)))
    return out


def get(name: str, extra: str | Path | None = None) -> Target:
    t = available(extra)
    if name not in t:
        raise UnknownRef(f"unknown target {name!r}", f"known targets: {', '.join(sorted(t))} (see `ledger targets`)")
    return t[name]


def from_body(body: dict) -> Target:
    if not isinstance(body, dict) or body.get("kind") != "target":
        raise SpecError("object is not a target profile")
    d = {k: v for k, v in body.items() if k != "kind"}
    try:
        return Target(**{**d, "dtypes": tuple(d["dtypes"])})
    except (TypeError, KeyError) as e:
        raise SpecError(f"stored target profile is malformed: {e}") from None
