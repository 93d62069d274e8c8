"""`ledger serve`: the keeper -- lifecycle, control socket and loop -- and the confined image
process it runs.

Two processes, because Landlock cannot express "write the journal, never read the sealed
suite" for one process (ledger/image/confine.py says why):

  the keeper   this module, not confined. It binds the sockets, computes the image's policy
               from the journal, starts the image under it, commits the image's buffer to the
               journal and writes the lifecycle records (kind `image`) through ledger/image/fold.py,
               answers control requests, and with --learn runs the learn cycle itself. It never
               loads a model, runs wasm, or parses a client's act request.
  the image    ledger/image/worker.py, confined by Landlock: model, capabilities, requests.

Lifecycle, as the journal shows it (each an `image` record carrying a new context):
  start   the keeper started and its first image is serving HEAD
  pause   a learn cycle (`ledger run`, or --learn) asked; the image finished the request in
          flight, its buffer was committed, it exited
  resume  a new image serves HEAD (the new generation after Accept, the old one after a refusal)
  restart the image asked to be restarted (HEAD moved to a generation committed after it
          started) or died; its buffer was committed first
  stop    `ledger image stop`, SIGTERM or Ctrl-C

Crash safety: the image's buffer is fsynced before any reply, and a keeper that starts commits
what the last one left (only entries after the committed cursor) before anything else.
Only one keeper serves a store (an flock on run/keeper.lock, released by the kernel on death).

Other processes reach the keeper through ledger/image/client.py (status, stop, and `paused(store)`,
the hook the learn cycle uses: `with paused(store): run_cycle(...)`).
"""

from __future__ import annotations

import fcntl
import json
import os
import select
import selectors
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

import ledger
from ledger import experience, generations
from ledger.capabilities import cache
from ledger.cycle import Policy, due, run_cycle
from ledger.errors import BadInput, InternalError, LedgerError, Locked, Refused, SandboxUnavailable
from ledger.image import act as actlib
from ledger.image import confine, protocol
from ledger.image import context as ctxlib
from ledger.image.client import ERROR_JSON_TAG, READY_TIMEOUT
from ledger.image.fold import FOLD_INTERVAL, FOLD_MAX, Fold, fresh, journal_position
from ledger.image.worker import RESTART_EXIT
from ledger.options import ServeOptions
from ledger.sandbox import landlock_abi
from ledger.sandbox.run import bootstrap_command
from ledger.store import Store

DRAIN_TIMEOUT = 120.0      # the request in flight: at most 48 bytes plus a capability's time limit
CRASH_WINDOW, CRASH_LIMIT = 10.0, 3
LEARN_EVERY = 5.0


def _log(msg: str) -> None:
    print(f"[ledger serve {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def _package_root() -> str:
    return os.path.dirname(os.path.dirname(os.path.abspath(ledger.__file__)))


class _Worker:
    """One image process and what the keeper knows about it."""

    def __init__(self, proc, channel, session, scratch, info, sandbox):
        self.proc, self.channel, self.session, self.scratch = proc, channel, session, scratch
        self.reader = protocol.LineReader(channel)
        self.info, self.sandbox = info, sandbox
        self.supervisor = None        # seccomp.Supervisor of this image (None when unsandboxed)
        self.started = time.monotonic()
        self.dirty = False
        self.urgent = False
        self.since = 0.0              # when the oldest uncommitted entry was announced
        self.spooled = self.committed = 0
        self.drained: int | None = None

    def due(self) -> bool:
        return self.dirty and (self.urgent or self.drained is not None or self.spooled - self.committed >= FOLD_MAX
                               or time.monotonic() - self.since >= FOLD_INTERVAL)


class Keeper:
    """One store's image: its sockets, the image process, the control requests, and the loop that
    ties them together. What reaches the journal goes through `self.fold` (ledger/image/fold.py)."""

    def __init__(self, store, options: ServeOptions = ServeOptions(), say=_log):
        self.store, self.options, self.say = store, options, say
        self.learn = options.learn
        self.run = protocol.run_dir(store.root)
        self.buffer = self.run / protocol.BUFFER_DIR
        self.worker: _Worker | None = None
        self.state = "starting"
        self.pause_holder: socket.socket | None = None
        self.stop_requested = False
        self.stop_replies: list[socket.socket] = []
        self.crashes: list[float] = []
        self.fold: Fold | None = None
        self.next_learn = 0.0
        self.learning = None
        self.learned = None
        self.lockfd = -1
        self.owner = False

    @property
    def ctx(self):
        """The image's context as the journal holds it (None before start)."""
        return self.fold.ctx if self.fold else None

    # --- start and stop ---------------------------------------------------------------------------
    def start(self) -> None:
        self.run.mkdir(exist_ok=True)
        self.buffer.mkdir(exist_ok=True)
        os.chmod(self.run, 0o700)
        self.lockfd = os.open(self.run / "keeper.lock", os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(self.lockfd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(self.lockfd, 64, 0).decode(errors="replace").strip()
            os.close(self.lockfd)
            self.lockfd = -1
            raise Locked(f"an image is already serving this store (keeper pid {holder or '?'})",
                         "see `ledger image status`; stop it with `ledger image stop`") from None
        self.owner = True    # from here on the run folder's sockets and state file are ours
        os.ftruncate(self.lockfd, 0)
        os.pwrite(self.lockfd, str(os.getpid()).encode(), 0)
        if not self.options.unsandboxed and landlock_abi() < 1:
            raise SandboxUnavailable("Landlock is not available on this kernel, so the image cannot be confined; "
                                     "nothing was started", "pass --unsandboxed to serve without it (recorded)")
        fresh(self.store)
        if generations.head(self.store) is None:
            raise Refused("there is no generation to serve",
                          "commit one first: `ledger run`, `ledger demo` or `ledger capability add`")
        self.fold = Fold(self.store, self.buffer, self.say)
        self.fold.recover()
        self.listen = self._bind(protocol.image_socket(self.store.root), backlog=128)
        self.control = self._bind(protocol.control_socket(self.store.root), backlog=16)
        self.sel = selectors.DefaultSelector()
        self.control.setblocking(False)
        self.sel.register(self.control, selectors.EVENT_READ, ("control-listen", None))
        self.spawn("start")
        self._write_state()

    def _bind(self, path: Path, backlog: int) -> socket.socket:
        if len(str(path).encode()) > protocol.SUN_PATH_MAX:
            raise BadInput(f"socket path {path} is longer than the {protocol.SUN_PATH_MAX} bytes a Unix socket allows",
                           "use a store at a shorter path")
        path.unlink(missing_ok=True)   # a dead keeper's socket: we hold the keeper lock
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        old = os.umask(0o177)
        try:
            s.bind(str(path))
        finally:
            os.umask(old)
        s.listen(backlog)
        return s

    def _write_state(self) -> None:
        w = self.worker
        data = {"pid": os.getpid(), "state": self.state, "store": str(self.store.root),
                "socket": str(protocol.image_socket(self.store.root)), "control": str(protocol.control_socket(self.store.root)),
                "image_pid": w.proc.pid if w else None, "generation": self.ctx.generation if self.ctx else None}
        tmp = self.run / f".{protocol.STATE_FILE}.{os.getpid()}"
        tmp.write_text(json.dumps(data, sort_keys=True) + "\n")
        os.replace(tmp, self.run / protocol.STATE_FILE)

    def close(self) -> None:
        if self.owner:
            for p in (protocol.image_socket(self.store.root), protocol.control_socket(self.store.root),
                      self.run / protocol.STATE_FILE):
                p.unlink(missing_ok=True)
        for s in (getattr(self, "listen", None), getattr(self, "control", None)):
            if s is not None:
                s.close()
        if self.lockfd >= 0:
            os.close(self.lockfd)
            self.lockfd = -1

    def _commit(self, w: "_Worker") -> None:
        urgent = w.urgent
        w.dirty = w.urgent = False
        w.committed = w.spooled
        try:
            self.fold.fold(w.session, folded=self._folded)
        except Locked as e:
            # Another writer holds the store for longer than LOCK_WAIT: the turns stay in the
            # image's buffer (durable) and are committed on the next attempt.
            self.say(f"could not commit the image's buffer yet: {e.message}; retrying")
            w.dirty, w.urgent, w.since = True, urgent, time.monotonic()

    def _folded(self, session: str, first: int, frm: int, upto: int) -> None:
        w = self.worker
        if w is not None and w.session == session:   # the image maps its request ids to turn ids
            self._tell(w, op="folded", session=session, first=first, **{"from": frm, "upto": upto})

    # --- the image process --------------------------------------------------------------------------
    def spawn(self, event: str) -> None:
        """Start an image on HEAD, wait until it serves, and record `event`."""
        st, offset = journal_position(self.store)
        head = generations.head(self.store)
        if head is None or head.base is None:
            raise Refused(f"{head.name if head else 'HEAD'} names no base weights, so there is no model to serve",
                          "commit a generation with a base (`ledger run`, `ledger demo`) or roll back to one")
        gens = confine.all_generations(self.store)
        self._warm_capabilities(gens)
        session = uuid.uuid4().hex[:16]
        # Scratch inside the image's own folder, so that a keeper that was killed leaves nothing
        # behind that the next one does not clean up (recover()).
        scratch = confine.scratch_dir(self.buffer, session)
        sup = None   # the image's seccomp supervisor: records the syscalls its filter refuses
        ours = theirs = None
        try:
            policy, objects = confine.policy(self.store, gens, self.buffer,
                                             # the ledger-cuda* decoders (generate.CUDA_DECODERS) need the GPU
                                             gpu=(self.options.decoder or "").startswith("ledger-cuda"))
            recent = [[rid, _shown(t), t.get("id")] for rid, t in ctxlib.recent_requests(self.store).items()]
            ours, theirs = socket.socketpair()
            # everything the image needs, in one JSON file: its options, and the fds it inherits
            cfg = {
                "listen_fd": self.listen.fileno(),
                "channel_fd": theirs.fileno(),
                "store": str(self.store.root),
                "state": st.to_json(),
                "offset": offset,
                "objects": sorted(objects),
                "generations": [{"id": g.id, "n": g.n, "base": g.base, "adapter": g.adapter} for g in gens],
                "buffer": str(self.buffer),
                "scratch": str(scratch),
                "session": session,
                "recent": recent,
                "threads": self.options.threads,
                "decoder": self.options.decoder,
                "keeper_pid": os.getpid(),
                "durability": self.options.durability,
                "probe": os.environ.get("LEDGER_IMAGE_PROBE") == "1",
                "hold": os.environ.get("LEDGER_IMAGE_HOLD"),
            }
            (scratch / "config.json").write_text(json.dumps(cfg))
            sup = None if self.options.unsandboxed else confine.supervisor(self.run, session)
            rules, prog = confine.rules(policy, landlock=not self.options.unsandboxed,
                                        notify=sup.path if sup else None)
            (scratch / "rules.json").write_text(json.dumps(rules))
            status_r, status_w = os.pipe()
            cmd = [*bootstrap_command(), "--rules-file", str(scratch / "rules.json"),
                   "--status-fd", str(status_w), "--cwd", str(scratch), "--",
                   sys.executable, "-m", "ledger.image.worker", str(scratch / "config.json")]
            try:
                proc = subprocess.Popen(cmd, cwd=_package_root(), env=self._env(scratch), stdin=subprocess.DEVNULL,
                                        pass_fds=(self.listen.fileno(), theirs.fileno(), status_w))
            finally:
                os.close(status_w)
                theirs.close()
            status = _read_all(status_r, 30.0)
            if not status.startswith("ok "):
                proc.kill()
                proc.wait()
                raise SandboxUnavailable(f"could not confine the image: {status.strip() or 'no status'}; nothing was served")
            try:   # what its bootstrap applied: Landlock ABI, seccomp filter id, capabilities, private /dev/shm
                confinement = None if self.options.unsandboxed else confine.confinement(status, prog)
            except SandboxUnavailable:
                proc.kill()
                proc.wait()
                raise
            sandbox = {
                "sandboxed": not self.options.unsandboxed,
                "landlock_abi": int(status.split()[1]),
                "grants": len(policy.grants()),
                "objects": len(objects),
                "read_write": list(policy.read_write),
                "network": policy.network,
                "protected": list(policy.protected),
                "confinement": confinement,
            }
            info = self._await_ready(proc, ours)
        except BaseException:
            for sock in (ours, theirs):   # closed twice is harmless; never leaked
                if sock is not None:
                    sock.close()
            if sup is not None:
                sup.close()
            shutil.rmtree(scratch, ignore_errors=True)
            raise
        self.worker = _Worker(proc, ours, session, scratch, info, sandbox)
        self.worker.supervisor = sup
        self.sel.register(ours, selectors.EVENT_READ, ("worker", None))
        self.state = "serving"
        self.fold.lifecycle(event, session=session, decoder=info.get("decoder"), sandbox=sandbox, image_pid=proc.pid)
        self.say(
            f"serving {self.ctx and f'gen-{self.ctx.gen}'} ({head.id[:15]}…) on {protocol.image_socket(self.store.root)}"
            f" [{event}; decoder {info.get('decoder')}; "
            + (f"Landlock ABI {sandbox['landlock_abi']}, {sandbox['grants']} grants]" if sandbox["sandboxed"] else "UNSANDBOXED]")
        )

    def _env(self, scratch: Path) -> dict:
        keep = ("PATH", "LANG", "LANGUAGE", "LC_ALL", "LC_CTYPE", "TZ", "USER", "LOGNAME", "PYTHONHASHSEED",
                "LD_LIBRARY_PATH", "LEDGER_DEBUG")
        env = {k: os.environ[k] for k in keep if k in os.environ}
        env.setdefault("PATH", os.defpath)
        env.update({"HOME": str(scratch), "TMPDIR": str(scratch), "PYTHONDONTWRITEBYTECODE": "1",
                    "OMP_NUM_THREADS": str(self.options.threads), "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"})
        return env

    def _warm_capabilities(self, gens) -> None:
        """Compile each capability module into the store's cache now: the image can read the
        cache but not write it (compiled code it wrote would later run outside its sandbox)."""
        mods = {e["module"] for g in gens for e in g.capabilities.values()}
        (self.store.root / "cache" / "wasm").mkdir(parents=True, exist_ok=True)
        if mods:
            for m in sorted(mods):
                cache.load(self.store, m)

    def _await_ready(self, proc, chan: socket.socket) -> dict:
        reader = protocol.LineReader(chan)
        chan.settimeout(READY_TIMEOUT)
        try:
            line = reader.read_line()
        except socket.timeout:
            line = None
        finally:
            chan.settimeout(None)
        if line is None:
            proc.kill()
            code = proc.wait()
            raise InternalError(f"the image process exited ({code}) before it was ready",
                                f"see its output above (or {self.run / protocol.LOG_FILE} when detached)")
        msg = protocol.decode(line)
        if msg.get("event") == "failed":
            proc.wait()
            raise protocol.to_error({"error": msg.get("error")})
        if msg.get("event") != "ready":
            proc.kill()
            proc.wait()
            raise InternalError(f"the image sent {msg.get('event')!r} before it was ready")
        return msg

    def _tell(self, w: _Worker, **msg) -> None:
        try:
            w.channel.sendall(protocol.encode(msg))
        except OSError:
            pass   # it exited; the exit is handled by the loop

    def _on_worker(self, w: _Worker) -> bool:
        """Read the image's messages; False once it has exited (channel closed)."""
        try:
            data = w.channel.recv(1 << 20)
        except socket.timeout:
            return True
        except OSError:
            data = b""
        if not data:
            return False
        for line in w.reader.feed(data):
            msg = protocol.decode(line)
            if msg.get("event") == "spooled":
                if not w.dirty:
                    w.since = time.monotonic()
                w.dirty = True
                w.urgent = w.urgent or bool(msg.get("urgent"))
                w.spooled = int(msg.get("n", 0))
            elif msg.get("event") == "drained":
                w.drained = int(msg.get("upto", 0))
                w.dirty = True
        return True

    def _reap(self, w: _Worker, why: str) -> int:
        """The image exited: commit the rest of its buffer, drop its files, forget it."""
        self.sel.unregister(w.channel)
        w.channel.close()
        try:
            code = w.proc.wait(timeout=DRAIN_TIMEOUT)
        except subprocess.TimeoutExpired:
            w.proc.kill()
            code = w.proc.wait()
        self.worker = None
        self.fold.fold(w.session, final=True, folded=self._folded)
        self.fold.forget(w.session)
        shutil.rmtree(w.scratch, ignore_errors=True)
        if w.supervisor is not None:
            w.supervisor.close()
        self.say(f"image (pid {w.proc.pid}) exited with {code}: {why}")
        return code

    def stop_worker(self, why: str) -> None:
        """Ask the image to finish the request in flight and exit; commit its buffer."""
        w = self.worker
        if w is None:
            return
        self._tell(w, op="stop")
        deadline = time.monotonic() + DRAIN_TIMEOUT
        w.channel.settimeout(1.0)
        while time.monotonic() < deadline:
            alive = self._on_worker(w)
            if w.dirty:
                self._commit(w)
            if not alive:
                break
        else:
            self.say("the image did not stop in time; killing it")
            w.proc.kill()
        w.channel.settimeout(None)
        self._reap(w, why)

    # --- control ------------------------------------------------------------------------------------
    def status(self) -> dict:
        w = self.worker
        return {"running": True, "pid": os.getpid(), "state": self.state, "socket": str(protocol.image_socket(self.store.root)),
                "image_pid": w.proc.pid if w else None, "session": w.session if w else None,
                "decoder": w.info.get("decoder") if w else None,
                "sandbox": confine.status(w.sandbox, w.supervisor) if w else None,
                "generation": self.ctx.generation, "gen": self.ctx.gen, "context": {**self.ctx.to_json(), "id": self.ctx.id},
                "unrecorded": self.fold.unrecorded(),
                "learn": Policy.of(self.learn).to_json() if self.learn else None}

    def _control(self, conn: socket.socket, msg: dict) -> dict | None:
        op = msg.get("op")
        if op == "status":
            return protocol.ok(msg.get("id"), **self.status())
        if op == "stop":
            self.stop_requested = True
            self.stop_replies.append(conn)
            return None
        if op == "pause":
            if self.learning is not None:
                raise Locked("the image is running a learn cycle of its own (--learn)",
                             "wait for it to finish; `ledger image status` shows the state")
            if self.pause_holder is not None:
                raise Locked("the image is already paused by another client (a learn cycle is running)",
                             "wait for it to finish; `ledger image status` shows the state")
            self.pause_holder = conn
            self.stop_worker("paused for a learn cycle")
            self.state = "paused"
            self.fold.lifecycle("pause")
            self._write_state()
            return protocol.ok(msg.get("id"), paused=True, generation=self.ctx.generation, gen=self.ctx.gen)
        if op == "resume":
            if self.pause_holder is not conn:
                raise BadInput("resume comes from the client that paused the image")
            self._resume()
            return protocol.ok(msg.get("id"), resumed=True, generation=self.ctx.generation, gen=self.ctx.gen)
        raise BadInput(f"unknown control op {op!r}", "ops: status, stop, pause, resume")

    def _resume(self) -> None:
        self.pause_holder = None
        self.spawn("resume")
        self._write_state()

    def _on_control(self, conn: socket.socket, reader) -> bool:
        try:
            data = conn.recv(65536)
        except OSError:
            data = b""
        if not data:
            return False
        for line in reader.feed(data):
            rid = None
            try:
                msg = protocol.decode(line)
                rid = msg.get("id")
                reply = self._control(conn, msg)
            except LedgerError as e:
                reply = protocol.error(rid, e)
            if reply is not None:
                try:
                    conn.sendall(protocol.encode(reply))
                except OSError:
                    return False
        return True

    # --- learning --------------------------------------------------------------------------------
    def maybe_learn(self) -> None:
        """--learn: when the trigger policy says a cycle is due, stop the image, run the cycle on a
        thread (the keeper keeps answering control requests meanwhile), then serve HEAD again."""
        if self.learning is not None:
            if self.learning.is_alive():
                return
            self.learning = None
            out = self.learned
            if isinstance(out, LedgerError):
                self.say(f"learn: the cycle failed: {out.message} ({out.hint}); serving on")
                self.next_learn = time.monotonic() + 600
            elif isinstance(out, BaseException):
                self.say(f"learn: the cycle failed: {type(out).__name__}: {out}; serving on")
                self.next_learn = time.monotonic() + 600
            else:
                self.say(f"learn: cycle {out.cycle}: {out.verdict} -> {out.generation}")
            self.spawn("resume")
            self._write_state()
            return
        if self.learn is None or self.state != "serving" or time.monotonic() < self.next_learn:
            return
        self.next_learn = time.monotonic() + LEARN_EVERY
        fresh(self.store)
        if experience.pending(self.store) < self.learn.min_turns or due(self.store, Policy.of(self.learn)):
            return
        self.say("learn: the trigger policy says a cycle is due; pausing the image")
        self.stop_worker("paused for a learn cycle (--learn)")
        self.state = "learning"
        self.fold.lifecycle("pause", learn=True)
        self._write_state()
        self.learned = None
        self.learning = threading.Thread(target=self._learn, name="ledger-learn", daemon=True)
        self.learning.start()

    def _learn(self) -> None:
        try:   # its own Store object: the keeper's thread keeps using its own
            self.learned = run_cycle(Store.open(self.store.root), self.learn,
                                     progress=lambda stage, m: self.say(f"learn: {stage}: {m}"))
        except BaseException as e:  # noqa: BLE001 - reported by the keeper's thread, which serves on
            self.learned = e

    # --- the loop ----------------------------------------------------------------------------------
    def loop(self) -> None:
        signal.signal(signal.SIGTERM, lambda *_: setattr(self, "stop_requested", True))
        signal.signal(signal.SIGINT, lambda *_: setattr(self, "stop_requested", True))
        controls: dict[socket.socket, object] = {}
        while not self.stop_requested:
            w = self.worker
            wait = 0.2 if w is None or not w.dirty else max(0.0, min(0.2, w.since + FOLD_INTERVAL - time.monotonic()))
            for key, _ in self.sel.select(timeout=wait):
                kind, _ = key.data
                if kind == "control-listen":
                    try:
                        c, _ = self.control.accept()
                    except (BlockingIOError, InterruptedError):
                        continue
                    c.setblocking(True)
                    c.settimeout(10.0)
                    controls[c] = protocol.LineReader(c)
                    self.sel.register(c, selectors.EVENT_READ, ("control", None))
                elif kind == "control":
                    c = key.fileobj
                    if not self._on_control(c, controls[c]):
                        self.sel.unregister(c)
                        controls.pop(c, None)
                        if c in self.stop_replies:
                            self.stop_replies.remove(c)
                        c.close()
                        if c is self.pause_holder:   # the cycle's client went away: resume anyway
                            self.say("the client that paused the image is gone; resuming")
                            self._resume()
                elif kind == "worker" and self.worker is not None:
                    w = self.worker
                    if not self._on_worker(w):
                        self._after_exit(w)
            w = self.worker
            if w is not None and w.due():
                self._commit(w)
            self.maybe_learn()
        self.shutdown()

    def _after_exit(self, w: _Worker) -> None:
        code = self._reap(w, "restart requested" if w.drained is not None else "exited unexpectedly")
        if self.stop_requested or self.pause_holder is not None:
            return
        if code != RESTART_EXIT:
            now = time.monotonic()
            self.crashes = [t for t in self.crashes if now - t < CRASH_WINDOW] + [now]
            if len(self.crashes) >= CRASH_LIMIT:
                self.say(f"the image failed {CRASH_LIMIT} times within {CRASH_WINDOW:g} s; stopping")
                self.stop_requested = True
                return
        self.spawn("restart")
        self._write_state()

    def shutdown(self) -> None:
        if self.learning is not None:
            self.say("waiting for the learn cycle to finish before stopping")
            self.learning.join()
            self.learning = None
        self.state = "stopping"
        self.stop_worker("stopping")
        self.fold.lifecycle("stop")
        for c in self.stop_replies:
            try:
                c.sendall(protocol.encode(protocol.ok(None, stopped=True)))
            except OSError:
                pass
        self.say("stopped")


def _shown(t: dict) -> dict:
    """A recorded turn as an act reply shows it (for duplicates of requests already committed)."""
    try:
        kind = "refusal" if t.get("refusal") else ("call" if actlib.parse(t.get("action", "")) else "text")
    except BadInput:
        kind = "call"
    return {**{k: v for k, v in t.items() if k != "id"}, "kind": kind}


def _read_all(fd: int, timeout: float) -> str:
    out = b""
    deadline = time.monotonic() + timeout
    try:
        while time.monotonic() < deadline:
            r, _, _ = select.select([fd], [], [], max(0.0, deadline - time.monotonic()))
            if not r:
                break
            chunk = os.read(fd, 4096)
            if not chunk:
                break
            out += chunk
    finally:
        os.close(fd)
    return out.decode("utf-8", "replace")


def serve(store, options: ServeOptions = ServeOptions(), *, ready=None) -> None:
    """Run a keeper in this process until it is stopped. `ready(keeper)` is called once serving."""
    k = Keeper(store, options)
    try:
        k.start()
        if ready is not None:
            ready(k)
        k.loop()
    finally:
        if k.worker is not None:   # an exception on the way: never leave the image running
            k.worker.proc.kill()
            k.worker.proc.wait()
        k.close()


def main() -> int:
    """`python -m ledger.image`: the keeper as `ledger serve --detach` starts it (ledger.image.client
    .start_detached). It reads one JSON object on stdin, {"store": DIR, "options": ServeOptions},
    and logs a LedgerError that stops it as one JSON line (ERROR_JSON_TAG) before exiting with its code."""
    try:
        try:
            msg = json.loads(sys.stdin.buffer.read(1 << 20))
        except ValueError as e:
            raise BadInput(f"the keeper's options on stdin are not JSON: {e}", "start it with `ledger serve --detach`") from None
        if not isinstance(msg, dict) or not isinstance(msg.get("store"), str):
            raise BadInput("the keeper's options on stdin name no store", "start it with `ledger serve --detach`")
        serve(Store.open(msg["store"]), ServeOptions.from_json(msg.get("options") or {}))
    except LedgerError as e:
        _log(f"error: {e.message} (hint: {e.hint})")
        _log(ERROR_JSON_TAG + json.dumps(e.to_json(), sort_keys=True, default=str))  # read by start_detached
        return e.exit_code
    return 0
