"""The sandbox's seccomp filter: which sockets a child may open, and the syscalls it may not make.

Landlock (landlock.py) confines paths and TCP ports; it does not restrict which socket families a
process opens, UDP, connecting to a pathname unix socket, or the kernel interfaces that could
undo a sandbox (namespaces, mounts, io_uring, ptrace-like peeking). This filter does:

  socket()      AF_UNIX: refused (socketpair(AF_UNIX) stays allowed). A pathname unix socket is
                reached with socket() + connect(), and Landlock cannot refuse that connect, so
                refusing the socket is what keeps a child away from the image's and the keeper's
                sockets. With gpu, AF_UNIX SOCK_SEQPACKET is allowed: the CUDA driver probes the
                MPS control socket (/tmp/nvidia-mps/control) with one and fails cuInit (304) if
                socket() is refused; a SEQPACKET socket cannot connect to the store's SOCK_STREAM
                sockets (EPROTOTYPE). AF_INET / AF_INET6: refused unless the policy allows
                network, and then SOCK_STREAM only (no UDP, no raw); with network also
                AF_NETLINK NETLINK_ROUTE (gloo reads the addresses through it; read-only without
                CAP_NET_ADMIN). Every other family (packet, vsock, ...): refused.
  refused       ptrace, process_vm_readv/writev, process_madvise, pidfd_getfd, kcmp; mount and
                the new mount API, umount2, pivot_root, chroot; unshare, setns, clone() with a
                namespace flag; io_uring (its requests would bypass this filter); bpf,
                perf_event_open, userfaultfd; keyrings; modules, kexec, reboot, swap, clock
                setting, acct, quotactl, iopl/ioperm, syslog, open_by_handle_at.
  clone3        ENOSYS, not refused: its flags sit in memory a filter cannot read, so libc is
                told it does not exist and falls back to clone(), whose flags are checked.
  other arch    a syscall from another ABI (x32, i386) kills the process.

A refused call either returns EPERM (SECCOMP_RET_ERRNO) or, when the parent supervises the run,
is handed to the parent (SECCOMP_RET_USER_NOTIF), which records it and answers EPERM: a record
the child cannot forge or suppress (Supervisor below).

The program is built by the parent (program()), and its id is the BLAKE3 of its bytes
(run.filter_id()); the bootstrap installs exactly those bytes. x86_64 only: the syscall numbers are
per architecture and only this table was run here; elsewhere the sandbox refuses to run.
"""

from __future__ import annotations

import ctypes
import errno
import os
import select
import socket
import struct
import threading
from dataclasses import dataclass

# --- kernel constants (linux/seccomp.h, linux/filter.h, linux/audit.h) -----------------------------
AUDIT_ARCH_X86_64 = 0xC000003E
ARCHES = {"x86_64": AUDIT_ARCH_X86_64}
SECCOMP_SET_MODE_FILTER = 1
SECCOMP_FILTER_FLAG_NEW_LISTENER = 1 << 3
RET_KILL_PROCESS = 0x80000000
RET_ERRNO = 0x00050000
RET_USER_NOTIF = 0x7FC00000
RET_ALLOW = 0x7FFF0000
NR_SECCOMP = 317
_IOCTL_NOTIF_RECV = 0xC0502100    # _IOWR('!', 0, struct seccomp_notif): 80 bytes
_IOCTL_NOTIF_SEND = 0xC0182101    # _IOWR('!', 1, struct seccomp_notif_resp): 24 bytes
_NOTIF_SIZE, _RESP_SIZE = 80, 24

_LD_W_ABS = 0x20                  # BPF_LD | BPF_W | BPF_ABS
_ALU_AND_K = 0x54                 # BPF_ALU | BPF_AND | BPF_K
_JEQ_K, _JGE_K, _JSET_K = 0x15, 0x35, 0x45
_RET_K = 0x06
_OFF_NR, _OFF_ARCH = 0, 4


def _arg(i: int) -> int:          # low 32 bits of syscall argument i (little-endian)
    return 16 + 8 * i


AF_UNIX, AF_INET, AF_INET6, AF_NETLINK = 1, 2, 10, 16
NETLINK_ROUTE = 0
SOCK_STREAM, SOCK_SEQPACKET, SOCK_TYPE_MASK = 1, 5, 0xF
CLONE_NAMESPACES = 0x00000080 | 0x00020000 | 0x02000000 | 0x04000000 | 0x08000000 | 0x10000000 \
    | 0x20000000 | 0x40000000     # NEWTIME NEWNS NEWCGROUP NEWUTS NEWIPC NEWUSER NEWPID NEWNET
X32_BIT = 0x40000000

# x86_64 numbers (asm/unistd_64.h)
SYSCALLS_X86_64 = {
    "ptrace": 101, "process_vm_readv": 310, "process_vm_writev": 311, "process_madvise": 440,
    "pidfd_getfd": 438, "kcmp": 312,
    "mount": 165, "umount2": 166, "pivot_root": 155, "chroot": 161, "open_tree": 428,
    "move_mount": 429, "fsopen": 430, "fsconfig": 431, "fsmount": 432, "fspick": 433,
    "mount_setattr": 442, "unshare": 272, "setns": 308,
    "io_uring_setup": 425, "io_uring_enter": 426, "io_uring_register": 427,
    "bpf": 321, "perf_event_open": 298, "userfaultfd": 323,
    "keyctl": 250, "add_key": 248, "request_key": 249,
    "init_module": 175, "finit_module": 313, "delete_module": 176, "kexec_load": 246,
    "kexec_file_load": 320, "reboot": 169, "swapon": 167, "swapoff": 168,
    "settimeofday": 164, "clock_settime": 227, "clock_adjtime": 305, "adjtimex": 159,
    "acct": 163, "quotactl": 179, "iopl": 172, "ioperm": 173, "syslog": 103,
    "open_by_handle_at": 304,
}
NR_SOCKET, NR_SOCKETPAIR, NR_CLONE, NR_CLONE3 = 41, 53, 56, 435
NAMES = {**{v: k for k, v in SYSCALLS_X86_64.items()}, NR_SOCKET: "socket", NR_SOCKETPAIR: "socketpair",
         NR_CLONE: "clone"}
FAMILIES = {1: "AF_UNIX", 2: "AF_INET", 10: "AF_INET6", 16: "AF_NETLINK", 17: "AF_PACKET", 40: "AF_VSOCK"}
TYPES = {1: "SOCK_STREAM", 2: "SOCK_DGRAM", 3: "SOCK_RAW", 5: "SOCK_SEQPACKET"}


def available() -> str | None:
    """None when a filter can be built for this machine, else why not."""
    if os.uname().machine not in ARCHES:
        return (f"the seccomp filter's syscall table covers x86_64 only, this is {os.uname().machine}")
    return None


class _Asm:
    """A straight-line BPF program with forward jumps to named labels."""

    def __init__(self):
        self.ins: list[tuple] = []     # (code, jt, jf, k); jt/jf may be label names
        self.labels: dict[str, int] = {}

    def op(self, code: int, k: int, jt=0, jf=0) -> None:
        self.ins.append((code, jt, jf, k))

    def label(self, name: str) -> None:
        self.labels[name] = len(self.ins)

    def bytes(self) -> bytes:
        out = bytearray()
        for i, (code, jt, jf, k) in enumerate(self.ins):
            offs = []
            for j in (jt, jf):
                if isinstance(j, str):
                    j = self.labels[j] - i - 1
                if not 0 <= j <= 255:
                    raise ValueError(f"BPF jump out of range at {i}")
                offs.append(j)
            out += struct.pack("<HBBI", code, offs[0], offs[1], k & 0xFFFFFFFF)
        return bytes(out)


def program(*, network: bool, supervised: bool, gpu: bool = False) -> bytes:
    """The filter for a child: network allows TCP (SOCK_STREAM over AF_INET/AF_INET6); gpu allows
    AF_UNIX SOCK_SEQPACKET sockets (the CUDA driver's probe of the MPS control socket);
    supervised hands refused calls to the parent (USER_NOTIF) instead of returning EPERM."""
    why = available()
    if why:
        raise OSError(errno.ENOSYS, why)
    deny = RET_USER_NOTIF if supervised else RET_ERRNO | errno.EPERM
    a = _Asm()
    a.op(_LD_W_ABS, _OFF_ARCH)
    a.op(_JEQ_K, AUDIT_ARCH_X86_64, 0, "kill")
    a.op(_LD_W_ABS, _OFF_NR)
    a.op(_JGE_K, X32_BIT, "kill", 0)
    for nr in sorted(SYSCALLS_X86_64.values()):
        a.op(_JEQ_K, nr, "deny", 0)
    a.op(_JEQ_K, NR_CLONE3, "enosys", 0)
    a.op(_JEQ_K, NR_SOCKET, "socket", 0)
    a.op(_JEQ_K, NR_SOCKETPAIR, "socketpair", 0)
    a.op(_JEQ_K, NR_CLONE, "clone", 0)
    a.op(_RET_K, RET_ALLOW)
    a.label("socket")
    a.op(_LD_W_ABS, _arg(0))
    if gpu:
        a.op(_JEQ_K, AF_UNIX, "unix", 0)
    if network:
        a.op(_JEQ_K, AF_INET, "inet", 0)
        a.op(_JEQ_K, AF_INET6, "inet", 0)
        a.op(_JEQ_K, AF_NETLINK, "netlink", 0)
    a.op(_RET_K, deny)
    if network:
        a.label("netlink")
        a.op(_LD_W_ABS, _arg(2))
        a.op(_JEQ_K, NETLINK_ROUTE, "allow", "deny")
    if network:
        a.label("inet")
        a.op(_LD_W_ABS, _arg(1))
        a.op(_ALU_AND_K, SOCK_TYPE_MASK)      # drop SOCK_NONBLOCK / SOCK_CLOEXEC
        a.op(_JEQ_K, SOCK_STREAM, "allow", "deny")
    if gpu:
        a.label("unix")
        a.op(_LD_W_ABS, _arg(1))
        a.op(_ALU_AND_K, SOCK_TYPE_MASK)
        a.op(_JEQ_K, SOCK_SEQPACKET, "allow", "deny")
    a.label("socketpair")
    a.op(_LD_W_ABS, _arg(0))
    a.op(_JEQ_K, AF_UNIX, "allow", "deny")
    a.label("clone")
    a.op(_LD_W_ABS, _arg(0))
    a.op(_JSET_K, CLONE_NAMESPACES, "deny", "allow")
    a.label("allow")
    a.op(_RET_K, RET_ALLOW)
    a.label("deny")
    a.op(_RET_K, deny)
    a.label("enosys")
    a.op(_RET_K, RET_ERRNO | errno.ENOSYS)
    a.label("kill")
    a.op(_RET_K, RET_KILL_PROCESS)
    return a.bytes()


class _SockFprog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]


def install(prog: bytes, *, listener: bool) -> int:
    """Install `prog` on the calling thread (no_new_privs must be set). With listener, returns
    the notification fd (SECCOMP_FILTER_FLAG_NEW_LISTENER), else -1. Raises OSError."""
    if len(prog) % 8 or not prog:
        raise OSError(errno.EINVAL, "a BPF program is a whole number of 8-byte instructions")
    buf = ctypes.create_string_buffer(prog, len(prog))
    fprog = _SockFprog(len(prog) // 8, ctypes.cast(buf, ctypes.c_void_p))
    lib = ctypes.CDLL(None, use_errno=True)
    lib.syscall.restype = ctypes.c_long
    ctypes.set_errno(0)
    flags = SECCOMP_FILTER_FLAG_NEW_LISTENER if listener else 0
    fd = lib.syscall(ctypes.c_long(NR_SECCOMP), ctypes.c_ulong(SECCOMP_SET_MODE_FILTER),
                     ctypes.c_ulong(flags), ctypes.byref(fprog))
    if fd < 0:
        err = ctypes.get_errno()
        raise OSError(err, f"seccomp(SET_MODE_FILTER): {os.strerror(err)}")
    return fd if listener else -1


def send_listener(sock: socket.socket, fd: int) -> None:
    """Hand the notification fd to the supervising parent over a connected unix socket."""
    socket.send_fds(sock, [b"L"], [fd])


# --- the parent side ---------------------------------------------------------------------------------
@dataclass(frozen=True)
class SyscallDenial:
    """A syscall the filter refused, as the kernel reported it to the parent (not the child)."""
    syscall: str          # "socket", "ptrace", ...
    detail: str           # e.g. "AF_INET, SOCK_DGRAM" or the first argument in hex
    pid: int
    count: int = 1

    def as_dict(self) -> dict:
        return {"syscall": self.syscall, "detail": self.detail, "pid": self.pid, "count": self.count}


def describe(nr: int, args: tuple[int, ...]) -> tuple[str, str]:
    """(syscall name, a short account of its arguments) for a refused call."""
    name = NAMES.get(nr, f"syscall {nr}")
    if nr in (NR_SOCKET, NR_SOCKETPAIR):
        fam, typ = args[0] & 0xFFFFFFFF, args[1] & SOCK_TYPE_MASK
        return name, f"{FAMILIES.get(fam, f'family {fam}')}, {TYPES.get(typ, f'type {typ}')}"
    if nr == NR_CLONE:
        return name, f"flags {args[0] & 0xFFFFFFFF:#x}"
    return name, f"{args[0]:#x}"


class Supervisor:
    """Receives the children's seccomp notification fds on a unix socket at `path`, records each
    refused syscall and answers it with EPERM. One thread; start() before the children, close()
    after they are gone. At most `limit` distinct (syscall, detail) records are kept (counted)."""

    def __init__(self, path: str, limit: int = 1000):
        self.path, self.limit = path, limit
        self.listeners = 0
        self.truncated = False
        self._closed = False
        self._records: dict[tuple[str, str], SyscallDenial] = {}
        self._lock = threading.Lock()
        self._server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
        old = os.umask(0o177)
        try:
            self._server.bind(path)
        finally:
            os.umask(old)
        self._server.listen(64)
        self._stop_r, self._stop_w = os.pipe()
        self._thread = threading.Thread(target=self._run, daemon=True, name="ledger-seccomp")

    def start(self) -> Supervisor:
        self._thread.start()
        return self

    def denials(self) -> tuple[SyscallDenial, ...]:
        with self._lock:
            return tuple(self._records.values())

    def close(self, wait: float = 5.0) -> None:
        """Answer what is pending, then stop (idempotent)."""
        if self._closed:
            return
        self._closed = True
        os.write(self._stop_w, b"x")
        self._thread.join(wait)
        for fd in (self._stop_r, self._stop_w):
            os.close(fd)

    def _record(self, nr: int, pid: int, args: tuple[int, ...]) -> None:
        key = describe(nr, args)
        with self._lock:
            old = self._records.get(key)
            if old is not None:
                self._records[key] = SyscallDenial(old.syscall, old.detail, old.pid, old.count + 1)
            elif len(self._records) < self.limit:
                self._records[key] = SyscallDenial(key[0], key[1], pid)
            else:
                self.truncated = True

    def _answer(self, fd: int) -> bool:
        """Receive one notification and refuse it; False when the fd is finished with."""
        req = bytearray(_NOTIF_SIZE)      # must be zeroed for NOTIF_RECV
        buf = (ctypes.c_char * _NOTIF_SIZE).from_buffer(req)
        lib = ctypes.CDLL(None, use_errno=True)
        if lib.ioctl(fd, ctypes.c_ulong(_IOCTL_NOTIF_RECV), buf) != 0:
            err = ctypes.get_errno()
            return err in (errno.ENOENT, errno.EINTR)   # the caller died meanwhile: keep going
        nid, pid, _flags, nr, _arch, _ip = struct.unpack_from("<QIIiIQ", req, 0)
        args = struct.unpack_from("<6Q", req, 32)
        self._record(nr, pid, args)
        resp = bytearray(struct.pack("<QqiI", nid, 0, -errno.EPERM, 0))
        rbuf = (ctypes.c_char * _RESP_SIZE).from_buffer(resp)
        lib.ioctl(fd, ctypes.c_ulong(_IOCTL_NOTIF_SEND), rbuf)   # ENOENT: it died; nothing to answer
        return True

    def _accept(self, fds: list[int]) -> None:
        conn, _ = self._server.accept()
        with conn:
            conn.settimeout(5.0)
            try:
                _, got, _, _ = socket.recv_fds(conn, 16, 4)
            except OSError:
                return
        fds.extend(got[:1])
        for extra in got[1:]:
            os.close(extra)
        if got:
            self.listeners += 1

    def _run(self) -> None:
        fds: list[int] = []
        try:
            while True:
                poll = select.poll()
                poll.register(self._stop_r, select.POLLIN)
                poll.register(self._server.fileno(), select.POLLIN)
                for fd in fds:
                    poll.register(fd, select.POLLIN)
                for fd, ev in poll.poll():
                    if fd == self._stop_r:
                        # drain what is pending, then stop: every child is gone by now
                        for lfd in fds:
                            while select.select([lfd], [], [], 0)[0] and self._answer(lfd):
                                pass
                        return
                    if fd == self._server.fileno():
                        self._accept(fds)
                    elif ev & select.POLLIN:
                        if not self._answer(fd):
                            fds.remove(fd)
                            os.close(fd)
                    elif ev & (select.POLLHUP | select.POLLERR | select.POLLNVAL):
                        fds.remove(fd)     # every process using this filter has exited
                        os.close(fd)
        finally:
            for fd in fds:
                os.close(fd)
            self._server.close()
            try:
                os.unlink(self.path)
            except OSError:
                pass

