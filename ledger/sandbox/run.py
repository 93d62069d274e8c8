"""Run a child confined to its policy, and what came of it (SandboxResult).

See the package docstring (ledger/sandbox/__init__.py) and docs/sandbox.md.
"""

from __future__ import annotations

import dataclasses
import getpass
import hashlib
import json
import os
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from typing import Iterable, Mapping, Sequence

import blake3

import ledger
from ledger.errors import BadInput, InternalError, SandboxUnavailable
from ledger.sandbox import audit_hook, privileges, seccomp
from ledger.sandbox.landlock import EXEC_KINDS, READ_KINDS, WRITE_KINDS, landlock_abi
from ledger.sandbox.policy import Grant, SandboxPolicy, within
from ledger.sandbox.seccomp import SyscallDenial

__all__ = ["Confinement", "DeniedAttempt", "SandboxResult", "SyscallDenial", "bootstrap_command", "bootstrap_rules",
           "filter_id",
           "read_confinement", "run_sandboxed"]


@dataclass(frozen=True)
class DeniedAttempt:
    """An attempt on a path outside the policy, as recorded by the child's audit hook.

    op is the audit event ("open", "os.listdir", ...), access one of read/write/exec/meta.
    """
    op: str
    path: str
    access: str
    protected: bool = False

    def as_dict(self) -> dict:
        return dataclasses.asdict(self)


@dataclass(frozen=True)
class Confinement:
    """What the bootstrap applied, as every confined process reported it (the parent checks that
    they agree and that the filter they installed is the one it built)."""
    landlock_abi: int
    seccomp_filter_hash: str              # b3:<BLAKE3 of the BPF program bytes>
    seccomp_supervised: bool         # refused syscalls are reported to the parent
    capabilities_dropped: tuple[str, ...]   # held (effective, permitted or bounding) before
    capabilities_left: tuple[str, ...]      # capability sets still non-empty (normally none)
    shm_private: bool
    namespaces: str                  # "mount", "user+mount", or "launcher" (made by it)
    no_new_privs: bool
    net: str = "host"                # "loopback": a network namespace of loopback alone (its launcher made it)

    def as_dict(self) -> dict:
        d = dataclasses.asdict(self)
        d["capabilities_dropped"] = list(self.capabilities_dropped)
        d["capabilities_left"] = list(self.capabilities_left)
        return d


def bootstrap_rules(grants: Sequence[Grant], policy: SandboxPolicy, *, landlock: bool = True,
                    notify: str | None = None, shm: str = "private", net: str = "host") -> tuple[dict, bytes]:
    """The bootstrap's rules (see ledger/sandbox/__main__.py) and the seccomp program in them.

    notify: a seccomp.Supervisor's socket path (refused syscalls are recorded), else they only
    fail with EPERM. shm: "private" (the bootstrap makes it), "inherit" (a launcher did).
    net: "host", or "loopback" (the launcher made a network namespace of loopback alone, and
    each process checks that it is in it before it confines itself)."""
    prog = seccomp.program(network=policy.network, supervised=notify is not None, gpu=policy.gpu)
    return ({"grants": [[g.path, g.kind] for g in grants], "network": policy.network, "landlock": landlock,
             "seccomp": prog.hex(), "notify": notify, "shm": shm,
             "caller_mntns": privileges.mount_namespace(), "net": net,
             "caller_netns": privileges.net_namespace()}, prog)


def read_confinement(reports: Sequence[Sequence[str]], prog: bytes) -> Confinement:
    """The Confinement named by the bootstraps' reports (their lines after `ok <abi>`).
    Raises SandboxUnavailable unless each reported one, with this filter, and they agree."""
    seen = []
    for lines in reports:
        found = [x for x in lines[1:] if x.startswith("confined ")]
        try:
            c = json.loads(found[0][len("confined "):]) if len(found) == 1 else None
        except ValueError:
            c = None
        if not isinstance(c, dict):
            raise SandboxUnavailable("a confined process did not report what was applied; nothing is trusted")
        if c.get("seccomp_sha256") != hashlib.sha256(prog).hexdigest():
            raise SandboxUnavailable("a confined process installed another seccomp filter than the one built for it")
        seen.append(c)
    if not seen:
        raise SandboxUnavailable("no confined process reported")
    first = seen[0]
    try:
        conf = Confinement(
            landlock_abi=min(int(c["landlock_abi"]) for c in seen), seccomp_filter_hash=filter_id(prog),
            seccomp_supervised=all(c["seccomp_supervised"] is True for c in seen),
            capabilities_dropped=tuple(first["capabilities_dropped"]),
            capabilities_left=tuple(sorted({str(x) for c in seen for x in c["capabilities_left"]})),
            shm_private=all(c["shm"] == "private" for c in seen), namespaces=str(first["namespaces"]),
            no_new_privs=all(c["no_new_privs"] is True for c in seen),
            net="loopback" if all(c.get("net") == "loopback" for c in seen) else "host")
    except (KeyError, TypeError, ValueError):
        raise SandboxUnavailable("a confined process reported its confinement in an unknown form") from None
    return conf


@dataclass(frozen=True)
class SandboxResult:
    returncode: int
    sandboxed: bool            # False only when the caller asked for unsandboxed=True
    abi: int                   # Landlock ABI enforced (0 when not sandboxed)
    denied_attempts: tuple[DeniedAttempt, ...]
    protected_attempts: tuple[DeniedAttempt, ...]
    stdout_tail: str           # the last tail_bytes of each stream
    stderr_tail: str
    wall_s: float
    timed_out: bool = False
    audit_truncated: bool = False   # the hook's record was cut short or partly unreadable
    processes: int = 1         # how many processes confined themselves and reported (launcher: N)
    confinement: Confinement | None = None     # None only when unsandboxed
    syscall_denials: tuple[SyscallDenial, ...] = ()   # refused by seccomp, reported by the kernel
    syscall_denials_truncated: bool = False

    def as_dict(self) -> dict:
        d = dataclasses.asdict(self)
        d["denied_attempts"] = [a.as_dict() for a in self.denied_attempts]
        d["protected_attempts"] = [a.as_dict() for a in self.protected_attempts]
        d["confinement"] = self.confinement.as_dict() if self.confinement else None
        d["syscall_denials"] = [a.as_dict() for a in self.syscall_denials]
        return d


_MAX_LOG_BYTES = 1 << 20         # parent reads at most this much of the hook's log
MAX_ATTEMPTS = 1000             # and reports at most this many distinct attempts
_MAX_PATH = 4096
_ACCESSES = ("read", "write", "exec", "meta")


def classifier_roots(grants: Iterable[Grant], pid: int | None) -> dict:
    """Allowed path prefixes per access type. pid None keeps "/proc/self" for the hook to map."""
    roots = {a: [] for a in _ACCESSES}
    for g in grants:
        path = g.path
        if path == "/proc/self" and pid is not None:
            path = f"/proc/{pid}"
        if g.kind in READ_KINDS:
            roots["read"].append(path)
        if g.kind in WRITE_KINDS:
            roots["write"].append(path)
            roots["meta"].append(path)
        if g.kind in EXEC_KINDS:
            roots["exec"].append(path)
    return roots


def parse_audit_log(path: str, roots: Mapping[str, Sequence[str]],
                     protected: Sequence[str]) -> tuple[list[DeniedAttempt], bool]:
    """Read the child's record defensively: bounded size, every line validated, every path
    re-classified against the policy (the child's own judgement is not trusted)."""
    truncated = False
    try:
        with open(path, "rb") as f:
            data = f.read(_MAX_LOG_BYTES + 1)
    except OSError:
        return [], True
    if len(data) > _MAX_LOG_BYTES:
        data, truncated = data[:_MAX_LOG_BYTES], True
    lines = data.split(b"\n")
    if data and not data.endswith(b"\n"):
        lines.pop()                # a partial last line (killed mid-write, or cut by us)
        truncated = True
    out: dict[tuple, DeniedAttempt] = {}
    for raw in lines:
        if not raw.strip():
            continue
        try:
            rec = json.loads(raw)
        except ValueError:
            truncated = True
            continue
        if not isinstance(rec, dict):
            truncated = True
            continue
        if rec.get("truncated") is True:
            truncated = True
            continue
        op, p, access = rec.get("op"), rec.get("path"), rec.get("access")
        if not (isinstance(op, str) and isinstance(p, str) and access in _ACCESSES
                and len(op) <= 64 and 0 < len(p) <= _MAX_PATH and "\x00" not in p
                and os.path.isabs(p)):
            truncated = True
            continue
        p = os.path.normpath(p)
        resolved = p if p.startswith("/proc/") else os.path.realpath(p)
        if any(within(p, r) and within(resolved, r) for r in roots[access]):
            continue               # allowed after all: not a denial
        prot = any(within(p, q) or within(resolved, q) for q in protected)
        key = (op, p, access)
        if key not in out:
            if len(out) >= MAX_ATTEMPTS:
                truncated = True
                break
            out[key] = DeniedAttempt(op=op, path=p, access=access, protected=prot)
    return list(out.values()), truncated



# --- running ---------------------------------------------------------------------------------------
_PASS_ENV = ("PATH", "LANG", "LANGUAGE", "LC_ALL", "LC_CTYPE", "LC_MESSAGES", "LC_NUMERIC", "TZ",
             "TERM", "USER", "LOGNAME", "CUDA_VISIBLE_DEVICES", "NVIDIA_VISIBLE_DEVICES",
             "CUBLAS_WORKSPACE_CONFIG", "OMP_NUM_THREADS", "MKL_NUM_THREADS", "PYTHONHASHSEED",
             "LD_LIBRARY_PATH", "CUDA_HOME", "CUDA_PATH", "CUDA_DEVICE_ORDER",
             "NVIDIA_DRIVER_CAPABILITIES", "LEDGER_DEBUG")


class _Tail:
    """Drain a pipe on a thread, keeping only its last `limit` bytes."""

    def __init__(self, stream, limit: int):
        self.buf, self.limit, self.stream = bytearray(), limit, stream
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self):
        try:
            while chunk := self.stream.read1(65536):
                self.buf += chunk
                if len(self.buf) > 2 * self.limit:
                    del self.buf[:-self.limit]
        except (OSError, ValueError):
            pass

    def text(self, wait: float) -> str:
        self.thread.join(wait)
        return bytes(self.buf[-self.limit:]).decode("utf-8", "replace")


def _user_name() -> str:
    try:
        return getpass.getuser()
    except (KeyError, OSError):     # no passwd entry (some containers)
        return "ledger"


def _package_root() -> str:
    return os.path.dirname(os.path.dirname(os.path.abspath(ledger.__file__)))


def _wait_unreaped(proc: subprocess.Popen, timeout: float | None, stop: threading.Event | None = None) -> bool:
    """Wait for proc to exit without reaping it, or for `stop` to be set (then the caller kills
    its group at once); True when the timeout ran out first."""
    try:
        pidfd = os.pidfd_open(proc.pid)
    except (AttributeError, OSError):          # pragma: no cover - kernels before 5.3
        try:
            proc.wait(timeout=timeout)
            return False
        except subprocess.TimeoutExpired:
            return True
    try:
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            wait = None if stop is None else 0.1
            if deadline is not None:
                left = max(0.0, deadline - time.monotonic())
                wait = left if wait is None else min(wait, left)
            ready, _, _ = select.select([pidfd], [], [], wait)
            if ready or (stop is not None and stop.is_set()):
                return False
            if deadline is not None and time.monotonic() >= deadline:
                return True
    finally:
        os.close(pidfd)


def _kill_group(pid: int) -> None:
    try:
        os.killpg(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


# How the bootstrap starts: ledger and ledger.sandbox as bare package stubs, so that importing
# ledger.sandbox.__main__ runs neither package's __init__ (they import the store, and blake3 from
# site-packages, which -s -S leaves out); only the standard library and the bootstrap's siblings.
BOOTSTRAP = ("import sys, types\n"
             "for name, path in (('ledger', {ledger!r}), ('ledger.sandbox', {sandbox!r})):\n"
             "    m = types.ModuleType(name); m.__path__ = [path]; sys.modules[name] = m\n"
             "from ledger.sandbox.__main__ import main\n"
             "sys.exit(main(sys.argv[1:]))\n")


def bootstrap_command() -> list[str]:
    """How to start the bootstrap: `[python, -E, -s, -S, -c, BOOTSTRAP]`; its arguments follow.

    -E: ignore PYTHON* (so the bootstrap itself neither loads the audit hook nor the caller's
    PYTHONPATH); -s -S: no site-packages."""
    here = os.path.dirname(os.path.abspath(__file__))
    return [sys.executable, "-E", "-s", "-S", "-c",
            BOOTSTRAP.format(ledger=os.path.dirname(here), sandbox=here)]


def filter_id(prog: bytes) -> str:
    """A seccomp filter's id: b3:<BLAKE3 of the program bytes>."""
    return "b3:" + blake3.blake3(prog).hexdigest()


def run_sandboxed(argv: Sequence[str | os.PathLike], policy: SandboxPolicy, *,
                  env: Mapping[str, str] | None = None, cwd: str | os.PathLike | None = None,
                  timeout: float | None = None, unsandboxed: bool = False,
                  tail_bytes: int = 65536, launcher: Sequence[str] = (), processes: int = 1,
                  stop: threading.Event | None = None, net: str = "host") -> SandboxResult:
    """Run argv confined to `policy` and return what happened.

    launcher (with processes=N): a program that starts N copies of the command appended to it
    (torchrun --no-python). It runs UNconfined, with the caller's authority, and must not load
    the audit hook (start it with `python -E`); each copy is the bootstrap, which confines itself
    -- so every process gets its own /proc/self grant -- and is SIGKILLed when the launcher dies,
    as the launcher is when the calling thread's process dies.
    Unless all N report that they are confined, SandboxUnavailable (or InternalError) is raised.
    net="loopback" (with a launcher, sandboxed): the launcher and every process it starts run in a
    network namespace whose only interface is loopback -- several node agents on one host reach
    each other and nothing else; each process checks it before confining itself.
    stop: set it (from another thread) to kill the child's process group at once; the result then
    has the child's kill status (the caller knows why it asked, e.g. the child broke the rules).

    Landlock unavailable and not unsandboxed: raises SandboxUnavailable before anything runs.
    unsandboxed=True: runs without Landlock (even where it is available) and returns
    sandboxed=False, which the caller must record; attempts outside the policy are still noted.
    env None: a minimal environment (PATH, locale, USER, CUDA/OMP settings); HOME and TMPDIR
    point at a private scratch folder, which is also the default cwd. The child additionally
    gets PYTHONPATH (the audit hook), LEDGER_SANDBOX_AUDIT, PYTHONDONTWRITEBYTECODE=1.
    """
    if not argv:
        raise BadInput("run_sandboxed: empty argv")
    argv = [os.fsdecode(os.fspath(a)) for a in argv]
    if not isinstance(policy, SandboxPolicy):
        raise BadInput("run_sandboxed: policy must be a SandboxPolicy")
    abi = 0
    if not unsandboxed:
        abi = landlock_abi()
        if abi < 1:
            raise SandboxUnavailable("Landlock is not available on this kernel, so the child "
                                     "cannot be confined; nothing was run")
        if not policy.network and abi < 4:
            raise SandboxUnavailable(f"policy denies network but Landlock ABI {abi} cannot "
                                     "restrict TCP (needs 4); nothing was run")
        why = seccomp.available()
        if why:
            raise SandboxUnavailable(f"no seccomp filter can be built here ({why}); nothing was run")
    policy.check()
    if processes < 1 or (processes > 1 and not launcher):
        raise BadInput("run_sandboxed: several processes need a launcher that starts them")
    if net not in ("host", "loopback") or (net == "loopback" and (not launcher or unsandboxed)):
        raise BadInput("run_sandboxed: net is \"host\", or \"loopback\" for a sandboxed launcher")
    if cwd is not None and not os.path.isdir(cwd):
        raise BadInput(f"run_sandboxed: cwd {cwd} is not a folder")

    work = tempfile.mkdtemp(prefix="ledger-sandbox-")
    supervisor = None
    try:
        scratch = os.path.join(work, "scratch")
        hookdir = os.path.join(work, "hook")
        log = os.path.join(work, "audit.log")
        os.mkdir(scratch, 0o700)
        os.mkdir(hookdir, 0o700)
        os.close(os.open(log, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600))
        extra = (Grant(os.path.realpath(scratch), "rw", "private scratch: HOME, TMPDIR"),
                 Grant(os.path.realpath(hookdir), "r", "the audit hook"),
                 Grant(os.path.realpath(log), "append", "the audit log"))
        grants = policy.grants() + extra
        hook_roots = classifier_roots(grants, None)
        hook_roots.pop("meta")
        with open(os.path.join(hookdir, "audit.json"), "w") as f:
            json.dump({"log": os.path.realpath(log), "max_lines": 2000, **hook_roots}, f)
        shutil.copyfile(audit_hook.__file__, os.path.join(hookdir, "sitecustomize.py"))

        if env is None:
            child_env = {k: os.environ[k] for k in _PASS_ENV if k in os.environ}
            child_env.setdefault("PATH", os.defpath)
            child_env["HOME"] = scratch
            user = _user_name()
            child_env.setdefault("USER", user)
            child_env.setdefault("LOGNAME", user)
        else:
            child_env = {str(k): str(v) for k, v in env.items()}
        child_env.setdefault("TMPDIR", scratch)
        child_env["PYTHONPATH"] = os.pathsep.join(
            [hookdir] + ([child_env["PYTHONPATH"]] if child_env.get("PYTHONPATH") else []))
        child_env["LEDGER_SANDBOX_AUDIT"] = os.path.join(hookdir, "audit.json")
        child_env["PYTHONDONTWRITEBYTECODE"] = "1"
        target_cwd = os.path.abspath(cwd) if cwd is not None else scratch

        status_dir = os.path.join(work, "status")     # one report per bootstrap, named by its pid
        os.mkdir(status_dir, 0o700)
        # Refused syscalls are reported by the kernel to this process (the child cannot forge or
        # suppress that record); each bootstrap hands its filter's notification fd over here.
        if not unsandboxed:
            try:
                supervisor = seccomp.Supervisor(os.path.join(work, "seccomp.sock")).start()
            except OSError as e:   # e.g. we are ourselves confined: no unix socket, no supervisor
                raise SandboxUnavailable(f"cannot supervise the child's seccomp filter ({e}); "
                                         "nothing was run") from None
        rules_body, prog = bootstrap_rules(grants, policy, landlock=not unsandboxed,
                                           notify=supervisor.path if supervisor else None,
                                           shm="inherit" if launcher else "private", net=net)
        rules = os.path.join(work, "rules.json")   # a file: argv strings are capped at 128 KiB
        with open(rules, "w") as f:
            json.dump(rules_body, f)
        bootstrap = bootstrap_command()
        # A launcher is put in its own session like any child here, out of reach of signals to
        # ours, so it is armed to die with this process; its processes die with it in turn. It
        # makes the private /dev/shm that all of them share (NCCL's shm transport needs one).
        shm = (["--private-shm"] + (["--loopback-net"] if net == "loopback" else [])) if not unsandboxed else []
        cmd = [*([*bootstrap, "--launcher", *shm, "--", *launcher] if launcher else []),
               *bootstrap, "--rules-file", rules, "--status-dir", status_dir,
               *(["--die-with-parent"] if launcher else []), "--cwd", target_cwd, "--", *argv]
        start = time.monotonic()
        proc = subprocess.Popen(cmd, cwd=_package_root(), env=child_env,
                                stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, start_new_session=True)
        try:
            out, err = _Tail(proc.stdout, tail_bytes), _Tail(proc.stderr, tail_bytes)
            timed_out = _wait_unreaped(proc, timeout, stop)
        except BaseException:      # e.g. KeyboardInterrupt: never leave the child running
            _kill_group(proc.pid)
            proc.wait()
            raise
        wall = time.monotonic() - start
        # Kill the whole process group -- on timeout, and after a normal exit so that no
        # descendant keeps writing into the output folder once we return. The leader is still
        # unreaped here (alive or a zombie), so its pid, which is the group id, cannot have been
        # reused by an unrelated process.
        _kill_group(proc.pid)
        returncode = proc.wait()
        stdout, stderr = out.text(5.0), err.text(5.0)
        if supervisor is not None:
            supervisor.close()
        reports = []
        for name in sorted(os.listdir(status_dir)):
            with open(os.path.join(status_dir, name), "rb") as f:
                reports.append(f.read(65536).decode("utf-8", "replace").splitlines())
        bad = [r for r in reports if not r or not r[0].startswith("ok ")]
        if bad or len(reports) != processes:
            detail = (bad[0][0] if bad and bad[0] else
                      f"{len(reports)} of {processes} process(es) reported, exit status {returncode}")
            what = "the child" if processes == 1 else f"the {processes} processes"
            if not unsandboxed:
                raise SandboxUnavailable(f"could not confine {what}: {detail}; nothing was run",
                                         stderr=stderr[-2000:])
            raise InternalError(f"sandbox bootstrap failed: {detail}", stderr=stderr[-2000:])
        enforced = min(int(r[0].split()[1]) for r in reports)
        confinement = None if unsandboxed else read_confinement(reports, prog)
        if supervisor is not None and supervisor.listeners != len(reports):
            raise SandboxUnavailable(f"{supervisor.listeners} of {len(reports)} confined process(es) handed "
                                     "their seccomp notifications to the parent", stderr=stderr[-2000:])
        status = [line for r in reports for line in r[1:]]

        roots = classifier_roots(grants, proc.pid)
        denied, truncated = parse_audit_log(log, roots, policy.protected)
        for line in status:
            if line.startswith("exec-denied "):   # execve refused with EACCES: record it
                p = line[len("exec-denied "):]
                prot = any(within(p, q) for q in policy.protected)
                denied.append(DeniedAttempt("os.exec", p, "exec", prot))
        return SandboxResult(returncode=returncode, sandboxed=not unsandboxed, abi=enforced,
                             denied_attempts=tuple(denied),
                             protected_attempts=tuple(a for a in denied if a.protected),
                             stdout_tail=stdout, stderr_tail=stderr, wall_s=wall, timed_out=timed_out,
                             audit_truncated=truncated, processes=len(reports), confinement=confinement,
                             syscall_denials=supervisor.denials() if supervisor else (),
                             syscall_denials_truncated=bool(supervisor and supervisor.truncated))
    finally:
        if supervisor is not None:
            supervisor.close()
        shutil.rmtree(work, ignore_errors=True)

