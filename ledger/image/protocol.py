"""The image's wire protocol: newline-delimited JSON over Unix stream sockets in the store.

    <store>/run/image.sock     requests to the image (act, status, ping)
    <store>/run/control.sock   the keeper, `ledger serve` itself (status, stop, pause, resume)

Both sockets are created by the keeper, mode 0600 (owner only), and exist exactly while it
runs. The image process inherits `image.sock` already listening, so a connection made while the
image is paused by a learn cycle waits in the socket's backlog and is answered by the image that
starts on the new HEAD.

Framing: each message is one JSON object on one line (UTF-8, at most MAX_LINE bytes, "\\n"
terminated). A connection may carry many requests; replies come back in request order.

Requests (to image.sock):

    {"op": "act", "id": REQUEST_ID, "situation": TEXT,
     "action": TEXT?,          # given: execute and record this action instead of generating one
     "max_new": 1..48?,        # tokens the model may generate (default 48)
     "wait_recorded": BOOL?}   # reply only once the turn is in the journal (reply has turn_id)
    {"op": "status"}          {"op": "ping"}

REQUEST_ID is the client's idempotency key ([A-Za-z0-9][A-Za-z0-9._:-]{0,63}); a retry with the
same id never records a second turn: it gets the first reply again with "duplicate": true.

Replies:

    {"v": 1, "ok": true, "id": ID, "turn": {request, situation, action, outcome, refusal, kind,
     source, generation, gen, latency_ms, time, call}, "turn_id": "t42" | null,
     "duplicate": BOOL, "record_ms": FLOAT}
    {"v": 1, "ok": false, "id": ID, "error": {"type", "message", "hint", "exit_code"},
     "retry": BOOL}       # retry: true means "send the same request again" (same id)

A turn is durable in the image's buffer before any reply is sent; `turn_id` is the number the
journal gives it when the keeper commits the buffer (usually within a fraction of a second).

Control requests (to control.sock): {"op": "status" | "stop" | "pause" | "resume"}. A pause lasts
while the connection that asked for it stays open; closing it resumes the image (so a crashed
`ledger run` cannot leave the image stopped).
"""

from __future__ import annotations

import errno
import fcntl
import json
import os
import re
import socket
import stat
import time
import uuid
from pathlib import Path

from ledger.errors import BadInput, ImageUnavailable, LedgerError
from ledger.image.generate import MAX_NEW

VERSION = 1
MAX_LINE = 1 << 16
MAX_TEXT = 1 << 14
REQUEST_ID_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._:-]{0,63}$")
RUN_DIR = "run"
IMAGE_SOCK = "image.sock"
CONTROL_SOCK = "control.sock"
STATE_FILE = "image.json"
LOG_FILE = "image.log"
BUFFER_DIR = "image"          # the image's own writable folder under run/: its buffer (spool)
SUN_PATH_MAX = 107


def run_dir(store_root) -> Path:
    return Path(store_root) / RUN_DIR


def keeper_serving(store_root) -> str | None:
    """Why a store's loose object files must stay where they are now: a keeper holds
    run/keeper.lock (it serves, granting its image those files by path), else None."""
    path = run_dir(store_root) / "keeper.lock"
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)   # a FIFO never waits
    except FileNotFoundError:
        return None   # no keeper ever ran: none serves
    except OSError as e:
        return f"run/keeper.lock cannot be opened ({e.strerror}): loose files stay"
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return "run/keeper.lock is not a regular file (planted?): loose files stay"
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        return None
    except OSError:
        return "an image is serving this store (its keeper holds run/keeper.lock): loose files stay"
    finally:
        os.close(fd)   # drops a lock we took


def image_socket(store_root) -> Path:
    return run_dir(store_root) / IMAGE_SOCK


def control_socket(store_root) -> Path:
    return run_dir(store_root) / CONTROL_SOCK


def new_request_id() -> str:
    return "r-" + uuid.uuid4().hex[:24]


# --- framing ---------------------------------------------------------------------------------
def encode(msg: dict) -> bytes:
    return json.dumps(msg, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode() + b"\n"


def decode(line: bytes) -> dict:
    if len(line) > MAX_LINE:
        raise BadInput(f"message longer than {MAX_LINE} bytes")
    try:
        msg = json.loads(line)
    except (ValueError, UnicodeDecodeError) as e:
        raise BadInput(f"message is not JSON ({e})", "send one JSON object per line") from None
    if not isinstance(msg, dict):
        raise BadInput("message is not a JSON object", "send one JSON object per line")
    return msg


class LineReader:
    """Buffered reading of newline-terminated messages from a socket."""

    def __init__(self, sock: socket.socket):
        self.sock, self.buf = sock, bytearray()

    def feed(self, data: bytes) -> list[bytes]:
        self.buf += data
        lines = []
        while True:
            i = self.buf.find(b"\n")
            if i < 0:
                if len(self.buf) > MAX_LINE:
                    raise BadInput(f"message longer than {MAX_LINE} bytes")
                return lines
            lines.append(bytes(self.buf[:i]))
            del self.buf[:i + 1]

    def read_line(self) -> bytes | None:
        """The next line, or None at EOF (a partial line at EOF counts as EOF)."""
        while True:
            i = self.buf.find(b"\n")
            if i >= 0:
                line = bytes(self.buf[:i])
                del self.buf[:i + 1]
                return line
            data = self.sock.recv(65536)
            if not data:
                return None
            self.buf += data
            if len(self.buf) > MAX_LINE + 1:
                raise BadInput(f"message longer than {MAX_LINE} bytes")


# --- requests --------------------------------------------------------------------------------
def check_id(rid) -> str:
    if not isinstance(rid, str) or not REQUEST_ID_RE.match(rid):
        raise BadInput(f"bad request id {rid!r}", "ids are 1-64 characters of [A-Za-z0-9._:-], starting alphanumeric")
    return rid


def parse_act(msg: dict) -> dict:
    """A validated act request: {id, situation, action (or None), max_new, wait_recorded}."""

    known = {"op", "v", "id", "situation", "action", "max_new", "wait_recorded"}
    extra = set(msg) - known
    if extra:
        raise BadInput(f"unknown field(s) {', '.join(sorted(extra))} in an act request", f"fields are {', '.join(sorted(known))}")
    rid = check_id(msg.get("id"))
    sit = msg.get("situation")
    if not isinstance(sit, str) or not sit.strip() or len(sit) > MAX_TEXT:
        raise BadInput(f"situation must be a non-empty string of at most {MAX_TEXT} characters")
    action = msg.get("action")
    if action is not None and (not isinstance(action, str) or not action.strip() or len(action) > MAX_TEXT):
        raise BadInput(f"a given action must be a non-empty string of at most {MAX_TEXT} characters")
    max_new = msg.get("max_new", MAX_NEW)
    if isinstance(max_new, bool) or not isinstance(max_new, int) or not 1 <= max_new <= MAX_NEW:
        raise BadInput(f"max_new must be an integer from 1 to {MAX_NEW}")
    wait = msg.get("wait_recorded", False)
    if not isinstance(wait, bool):
        raise BadInput("wait_recorded must be true or false")
    return {"id": rid, "situation": sit, "action": action, "max_new": max_new, "wait_recorded": wait}


def ok(rid, **fields) -> dict:
    return {"v": VERSION, "ok": True, "id": rid, **fields}


def error(rid, e: LedgerError, retry: bool = False) -> dict:
    return {"v": VERSION, "ok": False, "id": rid, "retry": retry,
            "error": {"type": type(e).__name__, "message": e.message, "hint": e.hint, "exit_code": e.exit_code}}


def to_error(reply: dict) -> LedgerError:
    """The typed error a failed reply carries, read as LedgerError.from_json reads any error that
    crossed a process boundary (the wire names the class under "type")."""
    err = reply.get("error") if isinstance(reply.get("error"), dict) else {}
    return LedgerError.from_json({"error": err.get("type"), "message": err.get("message"), "hint": err.get("hint")},
                                 origin="the image")


# --- the client ------------------------------------------------------------------------------
_GONE = (ConnectionResetError, BrokenPipeError, ConnectionAbortedError)


class NoReply(ImageUnavailable):
    """Something listens on the socket but did not answer in time (busy, or paused by a cycle)."""


def _connect(path: Path, timeout: float) -> socket.socket:
    if len(str(path).encode()) > SUN_PATH_MAX:
        raise BadInput(f"socket path {path} is longer than the {SUN_PATH_MAX} bytes a Unix socket allows",
                       "use a store at a shorter path")
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.settimeout(max(timeout, 0.001))
    try:
        s.connect(str(path))
    except BaseException:
        s.close()
        raise
    return s


def request(path: Path, msg: dict, *, timeout: float = 60.0, retry: bool = True) -> dict:
    """Send one request and return its reply.

    No keeper listening (no socket, or a stale one): ImageUnavailable at once. The connection
    dropped before a reply (the image was stopped or killed mid-request), or the reply says
    "retry": the same request (same id) is sent again until `timeout` runs out -- safe because
    the image records a request id at most once."""
    deadline = time.monotonic() + timeout
    delay = 0.02
    what = "the image" if Path(path).name == IMAGE_SOCK else "the image's keeper"
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            raise NoReply(f"{what} did not answer within {timeout:g} s",
                                   "it may be paused by a learn cycle; retry with a longer --timeout "
                                   "(the same request id is safe to resend)")
        try:
            s = _connect(Path(path), left)
        except (FileNotFoundError, ConnectionRefusedError):
            raise ImageUnavailable(f"no image is serving {Path(path).parent.parent}") from None
        except socket.timeout:
            continue
        except OSError as e:
            if e.errno in (errno.EAGAIN, errno.ECONNREFUSED):
                time.sleep(delay)
                delay = min(delay * 2, 0.5)
                continue
            raise
        try:
            s.sendall(encode(msg))
            line = LineReader(s).read_line()
        except socket.timeout:
            continue
        except _GONE:
            line = None
        finally:
            s.close()
        if line is None:
            if not retry:
                raise ImageUnavailable(f"{what} closed the connection before replying")
            time.sleep(delay)
            delay = min(delay * 2, 0.5)
            continue
        reply = decode(line)
        if not reply.get("ok") and reply.get("retry") and retry:
            time.sleep(delay)
            delay = min(delay * 2, 0.5)
            continue
        return reply


def act(store_root, situation: str, *, action: str | None = None, request_id: str | None = None,
        max_new: int | None = None, wait_recorded: bool = False, timeout: float = 60.0) -> dict:
    """Ask the image serving `store_root` to act; returns the reply (raises the typed error)."""
    msg = {"op": "act", "id": request_id or new_request_id(), "situation": situation}
    if action is not None:
        msg["action"] = action
    if max_new is not None:
        msg["max_new"] = max_new
    if wait_recorded:
        msg["wait_recorded"] = True
    parse_act(msg)   # the image's own check, made before connecting: bad input is said as such, even with no image
    reply = request(image_socket(store_root), msg, timeout=timeout)
    if not reply.get("ok"):
        raise to_error(reply)
    return reply
