"""The bootstrap: `python -E -s -S -m ledger.sandbox --rules-file F ... -- argv`.

A fresh, single-threaded interpreter that confines itself and then execs argv, so nothing of the
caller's state (threads, locks held at fork time) is in the confined process. Stdlib only below
this package (-s -S: no site-packages).
"""

from __future__ import annotations

import argparse
import ctypes
import errno
import json
import os
import signal
import sys
from typing import Sequence

from ledger.sandbox import landlock

_PR_SET_PDEATHSIG = 1
BOOTSTRAP_FAILED = 120


def main(args: Sequence[str]) -> int:
    # As early as possible: the process that started us (for --die-with-parent and --launcher).
    # One that died before this line leaves us adopted (ppid 1, or a subreaper's pid that the
    # check below cannot tell apart); a torchrun worker left so fails its rendezvous, whose
    # store died with torchrun.
    parent = os.getppid()
    ap = argparse.ArgumentParser(prog="python -m ledger.sandbox",
                                 description="confine this process with Landlock, then exec argv")
    src = ap.add_mutually_exclusive_group()
    src.add_argument("--rules", help='JSON: {"grants": [[path, kind], ...], "network": bool, '
                                     '"landlock": bool}')
    src.add_argument("--rules-file", help="the same JSON, in a file")
    ap.add_argument("--status-fd", type=int, default=-1)
    ap.add_argument("--status-dir", default=None, help="report into DIR/<pid> instead (several bootstraps)")
    ap.add_argument("--die-with-parent", action="store_true",
                    help="SIGKILL when the parent (a launcher) dies; it may not outlive it")
    ap.add_argument("--launcher", action="store_true",
                    help="start a launcher: only --die-with-parent, then exec argv UNconfined")
    ap.add_argument("--cwd", default=None)
    ap.add_argument("argv", nargs=argparse.REMAINDER)
    ns = ap.parse_args(args)
    argv = ns.argv[1:] if ns.argv[:1] == ["--"] else ns.argv
    if not ns.launcher and not (ns.rules or ns.rules_file):
        ap.error("one of --rules, --rules-file is required")
    status_fd = ns.status_fd
    if ns.die_with_parent or ns.launcher:
        if landlock.libc().prctl(_PR_SET_PDEATHSIG, ctypes.c_ulong(signal.SIGKILL), ctypes.c_ulong(0),
                         ctypes.c_ulong(0), ctypes.c_ulong(0)) != 0 or parent == 1 or os.getppid() != parent:
            return BOOTSTRAP_FAILED        # could not arm it, or the parent is already gone
    if ns.launcher:
        try:
            os.execvp(argv[0], argv)
        except (OSError, IndexError) as e:
            print(f"ledger.sandbox: cannot start the launcher {argv[:1]}: {e}", file=sys.stderr)
            return 127
    if ns.status_dir:
        # opened before confinement: the folder is not granted, so the target cannot touch it
        status_fd = os.open(os.path.join(ns.status_dir, str(os.getpid())),
                            os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)

    def report(line: str) -> None:
        if status_fd >= 0:
            try:
                os.write(status_fd, (line + "\n").encode())
            except OSError:
                pass

    if status_fd >= 0:
        os.set_inheritable(status_fd, False)   # closed by exec: the target never sees it
    try:
        if ns.rules_file:
            with open(ns.rules_file, "rb") as f:
                ns.rules = f.read()
        rules = json.loads(ns.rules)
        grants = [(str(p), str(k)) for p, k in rules["grants"] if k in landlock.KIND_RIGHTS]
        if not argv:
            raise ValueError("no command given")
        abi = landlock.restrict_self(grants, network=bool(rules.get("network", True))) \
            if rules.get("landlock", True) else 0
    except Exception as e:   # nothing of the caller's has run: fail closed
        report(f"error {type(e).__name__}: {e}")
        print(f"ledger.sandbox: {e}", file=sys.stderr)
        return BOOTSTRAP_FAILED
    report(f"ok {abi}")
    os.environ["LEDGER_SANDBOX_PID"] = str(os.getpid())   # exec keeps the pid
    try:
        if ns.cwd:
            os.chdir(ns.cwd)
        os.execvpe(argv[0], argv, os.environ)
    except OSError as e:
        if e.errno == errno.EACCES:
            report(f"exec-denied {os.path.abspath(argv[0]) if os.sep in argv[0] else argv[0]}")
        print(f"ledger.sandbox: cannot run {argv[0]}: {e}", file=sys.stderr)
        return 126 if e.errno == errno.EACCES else 127
    return 127   # pragma: no cover - execvpe does not return


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
