"""One writer at a time: a lock file created with O_EXCL holding pid, host, start time.

Readers never take it. A holder is *dead* only if it was on this host and its pid is gone (or
the pid now belongs to a younger process). A dead holder cannot be writing, so a writer that
finds one clears it (the crash invariants make whatever it left behind harmless) — that is
what lets `ledger run` restart cleanly after a SIGKILL. A lock from another host can't be
judged from here, so it is left unless `unlock --force-other-host`; a live holder's lock is
never cleared. Clearing happens under a short-lived `lock.break` file so two processes can't
both judge the same dead lock and one of them delete the other's fresh lock.
"""

from __future__ import annotations

import json
import os
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
        return self.host == os.uname().nodename

    def status(self) -> str:
        """'live', 'dead' or 'foreign' (another host: unknown)."""
        if not self.local:
            return "foreign"
        if self.pid <= 0 or not _alive(self.pid):
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
        self.broke = False
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
            # A half-written lock file: either its creator is between create and write (a
            # microsecond window) or it crashed there, before starting any transaction.
            # Give it a few seconds, then judge it dead.
            try:
                age = time.time() - self.path.stat().st_mtime
            except FileNotFoundError:
                return None
            return LockInfo(0 if age > 5 else os.getpid(), os.uname().nodename, 0.0, None, raw)

    def acquire(self, wait: float = 0.0) -> None:
        me = {"pid": os.getpid(), "host": os.uname().nodename, "time": time.time(), "start": _proc_start(os.getpid())}
        data = json.dumps(me).encode()
        deadline = time.monotonic() + wait
        delay = 0.005
        while True:
            try:
                fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
            except FileExistsError:
                cleared, _ = self.break_if_dead()
                if cleared:
                    self.broke = True
                    continue
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
            except OSError as e:
                os.close(fd)
                self.path.unlink(missing_ok=True)
                raise fsio.io_error(e, "writing the lock file") from e
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
        if not (st == "dead" or (st == "foreign" and force_foreign)):
            return False, info
        guard = self.path.with_name("lock.break")
        try:
            fd = os.open(guard, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        except FileExistsError:
            try:
                if time.time() - guard.stat().st_mtime > 10:  # a breaker died mid-break
                    guard.unlink()
            except FileNotFoundError:
                pass
            return False, info
        os.close(fd)
        try:
            # Re-read under the guard: remove only the exact lock we judged dead.
            if self.path.read_bytes() == info.raw:
                self.path.unlink()
                return True, info
            return False, info
        except FileNotFoundError:
            return False, info
        finally:
            guard.unlink(missing_ok=True)
