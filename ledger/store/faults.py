"""Fault injection for the crash and I/O-error tests (tests/reliability/).

LEDGER_FAULT_AT=N      SIGKILL this process at the N-th fault point it passes (1-based).
LEDGER_FAULT_ERRNO=E:N raise OSError(E) at the N-th write-like operation, once;
                       E:N+ raises at the N-th and every later one. E is ENOSPC or EIO.
LEDGER_FAULT_TRACE=F   append the name of each fault point passed to file F.

Both counters are per process. Production code calls `point()` between the steps of a
transaction and routes writes through `io_check()`; with the variables unset both cost one
dict lookup.
"""

from __future__ import annotations

import errno
import os
import signal

_points = 0
_ios = 0


def active() -> bool:
    """Whether fault points are live (LEDGER_FAULT_AT or LEDGER_FAULT_TRACE is set)."""
    return "LEDGER_FAULT_AT" in os.environ or "LEDGER_FAULT_TRACE" in os.environ


def point(name: str) -> None:
    """A named fault point: SIGKILL if it is the LEDGER_FAULT_AT-th passed; listed in LEDGER_FAULT_TRACE."""
    global _points
    at = os.environ.get("LEDGER_FAULT_AT")
    trace = os.environ.get("LEDGER_FAULT_TRACE")
    if at is None and trace is None:
        return
    _points += 1
    if trace:
        with open(trace, "a") as f:
            f.write(f"{_points} {name}\n")
    if at is not None and _points == int(at):
        os.kill(os.getpid(), signal.SIGKILL)


def io_check(what: str) -> None:
    """A write about to happen: raise the injected OSError if LEDGER_FAULT_ERRNO says so."""
    global _ios
    spec = os.environ.get("LEDGER_FAULT_ERRNO")
    if not spec:
        return
    _ios += 1
    name, _, n = spec.partition(":")
    always = n.endswith("+")
    n = int(n.rstrip("+") or "1")
    if _ios == n or (always and _ios >= n):
        code = getattr(errno, name)
        raise OSError(code, f"{os.strerror(code)} (injected at {what})")


def reset() -> None:
    """For in-process tests."""
    global _points, _ios
    _points = 0
    _ios = 0
