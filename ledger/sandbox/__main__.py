"""The bootstrap: `python -E -s -S -c <run.BOOTSTRAP> --rules-file F ... -- argv` (or `python -m ledger.sandbox`).

A fresh, single-threaded interpreter that confines itself and then execs argv, so nothing of the
caller's state (threads, locks held at fork time) is in the confined process. It imports only
the standard library and its sibling modules landlock, privileges and seccomp (-s -S: no
site-packages); run.bootstrap_command() starts it through package stubs, so neither
ledger/__init__.py nor ledger/sandbox/__init__.py (which import the store and blake3) runs.

The rules (JSON, written by the parent: run.bootstrap_rules):
  grants        [[path, kind], ...]       Landlock rules (landlock.KIND_RIGHTS)
  network       bool                      TCP allowed (Landlock) and AF_INET/6 SOCK_STREAM (seccomp)
  landlock      bool                      False: unsandboxed, none of the below is applied
  seccomp       hex                       the filter program to install (seccomp.program)
  notify        path | null               the parent's seccomp Supervisor socket
  shm           "private" | "inherit"     make /dev/shm private here, or check that the launcher did
  caller_mntns  int                       the caller's mount namespace ("inherit" must differ)
Every one of them is required when landlock is true: a missing one is a refusal, never less.

The order: private /dev/shm (needs CAP_SYS_ADMIN, or a user namespace) -> Landlock ruleset (opens
the granted paths, which may need the caller's authority) -> drop all capabilities ->
no_new_privs + landlock_restrict_self -> seccomp (last: it refuses unshare and mount) -> report ->
exec. Reports: `ok <abi>`, then `confined <json>` (what was applied), on the status fd or file.
"""

from __future__ import annotations

import argparse
import ctypes
import errno
import hashlib
import json
import os
import signal
import socket
import sys
from typing import Sequence

from ledger.sandbox import landlock, privileges, seccomp

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
    ap.add_argument("--private-shm", action="store_true",
                    help="(with --launcher) give the launcher and all it starts a private /dev/shm")
    ap.add_argument("--loopback-net", action="store_true",
                    help="(with --launcher) run the launcher and all it starts in a network namespace of "
                         "loopback alone")
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
            if ns.private_shm:   # every rank then shares this one tmpfs (NCCL's shm transport)
                privileges.private_shm()
            if ns.loopback_net:  # all its processes run here: 127.0.0.1 is all they need to reach
                privileges.loopback_net()
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
        confined = confine(rules, grants) if rules.get("landlock", True) else None
    except Exception as e:   # nothing of the caller's has run: fail closed
        report(f"error {type(e).__name__}: {e}")
        print(f"ledger.sandbox: {e}", file=sys.stderr)
        return BOOTSTRAP_FAILED
    report(f"ok {confined['landlock_abi'] if confined else 0}")
    if confined:
        report("confined " + json.dumps(confined, sort_keys=True))
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


def confine(rules: dict, grants: list[tuple[str, str]]) -> dict:
    """Apply everything the rules ask for to this (single-threaded) process; what was applied.
    Raises on the first thing that cannot be applied: the caller then refuses to run."""
    missing = [k for k in ("network", "seccomp", "notify", "shm", "caller_mntns") if k not in rules]
    if missing:
        raise ValueError(f"the rules lack {', '.join(missing)}: refusing to confine less")
    network = bool(rules["network"])
    if rules["shm"] == "private":
        namespaces = privileges.private_shm()
    elif rules["shm"] == "inherit":
        namespaces = "launcher"
        if not privileges.shm_is_private(int(rules["caller_mntns"])):
            raise OSError("the launcher did not give this process a private /dev/shm")
    else:
        raise ValueError(f"unknown shm mode {rules['shm']!r}")
    net = rules.get("net", "host")
    if net == "loopback":
        if not privileges.only_loopback(int(rules["caller_netns"])):
            raise OSError("the launcher did not give this process a network namespace of loopback alone")
    elif net != "host":
        raise ValueError(f"unknown net mode {net!r}")
    prog = bytes.fromhex(rules["seccomp"])
    notify = None
    if rules["notify"]:
        # connected now: once the filter is on, socket(AF_UNIX) is refused
        notify = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
        notify.connect(rules["notify"])
    ruleset, abi = landlock.ruleset(grants, network=network)
    dropped = privileges.drop_all()
    landlock.enforce(ruleset, abi)
    listener = seccomp.install(prog, listener=notify is not None)
    if notify is not None:
        seccomp.send_listener(notify, listener)
        os.close(listener)
        notify.close()
    return {"landlock_abi": abi, "seccomp_sha256": hashlib.sha256(prog).hexdigest(),
            "seccomp_supervised": notify is not None, "capabilities_dropped": dropped,
            "capabilities_left": sorted(k for k, v in privileges.capability_sets().items() if v),
            "shm": "private", "namespaces": namespaces, "no_new_privs": True, "net": net}


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
