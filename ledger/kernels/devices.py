"""Which GPU a build is for. Accepts what callers have at hand:

* a target profile object (``ledger.plan.targets.Target``: ``device``, ``compute_capability``
  "9.0", ``name``) or a dict of the same fields;
* a profile name ("h200", "a100-40gb", ...), looked up in ledger's target profiles when that
  module is importable, else in a small built-in table;
* "sm_90" / "sm_86" / "9.0";
* "local": the GPU this process sees (needs cupy and a device).

A CPU target is refused with RealizationUnavailable: ledger never falls back.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from ledger.errors import BadInput, RealizationUnavailable

# Used when ledger.plan.targets cannot be imported (e.g. a bare GPU box running only kernels).
_KNOWN_CC = {"h200": (9, 0), "h100": (9, 0), "a100": (8, 0), "a100-40gb": (8, 0), "a100-80gb": (8, 0),
             "a10": (8, 6), "rtx3070-8gb": (8, 6), "rtx3090": (8, 6), "l4": (8, 9), "rtx4090": (8, 9),
             "v100": (7, 0), "t4": (7, 5)}


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
    try:  # the project's own target profiles, when the full package is importable
        from ledger.plan import targets as profiles

        prof = profiles.get(t)
    except ImportError:
        prof = None
    except Exception:  # UnknownRef and friends: fall back to the table, then say unknown
        prof = None
    if prof is not None:
        return resolve(prof)
    if t in _KNOWN_CC:
        return CudaTarget(t, _KNOWN_CC[t])
    raise BadInput(f"unknown target {target!r}", f"use a profile name ({', '.join(sorted(_KNOWN_CC))}), sm_XY or 'local'")
