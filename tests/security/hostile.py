"""The attacker: a stand-in for a training child (or the image) that tries every way out.

Run as `python hostile.py CONFIG_JSON`; stdlib and ctypes only, so it needs nothing the sandbox
does not give. Each attempt is recorded as "allowed: ..." or "denied: <errno name>", and all of
them are printed as one line `HOSTILE {json}` for the test to read. It never stops at the first
refusal: everything is tried in one run."""

import ctypes
import errno
import json
import os
import socket
import sys

cfg = json.loads(sys.argv[1])
libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long
seen = {}


def attempt(name, fn):
    try:
        seen[name] = "allowed: " + str(fn())[:200]
    except OSError as e:
        seen[name] = "denied: " + errno.errorcode.get(e.errno, str(e.errno))


def check(rc, what):
    if rc == -1:
        err = ctypes.get_errno()
        raise OSError(err, what)
    return rc


def unix_connect(path):
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.settimeout(5)
    s.connect(path)
    s.sendall(b'{"op": "status"}\n')
    return "connected to " + repr(path)


def udp():
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.sendto(b"hostile datagram", ("127.0.0.1", cfg["udp_port"]))
    return "sent"


def tcp():
    socket.create_connection(("127.0.0.1", cfg["tcp_port"]), timeout=5).close()
    return "connected"


def shm():
    with open(os.path.join("/dev/shm", cfg["shm_name"]), "w") as f:
        f.write("left behind")
    visible = cfg["host_shm"] in os.listdir("/dev/shm")
    if visible:
        return "wrote, and sees the host's /dev/shm"
    raise OSError(errno.ENOENT, "wrote only into a private /dev/shm")


def ptrace():
    return check(libc.ptrace(ctypes.c_long(16), ctypes.c_long(cfg["ppid"]), None, None), "PTRACE_ATTACH")


class IoVec(ctypes.Structure):
    _fields_ = [("base", ctypes.c_void_p), ("len", ctypes.c_size_t)]


def vm_read():
    buf = ctypes.create_string_buffer(64)
    local = IoVec(ctypes.cast(buf, ctypes.c_void_p), 64)
    remote = IoVec(ctypes.c_void_p(cfg["parent_address"]), 64)
    libc.process_vm_readv.restype = ctypes.c_ssize_t
    return check(libc.process_vm_readv(cfg["ppid"], ctypes.byref(local), 1, ctypes.byref(remote), 1, 0),
                 "process_vm_readv")


def proc_read(name):
    with open(f"/proc/{cfg['ppid']}/{name}", "rb") as f:
        return f.read(64)


def fds():
    extra = {}
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue        # the listing's own descriptor, closed by now
        if int(fd) > 2 and not target.endswith("audit.log"):   # the hook's own log
            extra[fd] = target
    if extra:
        return f"inherited {extra}"
    raise OSError(errno.EBADF, "only stdio")


def mount():
    target = os.path.join(cfg["out"], "mnt")
    os.makedirs(target, exist_ok=True)
    return check(libc.mount(b"tmpfs", target.encode(), b"tmpfs", ctypes.c_ulong(0), None), "mount")


def unshare():
    return check(libc.unshare(ctypes.c_int(0x10000000)), "unshare(CLONE_NEWUSER)")


def io_uring():
    params = ctypes.create_string_buffer(120)
    return check(libc.syscall(ctypes.c_long(425), ctypes.c_uint(4), params), "io_uring_setup")


def capabilities():
    with open("/proc/self/status") as f:
        held = {k: v.strip() for k, _, v in (line.partition(":") for line in f) if k.startswith("Cap")}
    if any(int(v, 16) for v in held.values()):
        return f"holds {held}"
    raise OSError(errno.EPERM, "none")


for i, path in enumerate(cfg["unix"]):
    attempt(f"unix-{i}", lambda p=path: unix_connect(p))
attempt("unix-abstract", lambda: unix_connect("\0" + cfg["abstract"]))
attempt("udp", udp)
attempt("tcp", tcp)
attempt("netlink", lambda: socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, 0).close())
attempt("shm", shm)
attempt("ptrace", ptrace)
attempt("process_vm_readv", vm_read)
for name in ("environ", "mem", "cmdline"):
    attempt(f"proc-{name}", lambda n=name: proc_read(n))
attempt("proc-fd", lambda: os.listdir(f"/proc/{cfg['ppid']}/fd"))
attempt("fds", fds)
attempt("capabilities", capabilities)
attempt("mode-000", lambda: open(cfg["mode000"], "rb").read())
attempt("chown", lambda: os.chown(cfg["chown"], 12345, 12345))
attempt("mount", mount)
attempt("unshare", unshare)
attempt("io_uring", io_uring)
print("HOSTILE " + json.dumps(seen), flush=True)
