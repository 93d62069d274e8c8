"""The kernel gate: a pure function of a test record and a bench record.

Refuses, in this order (first match wins):
  Unproven  - the records do not prove what they claim: different kernels; the bench timed a
              code object other than the one tested; candidate and baseline have the same
              code-object id (something was timed twice); fewer than 20 timed launches; a
              non-positive or non-finite time.
  Wrong     - any unwritten output, a non-finite error, the worst rel_l2 over the sweep above
              the kernel's tolerance, or an empty sweep.
  NotFaster - the candidate's median is not strictly below the baseline's.
Otherwise Accepted. Every decision carries the reason with the figures that decided it.
"""

from __future__ import annotations

import math

from ledger.kernels.harness import MIN_LAUNCHES
from ledger.kernels.records import BenchRecord, GateDecision, TestRecord


def gate(test_record: TestRecord, bench_record: BenchRecord) -> GateDecision:
    t, b = test_record, bench_record

    def decide(accepted: bool, code: str, reason: str) -> GateDecision:
        return GateDecision(kernel=t.kernel, accepted=accepted, code=code, reason=reason, test=t.id, bench=b.id)

    if t.kernel != b.kernel:
        return decide(False, "Unproven", f"test is of {t.kernel} but bench is of {b.kernel}")
    if t.code_object != b.candidate.code_object:
        return decide(False, "Unproven", f"the bench timed {b.candidate.code_object}, "
                                         f"not the tested code object {t.code_object}")
    if b.candidate.code_object == b.baseline.code_object:
        return decide(False, "Unproven", "candidate and baseline are the same code object: nothing was compared")
    if b.launches < MIN_LAUNCHES or b.candidate.launches < MIN_LAUNCHES or b.baseline.launches < MIN_LAUNCHES:
        return decide(False, "Unproven", f"only {min(b.launches, b.candidate.launches, b.baseline.launches)} "
                                         f"timed launches; the gate needs {MIN_LAUNCHES}")
    for who, tm in (("candidate", b.candidate), ("baseline", b.baseline)):
        if not (math.isfinite(tm.median_s) and tm.median_s > 0):
            return decide(False, "Unproven", f"{who} median time {tm.median_s!r} is not a positive finite number")

    if not t.cases:
        return decide(False, "Wrong", "the test sweep is empty: nothing shows the kernel is right")
    if t.unwritten:
        return decide(False, "Wrong", f"{t.unwritten} output elements were never written")
    worst = t.worst_rel_l2
    if worst is None:
        return decide(False, "Wrong", "the kernel produced a non-finite output")
    if not worst <= t.tolerance:
        bad = max(t.cases, key=lambda c: c["rel_l2"])
        return decide(False, "Wrong", f"worst relative error {worst:.3g} exceeds tolerance {t.tolerance:.3g} "
                                      f"(shape {bad['shape']}, path {bad.get('path')})")
    if not b.candidate.median_s < b.baseline.median_s:
        return decide(False, "NotFaster", f"candidate median {b.candidate.median_s * 1e6:.2f} us is not below "
                                          f"baseline {b.baseline.median_s * 1e6:.2f} us "
                                          f"({b.baseline.entry}, shape {b.shape})")
    return decide(True, "Accepted", f"worst relative error {worst:.3g} <= {t.tolerance:.3g}; "
                                    f"{b.speedup:.2f}x faster than {b.baseline.entry} at shape {b.shape} "
                                    f"({b.candidate_fraction:.1%} of copy bandwidth vs {b.baseline_fraction:.1%})")
