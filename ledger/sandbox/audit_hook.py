"""The sandbox's audit hook: records a Python child's attempts on paths outside its policy.

The parent copies THIS FILE into the child's hook folder as `sitecustomize.py` (run_sandboxed puts
that folder first on PYTHONPATH), so it is stdlib only and never imports ledger: the child need
not be able to. Its configuration comes from the file named by LEDGER_SANDBOX_AUDIT: the log to
append to (the only right the child has on it) and the allowed path prefixes per access.

A record only. Landlock enforces the policy; a hostile child can remove this hook, or bypass it
with ctypes or a non-Python program, but cannot lift Landlock. It never raises: an exception in
an audit hook would abort the operation being audited.
"""

import json
import os
import sys
import threading


def install() -> None:
    """Install the hook in this process (a no-op without LEDGER_SANDBOX_AUDIT)."""
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


if __name__ == "sitecustomize":   # the child's copy, imported by site at start-up
    install()
