"""GPU kernels: list, build, test, bench, gate.

Part of ledger.api (see its docstring): import the verbs from there, `from ledger import api`."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping, Sequence

from ledger.api._base import Result, StoreLike, Wrapped, take_warnings
from ledger.api._open import open_store
from ledger.errors import BadInput, NotAStore, Refused
from ledger.kernels import store_records as sr


@dataclass(frozen=True)
class Kernels(Result):
    """The kernel specs ledger knows, with their builds and gate results."""
    kernels: tuple[Mapping, ...]

    def to_json(self):
        return list(self.kernels)


def kernel_list(*, store: StoreLike = None) -> Kernels:
    """Registered kernels, their requirements, and per target the current build/test/bench/gate
    (readable without a store)."""
    try:
        s = open_store(store)
    except NotAStore:
        s = None  # the registry is readable without a store
    return Kernels(tuple(sr.status(s)), warnings=take_warnings(s))


@dataclass(frozen=True)
class KernelRecorded(Wrapped):
    """ledger.kernels.store_records' Recorded in `result` (record, record_id, target, journal)."""

    kernel: str = ""


@dataclass(frozen=True)
class KernelGated(KernelRecorded):
    """failure(): Refused when the gate refused the build (the refusal is recorded)."""

    ref: str = ""

    def failure(self):
        r = self.result
        d = r.record
        if d.accepted:
            return None
        return Refused(f"kernel gate refused {self.kernel} for {r.target}: {d.code}: {d.reason}",
                       f"the refusal is recorded ({r.record_id[:15]}); fix the kernel, rebuild, test and bench again")


def kernel_build(name: str, *, target: str | None, store: StoreLike = None) -> KernelRecorded:
    """Compile a kernel for a target with NVRTC; store source, options, NVRTC version, arch, PTX, cubin."""
    if target is None:
        raise BadInput("kernel build needs --target", "e.g. --target h200 (a profile), sm_90, or local")
    s = open_store(store)
    return KernelRecorded(result=sr.record_build(s, name, target), kernel=name, warnings=take_warnings(s))


def kernel_test(name: str, *, target: str | None = None, shapes: Sequence[str] | None = None, seed: int = 0,
                store: StoreLike = None) -> KernelRecorded:
    """Run the stored build on this GPU over a shape sweep; record the worst error vs the float64 oracle."""
    s = open_store(store)
    res = sr.record_test(s, name, target, shapes=list(shapes) if shapes else None, seed=seed)
    return KernelRecorded(result=res, kernel=name, warnings=take_warnings(s))


def kernel_bench(name: str, *, target: str | None = None, shape: str | None = None, launches: int = 50,
                 warmup: int = 10, store: StoreLike = None) -> KernelRecorded:
    """Time the stored build beside its torch baseline (CUDA events, same run); record medians."""
    s = open_store(store)
    res = sr.record_bench(s, name, target, shape=shape, launches=launches, warmup=warmup)
    return KernelRecorded(result=res, kernel=name, warnings=take_warnings(s))


def kernel_gate(name: str, *, target: str | None = None, test: str | None = None, bench: str | None = None,
                store: StoreLike = None) -> KernelGated:
    """Admit or refuse the current build: wrong or not faster than its baseline is refused (recorded)."""
    s = open_store(store)
    res = sr.record_gate(s, name, target, test=test, bench=bench)
    return KernelGated(result=res, kernel=name, ref=sr.ref_name("gate", name, res.target), warnings=take_warnings(s))
