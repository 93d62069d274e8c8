"""The image process: `python -m ledger.image.worker CONFIG` (a JSON file the keeper wrote: its
options, and the numbers of the listening socket and the channel it inherits).

Started by the keeper (ledger.image.keeper) through the Landlock bootstrap, so by the time this
module runs it can read only what ledger.image.confine granted. It

  * serves the generation HEAD names: base + adapter in memory (ledger.image.generate), and
    that generation's capabilities with exactly their grants (ledger.image.act);
  * answers requests on the listening socket it inherits (protocol: ledger.image.protocol),
    one at a time, across any number of connections;
  * re-reads HEAD between requests by folding the journal records appended since it last
    looked (one fstat when nothing changed), so a rollback is served from the next request on;
  * makes every turn durable in its buffer (ledger.image.spool) before replying, and keeps the
    request ids of recent turns so a retry is answered, never recorded twice;
  * talks to the keeper over an inherited socketpair: "ready", "spooled N", "drained N" to it;
    "folded" (turn ids for buffer entries), "stop" from it.

It never writes the store: it cannot (see confine.py), and it does not need to.
"""

from __future__ import annotations

import collections
import ctypes
import json
import os
import selectors
import signal
import socket
import sys
import time
import traceback
from pathlib import Path

from ledger import generations
from ledger.capabilities import cache
from ledger.errors import InternalError, JournalCorrupt, LedgerError, Refused
from ledger.image import act as actlib
from ledger.image import protocol
from ledger.image.generate import Model
from ledger.image.spool import SpoolWriter
from ledger.store import Store
from ledger.store.journal import now
from ledger.store.state import State, fold

RESTART_EXIT = 75       # "serve me again on the new HEAD": needs objects outside this process's grants
RING_MAX = 4096
ROUND_MAX = 64          # requests served between two fdatasyncs at most
_PR_SET_PDEATHSIG = 1


def _die_with(parent: int) -> None:
    """SIGKILL this process when the keeper dies, so an image never outlives its keeper."""
    try:
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, ctypes.c_ulong(signal.SIGKILL), 0, 0, 0)
    except (OSError, AttributeError):
        pass
    if os.getppid() != parent:
        os._exit(1)


class _Conn:
    def __init__(self, sock: socket.socket):
        self.sock = sock
        self.reader = protocol.LineReader(sock)
        self.lines: collections.deque[bytes] = collections.deque()
        self.waiting = False          # a wait_recorded reply is pending: later requests wait for it


class Image:
    def __init__(self, cfg: dict, listen: socket.socket, channel: socket.socket):
        import torch


        torch.set_num_threads(int(cfg["threads"]))   # the keeper writes every option (ServeOptions)
        self.cfg = cfg
        self.t0 = time.monotonic()
        self.store = Store(Path(cfg["store"]))          # read-only use: objects and the journal
        self.state, self.offset = State.from_json(cfg["state"]), int(cfg["offset"])
        self.allowed = set(cfg["objects"])
        self.listen, self.channel = listen, channel
        self.buffer = Path(cfg["buffer"])
        self.spool = SpoolWriter(self.buffer, cfg["session"])
        self.ring: collections.OrderedDict[str, dict] = collections.OrderedDict(
            (rid, {"turn": t, "turn_id": tid}) for rid, t, tid in cfg.get("recent", []))
        self.n_rid: dict[int, str] = {}
        self.waiters: dict[int, list[tuple[_Conn, dict]]] = {}
        self.folded = 0
        self.durability = cfg["durability"]
        self.write_ms = 0.0
        self.stats = collections.Counter()
        self.stopping = False
        self.exit_code = 0
        head = self.state.refs.get("HEAD")
        self.gen = generations.from_manifest(head, self.store.get_json(head))
        adapters = sorted({g["adapter"] for g in cfg.get("generations", []) if g.get("adapter")})
        self.model = Model(self.store, self.gen.base, Path(cfg["scratch"]) / "model", adapters=adapters,
                           decoder=cfg["decoder"])
        self.model.use(self.gen.adapter)
        self._warm(cfg)

    def _warm(self, cfg: dict) -> None:
        """Pay the first-request costs now, before "ready": the decoder's first pass, and loading
        wasmtime and the compiled capabilities of the generation it serves first."""
        self.model.generate("warm up", 2)
        mods = sorted({e["module"] for e in self.gen.capabilities.values()})
        if mods:
            for m in mods:
                cache.load(self.store, m)

    # --- talking to the keeper ---------------------------------------------------------------
    def tell(self, **msg) -> None:
        self.channel.sendall(protocol.encode(msg))

    def on_keeper(self, msg: dict) -> None:
        op = msg.get("op")
        if op == "stop":
            self.stopping = True
        elif op == "folded" and msg.get("session") == self.cfg["session"]:
            lo, hi, first = int(msg["from"]), int(msg["upto"]), int(msg["first"])
            for n in range(lo, hi + 1):
                tid = f"t{first + n - lo}"
                rid = self.n_rid.pop(n, None)
                if rid in self.ring:
                    self.ring[rid]["turn_id"] = tid
                for conn, reply in self.waiters.pop(n, []):
                    reply["turn_id"] = tid
                    self.send(conn, reply)
                    conn.waiting = False
            self.folded = max(self.folded, hi)

    # --- HEAD -----------------------------------------------------------------------------------
    def head(self) -> str | None:
        """HEAD as the journal says now: fold only the records appended since the last look."""
        size = os.stat(self.store.journal.path).st_size
        if size != self.offset:
            scan = self.store.journal.scan(self.offset, self.state.seq + 1, self.state.head)
            if scan.broken_at is not None:
                raise JournalCorrupt(f"the journal is damaged at {scan.problem}; the image will not guess what is live")
            self.state, self.offset = fold(scan.records, self.state), scan.end
        return self.state.refs.get("HEAD")

    def follow_head(self) -> None:
        """Switch to HEAD's generation at this request boundary, or ask to be restarted."""
        head = self.head()
        if head == self.gen.id:
            return
        if head is None:
            raise Refused("HEAD names no generation any more")
        if head not in self.allowed:
            raise _Restart(f"HEAD moved to a generation committed after this image started ({head[:15]}…)")
        g = generations.from_manifest(head, self.store.get_json(head))
        if g.base is None:
            raise Refused(f"HEAD ({g.name}) names no base weights, so there is no model to serve",
                          "roll back to a generation with a base (`ledger gens`)")
        if g.base != self.model.base_id:
            raise _Restart(f"{g.name} is built on another base")
        self.model.use(g.adapter)
        self.gen = g
        self.stats["switches"] += 1

    # --- requests ------------------------------------------------------------------------------
    def handle(self, conn: _Conn, line: bytes) -> dict | None:
        rid = None
        try:
            msg = protocol.decode(line)
            rid = msg.get("id")
            op = msg.get("op")
            if op == "act":
                return self.act(conn, protocol.parse_act(msg))
            if op == "status":
                return protocol.ok(rid, **self.status())
            if op == "ping":
                return protocol.ok(rid, pong=True)
            if op == "probe" and self.cfg.get("probe"):
                return protocol.ok(rid, **_probe(msg.get("path"), bool(msg.get("write"))))
            raise protocol.BadInput(f"unknown op {op!r}", "ops: act, status, ping")
        except _Restart as e:
            self.stopping, self.exit_code = True, RESTART_EXIT
            print(f"[image] restarting: {e}", file=sys.stderr, flush=True)
            return protocol.error(rid, Refused(f"the image is restarting: {e}"), retry=True)
        except LedgerError as e:
            self.stats["errors"] += 1
            return protocol.error(rid, e)
        except Exception as e:  # noqa: BLE001 - one request failed; the image keeps serving
            traceback.print_exc(file=sys.stderr)
            self.stats["errors"] += 1
            return protocol.error(rid, InternalError(f"the image failed on this request: {type(e).__name__}: {e}"))

    def act(self, conn: _Conn, req: dict) -> dict | None:
        rid = req["id"]
        self.stats["requests"] += 1
        seen = self.ring.get(rid)
        if seen is not None:
            self.stats["duplicates"] += 1
            reply = protocol.ok(rid, turn=seen["turn"], turn_id=seen.get("turn_id"), duplicate=True)
            return self._maybe_wait(conn, reply, req, next((n for n, r in self.n_rid.items() if r == rid), None))
        t0 = time.perf_counter()
        self.follow_head()
        g = self.gen
        if req["action"] is None:
            action, nbytes = self.model.generate(req["situation"], req["max_new"])
            source = "model"
            if not action.strip():
                raise Refused(f"{g.name} generated an empty action ({nbytes} bytes); nothing was recorded",
                              "experience rows need an action; ask again, or give one (--action)")
        else:
            action, nbytes, source = req["action"], 0, "given"
        done = actlib.perform(self.store, g, action)
        latency = round((time.perf_counter() - t0) * 1e3, 3)
        turn = {"situation": req["situation"], "action": action, "outcome": done.outcome, "refusal": done.refusal,
                "time": now(), "generation": g.id, "latency_ms": latency, "request": rid, "source": source}
        meta = {"kind": done.kind, "error": done.error, "gen": g.n, "bytes": nbytes}
        if done.call is not None:
            meta["call"] = done.call
        _hold(self.cfg, "before-record", self.buffer)
        t1 = time.perf_counter()
        n = self.spool.append(turn, meta)
        self.write_ms += (time.perf_counter() - t1) * 1e3
        shown = {**turn, "kind": done.kind, "gen": g.n, "call": done.call}
        self.ring[rid] = {"turn": shown, "turn_id": None}
        while len(self.ring) > RING_MAX:
            self.ring.popitem(last=False)
        self.n_rid[n] = rid
        reply = protocol.ok(rid, turn=shown, turn_id=None, duplicate=False)
        return self._maybe_wait(conn, reply, req, n)

    def _maybe_wait(self, conn: _Conn, reply: dict, req: dict, n: int | None) -> dict | None:
        if req["wait_recorded"] and reply.get("turn_id") is None and n is not None and n > self.folded:
            self.waiters.setdefault(n, []).append((conn, reply))
            conn.waiting = True
            return None
        return reply

    def status(self) -> dict:
        return {"pid": os.getpid(), "generation": self.gen.id, "gen": self.gen.n, "decoder": self.model.decoder,
                "session": self.cfg["session"], "buffered": self.spool.n, "folded": self.folded,
                "durability": self.durability,
                "uptime_s": round(time.monotonic() - self.t0, 3), **{k: self.stats[k] for k in
                ("requests", "duplicates", "errors", "switches")}, "sandbox": self.cfg.get("sandbox")}

    # --- the loop --------------------------------------------------------------------------------
    def send(self, conn: _Conn, reply: dict) -> None:
        try:
            conn.sock.sendall(protocol.encode(reply))
        except OSError:
            pass   # the client went away; a retry (same id) gets the recorded turn

    def round(self, conns: dict) -> None:
        """Serve what is queued: one request at a time, in arrival order per connection, taking
        turns between connections; a stop is honoured between requests, so the one in flight is
        finished and recorded first. The turns of a round become durable with ONE fdatasync
        (group commit) before any of its replies is sent."""
        outbox: list[tuple[_Conn, dict]] = []
        self.write_ms = 0.0
        before = self.spool.n
        busy = True
        while busy and len(outbox) < ROUND_MAX and not self.stopping:
            busy = False
            for c in list(conns.values()):
                if c.lines and not c.waiting and not self.stopping:
                    busy = True
                    reply = self.handle(c, c.lines.popleft())
                    if reply is not None:
                        outbox.append((c, reply))
        if self.spool.n == before:
            for c, reply in outbox:
                self.send(c, reply)
            return
        t0 = time.perf_counter()
        try:
            if self.durability == "fsync":
                self.spool.sync()
        except LedgerError as e:
            # Not durable, so not acknowledged; the entries may still reach the journal, and a
            # retry (same id) then finds them.
            for n in range(before + 1, self.spool.n + 1):
                for c, reply in self.waiters.pop(n, []):
                    c.waiting = False
                    outbox.append((c, reply))
            for c, reply in outbox:
                fresh = reply.get("ok") and "turn" in reply and not reply.get("duplicate")
                self.send(c, protocol.error(reply.get("id"), e) if fresh else reply)
            return
        sync_ms = (time.perf_counter() - t0) * 1e3
        _hold(self.cfg, "after-record", self.buffer)
        self.tell(event="spooled", n=self.spool.n, urgent=bool(self.waiters))
        recorded = self.spool.n - before
        share = round((self.write_ms + sync_ms) / recorded, 3)
        self.stats["rounds"] += 1
        for c, reply in outbox:
            if reply.get("ok") and not reply.get("duplicate") and "turn" in reply:
                reply["record_ms"] = share
            self.send(c, reply)
        for waiting in self.waiters.values():
            for _, reply in waiting:
                reply.setdefault("record_ms", share)

    def run(self) -> int:
        sel = selectors.DefaultSelector()
        self.listen.setblocking(False)
        sel.register(self.listen, selectors.EVENT_READ, "listen")
        sel.register(self.channel, selectors.EVENT_READ, "keeper")
        keeper = protocol.LineReader(self.channel)
        conns: dict[socket.socket, _Conn] = {}
        self.tell(event="ready", generation=self.gen.id, gen=self.gen.n, decoder=self.model.decoder,
                  why=self.model.why, pid=os.getpid())
        drained = False
        while True:
            if self.stopping and not drained:
                drained = True
                sel.unregister(self.listen)
                self.tell(event="drained", upto=self.spool.n)
            if drained and (not self.waiters or self.folded >= self.spool.n):
                break
            for key, _ in sel.select(timeout=1.0):
                if key.data == "listen":
                    try:
                        s, _ = self.listen.accept()
                    except (BlockingIOError, InterruptedError):
                        continue
                    s.setblocking(True)
                    s.settimeout(30.0)
                    conns[s] = _Conn(s)
                    sel.register(s, selectors.EVENT_READ, "conn")
                elif key.data == "keeper":
                    data = self.channel.recv(1 << 20)
                    if not data:
                        return 1       # the keeper is gone: nothing may be served unrecorded
                    for line in keeper.feed(data):
                        self.on_keeper(protocol.decode(line))
                else:
                    c = conns[key.fileobj]
                    try:
                        data = c.sock.recv(65536)
                        lines = c.reader.feed(data) if data else None
                    except (OSError, LedgerError):
                        lines = None
                    if lines is None:
                        sel.unregister(c.sock)
                        del conns[c.sock]
                        c.sock.close()
                        continue
                    c.lines.extend(lines)
            self.round(conns)
        for c in conns.values():
            c.sock.close()
        self.spool.close()
        return self.exit_code


class _Restart(Exception):
    pass


def _probe(path, write=False) -> dict:
    """Debug op (only when the keeper was started with LEDGER_IMAGE_PROBE=1): can this process
    open `path` for reading (or, with write, for appending -- nothing is written)? The sandbox
    test uses it to show that the sealed suite and the store's own files are out of reach."""
    if not isinstance(path, str) or not path:
        raise protocol.BadInput("probe needs a path")
    try:
        with open(path, "ab" if write else "rb") as f:
            if not write:
                f.read(1)
        return {"opened": True, "errno": 0}
    except OSError as e:
        return {"opened": False, "errno": e.errno, "error": e.strerror}


def _hold(cfg: dict, point: str, buffer: Path) -> None:
    """Test hook (LEDGER_IMAGE_HOLD=before-record|after-record at keeper start): stop forever at
    `point`, with a marker file saying so, so a test can SIGKILL the server mid-request."""
    if cfg.get("hold") == point:
        (buffer / f"held-{point}").write_text(str(os.getpid()))
        while True:
            time.sleep(3600)


def main(argv=None) -> int:
    args = sys.argv[1:] if argv is None else list(argv)
    if len(args) != 1:
        sys.stderr.write("usage: python -m ledger.image.worker CONFIG (the keeper starts it)\n")
        return 2
    cfg = json.loads(Path(args[0]).read_bytes())
    _die_with(int(cfg["keeper_pid"]))
    signal.signal(signal.SIGINT, signal.SIG_IGN)    # the keeper decides when the image stops
    listen = socket.socket(fileno=int(cfg["listen_fd"]))
    channel = socket.socket(fileno=int(cfg["channel_fd"]))
    try:
        image = Image(cfg, listen, channel)
    except LedgerError as e:
        channel.sendall(protocol.encode({"event": "failed", "error": protocol.error(None, e)["error"]}))
        return 2
    return image.run()


if __name__ == "__main__":
    sys.exit(main())
