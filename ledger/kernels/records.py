"""What build / test / bench / gate return: frozen dataclasses with a canonical-JSON body.

The CLI stores ``record.body()`` with ``tx.put_json`` and every artefact of
``record.artefacts()`` with ``tx.put_bytes``; the body names each artefact by the same
``b3:`` id the store will give it, so the stored record references its PTX / cubin.

Ids and canonical JSON are computed here with the same rules as ``ledger.store.ids`` and
``ledger.store.canonical`` (a CPU test checks they agree) so that this package can run on a
GPU machine that has no DuckDB or other store dependencies.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field

import blake3

_ENCODER = json.JSONEncoder(sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False)


def canonical(obj) -> bytes:
    return _ENCODER.encode(obj).encode("utf-8")


def b3(data: bytes) -> str:

    return "b3:" + blake3.blake3(bytes(data)).hexdigest()


def finite_or_none(v: float | None) -> float | None:
    """Canonical JSON has no NaN/Infinity: a non-finite measurement is recorded as null."""
    if v is None or not math.isfinite(v):
        return None
    return float(v)


@dataclass(frozen=True)
class BuildRecord:
    kernel: str
    arch: str                        # e.g. "sm_90"
    source: str                      # the exact text compiled
    source_file: str
    options: tuple[str, ...]         # NVRTC options of the cubin compile
    ptx_options: tuple[str, ...]     # NVRTC options of the PTX compile
    nvrtc_version: str
    entry_points: dict               # name expression -> lowered (mangled) name
    ptx: bytes = field(repr=False)
    cubin: bytes = field(repr=False)
    log: str = ""                    # ptxas -v: registers, spills, shared memory per entry

    @property
    def ptx_id(self) -> str:
        return b3(self.ptx)

    @property
    def cubin_id(self) -> str:
        return b3(self.cubin)

    @property
    def code_object(self) -> str:
        """The id of what actually runs: the cubin."""
        return self.cubin_id

    def body(self) -> dict:
        return {"kind": "kernel-build", "kernel": self.kernel, "arch": self.arch,
                "source_file": self.source_file, "source_id": b3(self.source.encode("utf-8")),
                "options": list(self.options), "ptx_options": list(self.ptx_options),
                "nvrtc_version": self.nvrtc_version, "entry_points": dict(self.entry_points),
                "ptx": self.ptx_id, "cubin": self.cubin_id, "log": self.log}

    def artefacts(self) -> dict[str, bytes]:
        """Every byte string the body references, by id (the source too)."""
        src = self.source.encode("utf-8")
        return {b3(src): src, self.ptx_id: self.ptx, self.cubin_id: self.cubin}

    @property
    def id(self) -> str:
        return b3(canonical(self.body()))


@dataclass(frozen=True)
class TestRecord:
    __test__ = False  # not a pytest test class
    kernel: str
    code_object: str                 # cubin id that was tested
    device: dict
    tolerance: float                 # on rel_l2 = ||y - oracle|| / ||oracle||
    cases: tuple[dict, ...]          # one per shape (and path): shape, rel_l2, rel_max, unwritten
    seed: int

    @property
    def worst_rel_l2(self) -> float | None:
        vals = [c["rel_l2"] for c in self.cases]
        if not vals or any(v is None for v in vals):
            return None  # a non-finite error is recorded as null: worst is "unknown/infinite"
        return max(vals)

    @property
    def worst_rel_max(self) -> float | None:
        vals = [c["rel_max"] for c in self.cases]
        if not vals or any(v is None for v in vals):
            return None
        return max(vals)

    @property
    def unwritten(self) -> int:
        return sum(int(c.get("unwritten", 0)) for c in self.cases)

    def body(self) -> dict:
        return {"kind": "kernel-test", "kernel": self.kernel, "code_object": self.code_object,
                "device": dict(self.device), "tolerance": self.tolerance, "cases": list(self.cases),
                "worst_rel_l2": self.worst_rel_l2, "worst_rel_max": self.worst_rel_max,
                "unwritten": self.unwritten, "seed": self.seed}

    @property
    def id(self) -> str:
        return b3(canonical(self.body()))


@dataclass(frozen=True)
class Timing:
    """One realization timed: what ran (code object id) and how long (seconds)."""
    code_object: str
    entry: str
    median_s: float
    p10_s: float
    p90_s: float
    launches: int

    def body(self) -> dict:
        return {"code_object": self.code_object, "entry": self.entry, "median_s": finite_or_none(self.median_s),
                "p10_s": finite_or_none(self.p10_s), "p90_s": finite_or_none(self.p90_s), "launches": self.launches}


@dataclass(frozen=True)
class BenchRecord:
    kernel: str
    shape: dict
    device: dict
    warmup: int
    launches: int
    weight_bytes: int                # bytes of weights one call must read (W, scales, A, B)
    copy_bytes_per_s: float          # device-to-device copy, read + write, measured in this run
    candidate: Timing
    baseline: Timing
    baseline_description: dict       # what the baseline code object id is the hash of
    extra: dict = field(default_factory=dict)   # side-by-side figures (e.g. base matvec, torch F.linear)

    @property
    def candidate_fraction(self) -> float:
        return self.weight_bytes / self.candidate.median_s / self.copy_bytes_per_s

    @property
    def baseline_fraction(self) -> float:
        return self.weight_bytes / self.baseline.median_s / self.copy_bytes_per_s

    @property
    def speedup(self) -> float:
        return self.baseline.median_s / self.candidate.median_s

    def body(self) -> dict:
        return {"kind": "kernel-bench", "kernel": self.kernel, "shape": dict(self.shape),
                "device": dict(self.device), "warmup": self.warmup, "launches": self.launches,
                "weight_bytes": self.weight_bytes, "copy_bytes_per_s": finite_or_none(self.copy_bytes_per_s),
                "candidate": self.candidate.body(), "baseline": self.baseline.body(),
                "baseline_description": self.baseline_description,
                "candidate_fraction": finite_or_none(self.candidate_fraction),
                "baseline_fraction": finite_or_none(self.baseline_fraction),
                "speedup": finite_or_none(self.speedup), "extra": self.extra}

    @property
    def id(self) -> str:
        return b3(canonical(self.body()))


@dataclass(frozen=True)
class GateDecision:
    kernel: str
    accepted: bool
    code: str          # Accepted | Wrong | NotFaster | Unproven
    reason: str
    test: str          # id of the test record judged
    bench: str         # id of the bench record judged

    @property
    def verdict(self) -> str:
        return "accepted" if self.accepted else "refused"

    def body(self) -> dict:
        return {"kind": "kernel-gate", "kernel": self.kernel, "verdict": self.verdict,
                "code": self.code, "reason": self.reason, "test": self.test, "bench": self.bench}

    @property
    def id(self) -> str:
        return b3(canonical(self.body()))
