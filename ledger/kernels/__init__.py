"""GPU kernels as checked artefacts: source + entry points + float64 oracle + torch reference
+ target requirements, built with NVRTC, tested against the oracle, benchmarked against the
torch realization, and admitted by a gate that can say no. See docs/kernels.md.

    from ledger import kernels
    b = kernels.build("lora-linear-bf16", "h200")          # BuildRecord (PTX + cubin bytes)
    t = kernels.test("lora-linear-bf16")                   # TestRecord (worst error vs oracle)
    r = kernels.bench("lora-linear-bf16", "1x8192x8192r16") # BenchRecord (median, fraction of copy BW)
    d = kernels.gate(t, r)                                  # GateDecision: accepted / refused + reason

Importing this package needs neither cupy nor a GPU; build/test/bench raise
``ledger.errors.RealizationUnavailable`` where they cannot run (no cupy, no device, a target
below the kernel's compute capability) -- they never fall back to another realization.
"""

from ledger.kernels.devices import CudaTarget
from ledger.kernels.devices import resolve as resolve_target
from ledger.kernels.gate import gate
from ledger.kernels.harness import bench, build, test
from ledger.kernels.records import BenchRecord, BuildRecord, GateDecision, TestRecord, Timing
from ledger.kernels.specs import KERNELS, KernelSpec, Requirements, Shape, default_sweep, get

__all__ = ["KERNELS", "BenchRecord", "BuildRecord", "CudaTarget", "GateDecision", "KernelSpec", "Requirements",
           "Shape", "TestRecord", "Timing", "bench", "build", "default_sweep", "gate", "get", "resolve_target",
           "test", "available"]


def available() -> list[dict]:
    """The registry as data (for `ledger kernel list`)."""
    return [KERNELS[k].body() for k in sorted(KERNELS)]
