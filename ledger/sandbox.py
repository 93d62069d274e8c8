"""Run a child process that can reach only the paths its policy grants (Linux Landlock).

This is the enforcement half of the sealed gate (DESIGN.md): a training child is granted its
declared inputs (read-only), its output folder (read-write) and the system paths a Python process
needs to start; everything else -- the user's working directory, home, the store and above all
the sealed suite under `.ledger/sealed/` -- is refused by the kernel with EACCES.

Public API
    landlock_abi() -> int                      kernel's Landlock ABI version, 0 when unavailable
    SandboxPolicy(read_only=, read_write=, protected=, ...)   frozen; to_json() / from_json()
    system_allowances(policy) -> tuple[Grant]  the documented system paths a child is given
    run_sandboxed(argv, policy, *, env=, cwd=, timeout=, unsandboxed=False) -> SandboxResult

How a run works
    The parent validates the policy, resolves every grant to a concrete path, and starts
    `python -E -s -S -m ledger.sandbox --rules-file F --status-dir D --cwd DIR -- argv...`.
    That bootstrap applies Landlock to itself, reports into D/<its pid>, then execs argv. With a
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

from __future__ import annotations

import argparse
import ctypes
import dataclasses
import errno
import json
import os
import select
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Mapping, Sequence

from ledger.errors import BadInput, InternalError, Refused, SandboxUnavailable

__all__ = ["landlock_abi", "SandboxPolicy", "Grant", "system_allowances", "DeniedAttempt",
           "SandboxResult", "run_sandboxed"]

# --- Landlock kernel interface (include/uapi/linux/landlock.h) ---------------------------------
# Syscall numbers are the same on x86_64 and aarch64 (added after the syscall tables unified).
_SYSCALLS = {"x86_64": (444, 445, 446), "aarch64": (444, 445, 446), "arm64": (444, 445, 446)}
_CREATE_RULESET_VERSION = 1 << 0
_RULE_PATH_BENEATH = 1
_PR_SET_NO_NEW_PRIVS = 38
_PR_SET_PDEATHSIG = 1

FS_EXECUTE = 1 << 0
FS_WRITE_FILE = 1 << 1
FS_READ_FILE = 1 << 2
FS_READ_DIR = 1 << 3
FS_REMOVE_DIR = 1 << 4
FS_REMOVE_FILE = 1 << 5
FS_MAKE_CHAR = 1 << 6
FS_MAKE_DIR = 1 << 7
FS_MAKE_REG = 1 << 8
FS_MAKE_SOCK = 1 << 9
FS_MAKE_FIFO = 1 << 10
FS_MAKE_BLOCK = 1 << 11
FS_MAKE_SYM = 1 << 12
FS_REFER = 1 << 13       # ABI 2: rename/link across directories
FS_TRUNCATE = 1 << 14    # ABI 3: truncate(2), O_TRUNC
FS_IOCTL_DEV = 1 << 15   # ABI 5: ioctl on device files
NET_BIND_TCP = 1 << 0    # ABI 4
NET_CONNECT_TCP = 1 << 1
SCOPE_ABSTRACT_UNIX_SOCKET = 1 << 0   # ABI 6
SCOPE_SIGNAL = 1 << 1
RESTRICT_SELF_LOG_NEW_EXEC_ON = 1 << 1   # ABI 7: kernel audit records denials after exec too

_FS_ABI1 = (1 << 13) - 1                 # EXECUTE .. MAKE_SYM
_FILE_RIGHTS = FS_EXECUTE | FS_WRITE_FILE | FS_READ_FILE | FS_TRUNCATE | FS_IOCTL_DEV


def _handled_fs(abi: int) -> int:
    """The filesystem rights this ABI can restrict; we handle (deny by default) all of them."""
    rights = _FS_ABI1
    if abi >= 2:
        rights |= FS_REFER
    if abi >= 3:
        rights |= FS_TRUNCATE
    if abi >= 5:
        rights |= FS_IOCTL_DEV
    return rights


# A grant kind names a bundle of rights. Rights a kernel cannot restrict are dropped by masking
# with _handled_fs(abi); rights that only apply to directories are dropped for file rules.
_KIND_RIGHTS = {
    "rx": FS_READ_FILE | FS_READ_DIR | FS_EXECUTE,           # system code: read and execute
    "r": FS_READ_FILE | FS_READ_DIR,                          # declared inputs
    "rw": (FS_READ_FILE | FS_READ_DIR | FS_WRITE_FILE | FS_TRUNCATE | FS_REMOVE_DIR
           | FS_REMOVE_FILE | FS_MAKE_DIR | FS_MAKE_REG | FS_MAKE_SYM | FS_MAKE_FIFO
           | FS_MAKE_SOCK | FS_REFER),                        # output folder, scratch
    "dev": FS_READ_FILE | FS_WRITE_FILE | FS_TRUNCATE,        # /dev/null ('w' opens with O_TRUNC)
    "devio": FS_READ_FILE | FS_WRITE_FILE | FS_READ_DIR | FS_IOCTL_DEV,   # GPU device nodes
    "append": FS_WRITE_FILE,                                  # the audit log: no read, no truncate
    "self": FS_READ_FILE | FS_READ_DIR | FS_WRITE_FILE | FS_TRUNCATE,   # the child's own /proc entry
}
_READ_KINDS = frozenset({"rx", "r", "rw", "dev", "devio", "self"})
_WRITE_KINDS = frozenset({"rw", "dev", "devio", "append", "self"})
_EXEC_KINDS = frozenset({"rx"})


class _RulesetAttr(ctypes.Structure):
    _fields_ = [("handled_access_fs", ctypes.c_uint64), ("handled_access_net", ctypes.c_uint64),
                ("scoped", ctypes.c_uint64)]


class _PathBeneathAttr(ctypes.Structure):
    _pack_ = 1   # the kernel struct is __attribute__((packed)): 12 bytes
    _fields_ = [("allowed_access", ctypes.c_uint64), ("parent_fd", ctypes.c_int32)]


def _libc():
    return ctypes.CDLL(None, use_errno=True)


def _syscall(libc, nr: int, *args) -> int:
    fn = libc.syscall
    fn.restype = ctypes.c_long
    ctypes.set_errno(0)
    return fn(ctypes.c_long(nr), *args)


def _probe_abi() -> int:
    if not sys.platform.startswith("linux"):
        return 0
    nrs = _SYSCALLS.get(os.uname().machine)
    if nrs is None:
        return 0
    try:
        libc = _libc()
        abi = _syscall(libc, nrs[0], None, ctypes.c_size_t(0), ctypes.c_uint32(_CREATE_RULESET_VERSION))
    except (OSError, AttributeError):
        return 0
    return abi if abi > 0 else 0   # -1: ENOSYS (not built / seccomp) or EOPNOTSUPP (disabled at boot)


def landlock_abi() -> int:
    """The kernel's Landlock ABI version (1, 2, ...), or 0 when Landlock is unavailable."""
    return _probe_abi()


def _restrict_self(grants: Sequence[tuple[str, str]], *, network: bool) -> int:
    """Confine the calling thread (and everything it later execs or forks) to `grants`.

    Only safe in a single-threaded process: other threads would stay unconfined. Raises OSError.
    """
    abi = _probe_abi()
    if abi < 1:
        raise OSError(errno.ENOSYS, "Landlock is not available on this kernel")
    nr_create, nr_add, nr_restrict = _SYSCALLS[os.uname().machine]
    libc = _libc()
    handled = _handled_fs(abi)
    attr = _RulesetAttr(handled_access_fs=handled)
    size = 8
    if abi >= 4:
        size = 16
        if not network:   # handle TCP bind/connect and add no port rule: all TCP denied
            attr.handled_access_net = NET_BIND_TCP | NET_CONNECT_TCP
    if abi >= 6:
        size = 24         # cannot signal or reach abstract sockets of processes outside the domain
        attr.scoped = SCOPE_ABSTRACT_UNIX_SOCKET | SCOPE_SIGNAL
    ruleset = _syscall(libc, nr_create, ctypes.byref(attr), ctypes.c_size_t(size), ctypes.c_uint32(0))
    if ruleset < 0:
        err = ctypes.get_errno()
        raise OSError(err, f"landlock_create_ruleset: {os.strerror(err)}")
    try:
        for path, kind in grants:
            rights = _KIND_RIGHTS[kind] & handled
            try:
                fd = os.open(path, os.O_PATH | os.O_CLOEXEC)
            except FileNotFoundError:
                continue      # vanished since the parent checked: granting less is always safe
            try:
                if not stat.S_ISDIR(os.fstat(fd).st_mode):
                    rights &= _FILE_RIGHTS
                if not rights:
                    continue
                rule = _PathBeneathAttr(allowed_access=rights, parent_fd=fd)
                if _syscall(libc, nr_add, ctypes.c_long(ruleset), ctypes.c_long(_RULE_PATH_BENEATH),
                            ctypes.byref(rule), ctypes.c_uint32(0)) != 0:
                    err = ctypes.get_errno()
                    raise OSError(err, f"landlock_add_rule {path!r} ({kind}): {os.strerror(err)}")
            finally:
                os.close(fd)
        if libc.prctl(_PR_SET_NO_NEW_PRIVS, ctypes.c_ulong(1), ctypes.c_ulong(0),
                      ctypes.c_ulong(0), ctypes.c_ulong(0)) != 0:
            err = ctypes.get_errno()
            raise OSError(err, f"prctl(PR_SET_NO_NEW_PRIVS): {os.strerror(err)}")
        flags = RESTRICT_SELF_LOG_NEW_EXEC_ON if abi >= 7 else 0
        if _syscall(libc, nr_restrict, ctypes.c_long(ruleset), ctypes.c_uint32(flags)) != 0:
            err = ctypes.get_errno()
            raise OSError(err, f"landlock_restrict_self: {os.strerror(err)}")
    finally:
        os.close(ruleset)
    return abi


# --- policy --------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Grant:
    """One path a child may reach, with a kind naming the rights (see _KIND_RIGHTS)."""
    path: str
    kind: str
    why: str = ""


def _norm(p: str | os.PathLike, field: str, *, absolute_only: bool = False) -> str:
    if not isinstance(p, (str, os.PathLike)):
        raise BadInput(f"sandbox policy: {field} must hold paths, got {type(p).__name__}")
    s = os.fspath(p)
    if isinstance(s, bytes):
        s = os.fsdecode(s)
    if not s or "\x00" in s:
        raise BadInput(f"sandbox policy: empty or NUL-containing path in {field}")
    if absolute_only and not os.path.isabs(s):
        raise BadInput(f"sandbox policy: {field} path {s!r} is not absolute")
    return os.path.realpath(s)


def _within(path: str, root: str) -> bool:
    return path == root or path.startswith(root.rstrip("/") + "/")


def _store_trouble(path: str) -> str | None:
    """Why granting `path` would expose a store (or its sealed area) wholesale, else None."""
    parts = Path(path).parts
    for i, part in enumerate(parts):
        if part.endswith(".ledger"):
            if i == len(parts) - 1:
                return "it is a store (.ledger) itself; grant specific objects or folders in it"
            if parts[i + 1] == "sealed":
                return "it is inside a store's sealed area"
    if os.path.isdir(os.path.join(path, ".ledger")):
        return "it contains a store (.ledger); grant specific folders instead"
    return None


@dataclass(frozen=True)
class SandboxPolicy:
    """What a sandboxed child may reach. Paths are stored absolute with symlinks resolved.

    read_only   declared inputs: read files, list folders
    read_write  output folders: create, write, rename, delete inside
    protected   paths that must stay unreachable (e.g. `.ledger/sealed`); any attempt on them is
                reported separately, and a policy whose grants reach them is refused
    system      add the system allowances (`system_allowances`) a Python child needs to start
    gpu         also grant NVIDIA device nodes and the /proc and /sys files drivers read
    network     allow TCP; False denies TCP bind/connect (needs ABI 4, else SandboxUnavailable)
    shared_memory  grant /dev/shm read-write (torch DataLoader workers pass tensors through it)
    """
    read_only: tuple[str, ...] = ()
    read_write: tuple[str, ...] = ()
    protected: tuple[str, ...] = ()
    system: bool = True
    gpu: bool = False
    network: bool = True
    shared_memory: bool = True

    _FORMAT = 1

    def __post_init__(self):
        for name in ("read_only", "read_write", "protected"):
            raw = getattr(self, name)
            if raw is None:
                raw = ()
            if isinstance(raw, (str, os.PathLike)):
                raise BadInput(f"sandbox policy: {name} must be a list of paths, not one path")
            paths = tuple(dict.fromkeys(_norm(p, name) for p in raw))
            object.__setattr__(self, name, paths)
        for name in ("system", "gpu", "network", "shared_memory"):
            if not isinstance(getattr(self, name), bool):
                raise BadInput(f"sandbox policy: {name} must be true or false")

    # JSON ----------------------------------------------------------------------------------
    def as_dict(self) -> dict:
        return {"format": self._FORMAT, "read_only": list(self.read_only),
                "read_write": list(self.read_write), "protected": list(self.protected),
                "system": self.system, "gpu": self.gpu, "network": self.network,
                "shared_memory": self.shared_memory}

    def to_json(self) -> str:
        return json.dumps(self.as_dict(), sort_keys=True, separators=(",", ":"))

    @classmethod
    def from_json(cls, data: str | bytes | Mapping) -> SandboxPolicy:
        if isinstance(data, (str, bytes)):
            try:
                data = json.loads(data)
            except ValueError as e:
                raise BadInput(f"sandbox policy: not JSON ({e})") from None
        if not isinstance(data, Mapping):
            raise BadInput("sandbox policy: expected a JSON object")
        if data.get("format") != cls._FORMAT:
            raise BadInput(f"sandbox policy: unknown format {data.get('format')!r}")
        known = {f.name for f in dataclasses.fields(cls)} | {"format"}
        extra = set(data) - known
        if extra:
            raise BadInput(f"sandbox policy: unknown fields {sorted(extra)}")
        kw = {}
        for name in ("read_only", "read_write", "protected"):
            value = data.get(name, [])
            if not isinstance(value, list) or not all(isinstance(p, str) for p in value):
                raise BadInput(f"sandbox policy: {name} must be a list of strings")
            kw[name] = tuple(_norm(p, name, absolute_only=True) for p in value)
        for name in ("system", "gpu", "network", "shared_memory"):
            if name in data:
                kw[name] = data[name]
        return cls(**kw)

    # grants --------------------------------------------------------------------------------
    def grants(self) -> tuple[Grant, ...]:
        """Every path the child gets: system allowances first, then the caller's."""
        out = list(system_allowances(self)) if self.system else []
        out += [Grant(p, "r", "declared input") for p in self.read_only]
        out += [Grant(p, "rw", "output folder") for p in self.read_write]
        return tuple(out)

    def check(self) -> None:
        """Refuse a policy that would expose a protected path, a store or home wholesale."""
        home = os.path.realpath(os.path.expanduser("~"))
        for g in self.grants():
            if g.path == "/proc/self":
                continue
            if g.path == "/":
                raise Refused("sandbox policy grants the whole filesystem (/)",
                              "grant specific folders", path=g.path)
            if home != "/" and _within(home, g.path):
                raise Refused(f"sandbox policy grants {g.path}, which contains the home folder",
                              "grant specific folders", path=g.path)
            trouble = _store_trouble(g.path)
            if trouble:
                raise Refused(f"sandbox policy grants {g.path}: {trouble}",
                              "grant specific object paths or folders, never .ledger itself",
                              path=g.path)
            for p in self.protected:
                if _within(p, g.path) or _within(g.path, p):
                    raise Refused(f"sandbox policy grant {g.path} ({g.why}) reaches protected "
                                  f"path {p}", "narrow the grant so the protected path is outside it",
                                  path=g.path, protected=p)
        for p in self.read_only + self.read_write:
            if not os.path.exists(p):
                raise BadInput(f"sandbox policy: granted path {p} does not exist",
                               "create the output folder before running the child")


def _python_paths() -> list[str]:
    paths = [sys.base_prefix, sys.base_exec_prefix, sys.prefix, sys.exec_prefix]
    try:
        import site
        paths += site.getsitepackages()
    except (AttributeError, ImportError):   # pragma: no cover - old virtualenv site.py
        pass
    return paths


def system_allowances(policy: SandboxPolicy | None = None) -> tuple[Grant, ...]:
    """The system paths a child gets unless policy.system is False. Only existing paths appear.

    Deliberately NOT here: the working directory, home, /tmp, /opt, /var, /srv, /mnt, the store.
    The child's HOME, TMPDIR and default cwd are a private scratch folder made per run.
    """
    policy = policy or SandboxPolicy()
    cand: list[Grant] = []
    for p in ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32"):
        cand.append(Grant(p, "rx", "system programs and shared libraries"))
    for p in _python_paths():
        cand.append(Grant(p, "rx", "the Python installation, venv and site-packages"))
    import ledger
    cand.append(Grant(os.path.dirname(os.path.abspath(ledger.__file__)), "r",
                      "the ledger package, so training children can import it"))
    for p in ("/etc/ld.so.cache", "/etc/ld.so.conf", "/etc/ld.so.conf.d", "/etc/localtime"):
        cand.append(Grant(p, "r", "dynamic loader configuration and local time"))
    for p in ("/etc/passwd", "/etc/group", "/etc/nsswitch.conf"):   # world-readable, no secrets
        cand.append(Grant(p, "r", "user database (getpwuid; torch's cache dir asks for the user)"))
    cand.append(Grant("/dev/null", "dev", "null device"))
    for p in ("/dev/zero", "/dev/urandom", "/dev/random"):
        cand.append(Grant(p, "r", "random and zero devices"))
    if policy.shared_memory:
        cand.append(Grant("/dev/shm", "rw", "POSIX shared memory (DataLoader workers)"))
    # /proc/self is resolved by the bootstrap to /proc/<its pid>, which the exec'd target keeps.
    # Writable because the CUDA driver names its threads through /proc/self/task/*/comm (cuInit
    # fails with 304 otherwise); fd/* and cwd links still resolve to, and are checked as, their
    # real targets. Other processes' entries are NOT granted: with /proc readable, a child could
    # read the parent's environ (measured on kernel 6.18), which may hold credentials.
    cand.append(Grant("/proc/self", "self", "the child's own /proc entry"))
    for p in ("/proc/cpuinfo", "/proc/meminfo", "/proc/stat", "/sys/devices/system/cpu",
              "/sys/devices/system/node"):
        cand.append(Grant(p, "r", "CPU and memory topology (torch, OpenMP)"))
    cand.append(Grant("/proc/sys/kernel/random/boot_id", "r", "boot id (torch inductor cache key)"))
    if policy.network:  # world-readable, no secrets: `localhost`, and the interfaces and PCI
        # devices gloo/NCCL scan when they bootstrap (torchrun rendezvous, DDP on loopback)
        for p in ("/etc/hosts", "/etc/host.conf", "/etc/gai.conf", "/sys/class/net", "/sys/bus/pci", "/sys/devices"):
            cand.append(Grant(p, "r", "loopback name, network interfaces and PCI topology (torchrun, gloo/NCCL)"))
    if policy.gpu:
        for name in sorted(os.listdir("/dev")) if os.path.isdir("/dev") else ():
            if name.startswith("nvidia"):
                cand.append(Grant(f"/dev/{name}", "devio", "NVIDIA device nodes"))
        for p in ("/proc/driver/nvidia", "/sys/bus/pci", "/sys/devices", "/sys/module/nvidia"):
            cand.append(Grant(p, "r", "NVIDIA driver and PCI topology"))
    seen: dict[str, Grant] = {}
    for g in cand:
        if g.path == "/proc/self":   # resolved by the bootstrap, not here (see above)
            seen.setdefault(g.path, g)
            continue
        if not os.path.exists(g.path):
            continue
        real = os.path.realpath(g.path)
        if real not in seen:
            seen[real] = Grant(real, g.kind, g.why)
    # Drop grants that a broader grant already covers (Landlock unions rights down the tree).
    kept = [g for g in seen.values()
            if not any(h is not g and h.path != "/proc/self" and g.path != "/proc/self"
                       and _within(g.path, h.path)
                       and not _KIND_RIGHTS[g.kind] & ~_KIND_RIGHTS[h.kind]
                       for h in seen.values())]
    return tuple(kept)


# --- results -------------------------------------------------------------------------------------
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

    def as_dict(self) -> dict:
        d = dataclasses.asdict(self)
        d["denied_attempts"] = [a.as_dict() for a in self.denied_attempts]
        d["protected_attempts"] = [a.as_dict() for a in self.protected_attempts]
        return d


# --- the audit hook, installed in Python children as sitecustomize -------------------------------
# Self-contained (stdlib only) so the child need not import ledger. It never raises: an exception
# in an audit hook would abort the operation being audited.
_HOOK_SOURCE = r'''
"""ledger sandbox audit hook: records attempts on paths outside the sandbox policy.

A record only. Landlock enforces the policy; a hostile child can remove this hook, but cannot
lift Landlock.
"""
def _ledger_sandbox_hook():
    import os, sys, json, threading
    cfg_path = os.environ.get("LEDGER_SANDBOX_AUDIT")
    if not cfg_path:
        return
    try:
        with open(cfg_path, "rb") as f:
            cfg = json.loads(f.read(1 << 20))
        fd = os.open(cfg["log"], os.O_WRONLY | os.O_APPEND | os.O_CLOEXEC)
    except Exception:
        return
    root_pid = os.environ.get("LEDGER_SANDBOX_PID", "")
    def fix(roots):
        out = []
        for r in roots:
            if r == "/proc/self":
                if not root_pid:
                    continue
                r = "/proc/" + root_pid
            out.append(r.rstrip("/") or "/")
        return tuple(out)
    roots = {k: fix(cfg[k]) for k in ("read", "write", "exec")}
    roots["meta"] = roots["write"]
    max_lines = int(cfg.get("max_lines", 2000))
    state = {"lines": 0}
    tls = threading.local()     # per-thread reentrancy guard: the hook's own calls are not recorded
    seen = set()
    dircache = {}
    W = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND
    def within(p, rs):
        for r in rs:
            if p == r or p.startswith(r + "/") or r == "/":
                return True
        return False
    def canon(p):
        p = os.path.abspath(os.fsdecode(p))
        if p == "/proc/self" or p.startswith("/proc/self/"):
            p = "/proc/%d" % os.getpid() + p[len("/proc/self"):]
        elif p == "/proc/thread-self" or p.startswith("/proc/thread-self/"):
            p = "/proc/%d/task/%d" % (os.getpid(), threading.get_native_id()) + p[len("/proc/thread-self"):]
        return p
    def real(p):
        if p.startswith("/proc/"):
            return p
        d, b = os.path.split(p)
        rd = dircache.get(d)
        if rd is None:
            if len(dircache) > 4096:
                dircache.clear()
            rd = dircache[d] = os.path.realpath(d)
        r = os.path.join(rd, b)
        return os.path.realpath(r) if os.path.islink(r) else r
    def note(op, path, access):
        if path is None or isinstance(path, int):
            return
        # Landlock judges the resolved path, so the record does too: /bin/cat -> /usr/bin/cat
        # is allowed, out/link -> sealed/x is not.
        p = real(canon(path))
        rs = roots[access]
        if within(p, rs):
            return
        key = (op, p, access)
        if key in seen:
            return
        seen.add(key)
        if state["lines"] >= max_lines:
            return
        state["lines"] += 1
        if state["lines"] == max_lines:
            line = {"truncated": True}
        else:
            line = {"op": op, "path": p, "access": access, "pid": os.getpid()}
        os.write(fd, (json.dumps(line) + "\n").encode("utf-8", "surrogateescape"))
    READ1 = {"os.listdir", "os.scandir", "ctypes.dlopen"}
    WRITE1 = {"os.mkdir", "os.rmdir", "os.remove", "os.truncate", "os.mkfifo", "os.mknod"}
    META1 = {"os.chmod", "os.chown", "os.utime", "os.setxattr", "os.removexattr"}
    def hook(event, args):
        if getattr(tls, "busy", False):
            return
        tls.busy = True
        try:
            if event == "open":
                path, mode, flags = args
                write = (isinstance(mode, str) and any(c in mode for c in "wax+")) or \
                        (isinstance(flags, int) and bool(flags & W))
                note(event, path, "write" if write else "read")
            elif event in READ1:
                p = args[0] if args else None
                if event == "ctypes.dlopen" and not (isinstance(p, str) and "/" in p):
                    return
                note(event, "." if p is None and event != "ctypes.dlopen" else p, "read")
            elif event in WRITE1:
                note(event, args[0], "write")
            elif event in META1:
                note(event, args[0], "meta")
            elif event in ("os.rename", "os.link"):
                note(event, args[0], "write")
                note(event, args[1], "write")
            elif event == "os.symlink":
                note(event, args[1], "write")
            elif event in ("os.exec", "os.posix_spawn", "os.spawn"):
                p = args[1] if event == "os.spawn" else args[0]
                note(event, p, "exec")
            elif event == "subprocess.Popen":
                exe = args[0]
                if exe is None and args[1]:
                    a = args[1]
                    exe = a if isinstance(a, (str, bytes)) else a[0]
                if isinstance(exe, (str, bytes, os.PathLike)) and os.sep in os.fsdecode(exe):
                    note(event, exe, "exec")
        except BaseException:
            pass
        finally:
            tls.busy = False
    sys.addaudithook(hook)

_ledger_sandbox_hook()
del _ledger_sandbox_hook
'''

_MAX_LOG_BYTES = 1 << 20         # parent reads at most this much of the hook's log
_MAX_ATTEMPTS = 1000             # and reports at most this many distinct attempts
_MAX_PATH = 4096
_ACCESSES = ("read", "write", "exec", "meta")


def _classifier_roots(grants: Iterable[Grant], pid: int | None) -> dict:
    """Allowed path prefixes per access type. pid None keeps "/proc/self" for the hook to map."""
    roots = {a: [] for a in _ACCESSES}
    for g in grants:
        path = g.path
        if path == "/proc/self" and pid is not None:
            path = f"/proc/{pid}"
        if g.kind in _READ_KINDS:
            roots["read"].append(path)
        if g.kind in _WRITE_KINDS:
            roots["write"].append(path)
            roots["meta"].append(path)
        if g.kind in _EXEC_KINDS:
            roots["exec"].append(path)
    return roots


def _parse_audit_log(path: str, roots: Mapping[str, Sequence[str]],
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
        if any(_within(p, r) and _within(resolved, r) for r in roots[access]):
            continue               # allowed after all: not a denial
        prot = any(_within(p, q) or _within(resolved, q) for q in protected)
        key = (op, p, access)
        if key not in out:
            if len(out) >= _MAX_ATTEMPTS:
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
_BOOTSTRAP_FAILED = 120


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
    import getpass
    try:
        return getpass.getuser()
    except (KeyError, OSError):     # no passwd entry (some containers)
        return "ledger"


def _package_root() -> str:
    import ledger
    return os.path.dirname(os.path.dirname(os.path.abspath(ledger.__file__)))


def _wait_unreaped(proc: subprocess.Popen, timeout: float | None) -> bool:
    """Wait for proc to exit without reaping it; True when the timeout ran out first."""
    try:
        pidfd = os.pidfd_open(proc.pid)
    except (AttributeError, OSError):          # pragma: no cover - kernels before 5.3
        try:
            proc.wait(timeout=timeout)
            return False
        except subprocess.TimeoutExpired:
            return True
    try:
        ready, _, _ = select.select([pidfd], [], [], timeout)
        return not ready
    finally:
        os.close(pidfd)


def _kill_group(pid: int) -> None:
    try:
        os.killpg(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def run_sandboxed(argv: Sequence[str | os.PathLike], policy: SandboxPolicy, *,
                  env: Mapping[str, str] | None = None, cwd: str | os.PathLike | None = None,
                  timeout: float | None = None, unsandboxed: bool = False,
                  tail_bytes: int = 65536, launcher: Sequence[str] = (), processes: int = 1) -> SandboxResult:
    """Run argv confined to `policy` and return what happened.

    launcher (with processes=N): a program that starts N copies of the command appended to it
    (torchrun --no-python). It runs UNconfined, with the caller's authority, and must not load
    the audit hook (start it with `python -E`); each copy is the bootstrap, which confines itself
    -- so every process gets its own /proc/self grant -- and is SIGKILLed when the launcher dies,
    as the launcher is when the calling thread's process dies.
    Unless all N report that they are confined, SandboxUnavailable (or InternalError) is raised.

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
    policy.check()
    if processes < 1 or (processes > 1 and not launcher):
        raise BadInput("run_sandboxed: several processes need a launcher that starts them")
    if cwd is not None and not os.path.isdir(cwd):
        raise BadInput(f"run_sandboxed: cwd {cwd} is not a folder")

    work = tempfile.mkdtemp(prefix="ledger-sandbox-")
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
        hook_roots = _classifier_roots(grants, None)
        hook_roots.pop("meta")
        with open(os.path.join(hookdir, "audit.json"), "w") as f:
            json.dump({"log": os.path.realpath(log), "max_lines": 2000, **hook_roots}, f)
        with open(os.path.join(hookdir, "sitecustomize.py"), "w") as f:
            f.write(_HOOK_SOURCE)

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

        rules = os.path.join(work, "rules.json")   # a file: argv strings are capped at 128 KiB
        with open(rules, "w") as f:
            json.dump({"grants": [[g.path, g.kind] for g in grants], "network": policy.network,
                       "landlock": not unsandboxed}, f)
        status_dir = os.path.join(work, "status")     # one report per bootstrap, named by its pid
        os.mkdir(status_dir, 0o700)
        # -E: ignore PYTHON* (so the bootstrap itself neither loads the hook nor the caller's
        # PYTHONPATH); -s -S: no site-packages; `-m` finds ledger through cwd = package root.
        bootstrap = [sys.executable, "-E", "-s", "-S", "-m", "ledger.sandbox"]
        # A launcher is put in its own session like any child here, out of reach of signals to
        # ours, so it is armed to die with this process; its processes die with it in turn.
        cmd = [*([*bootstrap, "--launcher", "--", *launcher] if launcher else []),
               *bootstrap, "--rules-file", rules, "--status-dir", status_dir,
               *(["--die-with-parent"] if launcher else []), "--cwd", target_cwd, "--", *argv]
        start = time.monotonic()
        proc = subprocess.Popen(cmd, cwd=_package_root(), env=child_env,
                                stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, start_new_session=True)
        try:
            out, err = _Tail(proc.stdout, tail_bytes), _Tail(proc.stderr, tail_bytes)
            timed_out = _wait_unreaped(proc, timeout)
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
        status = [line for r in reports for line in r[1:]]

        roots = _classifier_roots(grants, proc.pid)
        denied, truncated = _parse_audit_log(log, roots, policy.protected)
        for line in status:
            if line.startswith("exec-denied "):   # execve refused with EACCES: record it
                p = line[len("exec-denied "):]
                prot = any(_within(p, q) for q in policy.protected)
                denied.append(DeniedAttempt("os.exec", p, "exec", prot))
        return SandboxResult(returncode=returncode, sandboxed=not unsandboxed, abi=enforced,
                             denied_attempts=tuple(denied),
                             protected_attempts=tuple(a for a in denied if a.protected),
                             stdout_tail=stdout, stderr_tail=stderr, wall_s=wall, timed_out=timed_out,
                             audit_truncated=truncated, processes=len(reports))
    finally:
        shutil.rmtree(work, ignore_errors=True)


# --- the bootstrap (runs as `python -m ledger.sandbox`) ------------------------------------------
def _bootstrap(args: Sequence[str]) -> int:
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
        if _libc().prctl(_PR_SET_PDEATHSIG, ctypes.c_ulong(signal.SIGKILL), ctypes.c_ulong(0),
                         ctypes.c_ulong(0), ctypes.c_ulong(0)) != 0 or parent == 1 or os.getppid() != parent:
            return _BOOTSTRAP_FAILED        # could not arm it, or the parent is already gone
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
        grants = [(str(p), str(k)) for p, k in rules["grants"] if k in _KIND_RIGHTS]
        if not argv:
            raise ValueError("no command given")
        abi = _restrict_self(grants, network=bool(rules.get("network", True))) \
            if rules.get("landlock", True) else 0
    except Exception as e:   # nothing of the caller's has run: fail closed
        report(f"error {type(e).__name__}: {e}")
        print(f"ledger.sandbox: {e}", file=sys.stderr)
        return _BOOTSTRAP_FAILED
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
    sys.exit(_bootstrap(sys.argv[1:]))
