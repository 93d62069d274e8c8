"""Kernel records in the store: what `ledger kernel build|test|bench|gate` commit.

Each command is ONE store transaction (kinds kernel-build, kernel-test, kernel-bench,
kernel-gate): the record body as a canonical-JSON object, the artefacts it references (source,
PTX, cubin) as objects, one journal record whose payload names the record id, the kernel and the
target, and the refs that say what is current:

    kernel-build/<kernel>/<target>   the build record that test, bench and compile use
    kernel-test/<kernel>/<target>    the latest test record of that build
    kernel-bench/<kernel>/<target>   the latest bench record of that build
    kernel/<kernel>/<target>         the gate record that ACCEPTED the current build; absent when
                                     the latest gate refused it or a rebuild changed the cubin.
                                     This is the ref compile checks before it selects cupy-fused.

`<target>` is the target profile's name (h200), or sm_XY for a target given as an arch or as
"local". Test and bench run the stored build's own cubin (read back from the store and checked
against its id), so the code object a gate admits is the one a plan names and a run loads.

Nothing here falls back: no cupy, no NVRTC or no device raises RealizationUnavailable (exit 3)
before anything is written.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

from ledger import records
from ledger.errors import BadInput, CorruptObject, InternalError, UnknownRef
from ledger.kernels import devices as T
from ledger.kernels import harness
from ledger.kernels import specs as S
from ledger.kernels.gate import gate as gate_fn
from ledger.kernels.records import BenchRecord, BuildRecord, GateDecision, TestRecord, Timing, b3

KINDS = ("build", "test", "bench", "gate")
_REF_PREFIX = {"build": "kernel-build", "test": "kernel-test", "bench": "kernel-bench", "gate": "kernel"}
_CLEAN = re.compile(r"[A-Za-z0-9._-]+")


def ref_name(kind: str, kernel: str, target: str) -> str:
    return f"{_REF_PREFIX[kind]}/{kernel}/{target}"


def target_key(tgt: T.CudaTarget) -> str:
    """The name records and refs use for a target: the profile name, else its arch."""
    return tgt.name if _CLEAN.fullmatch(tgt.name) and not tgt.name.startswith("local") else tgt.arch


@dataclass(frozen=True)
class Recorded:
    """What one kernel command committed (or found already committed)."""
    kind: str            # build | test | bench | gate
    kernel: str
    target: str
    record_id: str
    record: object       # BuildRecord | TestRecord | BenchRecord | GateDecision
    journal: dict | None  # the journal record appended; None when nothing new was written
    refs: dict
    gate_dropped: str | None = None  # a build whose cubin changed: the gate that no longer applies

    def to_json(self) -> dict:
        body = self.record.body()
        return {"kind": f"kernel-{self.kind}", "kernel": self.kernel, "target": self.target,
                "record": self.record_id, "new": self.journal is not None,
                "journal": (self.journal or {}).get("id"), "refs": dict(self.refs), "body": body}


# --- reading records back -------------------------------------------------------------------
def _checked(oid: str, rec, what: str):
    if rec.id != oid:
        raise CorruptObject(oid, f"{what} {oid} does not rebuild to its own id (got {rec.id})")
    return rec


def build_from_store(store, oid: str) -> BuildRecord:
    """A BuildRecord with its source, PTX and cubin read (and hash-verified) from the store."""
    body = store.get_json(oid)
    if not isinstance(body, dict) or body.get("kind") != "kernel-build":
        raise BadInput(f"{oid} is not a kernel build record")
    rec = BuildRecord(kernel=body["kernel"], arch=body["arch"],
                      source=store.get_bytes(body["source_id"]).decode("utf-8"), source_file=body["source_file"],
                      options=tuple(body["options"]), ptx_options=tuple(body["ptx_options"]),
                      nvrtc_version=body["nvrtc_version"], entry_points=dict(body["entry_points"]),
                      ptx=store.get_bytes(body["ptx"]), cubin=store.get_bytes(body["cubin"]), log=body.get("log", ""))
    return _checked(oid, rec, "kernel build record")


def _f(v) -> float:
    """Non-finite measurements are stored as null; they come back as NaN (and the gate refuses them)."""
    return float("nan") if v is None else float(v)


def test_from_body(body: dict) -> TestRecord:
    if not isinstance(body, dict) or body.get("kind") != "kernel-test":
        raise BadInput("object is not a kernel test record")
    return TestRecord(kernel=body["kernel"], code_object=body["code_object"], device=dict(body["device"]),
                      tolerance=float(body["tolerance"]), cases=tuple(body["cases"]), seed=int(body["seed"]))


test_from_body.__test__ = False  # a loader, not a pytest test


def _timing(b: dict) -> Timing:
    return Timing(code_object=b["code_object"], entry=b["entry"], median_s=_f(b["median_s"]), p10_s=_f(b["p10_s"]),
                  p90_s=_f(b["p90_s"]), launches=int(b["launches"]))


def bench_from_body(body: dict) -> BenchRecord:
    if not isinstance(body, dict) or body.get("kind") != "kernel-bench":
        raise BadInput("object is not a kernel bench record")
    return BenchRecord(kernel=body["kernel"], shape=dict(body["shape"]), device=dict(body["device"]),
                       warmup=int(body["warmup"]), launches=int(body["launches"]), weight_bytes=int(body["weight_bytes"]),
                       copy_bytes_per_s=_f(body["copy_bytes_per_s"]), candidate=_timing(body["candidate"]),
                       baseline=_timing(body["baseline"]), baseline_description=body["baseline_description"],
                       extra=body.get("extra") or {})


def gate_from_body(body: dict) -> GateDecision:
    if not isinstance(body, dict) or body.get("kind") != "kernel-gate":
        raise BadInput("object is not a kernel gate record")
    return GateDecision(kernel=body["kernel"], accepted=body["verdict"] == "accepted", code=body["code"],
                        reason=body["reason"], test=body["test"], bench=body["bench"])


def load_test(store, oid: str) -> TestRecord:
    return _checked(oid, test_from_body(store.get_json(oid)), "kernel test record")


def load_bench(store, oid: str) -> BenchRecord:
    return _checked(oid, bench_from_body(store.get_json(oid)), "kernel bench record")


def load_gate(store, oid: str) -> GateDecision:
    return _checked(oid, gate_from_body(store.get_json(oid)), "kernel gate record")


# --- which target -------------------------------------------------------------------------
def resolve_key(store, kernel: str, target: str | None) -> str:
    """The target key for `kernel`: from --target, else the only target it was built for."""
    S.get(kernel)  # unknown kernel -> UnknownRef naming the known ones
    if target is not None:
        tgt = T.resolve(target)
        S.get(kernel).requirements.check_cc(kernel, tgt.cc, f"target {tgt.name}")
        return target_key(tgt)
    prefix = ref_name("build", kernel, "")
    keys = sorted(name[len(prefix):] for name in store.state.refs if name.startswith(prefix))
    if len(keys) == 1:
        return keys[0]
    if not keys:
        raise UnknownRef(f"kernel {kernel} has no build in this store", f"run `ledger kernel build {kernel} --target T` first")
    raise BadInput(f"kernel {kernel} is built for several targets ({', '.join(keys)})", "pass --target")


def current_build(store, kernel: str, key: str) -> tuple[str, BuildRecord]:
    ref = ref_name("build", kernel, key)
    oid = store.state.refs.get(ref)
    if oid is None:
        raise UnknownRef(f"kernel {kernel} has no build for target {key} in this store",
                         f"run `ledger kernel build {kernel} --target {key}` first")
    return oid, build_from_store(store, oid)


def probe_device() -> dict:
    """The local device, or RealizationUnavailable (no cupy / no NVRTC / no GPU)."""
    from ledger.kernels import runtime

    return runtime.device_info()


def gated(store, kernel: str, key: str) -> dict | None:
    """The accepted gate for the CURRENT build of `kernel` on `key`, or None.

    Checked, not trusted: the ref must name an accepted gate whose test and bench timed the
    cubin the current build ref names."""
    refs = store.state.refs
    gid, bid = refs.get(ref_name("gate", kernel, key)), refs.get(ref_name("build", kernel, key))
    if gid is None or bid is None:
        return None
    g = load_gate(store, gid)
    build = store.get_json(bid)
    t = load_test(store, g.test)
    if not (g.accepted and g.kernel == kernel and t.code_object == build["cubin"]):
        return None
    return {"kernel": kernel, "target": key, "gate": gid, "build": bid, "code_object": build["cubin"],
            "arch": build["arch"], "reason": g.reason}


# --- the four commands --------------------------------------------------------------------
def record_build(store, kernel: str, target: str, *, defines: tuple[str, ...] = ()) -> Recorded:
    tgt = T.resolve(target)
    key = target_key(tgt)
    rec = harness.build(kernel, tgt, defines=defines)   # RealizationUnavailable without cupy/NVRTC
    rid = rec.id
    ref = ref_name("build", kernel, key)
    gref = ref_name("gate", kernel, key)
    if store.state.refs.get(ref) == rid and store.has(rid):
        return Recorded("build", kernel, key, rid, rec, None, {ref: rid})
    with store.transaction("kernel-build") as tx:
        refs_now = store.state.refs  # the state this transaction appends to
        for oid, data in rec.artefacts().items():
            got = tx.put_bytes(data, "kernel-artefact")
            assert got == oid, "kernel artefact ids follow the store's rules"
        got = tx.put_json(rec.body(), "kernel-build")
        assert got == rid
        tx.outputs.append(rid)
        tx.refs[ref] = rid
        old_gate, dropped = refs_now.get(gref), None
        # A gate admits one code object: a build with another cubin is not admitted by it.
        if old_gate is not None and load_test(store, load_gate(store, old_gate).test).code_object != rec.cubin_id:
            tx.refs[gref], dropped = None, old_gate
        records.write(tx, records.KernelBuild(record=rid, kernel=kernel, target=key, arch=rec.arch, cubin=rec.cubin_id,
                                              target_profile=tgt.body(),
                                              **({"gate_dropped": dropped} if dropped else {})))
    return Recorded("build", kernel, key, rid, rec, tx.record, dict(tx.refs), dropped)


def record_test(store, kernel: str, target: str | None, *, shapes=None, seed: int = 0) -> Recorded:
    key = resolve_key(store, kernel, target)
    probe_device()
    bid, br = current_build(store, kernel, key)
    rec = harness.test(kernel, shapes, seed=seed, build_record=br)
    rid = rec.id
    ref = ref_name("test", kernel, key)
    with store.transaction("kernel-test") as tx:
        _same_build(store, kernel, key, bid)
        assert tx.put_json(rec.body(), "kernel-test") == rid
        tx.inputs.append(bid)
        tx.outputs.append(rid)
        tx.refs[ref] = rid
        records.write(tx, records.KernelTest(record=rid, kernel=kernel, target=key, build=bid,
                                             worst_rel_l2=rec.worst_rel_l2, tolerance=rec.tolerance,
                                             unwritten=rec.unwritten))
    return Recorded("test", kernel, key, rid, rec, tx.record, dict(tx.refs))


def _same_build(store, kernel: str, key: str, bid: str) -> None:
    """Under the lock: the build measured is still the current one (no rebuild raced us)."""
    now = store.state.refs.get(ref_name("build", kernel, key))
    if now != bid:
        raise BadInput(f"the build of {kernel} for {key} changed to {now} while {bid} was being measured",
                       "run the command again")


def default_bench_shape(kernel: str) -> str:
    return "1x8192x8192" + ("r16" if S.get(kernel).lora else "")


def record_bench(store, kernel: str, target: str | None, *, shape: str | None = None, launches: int = 50,
                 warmup: int = 10, seed: int = 0) -> Recorded:
    key = resolve_key(store, kernel, target)
    sh = S.Shape.coerce(shape or default_bench_shape(kernel))
    S.get(kernel).requirements.check_shape(kernel, sh)
    if launches < harness.MIN_LAUNCHES:
        raise BadInput(f"launches={launches}: a bench needs at least {harness.MIN_LAUNCHES} timed launches")
    probe_device()
    bid, br = current_build(store, kernel, key)
    rec = harness.bench(kernel, sh, launches=launches, warmup=warmup, seed=seed, build_record=br)
    rid = rec.id
    ref = ref_name("bench", kernel, key)
    with store.transaction("kernel-bench") as tx:
        _same_build(store, kernel, key, bid)
        assert tx.put_json(rec.body(), "kernel-bench") == rid
        # The baseline's code-object id is the hash of its description (torch's realization and
        # the torch build): stored too, so both ids in the record resolve to what was timed.
        base = tx.put_json(rec.baseline_description, "kernel-baseline")
        if base != rec.baseline.code_object:
            raise InternalError(f"baseline id {rec.baseline.code_object[:15]}… is not the hash of its description",
                                "report it: the bench record would name code it cannot show")
        tx.inputs.append(bid)
        tx.outputs.extend([rid, base])
        tx.refs[ref] = rid
        records.write(tx, records.KernelBench(record=rid, kernel=kernel, target=key, build=bid, shape=str(sh),
                                              candidate_median_s=_finite(rec.candidate.median_s),
                                              baseline_median_s=_finite(rec.baseline.median_s)))
    return Recorded("bench", kernel, key, rid, rec, tx.record, dict(tx.refs))


def _finite(v: float) -> float | None:
    return v if isinstance(v, (int, float)) and math.isfinite(v) else None


def record_gate(store, kernel: str, target: str | None, *, test: str | None = None, bench: str | None = None) -> Recorded:
    """Judge a test and a bench record (default: the latest of the current build) and record the
    decision; Accepted sets kernel/<kernel>/<target>, a refusal removes it."""
    key = resolve_key(store, kernel, target)
    gref = ref_name("gate", kernel, key)
    with store.transaction("kernel-gate") as tx:
        refs = store.state.refs  # read under the lock: the state this record appends to
        bid, _ = current_build(store, kernel, key)
        build_cubin = store.get_json(bid)["cubin"]

        def pick(kind, given):
            if given:
                return store.resolve(given)
            oid = refs.get(ref_name(kind, kernel, key))
            if oid is None:
                raise UnknownRef(f"kernel {kernel} has no {kind} record for target {key}",
                                 f"run `ledger kernel {kind} {kernel} --target {key}` first")
            return oid

        tid, rid_b = pick("test", test), pick("bench", bench)
        t, b = load_test(store, tid), load_bench(store, rid_b)
        if t.kernel != kernel:
            raise BadInput(f"test record {tid} is of kernel {t.kernel}, not {kernel}")
        if t.code_object != build_cubin:
            raise BadInput(f"test record {tid} tested code object {t.code_object}, but the current build of "
                           f"{kernel} for {key} is {build_cubin}",
                           "run `ledger kernel test` and `ledger kernel bench` for the current build")
        d = gate_fn(t, b)
        did = d.id
        assert tx.put_json(d.body(), "kernel-gate") == did
        tx.inputs.extend([bid, tid, rid_b])
        tx.outputs.append(did)
        if d.accepted:
            tx.refs[gref] = did
        elif refs.get(gref) is not None:
            tx.refs[gref] = None
        records.write(tx, records.KernelGate(record=did, kernel=kernel, target=key, build=bid, code_object=build_cubin,
                                             verdict=d.verdict, code=d.code))
    return Recorded("gate", kernel, key, did, d, tx.record, dict(tx.refs))


def status(store) -> list[dict]:
    """Every registered kernel with, per target built, its build / test / bench / gate refs."""
    refs = store.state.refs if store is not None else {}
    out = []
    for spec in (S.KERNELS[k] for k in sorted(S.KERNELS)):
        prefix = ref_name("build", spec.name, "")
        targets = {}
        for name in sorted(refs):
            if name.startswith(prefix):
                key = name[len(prefix):]
                targets[key] = {kind: refs.get(ref_name(kind, spec.name, key)) for kind in KINDS}
        out.append({**spec.body(), "targets": targets})
    return out


__all__ = ["KINDS", "Recorded", "b3", "bench_from_body", "build_from_store", "current_build", "gate_from_body",
           "gated", "load_bench", "load_gate", "load_test", "probe_device", "record_bench", "record_build",
           "record_gate", "record_test", "ref_name", "resolve_key", "status", "target_key", "test_from_body"]
