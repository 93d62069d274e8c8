"""Which GPU a build is for. Accepts what callers have at hand:

* a target profile object (``ledger.plan.targets.Target``: ``device``, ``compute_capability``
  "9.0", ``name``) or a dict of the same fields;
* a profile name ("h200", "a100-40gb", ...), looked up in ledger's built-in target profiles
  (ledger/plan/targets.toml, read as data);
* "sm_90" / "sm_86" / "9.0";
* "local": the GPU this process sees (needs cupy and a device).

A CPU target is refused with RealizationUnavailable: ledger never falls back.
"""

from __future__ import annotations

import re
import tomllib
from dataclasses import dataclass
from pathlib import Path

from ledger.errors import BadInput, RealizationUnavailable

# The built-in target profiles are data (ledger/plan/targets.toml): read here as data, so the
# kernels stay below plan/ in the import graph and there is one table of devices, not two.
PROFILES_FILE = Path(__file__).resolve().parents[1] / "plan" / "targets.toml"


def _profiles() -> dict:
    with open(PROFILES_FILE, "rb") as f:
        return tomllib.load(f)


@dataclass(frozen=True)
class CudaTarget:
    name: str
    cc: tuple[int, int]

    @property
    def arch(self) -> str:
        return f"sm_{self.cc[0]}{self.cc[1]}"

    @property
    def virtual_arch(self) -> str:
        return f"compute_{self.cc[0]}{self.cc[1]}"

    def body(self) -> dict:
        return {"name": self.name, "arch": self.arch, "compute_capability": f"{self.cc[0]}.{self.cc[1]}"}


def _not_cuda(name: str) -> RealizationUnavailable:
    return RealizationUnavailable(f"target {name!r} has no CUDA device; the cupy kernels cannot be built for it",
                                  "compile for a CUDA target (e.g. h200); ledger never falls back silently",
                                  target=name)


def _parse_cc(s: str) -> tuple[int, int]:
    major, minor = s.split(".")
    return int(major), int(minor)


def resolve(target) -> CudaTarget:
    if isinstance(target, CudaTarget):
        return target
    if target is None:
        raise BadInput("no target given", "pass a target: a profile name (h200), sm_XY, or 'local'")
    if isinstance(target, dict) or hasattr(target, "compute_capability"):
        get = target.get if isinstance(target, dict) else (lambda k, d=None: getattr(target, k, d))
        name = str(get("name", "target"))
        if get("device", "cuda") != "cuda" or not get("compute_capability", ""):
            raise _not_cuda(name)
        return CudaTarget(name, _parse_cc(str(get("compute_capability"))))
    if not isinstance(target, str):
        raise BadInput(f"bad target {target!r}", "pass a target profile, a name (h200), sm_XY, or 'local'")
    t = target.strip()
    if t in ("local", "cuda", "device"):
        from ledger.kernels import runtime

        info = runtime.device_info()
        return CudaTarget(f"local:{info['name']}", tuple(info["cc"]))
    if t == "cpu":
        raise _not_cuda(t)
    m = re.fullmatch(r"sm_(\d)(\d)a?", t)
    if m:
        return CudaTarget(t, (int(m[1]), int(m[2])))
    if re.fullmatch(r"\d+\.\d+", t):
        return CudaTarget(f"sm_{t.replace('.', '')}", _parse_cc(t))
    profiles = _profiles()
    if t in profiles:
        return resolve({"name": t, **profiles[t]})
    raise BadInput(f"unknown target {target!r}", f"use a profile name ({', '.join(sorted(profiles))}), sm_XY or 'local'")
