"""A hostile process confined like a training child, and like the image, tries every way out
(issue 16): the image's and the keeper's unix sockets, an abstract unix socket, UDP, TCP with
network off, netlink, a /dev/shm file that outlives the run, ptrace and process_vm_readv of the
parent, the parent's /proc entries, inherited descriptors, capabilities (a mode-000 file, chown,
mount), new namespaces and io_uring. Each is denied; each refused syscall is in the result's
record (seccomp, reported by the kernel to the parent, not by the child); the parent's listeners
receive nothing; and the receipt names the confinement.

The training child is the real launch path (train.run.child_job + train.job.launch: its policy,
its environment) with the command replaced by tests/security/hostile.py. The image is the
image's own bootstrap rules (image.confine.policy + confine.rules, with its seccomp supervisor),
started as the keeper does.
One hostile run per kind, shared by the tests below (each test checks one rule)."""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import socket
import subprocess
import sys
import threading
import uuid
from pathlib import Path

import pytest

from ledger.image import confine, protocol
from ledger.plan import compile as comp
from ledger.plan import spec, targets
from ledger.sandbox import landlock_abi
from ledger.sandbox.run import bootstrap_command
from ledger.store import Store
from ledger.train import job
from ledger.train import run as trainlib

pytestmark = pytest.mark.skipif(landlock_abi() < 6, reason="needs Landlock ABI 6 (scoped abstract sockets)")

HOSTILE = str(Path(__file__).with_name("hostile.py"))
TINY = "[data]\nsteps = 2\nmicro_batch = 4\n"
SECRET = "parent-secret-" + uuid.uuid4().hex


class Listeners:
    """Real listening sockets where the store's image and keeper listen, an abstract unix socket,
    a TCP and a UDP socket on loopback; a thread notes every connection or datagram."""

    def __init__(self, store_root: Path):
        protocol.run_dir(store_root).mkdir(parents=True, exist_ok=True)
        self.unix_paths = [str(protocol.image_socket(store_root)), str(protocol.control_socket(store_root))]
        self.abstract = "ledger-hostile-" + uuid.uuid4().hex[:12]
        self.got: list[str] = []
        self.socks = []
        for path in self.unix_paths:
            s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            s.bind(path)
            s.listen(8)
            self.socks.append(("unix " + path, s))
        a = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        a.bind("\0" + self.abstract)
        a.listen(8)
        self.socks.append(("abstract", a))
        t = socket.create_server(("127.0.0.1", 0))
        self.tcp_port = t.getsockname()[1]
        self.socks.append(("tcp", t))
        u = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        u.bind(("127.0.0.1", 0))
        self.udp_port = u.getsockname()[1]
        self.socks.append(("udp", u))
        for name, s in self.socks:
            s.settimeout(0.2)
        self.stop = False
        self.thread = threading.Thread(target=self._watch, daemon=True)
        self.thread.start()

    def _watch(self):
        while not self.stop:
            for name, s in self.socks:
                try:
                    if name == "udp":
                        s.recvfrom(64)
                    else:
                        s.accept()[0].close()
                    self.got.append(name)
                except OSError:
                    pass

    def close(self):
        self.stop = True
        self.thread.join(5)
        for _, s in self.socks:
            s.close()
        for p in self.unix_paths:
            os.unlink(p)


def _config(store_root: Path, listeners: Listeners, out: Path, mode000: Path, chown: Path) -> dict:
    return {"unix": listeners.unix_paths, "abstract": listeners.abstract, "tcp_port": listeners.tcp_port,
            "udp_port": listeners.udp_port, "shm_name": "ledger-hostile-" + uuid.uuid4().hex[:12],
            "host_shm": HOST_SHM.name, "ppid": os.getpid(), "parent_address": id(SECRET), "out": str(out),
            "mode000": str(mode000), "chown": str(chown)}


def _seen(stdout: str) -> dict:
    lines = [x for x in stdout.splitlines() if x.startswith("HOSTILE ")]
    assert lines, stdout
    return json.loads(lines[-1][len("HOSTILE "):])


HOST_SHM = Path("/dev/shm") / ("ledger-host-" + uuid.uuid4().hex[:12])


@pytest.fixture(scope="module", autouse=True)
def host_shm():
    """A file in the host's /dev/shm that a private one does not show; a secret in our environ."""
    HOST_SHM.write_text("the host's")
    os.environ["LEDGER_TEST_PARENT_SECRET"] = SECRET
    yield
    HOST_SHM.unlink()
    os.environ.pop("LEDGER_TEST_PARENT_SECRET", None)


@pytest.fixture(scope="module")
def child(tmp_path_factory):
    """The hostile training child, run once through the real launch path."""
    store = Store.init(tmp_path_factory.mktemp("hostile-child"))
    plan = comp.compile_spec(store, spec.parse(TINY), targets.get("cpu")).plan
    work = job.new_work(store, "train")   # inputs/, out/, scratch/: the attacker needs no inputs
    mode000, chown = work / "inputs" / "locked", work / "out" / "mine.txt"
    mode000.write_text("only with CAP_DAC_OVERRIDE")
    mode000.chmod(0)
    chown.write_text("mine")
    listeners = Listeners(store.root)
    try:
        cfg = _config(store.root, listeners, work / "out", mode000, chown)
        cj = trainlib.child_job(store, work, plan, unsandboxed=False, timeout=120)
        attacker = work / "inputs" / "hostile.py"     # where the child can read it
        shutil.copyfile(HOSTILE, attacker)
        cj = dataclasses.replace(cj, argv=(sys.executable, str(attacker), json.dumps(cfg)))
        # an inheritable descriptor of the parent's, open on a store file, while the child starts
        leak = os.open(store.root / "config", os.O_RDONLY)
        os.set_inheritable(leak, True)
        try:
            res = job.launch(cj)
        finally:
            os.close(leak)
        seen = _seen(res.stdout_tail + res.stderr_tail)
    finally:
        listeners.close()
    left = Path("/dev/shm") / cfg["shm_name"]
    survived = left.exists()
    left.unlink(missing_ok=True)
    return {"res": res, "seen": seen, "got": listeners.got, "shm_survived": survived, "job": cj,
            "owner": chown.stat().st_uid}


@pytest.fixture(scope="module")
def image(tmp_path_factory):
    """The same attacker confined as the image is: the image's policy and bootstrap rules."""
    from ledger.cycle import ensure_genesis, load_spec

    store = Store.init(tmp_path_factory.mktemp("hostile-image"))
    ensure_genesis(store, load_spec(None))
    buffer = protocol.run_dir(store.root) / protocol.BUFFER_DIR
    buffer.mkdir(parents=True)
    policy, _ = confine.policy(store, confine.all_generations(store), buffer)
    sup = confine.supervisor(protocol.run_dir(store.root), "hostile")
    rules, prog = confine.rules(policy, notify=sup.path)
    scratch = confine.scratch_dir(buffer, "hostile")
    (scratch / "rules.json").write_text(json.dumps(rules))
    mode000, chown = scratch / "locked", scratch / "mine.txt"
    mode000.write_text("only with CAP_DAC_OVERRIDE")
    mode000.chmod(0)
    chown.write_text("mine")
    listeners = Listeners(store.root)
    try:
        cfg = _config(store.root, listeners, scratch, mode000, chown)
        shutil.copyfile(HOSTILE, scratch / "hostile.py")
        status_r, status_w = os.pipe()
        cmd = [*bootstrap_command(), "--rules-file", str(scratch / "rules.json"), "--status-fd", str(status_w),
               "--cwd", str(scratch), "--", sys.executable, "-S", str(scratch / "hostile.py"), json.dumps(cfg)]
        proc = subprocess.run(cmd, env={"PATH": os.defpath, "HOME": str(scratch)}, pass_fds=(status_w,),
                              capture_output=True, text=True, timeout=120)
        os.close(status_w)
        with os.fdopen(status_r) as f:
            status = f.read()
        seen = _seen(proc.stdout + proc.stderr)
    finally:
        listeners.close()
        sup.close()
    left = Path("/dev/shm") / cfg["shm_name"]
    survived = left.exists()
    left.unlink(missing_ok=True)
    return {"status": status, "prog": prog, "seen": seen, "got": listeners.got, "shm_survived": survived,
            "owner": chown.stat().st_uid, "stderr": proc.stderr,
            "denials": {(d.syscall, d.detail) for d in sup.denials()}}


def _denied(seen: dict, *names: str) -> None:
    for n in names:
        assert seen[n].startswith("denied"), (n, seen[n])


def _refused(res, syscall: str, detail: str | None = None) -> None:
    got = [(d.syscall, d.detail) for d in res.syscall_denials]
    assert any(s == syscall and (detail is None or d == detail) for s, d in got), got


# --- the training child ------------------------------------------------------------------------------
def test_child_cannot_connect_to_the_image_or_keeper_socket(child):
    _denied(child["seen"], "unix-0", "unix-1", "unix-abstract")
    assert not [g for g in child["got"] if g.startswith(("unix", "abstract"))]
    _refused(child["res"], "socket", "AF_UNIX, SOCK_STREAM")


def test_child_cannot_send_udp(child):
    _denied(child["seen"], "udp")
    assert "udp" not in child["got"]
    _refused(child["res"], "socket", "AF_INET, SOCK_DGRAM")


def test_child_cannot_reach_a_loopback_tcp_listener_without_network(child):
    assert child["job"].policy.network is False
    _denied(child["seen"], "tcp")
    assert "tcp" not in child["got"]
    _refused(child["res"], "socket", "AF_INET, SOCK_STREAM")


def test_child_cannot_open_other_socket_families(child):
    _denied(child["seen"], "netlink")
    _refused(child["res"], "socket", "AF_NETLINK, SOCK_RAW")


def test_child_shm_is_private_and_gone_after_the_run(child):
    _denied(child["seen"], "shm")          # it wrote, but only into its own /dev/shm
    assert not child["shm_survived"]
    assert child["res"].confinement.shm_private


def test_child_cannot_ptrace_or_read_the_parents_memory(child):
    _denied(child["seen"], "ptrace", "process_vm_readv")
    _refused(child["res"], "ptrace")
    _refused(child["res"], "process_vm_readv")


def test_child_cannot_read_the_parents_proc_entries(child):
    _denied(child["seen"], "proc-environ", "proc-mem", "proc-cmdline", "proc-fd")
    recorded = {a.path for a in child["res"].denied_attempts}
    for name in ("environ", "mem", "cmdline", "fd"):
        assert f"/proc/{os.getpid()}/{name}" in recorded, recorded
    assert SECRET not in child["res"].stdout_tail + child["res"].stderr_tail


def test_child_inherits_no_descriptor_beyond_stdio(child):
    _denied(child["seen"], "fds")


def test_child_holds_no_capability_even_as_root(child):
    seen, conf = child["seen"], child["res"].confinement
    _denied(seen, "capabilities", "mode-000", "chown", "mount")
    assert child["owner"] == os.getuid()               # the chown did not happen
    _refused(child["res"], "mount")
    assert conf.capabilities_left == () and conf.no_new_privs
    if os.geteuid() == 0:
        assert {"cap_dac_override", "cap_chown", "cap_sys_admin"} <= set(conf.capabilities_dropped)


def test_child_cannot_make_namespaces_or_use_io_uring(child):
    _denied(child["seen"], "unshare", "io_uring")
    _refused(child["res"], "unshare")
    _refused(child["res"], "io_uring_setup")


def test_receipt_names_the_confinement(child):
    rec = job.sandbox_record(child["res"], child["job"].policy)
    c = rec["confinement"]
    assert c["landlock_abi"] == landlock_abi()
    assert c["seccomp_filter_hash"].startswith("b3:") and len(c["seccomp_filter_hash"]) == 67
    assert c["shm_private"] and c["seccomp_supervised"] and c["capabilities_left"] == []
    assert "ptrace" in {d["syscall"] for d in rec["syscall_denials"]}
    json.dumps(rec)                        # a receipt is JSON


# --- the image ---------------------------------------------------------------------------------------
def test_image_cannot_open_any_socket_or_reach_a_listener(image):
    seen = image["seen"]
    _denied(seen, "unix-0", "unix-1", "unix-abstract", "udp", "tcp", "netlink")
    assert image["got"] == [], image["got"]
    assert {("socket", "AF_UNIX, SOCK_STREAM"), ("socket", "AF_INET, SOCK_DGRAM"), ("socket", "AF_INET, SOCK_STREAM"),
            ("socket", "AF_NETLINK, SOCK_RAW")} <= image["denials"]


def test_image_shm_is_private_and_gone(image):
    _denied(image["seen"], "shm")
    assert not image["shm_survived"]


def test_image_cannot_ptrace_read_the_parent_or_inherit_descriptors(image):
    _denied(image["seen"], "ptrace", "process_vm_readv", "proc-environ", "proc-mem", "proc-cmdline", "proc-fd", "fds")
    assert {"ptrace", "process_vm_readv"} <= {name for name, _ in image["denials"]}


def test_image_holds_no_capability_and_makes_no_namespace(image):
    _denied(image["seen"], "capabilities", "mode-000", "chown", "mount", "unshare", "io_uring")
    assert image["owner"] == os.getuid()
    assert {"mount", "unshare", "io_uring_setup"} <= {name for name, _ in image["denials"]}


def test_image_reports_its_confinement(image):
    c = confine.confinement(image["status"], image["prog"])
    assert c["landlock_abi"] == landlock_abi() and c["seccomp_filter_hash"].startswith("b3:")
    assert c["shm_private"] and c["capabilities_left"] == [] and c["no_new_privs"]
    assert c["seccomp_supervised"]         # the keeper records what the image's filter refuses


def test_a_real_runs_receipt_names_the_confinement_and_the_store_verifies(trained):
    """The confinement in a committed receipt is data, not a reference: the filter's id sits under
    a `_hash` key, so `verify` does not look for it among the objects."""
    from ledger.store.verify import verify

    store, res = trained["store"], trained["result"]
    c = store.get_json(res.receipt_id)["sandbox"]["confinement"]
    assert c["seccomp_filter_hash"].startswith("b3:") and c["shm_private"] and c["capabilities_left"] == []
    rep = verify(store)
    assert rep.ok, rep.errors
