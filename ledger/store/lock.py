"""One writer at a time: a lock file created with O_EXCL holding pid, host, start time.

Readers never take it. A holder is *dead* only if it was on this host and its pid is gone (or
the pid now belongs to a younger process). A lock from another host can't be judged from
here, so `unlock` leaves it unless forced; a live holder's lock is never cleared.
"""

from __future__ import annotations

import json
import os
import socket
import time
from dataclasses import dataclass
from pathlib import Path

from ledger.errors import Locked
from ledger.store import fsio


def _proc_start(pid: int) -> str | None:
    """Kernel start time of a process (clock ticks since boot), to tell a reused pid apart."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            data = f.read()
        return data[data.rindex(b")") + 2:].split()[19].decode()
    except (OSError, ValueError, IndexError):
        return None


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


@dataclass(frozen=True)
class LockInfo:
    pid: int
    host: str
    time: float
    start: str | None
    raw: bytes

    @property
    def local(self) -> bool:
        return self.host == socket.gethostname()

    def status(self) -> str:
        """'live', 'dead' or 'foreign' (another host: unknown)."""
        if not self.local:
            return "foreign"
        if not _alive(self.pid):
            return "dead"
        if self.start is not None and _proc_start(self.pid) not in (None, self.start):
            return "dead"  # the pid was reused by another process
        return "live"

    def describe(self) -> str:
        age = time.time() - self.time
        return f"pid {self.pid} on {self.host}, {age:.0f}s ago"


class Lock:
    def __init__(self, root: Path):
        self.path = root / "lock"
        self.held = False
        self._raw = b""

    def read(self) -> LockInfo | None:
        try:
            raw = self.path.read_bytes()
        except FileNotFoundError:
            return None
        try:
            d = json.loads(raw)
            return LockInfo(int(d["pid"]), str(d["host"]), float(d["time"]), d.get("start"), raw)
        except (ValueError, KeyError, TypeError):
            # A half-written lock file (crash between create and write): its holder never
            # started a transaction. Treat it as dead.
            return LockInfo(-1, socket.gethostname(), 0.0, None, raw)

    def acquire(self, wait: float = 0.0) -> None:
        me = {"pid": os.getpid(), "host": socket.gethostname(), "time": time.time(), "start": _proc_start(os.getpid())}
        data = json.dumps(me).encode()
        deadline = time.monotonic() + wait
        delay = 0.005
        while True:
            try:
                fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
            except FileExistsError:
                if time.monotonic() >= deadline:
                    info = self.read()
                    who = info.describe() if info else "a process that just finished"
                    status = info.status() if info else "live"
                    hint = ("its holder is dead: run `ledger unlock`" if status == "dead"
                            else "another ledger process is writing; retry shortly (or pass --wait SECONDS)")
                    raise Locked(f"store is locked by {who}", hint) from None
                time.sleep(delay)
                delay = min(delay * 2, 0.1)
                continue
            try:
                fsio.write_all(fd, data, "writing the lock file")
            finally:
                os.close(fd)
            self.held = True
            self._raw = data
            return

    def release(self) -> None:
        if not self.held:
            return
        try:
            if self.path.read_bytes() == self._raw:
                self.path.unlink()
        except FileNotFoundError:
            pass
        self.held = False

    def break_if_dead(self, force_foreign: bool = False) -> tuple[bool, LockInfo | None]:
        info = self.read()
        if info is None:
            return False, None
        st = info.status()
        if st == "dead" or (st == "foreign" and force_foreign):
            # Remove only the exact lock we judged; a new holder's file is left alone.
            try:
                if self.path.read_bytes() == info.raw:
                    self.path.unlink()
                    return True, info
            except FileNotFoundError:
                return False, info
        return False, info
