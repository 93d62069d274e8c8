"""ledger.sandbox: Landlock confinement of child processes, and the record of denied attempts.

Each test that runs a child checks both halves: what the child itself saw (EACCES, via a printed
marker) and what the parent recorded (SandboxResult.denied_attempts / protected_attempts).
"""

from __future__ import annotations

import ctypes
import errno
import hashlib
import importlib.util
import json
import os
import socket
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from ledger.errors import BadInput, Refused, SandboxUnavailable
from ledger.sandbox import SandboxPolicy, landlock, landlock_abi, run_sandboxed, seccomp, system_allowances
from ledger.sandbox import policy as sbpolicy
from ledger.sandbox import run as sbrun
from ledger.sandbox.__main__ import BOOTSTRAP_FAILED

ABI = landlock_abi()
needs_landlock = pytest.mark.skipif(ABI < 1, reason="Landlock unavailable on this kernel "
                                    "(see test_landlock_is_available for why)")


def run_py(code: str, policy: SandboxPolicy, *args, **kw):
    return run_sandboxed([sys.executable, "-c", textwrap.dedent(code), *map(str, args)], policy, **kw)


@pytest.fixture
def layout(tmp_path):
    """tmp/A (input), tmp/OUT (output), tmp/sealed (the suite), tmp/elsewhere (nobody's)."""
    a, out, sealed, elsewhere = (tmp_path / n for n in ("A", "OUT", "sealed", "elsewhere"))
    for d in (a, out, sealed, elsewhere):
        d.mkdir()
    (a / "input.txt").write_text("input-data")
    (sealed / "suite.json").write_text('{"secret": "answers"}')
    (elsewhere / "other.txt").write_text("other")
    policy = SandboxPolicy(read_only=[a], read_write=[out], protected=[sealed])
    return tmp_path, a, out, sealed, elsewhere, policy


def _attempts(result, access=None):
    return {(x.path, x.access) for x in result.denied_attempts if access in (None, x.access)}


# (1) ---------------------------------------------------------------------------------------------
def test_landlock_is_available():
    if ABI < 1:
        nrs = landlock.SYSCALLS.get(os.uname().machine)
        if not sys.platform.startswith("linux") or nrs is None:
            pytest.skip(f"Landlock is Linux x86_64/aarch64 only; this is {sys.platform} {os.uname().machine}")
        libc = ctypes.CDLL(None, use_errno=True)
        libc.syscall.restype = ctypes.c_long
        libc.syscall(ctypes.c_long(nrs[0]), None, ctypes.c_size_t(0), ctypes.c_uint32(1))
        err = ctypes.get_errno()
        if err == errno.ENOSYS:
            pytest.skip("kernel has no Landlock syscalls (CONFIG_SECURITY_LANDLOCK off, or a "
                        "seccomp filter blocks them)")
        if err == errno.EOPNOTSUPP:
            pytest.skip("Landlock is built in but disabled at boot (add landlock to lsm=)")
        pytest.fail(f"Landlock probe failed unexpectedly: errno {err} ({os.strerror(err)})")
    assert ABI >= 1
    handled = landlock.handled_fs(ABI)
    assert bool(handled & landlock.FS_REFER) == (ABI >= 2)
    assert bool(handled & landlock.FS_TRUNCATE) == (ABI >= 3)
    assert bool(handled & landlock.FS_IOCTL_DEV) == (ABI >= 5)


# (2) ---------------------------------------------------------------------------------------------
@needs_landlock
def test_child_reads_input_writes_output_and_cannot_open_sealed(layout):
    tmp, a, out, sealed, _, policy = layout
    r = run_py("""
        import os, sys
        a, out, sealed = sys.argv[1:4]
        data = open(os.path.join(a, "input.txt")).read()
        with open(os.path.join(out, "result.txt"), "w") as f:
            f.write(data.upper())
        try:
            open(os.path.join(sealed, "suite.json")).read()
            print("SEALED-READ")
        except PermissionError as e:
            print("SEALED-EACCES", e.errno)
        try:
            os.listdir(sealed)
            print("SEALED-LISTED")
        except PermissionError as e:
            print("SEALED-LIST-EACCES", e.errno)
        os.symlink(sealed, os.path.join(out, "peek"))       # a way round? no: Landlock sees the target
        try:
            open(os.path.join(out, "peek", "suite.json")).read()
            print("SYMLINK-READ")
        except PermissionError as e:
            print("SYMLINK-EACCES", e.errno)
    """, policy, a, out, sealed)
    assert r.returncode == 0, r.stderr_tail
    assert r.sandboxed and r.abi == ABI
    assert f"SEALED-EACCES {errno.EACCES}" in r.stdout_tail
    assert f"SEALED-LIST-EACCES {errno.EACCES}" in r.stdout_tail
    assert f"SYMLINK-EACCES {errno.EACCES}" in r.stdout_tail
    assert "READ" not in r.stdout_tail.replace("EACCES", "") and "LISTED" not in r.stdout_tail
    assert (out / "result.txt").read_text() == "INPUT-DATA"

    suite = str(sealed / "suite.json")
    prot = {(x.op, x.path, x.access) for x in r.protected_attempts}
    assert ("open", suite, "read") in prot
    assert ("os.listdir", str(sealed), "read") in prot
    assert all(x.protected for x in r.protected_attempts)
    assert set(r.protected_attempts) <= set(r.denied_attempts)
    # the input read and the output write were allowed, so they are not in the record
    assert not any(x.path.startswith((str(a), str(out) + "/result")) for x in r.denied_attempts)


# (3) ---------------------------------------------------------------------------------------------
@needs_landlock
def test_writing_outside_output_is_denied(layout):
    tmp, a, out, _, elsewhere, policy = layout
    r = run_py("""
        import os, sys
        a, elsewhere = sys.argv[1:3]
        for path, mode in [(os.path.join(elsewhere, "new.txt"), "w"),
                           (os.path.join(elsewhere, "other.txt"), "a"),
                           (os.path.join(a, "input.txt"), "w"),        # read-only input: no truncate
                           (os.path.join(a, "new.txt"), "x")]:
            try:
                open(path, mode).write("x")
                print("WROTE", path)
            except PermissionError as e:
                print("DENIED", e.errno, path)
        try:
            os.mkdir(os.path.join(elsewhere, "d"))
            print("MKDIR")
        except PermissionError:
            print("MKDIR-DENIED")
        try:
            os.truncate(os.path.join(a, "input.txt"), 0)    # needs TRUNCATE (ABI 3) to be refused
            print("TRUNCATED")
        except PermissionError:
            print("TRUNCATE-DENIED")
    """, policy, a, elsewhere)
    assert r.returncode == 0, r.stderr_tail
    assert "WROTE" not in r.stdout_tail and "MKDIR-DENIED" in r.stdout_tail
    if ABI >= 3:
        assert "TRUNCATE-DENIED" in r.stdout_tail
    assert r.stdout_tail.count(f"DENIED {errno.EACCES}") == 4
    assert not (elsewhere / "new.txt").exists() and not (a / "new.txt").exists()
    assert (elsewhere / "other.txt").read_text() == "other"
    assert (a / "input.txt").read_text() == "input-data"
    writes = _attempts(r, "write")
    assert {(str(elsewhere / "new.txt"), "write"), (str(elsewhere / "other.txt"), "write"),
            (str(a / "input.txt"), "write"), (str(a / "new.txt"), "write"),
            (str(elsewhere / "d"), "write"), (str(a / "input.txt"), "write")} <= writes
    assert r.protected_attempts == ()


# (4) ---------------------------------------------------------------------------------------------
@needs_landlock
def test_home_and_working_directory_are_not_readable(layout, monkeypatch):
    tmp, _, _, _, _, policy = layout
    work = tmp / "project"
    work.mkdir()
    (work / "notes.txt").write_text("private")
    monkeypatch.chdir(work)
    home = os.path.realpath(Path.home())
    r = run_py("""
        import os, sys
        for p in sys.argv[1:]:
            try:
                if os.path.isdir(p):
                    os.listdir(p)
                else:
                    open(p).read()
                print("READ", p)
            except PermissionError:
                print("EACCES", p)
    """, policy, home, os.getcwd(), work / "notes.txt")
    assert r.returncode == 0, r.stderr_tail
    assert "READ" not in r.stdout_tail
    for p in (home, str(work), str(work / "notes.txt")):
        assert f"EACCES {p}" in r.stdout_tail
        assert (p, "read") in _attempts(r)
    # and no system allowance is, or contains, the working directory or home
    for g in system_allowances(policy):
        assert not sbpolicy.within(str(work), g.path), g
        assert not sbpolicy.within(home, g.path), g


# (5) ---------------------------------------------------------------------------------------------
@needs_landlock
@pytest.mark.skipif(importlib.util.find_spec("torch") is None, reason="torch not installed")
def test_torch_child_runs_under_the_policy(layout):
    tmp, _, out, _, _, policy = layout
    r = run_py("""
        import os, sys, torch
        x = torch.arange(6.0).reshape(2, 3)
        torch.save(x @ x.T, os.path.join(sys.argv[1], "gram.pt"))
        print("TORCH-OK", torch.__version__)
    """, policy, out, timeout=300)
    assert r.returncode == 0, r.stderr_tail
    assert "TORCH-OK" in r.stdout_tail
    assert (out / "gram.pt").stat().st_size > 0
    assert r.protected_attempts == ()


# (6) ---------------------------------------------------------------------------------------------
def test_unavailable_landlock_refuses_before_running_and_unsandboxed_is_marked(layout, monkeypatch):
    tmp, _, out, sealed, _, policy = layout
    marker = out / "ran.txt"
    code = """
        import sys
        open(sys.argv[1], "w").write("ran")
        try:
            print("SUITE", open(sys.argv[2]).read())
        except PermissionError:
            print("SUITE-EACCES")
    """
    monkeypatch.setattr(sbrun, "landlock_abi", lambda: 0)
    spawned = []
    real_popen = sbrun.subprocess.Popen
    monkeypatch.setattr(sbrun.subprocess, "Popen", lambda *a, **k: spawned.append(a) or real_popen(*a, **k))
    with pytest.raises(SandboxUnavailable) as e:
        run_py(code, policy, marker, sealed / "suite.json")
    assert e.value.exit_code == 3 and "unsandboxed" in e.value.hint
    assert not marker.exists() and spawned == []

    r = run_py(code, policy, marker, sealed / "suite.json", unsandboxed=True)
    assert r.returncode == 0, r.stderr_tail
    assert r.sandboxed is False and r.abi == 0 and r.confinement is None and r.syscall_denials == ()
    assert marker.read_text() == "ran"
    # unconfined, the read succeeds -- and the record still says so
    assert "SUITE" in r.stdout_tail and "EACCES" not in r.stdout_tail
    assert [x.path for x in r.protected_attempts] == [str(sealed / "suite.json")]


# (7) ---------------------------------------------------------------------------------------------
def test_policy_json_round_trip(tmp_path):
    p = SandboxPolicy(read_only=[tmp_path / "a", str(tmp_path / "b")], read_write=[tmp_path / "out"],
                      protected=[tmp_path / "s"], gpu=True, network=False, shared_memory=False)
    text = p.to_json()
    assert SandboxPolicy.from_json(text) == p
    assert SandboxPolicy.from_json(text.encode()) == p
    assert SandboxPolicy.from_json(json.loads(text)) == p
    assert json.loads(text)["read_only"] == [str(tmp_path / "a"), str(tmp_path / "b")]
    with pytest.raises(BadInput):
        SandboxPolicy.from_json("{not json")
    with pytest.raises(BadInput):
        SandboxPolicy.from_json({**json.loads(text), "read_only": ["relative/path"]})
    with pytest.raises(BadInput):
        SandboxPolicy.from_json({**json.loads(text), "read_write": "/one/string"})
    with pytest.raises(BadInput):
        SandboxPolicy.from_json({**json.loads(text), "grant_everything": True})
    with pytest.raises(BadInput):
        SandboxPolicy.from_json({**json.loads(text), "format": 99})
    with pytest.raises(BadInput):
        SandboxPolicy(read_only="/a/single/string")


# policy refusals ----------------------------------------------------------------------------------
def test_policy_refuses_grants_that_reach_protected_paths_or_a_store(tmp_path):
    store = tmp_path / "proj" / ".ledger"
    sealed = store / "sealed"
    obj = store / "objects" / "ab"
    for d in (sealed, obj):
        d.mkdir(parents=True)
    out = tmp_path / "out"
    out.mkdir()
    ok = SandboxPolicy(read_only=[obj], read_write=[out], protected=[sealed])
    ok.check()   # a specific object folder inside the store is fine
    bad = [
        SandboxPolicy(read_only=[tmp_path], protected=[sealed]),          # parent of the suite
        SandboxPolicy(read_only=[sealed / "suite.json"], protected=[sealed]),   # inside it
        SandboxPolicy(read_only=[store]),                                  # .ledger wholesale
        SandboxPolicy(read_only=[tmp_path / "proj"]),                      # a folder holding a store
        SandboxPolicy(read_only=[sealed]),                                 # the sealed area, unlisted
        SandboxPolicy(read_only=["/"]),
        SandboxPolicy(read_only=[Path.home()]) if os.path.realpath(Path.home()) != "/" else None,
    ]
    for pol in filter(None, bad):
        with pytest.raises(Refused):
            pol.check()
    with pytest.raises(BadInput):
        SandboxPolicy(read_write=[tmp_path / "missing"]).check()
    # a protected path under a system allowance is refused too (the venv here)
    with pytest.raises(Refused):
        SandboxPolicy(protected=[Path(sys.prefix) / "secret"]).check()


# the record is parsed defensively -----------------------------------------------------------------
def test_audit_log_parsing_is_bounded_and_distrustful(tmp_path):
    out, sealed = tmp_path / "out", tmp_path / "sealed"
    log = tmp_path / "audit.log"
    lines = [
        json.dumps({"op": "open", "path": str(sealed / "x"), "access": "read"}),
        json.dumps({"op": "open", "path": str(sealed / "x"), "access": "read"}),   # duplicate
        json.dumps({"op": "open", "path": str(out / "fine"), "access": "write"}),  # allowed: dropped
        json.dumps({"op": "open", "path": "relative", "access": "read"}),
        json.dumps({"op": "open", "path": "/a\u0000b", "access": "read"}),
        json.dumps({"op": "open", "path": "/x", "access": "teleport"}),
        json.dumps(["not", "a", "dict"]),
        "}{ garbage",
        json.dumps({"op": "open", "path": "/etc/shadow", "access": "read"}),
    ]
    log.write_text("\n".join(lines) + "\n" + "x" * (2 << 20))   # then a 2 MiB unterminated tail
    roots = {"read": [str(out)], "write": [str(out)], "exec": [], "meta": [str(out)]}
    attempts, truncated = sbrun.parse_audit_log(str(log), roots, [str(sealed)])
    assert truncated
    assert [(a.path, a.protected) for a in attempts] == [(str(sealed / "x"), True), ("/etc/shadow", False)]

    log.write_bytes(b"".join(json.dumps({"op": "open", "path": f"/p/{i}", "access": "read"}).encode()
                             + b"\n" for i in range(5000)))
    attempts, truncated = sbrun.parse_audit_log(str(log), roots, [])
    assert truncated and len(attempts) == sbrun.MAX_ATTEMPTS


# Landlock is the enforcement; the hook only the record ----------------------------------------------
@needs_landlock
def test_enforcement_does_not_depend_on_the_hook(layout):
    tmp, a, out, sealed, _, policy = layout
    suite = str(sealed / "suite.json")
    r = run_sandboxed(["/bin/cat", suite], policy)        # not Python: no hook at all
    assert r.returncode != 0 and "Permission denied" in r.stderr_tail
    assert r.protected_attempts == ()                      # ...so nothing could be recorded
    r = run_py("""
        import ctypes, sys
        libc = ctypes.CDLL(None, use_errno=True)           # raw open(2): the audit hook never sees it
        fd = libc.open(sys.argv[1].encode(), 0)
        print("RAW", fd, ctypes.get_errno())
    """, policy, suite)
    assert f"RAW -1 {errno.EACCES}" in r.stdout_tail, r.stdout_tail + r.stderr_tail
    assert r.protected_attempts == ()


@needs_landlock
def test_timeout_kills_the_child(layout):
    *_, policy = layout
    r = run_py("import time; print('START', flush=True); time.sleep(60)", policy, timeout=1.5)
    assert r.timed_out and r.returncode < 0
    assert "START" in r.stdout_tail and r.wall_s < 30


@pytest.mark.skipif(ABI < 4, reason="TCP restriction needs Landlock ABI 4")
def test_network_false_denies_tcp(layout):
    *_, policy = layout
    with socket.create_server(("127.0.0.1", 0)) as srv:
        port = srv.getsockname()[1]
        code = """
            import socket, sys
            try:
                socket.create_connection(("127.0.0.1", int(sys.argv[1])), timeout=5).close()
                print("CONNECTED")
            except PermissionError as e:
                print("NET-EACCES", e.errno)
        """
        closed = SandboxPolicy(**{**policy.__dict__, "network": False})
        r = run_py(code, closed, port)
        # the seccomp filter refuses the socket itself (EPERM) and the parent records it; were a
        # socket obtained some other way, Landlock would still refuse the connect (EACCES)
        assert f"NET-EACCES {errno.EPERM}" in r.stdout_tail, r.stdout_tail + r.stderr_tail
        assert [(d.syscall, d.detail) for d in r.syscall_denials] == [("socket", "AF_INET, SOCK_STREAM")]
        r = run_py(code, policy, port)
        assert "CONNECTED" in r.stdout_tail, r.stdout_tail + r.stderr_tail


# launchers: several processes, each confining itself ---------------------------------------------
# A stand-in for torchrun: starts N copies of the command after it, each in its own session (as
# torchrun does), and waits for them. It runs unconfined, as a launcher does.
LAUNCHER = textwrap.dedent("""
    import os, subprocess, sys
    n, cmd = int(sys.argv[1]), sys.argv[2:]
    procs = [subprocess.Popen(cmd, env=dict(os.environ, RANK=str(r)), start_new_session=True) for r in range(n)]
    sys.exit(max(p.wait() for p in procs))
""")


@needs_landlock
def test_a_launcher_starts_processes_that_each_confine_themselves(layout):
    tmp, a, out, sealed, elsewhere, policy = layout
    code = """
        import os, sys
        rank = os.environ["RANK"]
        try:
            open(sys.argv[1]).read()
            seen = "READ"
        except PermissionError:
            seen = "EACCES"
        # its own /proc entry is granted to each of them, not only to the first
        with open("/proc/self/status") as f:
            f.read()
        open(os.path.join(sys.argv[2], f"rank-{rank}"), "w").write(f"{os.getpid()} {seen}")
    """
    res = run_py(code, policy, elsewhere / "other.txt", out, timeout=60,
                 launcher=[sys.executable, "-E", "-c", LAUNCHER, "3"], processes=3)
    assert res.returncode == 0, res.stderr_tail
    assert res.sandboxed and res.abi >= 1 and res.processes == 3
    seen = [(out / f"rank-{r}").read_text().split() for r in range(3)]
    assert [s[1] for s in seen] == ["EACCES"] * 3 and len({s[0] for s in seen}) == 3
    assert _attempts(res) == {(str(elsewhere / "other.txt"), "read")}


@needs_landlock
def test_a_launcher_that_starts_fewer_processes_than_promised_is_refused(layout):
    *_, out, sealed, elsewhere, policy = layout
    with pytest.raises(SandboxUnavailable, match="2 of 3 process"):
        run_py("print('hi')", policy, timeout=60, launcher=[sys.executable, "-E", "-c", LAUNCHER, "2"], processes=3)
    with pytest.raises(BadInput, match="launcher"):
        run_py("print('hi')", policy, processes=2)


@needs_landlock
def test_processes_started_by_a_launcher_die_with_it(layout):
    """torchrun starts its workers in their own sessions, out of reach of the process-group kill:
    they are armed to die with their launcher instead."""
    import time

    *_, out, sealed, elsewhere, policy = layout
    launcher = textwrap.dedent("""
        import os, subprocess, sys, time
        subprocess.Popen(sys.argv[2:], start_new_session=True)
        while not os.path.exists(sys.argv[1]):
            time.sleep(0.05)
        os._exit(0)                      # the launcher dies; its worker must not live on
    """)
    pidfile = out / "pid"
    res = run_py("import os, sys, time\nopen(sys.argv[1], 'w').write(str(os.getpid()))\ntime.sleep(120)",
                 policy, pidfile, timeout=60, launcher=[sys.executable, "-E", "-c", launcher, str(pidfile)])
    assert res.returncode == 0 and res.processes == 1 and res.wall_s < 30
    pid = int(pidfile.read_text())
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        try:
            with open(f"/proc/{pid}/stat") as f:
                if f.read().rsplit(")", 1)[1].split()[0] == "Z":
                    break                # dead, not yet reaped by whoever adopted it
        except FileNotFoundError:
            break
        time.sleep(0.05)
    else:
        os.kill(pid, 9)
        pytest.fail("the worker outlived its launcher")


@needs_landlock
def test_a_launcher_and_its_processes_die_with_the_caller(layout, tmp_path):
    """The caller (ledger) is SIGKILLed mid-run: its launcher, in a session of its own, and the
    launcher's processes, in theirs, all die with it."""
    import signal
    import subprocess
    import time

    *_, out, sealed, elsewhere, policy = layout
    launcher = textwrap.dedent("""
        import os, subprocess, sys
        open(sys.argv[1], "w").write(str(os.getpid()))
        procs = [subprocess.Popen(sys.argv[2:], env=dict(os.environ, RANK=str(r)), start_new_session=True)
                 for r in range(2)]
        sys.exit(max(p.wait() for p in procs))
    """)
    caller = textwrap.dedent(f"""
        import sys, threading
        from ledger.sandbox import SandboxPolicy, run_sandboxed
        policy = SandboxPolicy.from_json(sys.argv[1])
        code = ("import os, sys, time; open(os.path.join(sys.argv[1], 'rank-' + os.environ['RANK']), 'w')"
                ".write(str(os.getpid())); time.sleep(120)")
        # from a thread, as `ledger train` does
        t = threading.Thread(target=run_sandboxed, args=([sys.executable, "-c", code, {str(out)!r}], policy),
                             kwargs=dict(launcher=[sys.executable, "-E", "-c", {launcher!r}, {str(out / 'launcher')!r}],
                                         processes=2, timeout=120))
        t.start()
        t.join()
    """)
    p = subprocess.Popen([sys.executable, "-c", caller, policy.to_json()])
    files = [out / "launcher", out / "rank-0", out / "rank-1"]
    deadline = time.monotonic() + 60
    while not all(f.exists() and f.read_text() for f in files):
        assert time.monotonic() < deadline and p.poll() is None, "the processes did not start"
        time.sleep(0.05)
    pids = [int(f.read_text()) for f in files]
    p.send_signal(signal.SIGKILL)
    p.wait()
    deadline = time.monotonic() + 10
    alive = pids
    while alive and time.monotonic() < deadline:
        alive = [pid for pid in pids if _running(pid)]
        time.sleep(0.05)
    for pid in alive:
        os.kill(pid, signal.SIGKILL)
    assert not alive, f"outlived the caller: {alive}"


def _running(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


# the rest of the confinement: refused rather than applied in part ----------------------------------
def test_no_seccomp_filter_here_refuses_before_running(layout, monkeypatch):
    *_, out, _, _, policy = layout
    monkeypatch.setattr(seccomp, "available", lambda: "the seccomp filter's syscall table covers x86_64 only")
    spawned = []
    real_popen = sbrun.subprocess.Popen
    monkeypatch.setattr(sbrun.subprocess, "Popen", lambda *a, **k: spawned.append(a) or real_popen(*a, **k))
    with pytest.raises(SandboxUnavailable) as e:
        run_py("open('/tmp/x', 'w')", policy)
    assert e.value.exit_code == 3 and "x86_64" in e.value.message and spawned == []


def _bootstrap(rules: dict, tmp_path):
    status_r, status_w = os.pipe()
    p = subprocess.run([*sbrun.bootstrap_command(), "--rules", json.dumps(rules), "--status-fd", str(status_w),
                        "--", "/bin/echo", "RAN"], pass_fds=(status_w,), capture_output=True, text=True, timeout=60)
    os.close(status_w)
    with os.fdopen(status_r) as f:
        return p, f.read()


@needs_landlock
@pytest.mark.parametrize("missing", ["seccomp", "notify", "shm", "caller_mntns", "network"])
def test_bootstrap_refuses_rules_that_leave_out_part_of_the_confinement(layout, tmp_path, missing):
    *_, policy = layout
    rules, _ = sbrun.bootstrap_rules(policy.grants(), policy)
    del rules[missing]
    p, status = _bootstrap(rules, tmp_path)
    assert p.returncode == BOOTSTRAP_FAILED and "RAN" not in p.stdout
    assert status.startswith("error ") and "refusing to confine less" in status


@needs_landlock
def test_a_rank_refuses_a_dev_shm_its_launcher_did_not_make_private(layout, tmp_path):
    *_, policy = layout
    rules, _ = sbrun.bootstrap_rules(policy.grants(), policy, shm="inherit")   # but no launcher made one
    p, status = _bootstrap(rules, tmp_path)
    assert p.returncode == BOOTSTRAP_FAILED and "RAN" not in p.stdout
    assert "private /dev/shm" in status


def test_a_report_of_another_filter_is_a_refusal():
    prog = seccomp.program(network=False, supervised=True)
    other = seccomp.program(network=True, supervised=True)
    report = {"landlock_abi": 7, "seccomp_sha256": hashlib.sha256(other).hexdigest(), "seccomp_supervised": True,
              "capabilities_dropped": [], "capabilities_left": [], "shm": "private", "namespaces": "mount",
              "no_new_privs": True}
    with pytest.raises(SandboxUnavailable, match="another seccomp filter"):
        sbrun.read_confinement([["ok 7", "confined " + json.dumps(report)]], prog)
    with pytest.raises(SandboxUnavailable, match="did not report"):
        sbrun.read_confinement([["ok 7"]], prog)
    report["seccomp_sha256"] = hashlib.sha256(prog).hexdigest()
    c = sbrun.read_confinement([["ok 7", "confined " + json.dumps(report)]], prog)
    assert c.seccomp_filter_hash == sbrun.filter_id(prog) and c.shm_private


@needs_landlock
def test_a_confined_child_cannot_start_a_sandbox_of_its_own(layout):
    """A sandbox inside a sandbox would need a unix socket (the supervisor), a mount namespace
    and capabilities: none is there, so it is a typed refusal (exit 3), not half a sandbox."""
    tmp, a, out, _, _, policy = layout
    r = run_py("""
        import sys
        from ledger.errors import SandboxUnavailable
        from ledger.sandbox import SandboxPolicy, run_sandboxed
        try:
            run_sandboxed(["/bin/true"], SandboxPolicy(read_write=[sys.argv[1]]))
            print("INNER-RAN")
        except SandboxUnavailable as e:
            print("INNER-REFUSED", e.exit_code)
    """, policy, out, timeout=120)
    assert "INNER-REFUSED 3" in r.stdout_tail, r.stdout_tail + r.stderr_tail


def test_the_filter_is_a_pure_function_of_the_policy():
    ids = {(n, s, g): sbrun.filter_id(seccomp.program(network=n, supervised=s, gpu=g)) for n in (False, True)
           for s in (False, True) for g in (False, True)}
    assert len(set(ids.values())) == 8
    assert ids[(False, True, False)] == sbrun.filter_id(seccomp.program(network=False, supervised=True))


@needs_landlock
def test_gpu_children_get_seqpacket_unix_sockets_which_cannot_reach_a_stream_listener(layout, tmp_path):
    """The CUDA driver probes the MPS control socket with socket(AF_UNIX, SOCK_SEQPACKET) and
    fails cuInit (304) when that socket is refused, so gpu=True allows that one type; the store's
    sockets are SOCK_STREAM, which a SEQPACKET socket cannot connect to."""
    *_, policy = layout
    gpu = SandboxPolicy(**{**policy.__dict__, "gpu": True})
    path = str(tmp_path / "keeper.sock")
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as srv:
        srv.bind(path)
        srv.listen(4)
        srv.settimeout(0.5)
        r = run_py("""
            import socket, sys
            s = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
            try:
                s.connect(sys.argv[1])
                print("CONNECTED")
            except OSError as e:
                print("SEQPACKET-REFUSED", e.errno)
            try:
                socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
                print("STREAM-OPEN")
            except OSError as e:
                print("STREAM-DENIED", e.errno)
        """, gpu, path)
        with pytest.raises(TimeoutError):
            srv.accept()
    assert f"SEQPACKET-REFUSED {errno.EPROTOTYPE}" in r.stdout_tail, r.stdout_tail + r.stderr_tail
    assert f"STREAM-DENIED {errno.EPERM}" in r.stdout_tail
    assert [(d.syscall, d.detail) for d in r.syscall_denials] == [("socket", "AF_UNIX, SOCK_STREAM")]
