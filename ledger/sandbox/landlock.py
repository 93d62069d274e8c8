"""The Linux Landlock interface (include/uapi/linux/landlock.h), through ctypes.

Stdlib only: the bootstrap (`python -E -s -S -m ledger.sandbox`) imports this without
site-packages. `ruleset()` builds a ruleset from (path, kind) grants; `enforce()` confines the
calling thread to it, for good (Landlock domains survive exec and fork and cannot be lifted).
"""

from __future__ import annotations

import ctypes
import errno
import os
import stat
import sys
from typing import Sequence

# Syscall numbers are the same on x86_64 and aarch64 (added after the syscall tables unified).
SYSCALLS = {"x86_64": (444, 445, 446), "aarch64": (444, 445, 446), "arm64": (444, 445, 446)}
_CREATE_RULESET_VERSION = 1 << 0
_RULE_PATH_BENEATH = 1
PR_SET_NO_NEW_PRIVS = 38

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


def handled_fs(abi: int) -> int:
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
# with handled_fs(abi); rights that only apply to directories are dropped for file rules.
KIND_RIGHTS = {
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
READ_KINDS = frozenset({"rx", "r", "rw", "dev", "devio", "self"})
WRITE_KINDS = frozenset({"rw", "dev", "devio", "append", "self"})
EXEC_KINDS = frozenset({"rx"})


class _RulesetAttr(ctypes.Structure):
    _fields_ = [("handled_access_fs", ctypes.c_uint64), ("handled_access_net", ctypes.c_uint64),
                ("scoped", ctypes.c_uint64)]


class _PathBeneathAttr(ctypes.Structure):
    _pack_ = 1   # the kernel struct is __attribute__((packed)): 12 bytes
    _fields_ = [("allowed_access", ctypes.c_uint64), ("parent_fd", ctypes.c_int32)]


def libc():
    return ctypes.CDLL(None, use_errno=True)


def syscall(lib, nr: int, *args) -> int:
    fn = lib.syscall
    fn.restype = ctypes.c_long
    ctypes.set_errno(0)
    return fn(ctypes.c_long(nr), *args)


def prctl(lib, option: int, arg2: int = 0, arg3: int = 0, arg4: int = 0, arg5: int = 0) -> None:
    """prctl(2), raising OSError on failure."""
    if lib.prctl(ctypes.c_int(option), ctypes.c_ulong(arg2), ctypes.c_ulong(arg3),
                 ctypes.c_ulong(arg4), ctypes.c_ulong(arg5)) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"prctl({option}, {arg2}): {os.strerror(err)}")


def _probe_abi() -> int:
    if not sys.platform.startswith("linux"):
        return 0
    nrs = SYSCALLS.get(os.uname().machine)
    if nrs is None:
        return 0
    try:
        lib = libc()
        abi = syscall(lib, nrs[0], None, ctypes.c_size_t(0), ctypes.c_uint32(_CREATE_RULESET_VERSION))
    except (OSError, AttributeError):
        return 0
    return abi if abi > 0 else 0   # -1: ENOSYS (not built / seccomp) or EOPNOTSUPP (disabled at boot)


def landlock_abi() -> int:
    """The kernel's Landlock ABI version (1, 2, ...), or 0 when Landlock is unavailable."""
    return _probe_abi()


def ruleset(grants: Sequence[tuple[str, str]], *, network: bool) -> tuple[int, int]:
    """A Landlock ruleset fd holding `grants`, and the ABI it was built for. Raises OSError.

    Built before capabilities are dropped: opening the granted paths may need the caller's
    authority (folders of mode 0700). The caller closes the fd (enforce() does)."""
    abi = _probe_abi()
    if abi < 1:
        raise OSError(errno.ENOSYS, "Landlock is not available on this kernel")
    nr_create, nr_add, _ = SYSCALLS[os.uname().machine]
    lib = libc()
    handled = handled_fs(abi)
    attr = _RulesetAttr(handled_access_fs=handled)
    size = 8
    if abi >= 4:
        size = 16
        if not network:   # handle TCP bind/connect and add no port rule: all TCP denied
            attr.handled_access_net = NET_BIND_TCP | NET_CONNECT_TCP
    if abi >= 6:
        size = 24         # cannot signal or reach abstract sockets of processes outside the domain
        attr.scoped = SCOPE_ABSTRACT_UNIX_SOCKET | SCOPE_SIGNAL
    fd = syscall(lib, nr_create, ctypes.byref(attr), ctypes.c_size_t(size), ctypes.c_uint32(0))
    if fd < 0:
        err = ctypes.get_errno()
        raise OSError(err, f"landlock_create_ruleset: {os.strerror(err)}")
    try:
        for path, kind in grants:
            rights = KIND_RIGHTS[kind] & handled
            try:
                pfd = os.open(path, os.O_PATH | os.O_CLOEXEC)
            except FileNotFoundError:
                continue      # vanished since the parent checked: granting less is always safe
            try:
                if not stat.S_ISDIR(os.fstat(pfd).st_mode):
                    rights &= _FILE_RIGHTS
                if not rights:
                    continue
                rule = _PathBeneathAttr(allowed_access=rights, parent_fd=pfd)
                if syscall(lib, nr_add, ctypes.c_long(fd), ctypes.c_long(_RULE_PATH_BENEATH),
                           ctypes.byref(rule), ctypes.c_uint32(0)) != 0:
                    err = ctypes.get_errno()
                    raise OSError(err, f"landlock_add_rule {path!r} ({kind}): {os.strerror(err)}")
            finally:
                os.close(pfd)
    except BaseException:
        os.close(fd)
        raise
    return fd, abi


def enforce(fd: int, abi: int) -> None:
    """Confine the calling thread (and all it later execs or forks) to ruleset `fd`; closes it.

    Only safe in a single-threaded process: other threads would stay unconfined."""
    lib = libc()
    try:
        prctl(lib, PR_SET_NO_NEW_PRIVS, 1)
        flags = RESTRICT_SELF_LOG_NEW_EXEC_ON if abi >= 7 else 0
        if syscall(lib, SYSCALLS[os.uname().machine][2], ctypes.c_long(fd), ctypes.c_uint32(flags)) != 0:
            err = ctypes.get_errno()
            raise OSError(err, f"landlock_restrict_self: {os.strerror(err)}")
    finally:
        os.close(fd)


def restrict_self(grants: Sequence[tuple[str, str]], *, network: bool) -> int:
    """ruleset() then enforce(): confine the calling thread to `grants`; the ABI enforced."""
    fd, abi = ruleset(grants, network=network)
    enforce(fd, abi)
    return abi
