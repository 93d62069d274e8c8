"""What the bootstrap takes away besides paths and syscalls: capabilities, and the shared /dev/shm.

Its own module (not landlock.py or seccomp.py) because it is neither: it is the process's
credentials and mount namespace, set up before Landlock and seccomp are applied.

private_shm()   a new mount namespace (and, for a caller without CAP_SYS_ADMIN, a new user
                namespace mapping only the caller's own uid and gid) in which /dev/shm is a fresh
                tmpfs. Nothing the child writes there is visible outside, and the tmpfs is freed
                when the last process of the namespace exits. Mount propagation is made private
                first, so the new mount never reaches the host's namespace.
drop_all()      empty bounding, ambient, inheritable, permitted and effective capability sets,
                with securebits that stop uid 0 from regaining them at exec. Running as root then
                grants no more than any other uid: DAC is enforced on root's files (a mode 000 file
                cannot be read), chown and mount fail.

Stdlib only (the bootstrap runs with -s -S).
"""

from __future__ import annotations

import ctypes
import errno
import fcntl
import os
import socket
import struct

CLONE_NEWNS = 0x00020000
CLONE_NEWNET = 0x40000000
SIOCGIFFLAGS, SIOCSIFFLAGS, IFF_UP = 0x8913, 0x8914, 0x1
CLONE_NEWUSER = 0x10000000
MS_NOSUID, MS_NODEV, MS_NOEXEC = 0x2, 0x4, 0x8
MS_REC, MS_PRIVATE = 0x4000, 1 << 18
TMPFS_MAGIC = 0x01021994
CAP_SETPCAP, CAP_SYS_ADMIN = 8, 21

PR_CAPBSET_READ, PR_CAPBSET_DROP = 23, 24
PR_GET_SECUREBITS, PR_SET_SECUREBITS = 27, 28
PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL = 47, 4
# NOROOT (uid 0 gains nothing at exec), KEEP_CAPS off, NO_CAP_AMBIENT_RAISE, each one locked.
SECUREBITS = (1 << 0) | (1 << 1) | (1 << 5) | (1 << 6) | (1 << 7)
_CAPABILITY_VERSION_3 = 0x20080522

CAP_NAMES = ("chown", "dac_override", "dac_read_search", "fowner", "fsetid", "kill", "setgid",
             "setuid", "setpcap", "linux_immutable", "net_bind_service", "net_broadcast",
             "net_admin", "net_raw", "ipc_lock", "ipc_owner", "sys_module", "sys_rawio",
             "sys_chroot", "sys_ptrace", "sys_pacct", "sys_admin", "sys_boot", "sys_nice",
             "sys_resource", "sys_time", "sys_tty_config", "mknod", "lease", "audit_write",
             "audit_control", "setfcap", "mac_override", "mac_admin", "syslog", "wake_alarm",
             "block_suspend", "audit_read", "perfmon", "bpf", "checkpoint_restore")
_SETS = ("CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb")


def _libc():
    return ctypes.CDLL(None, use_errno=True)


def _check(rc: int, what: str) -> None:
    if rc != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{what}: {os.strerror(err)}")


def capability_sets() -> dict[str, int]:
    """This process's five capability sets, from /proc/self/status."""
    out = {}
    with open("/proc/self/status") as f:
        for line in f:
            key, _, value = line.partition(":")
            if key in _SETS:
                out[key] = int(value.strip(), 16)
    if set(out) != set(_SETS):
        raise OSError(errno.EPROTO, "/proc/self/status lacks the capability sets")
    return out


def names(mask: int) -> list[str]:
    """The capability names in a mask, e.g. ["cap_chown", "cap_kill"]."""
    return [f"cap_{CAP_NAMES[i]}" if i < len(CAP_NAMES) else f"cap_{i}" for i in range(64) if mask >> i & 1]


def mount_namespace() -> int:
    """The inode of this process's mount namespace (differs between namespaces)."""
    return os.stat("/proc/self/ns/mnt").st_ino


def _write(path: str, text: str) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CLOEXEC)
    try:
        os.write(fd, text.encode())
    finally:
        os.close(fd)


def private_shm() -> str:
    """Enter a new mount namespace with a fresh tmpfs on /dev/shm. Single-threaded callers only
    (a user namespace needs it). Returns "mount" or "user+mount" (which namespaces were made)."""
    if not os.path.isdir("/dev/shm"):
        raise OSError(errno.ENOENT, "/dev/shm does not exist, so it cannot be made private")
    lib = _libc()
    uid, gid = os.getuid(), os.getgid()
    userns = not capability_sets()["CapEff"] >> CAP_SYS_ADMIN & 1
    _check(lib.unshare(ctypes.c_int(CLONE_NEWNS | (CLONE_NEWUSER if userns else 0))), "unshare")
    if userns:   # map only ourselves: no other uid exists in there
        _write("/proc/self/setgroups", "deny")
        _write("/proc/self/uid_map", f"{uid} {uid} 1")
        _write("/proc/self/gid_map", f"{gid} {gid} 1")
    _check(lib.mount(None, b"/", None, ctypes.c_ulong(MS_REC | MS_PRIVATE), None), "mount --make-rprivate /")
    _check(lib.mount(b"tmpfs", b"/dev/shm", b"tmpfs", ctypes.c_ulong(MS_NOSUID | MS_NODEV | MS_NOEXEC),
                     b"mode=1777"), "mount tmpfs on /dev/shm")
    if userns:
        # Empty the bounding set while the namespace's CAP_SETPCAP is still held: a launcher
        # execs next and loses it (its uid is not 0 in here), and its ranks could not empty
        # theirs. A root caller's launcher keeps its own set; each rank empties its own.
        _drop_bounding(lib)
    return "user+mount" if userns else "mount"


def _drop_bounding(lib) -> None:
    with open("/proc/sys/kernel/cap_last_cap") as f:
        last = int(f.read().strip())
    for cap in range(last + 1):
        if lib.prctl(ctypes.c_int(PR_CAPBSET_READ), ctypes.c_ulong(cap), 0, 0, 0) == 1:
            _check(lib.prctl(ctypes.c_int(PR_CAPBSET_DROP), ctypes.c_ulong(cap), ctypes.c_ulong(0),
                             ctypes.c_ulong(0), ctypes.c_ulong(0)), f"prctl(PR_CAPBSET_DROP, {cap})")


def net_namespace() -> int:
    """The inode of this process's network namespace (differs between namespaces)."""
    return os.stat("/proc/self/ns/net").st_ino


def loopback_net() -> None:
    """Enter a new network namespace whose only interface is loopback, and bring it up.

    For a launcher whose processes all run on this host (several node agents on loopback): they
    reach each other over 127.0.0.1 and nothing else exists to reach -- Landlock can restrict
    TCP by port only, and a rendezvous uses ports chosen at run time, so the namespace is what
    confines it to this host. Call after private_shm() (whose user namespace, for a caller
    without CAP_SYS_ADMIN, grants the CAP_NET_ADMIN this needs)."""
    _check(_libc().unshare(ctypes.c_int(CLONE_NEWNET)), "unshare(CLONE_NEWNET)")
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        ifr = struct.pack("16sH14x", b"lo", 0)
        flags = struct.unpack("16sH14x", fcntl.ioctl(s.fileno(), SIOCGIFFLAGS, ifr))[1]
        fcntl.ioctl(s.fileno(), SIOCSIFFLAGS, struct.pack("16sH14x", b"lo", flags | IFF_UP))


def only_loopback(caller_namespace: int) -> bool:
    """True when this process is in another network namespace than the caller's and loopback is
    its only interface (what loopback_net() leaves; checked by ranks whose launcher made it)."""
    return net_namespace() != caller_namespace and [n for _, n in socket.if_nameindex()] == ["lo"]


def shm_is_private(caller_namespace: int) -> bool:
    """True when this process is in another mount namespace than the caller's and /dev/shm is a
    tmpfs there (what private_shm() leaves; checked by ranks whose launcher made it)."""
    if mount_namespace() == caller_namespace:
        return False
    buf = ctypes.create_string_buffer(256)    # struct statfs; f_type is its first field
    _check(_libc().statfs(b"/dev/shm", buf), "statfs /dev/shm")
    return int.from_bytes(buf.raw[:8], "little") == TMPFS_MAGIC


def drop_all() -> list[str]:
    """Drop every capability for good; the names of those held (effective, permitted or
    bounding) before."""
    before = capability_sets()
    lib = _libc()
    setpcap = before["CapEff"] >> CAP_SETPCAP & 1
    if not setpcap and os.geteuid() == 0:
        raise OSError(errno.EPERM, "uid 0 without CAP_SETPCAP cannot empty its bounding set")
    if setpcap:
        if lib.prctl(ctypes.c_int(PR_GET_SECUREBITS), 0, 0, 0, 0) & SECUREBITS != SECUREBITS:
            _check(lib.prctl(ctypes.c_int(PR_SET_SECUREBITS), ctypes.c_ulong(SECUREBITS), ctypes.c_ulong(0),
                             ctypes.c_ulong(0), ctypes.c_ulong(0)), "prctl(PR_SET_SECUREBITS)")
        _drop_bounding(lib)
    # else: a non-root rank whose launcher made the user namespace (and emptied the bounding set
    # there, private_shm): it holds nothing, and with no_new_privs and a uid other than 0 no exec
    # can give it anything. Were its bounding set not empty it could not empty it (that needs
    # CAP_SETPCAP); the check below then names it in what is left.
    _check(lib.prctl(ctypes.c_int(PR_CAP_AMBIENT), ctypes.c_ulong(PR_CAP_AMBIENT_CLEAR_ALL), ctypes.c_ulong(0),
                     ctypes.c_ulong(0), ctypes.c_ulong(0)), "prctl(PR_CAP_AMBIENT_CLEAR_ALL)")
    header = (ctypes.c_uint32 * 2)(_CAPABILITY_VERSION_3, 0)
    data = (ctypes.c_uint32 * 6)()    # two {effective, permitted, inheritable}, all empty
    _check(lib.capset(header, data), "capset")
    after = capability_sets()
    if not setpcap:
        after.pop("CapBnd")
    if any(after.values()):
        raise OSError(errno.EPERM, f"capabilities remain after dropping them: {after}")
    kept = capability_sets()["CapBnd"]
    return names((before["CapEff"] | before["CapPrm"] | before["CapBnd"]) & ~kept)
