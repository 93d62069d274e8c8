"""The image as other processes see it: its keeper's status, stop, the learn cycle's pause
hook, and starting a detached keeper (docs/image.md).

    status(root) / stop(root)        a control request to the keeper serving the store
    paused(store)                    `with paused(store): run_cycle(...)` -- the image finishes the
                                     request in flight, its turns are committed, and it serves HEAD
                                     again after the block
    start_detached(root, options)    `ledger serve --detach`
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from contextlib import contextmanager
from pathlib import Path

from ledger.errors import ImageUnavailable, InternalError, LedgerError, Locked
from ledger.image import protocol
from ledger.options import ServeOptions

READY_TIMEOUT = 600.0      # loading a large base can take a while
ERROR_JSON_TAG = "error-json: "  # the log line that carries a failed keeper's LedgerError.to_json()
_LOG_TAIL_BYTES = 1 << 20


def control(store_root, op: str, *, timeout: float = 30.0) -> dict:
    reply = protocol.request(protocol.control_socket(store_root), {"op": op}, timeout=timeout, retry=False)
    if not reply.get("ok"):
        raise protocol.to_error(reply)
    return reply


def status(store_root, timeout: float = 10.0) -> dict:
    """The keeper's status; {"running": false} when none listens; {"running": true, "state":
    "busy"} when one listens but is in the middle of starting or stopping an image."""
    try:
        return control(store_root, "status", timeout=timeout)
    except protocol.NoReply:
        try:
            known = json.loads((protocol.run_dir(store_root) / protocol.STATE_FILE).read_text())
        except (OSError, ValueError):
            known = {}
        return {"running": True, "state": "busy", "pid": known.get("pid")}
    except ImageUnavailable:
        return {"running": False}


def stop(store_root, timeout: float = 300.0) -> dict:
    return control(store_root, "stop", timeout=timeout)


@contextmanager
def paused(store, *, timeout: float = 3600.0):
    """Stop the image serving `store` (if any) for the duration of the block -- it finishes the
    request in flight and its turns are committed -- and start it again on HEAD afterwards.

    The pause lasts while this process holds its control connection open: if it dies, the
    keeper resumes by itself. Yields the keeper's pause reply, or None when no image runs."""
    path = protocol.control_socket(store.root)
    try:
        sock = protocol._connect(path, timeout)
    except (FileNotFoundError, ConnectionRefusedError):
        yield None
        return
    reader = protocol.LineReader(sock)

    def call(op: str) -> dict:
        sock.sendall(protocol.encode({"op": op}))
        line = reader.read_line()
        if line is None:
            raise ImageUnavailable("the image's keeper went away during the learn cycle")
        reply = protocol.decode(line)
        if not reply.get("ok"):
            raise protocol.to_error(reply)
        return reply

    try:
        info = call("pause")
        try:
            yield info
        finally:
            try:
                call("resume")
            except (LedgerError, OSError) as e:
                msg = getattr(e, "message", None) or str(e)
                store.warnings.append(f"the image could not be resumed after the cycle: {msg}; "
                                      "see `ledger image status`")
    finally:
        sock.close()


def start_detached(store_root, options: ServeOptions = ServeOptions(), *, timeout: float = READY_TIMEOUT,
                   env=None) -> dict:
    """Start a keeper (`python -m ledger.image`) in its own session, logging to run/image.log, and
    return its status once it serves (or raise the keeper's error). The keeper reads its options
    as one JSON object on stdin ({"store": ..., "options": ServeOptions.to_json()})."""
    root = Path(store_root)
    run = protocol.run_dir(root)
    st = status(root)
    if st.get("running"):
        raise Locked(f"an image is already serving this store (keeper pid {st.get('pid')})",
                     "see `ledger image status`; stop it with `ledger image stop`")
    run.mkdir(exist_ok=True)
    log = open(run / protocol.LOG_FILE, "ab")
    start = log.tell()
    try:
        proc = subprocess.Popen([sys.executable, "-m", "ledger.image"], stdin=subprocess.PIPE, stdout=log, stderr=log,
                                start_new_session=True, cwd=str(root.parent), env=env)
    finally:
        log.close()
    with proc.stdin:
        proc.stdin.write(json.dumps({"store": str(root), "options": options.to_json()}).encode())
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        code = proc.poll()
        if code is not None:
            with open(run / protocol.LOG_FILE, "rb") as f:
                end = f.seek(0, os.SEEK_END)
                f.seek(max(start, end - _LOG_TAIL_BYTES))  # the error line is last: read a bounded tail
                said = f.read(_LOG_TAIL_BYTES).decode("utf-8", "replace").strip().splitlines()
            # the keeper logs a LedgerError as one JSON line (ERROR_JSON_TAG) before exiting with its code
            last = next((line for line in reversed(said) if ERROR_JSON_TAG in line), None)
            if last is None:
                raise InternalError(f"`ledger serve` exited with {code} before serving",
                                    f"see {run / protocol.LOG_FILE}")
            raise LedgerError.from_json(last.partition(ERROR_JSON_TAG)[2].encode(), origin="`ledger serve`")
        st = status(root)
        if st.get("running") and st.get("state") == "serving" and st.get("pid") == proc.pid:
            return st
        time.sleep(0.1)
    raise InternalError(f"`ledger serve` did not start serving within {timeout:g} s",
                        f"see {run / protocol.LOG_FILE}")
