"""Run a child process that can reach only what its policy grants.

This is the enforcement half of the sealed gate (docs/gate.md): a training child is granted its
declared inputs (read-only), its output folder (read-write) and the system paths a Python process
needs to start; everything else -- the user's working directory, home, the store and above all
the sealed suite under `.ledger/sealed/` -- is refused by the kernel with EACCES.

Public API
    landlock_abi() -> int                      kernel's Landlock ABI version, 0 when unavailable
    SandboxPolicy(read_only=, read_write=, protected=, ...)   frozen; to_json() / from_json()
    system_allowances(policy) -> tuple[Grant]  the documented system paths a child is given
    run_sandboxed(argv, policy, *, env=, cwd=, timeout=, unsandboxed=False) -> SandboxResult

The modules
    landlock.py    the Landlock syscalls (ctypes) and the rights each grant kind carries
    seccomp.py     the BPF filter (sockets, ptrace, namespaces, ...) and the parent's Supervisor
                   that records every refused syscall
    privileges.py  dropping every capability; the private /dev/shm (mount namespace + tmpfs)
    policy.py      SandboxPolicy, Grant, system_allowances, the refusal rules
    audit_hook.py  the child's sitecustomize that records attempts outside the policy
    run.py         run_sandboxed, SandboxResult, the parent's defensive reading of the record
    __main__.py    the bootstrap (`python -m ledger.sandbox`) that confines itself, then execs

How a run works
    The parent validates the policy, resolves every grant to a concrete path, and starts
    `python -E -s -S -c <run.BOOTSTRAP> --rules-file F --status-dir D --cwd DIR -- argv...`.
    That bootstrap gives itself a private /dev/shm, drops every capability, applies Landlock and
    the seccomp filter to itself, reports into D/<its pid>, then execs argv. With a
    launcher (torchrun), the launcher starts N bootstraps and each confines itself.
    Landlock domains are inherited across exec and fork and can never be lifted, so the target
    and all its descendants stay confined.

    Why a bootstrap rather than subprocess's preexec_fn: preexec_fn runs Python code between
    fork() and exec() in a copy of a parent that may be multi-threaded (torch thread pools, rich
    progress, our own pipe readers). Any lock another thread held at fork time (allocator, import
    lock, logging) stays locked forever in the child, so CPython documents preexec_fn as unsafe
    with threads. A fresh interpreter is single-threaded when it calls landlock_restrict_self
    (which confines only the calling thread), can report failures over a pipe before anything
    of the caller's runs, and leaves nothing of the parent's state behind.

Recording denials
    Landlock reports nothing to userspace, so Python children get a `sitecustomize` (via
    PYTHONPATH) that installs a `sys.addaudithook` hook. It appends attempts on paths outside the
    policy to a log file the child can only append to; after exit the parent reads that log
    (bounded, parsed defensively, every entry re-classified against the policy) into
    `SandboxResult.denied_attempts` and `.protected_attempts`. The hook is a RECORD, not a
    guard: a hostile child can remove it, bypass it with ctypes, or not be Python at all -- it
    still cannot get past Landlock. See docs/sandbox.md.
"""

from ledger.sandbox.landlock import landlock_abi
from ledger.sandbox.policy import Grant, SandboxPolicy, system_allowances
from ledger.sandbox.run import Confinement, DeniedAttempt, SandboxResult, SyscallDenial, run_sandboxed

__all__ = ["landlock_abi", "SandboxPolicy", "Grant", "system_allowances", "DeniedAttempt",
           "SandboxResult", "run_sandboxed", "Confinement", "SyscallDenial"]
