"""One writer at a time: a lock file created with O_EXCL, held with a kernel lock.

The holder creates `lock` with O_EXCL, takes an open-file-description lock (F_OFD_SETLK) on
it and keeps that descriptor open while it writes; the file records pid, host and start time
for messages only. Liveness is the kernel's answer, never a pid's: the OFD lock belongs to the
open file, not to a pid, so it is right across PID namespaces and containers sharing the
folder (their pids and host names mean nothing here), and the kernel drops it the moment the
holder dies, however it dies.

A lock file whose kernel lock is free has a dead holder (or a creator that has not locked it
yet, see below): a writer or `ledger unlock` clears it. Clearing and releasing happen only
while holding the file's kernel lock, and only after checking that the path still names the
locked inode, so no one can delete a lock another process holds. A creator checks the same
after locking: if a breaker removed its fresh file in between, it starts over.

On a network filesystem (allowed with LEDGER_ALLOW_NETFS=1) another host's kernel lock may
not be visible here, so a free lock written from another host is left unless
`unlock --force-other-host`.

Anything at the lock path that is not a regular file (a symlink, dangling or not, a
directory, a FIFO) is not a lock anyone holds: writers refuse with `Locked` and
`ledger unlock` removes it (never following a link).
"""

from __future__ import annotations

import errno
import fcntl
import json
import os
import stat
import struct
import time
from dataclasses import dataclass
from pathlib import Path

from ledger.errors import Locked
from ledger.store import fsio

_F_OFD_SETLK = getattr(fcntl, "F_OFD_SETLK", 37)   # Linux >= 3.15; the value is fixed in the ABI
_F_OFD_GETLK = getattr(fcntl, "F_OFD_GETLK", 36)
_MAX_READ = 4096  # a lock record is ~100 bytes; never read more from a file anyone can write


def _flock_struct(kind: int) -> bytes:
    # struct flock {short l_type; short l_whence; off_t l_start; off_t l_len; pid_t l_pid;}
    # l_pid must be 0 for OFD locks; l_len 0 = the whole file.
    return struct.pack("hhqqi4x", kind, os.SEEK_SET, 0, 0, 0)


def ofd_lock(fd: int, kind: int = fcntl.F_WRLCK) -> bool:
    """Take an OFD lock on fd without waiting (F_WRLCK needs a writable fd). False if a
    conflicting one is held."""
    try:
        fcntl.fcntl(fd, _F_OFD_SETLK, _flock_struct(kind))
        return True
    except OSError as e:
        if e.errno in (errno.EAGAIN, errno.EACCES):
            return False
        raise


def ofd_lock_wait(fd: int) -> None:
    """Take an exclusive OFD lock on fd, waiting for it (used for the journal's append)."""
    fcntl.fcntl(fd, getattr(fcntl, "F_OFD_SETLKW", 38), _flock_struct(fcntl.F_WRLCK))


def _proc_start(pid: int) -> str | None:
    """Kernel start time of a process (clock ticks since boot): informational only."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            data = f.read(_MAX_READ)
        return data[data.rindex(b")") + 2:].split()[19].decode()
    except (OSError, ValueError, IndexError):
        return None


@dataclass(frozen=True)
class LockInfo:
    """What is at the lock path, and whether a live process holds it (the kernel says)."""
    pid: int | None
    host: str | None
    time: float | None
    state: str        # 'live', 'dead', 'foreign' (another host on a network fs) or 'invalid'
    kind: str = "file"  # 'file', or what sits at the lock path instead: 'symlink', 'directory', 'special'

    def status(self) -> str:
        return self.state

    def describe(self) -> str:
        if self.kind != "file":
            return f"a {self.kind} at the lock path (not a lock)"
        who = f"pid {self.pid} on {self.host}" if self.pid is not None else "an unknown process"
        if self.time:
            who += f", {max(0.0, time.time() - self.time):.0f}s ago"
        return who


def _parse(raw: bytes) -> tuple[int | None, str | None, float | None]:
    try:
        d = json.loads(raw)
        pid, host, t = d.get("pid"), d.get("host"), d.get("time")
        return (pid if isinstance(pid, int) and not isinstance(pid, bool) and 0 < pid < 1 << 31 else None,
                host if isinstance(host, str) else None,
                float(t) if isinstance(t, (int, float)) and not isinstance(t, bool) else None)
    except (ValueError, TypeError, AttributeError, OverflowError, RecursionError):
        return None, None, None  # half-written or garbage: its content is informational anyway


class Lock:
    """The store's writer lock: an O_EXCL lock file held with an OFD lock (see the module docstring)."""
    def __init__(self, root: Path, network_fs: bool | None = None):
        self.path = root / "lock"
        self._network_fs = network_fs
        self.held = False
        self.broke = False
        self._fd: int | None = None

    # --- looking --------------------------------------------------------------------------
    def _open_existing(self, write: bool) -> tuple[int | None, str]:
        """Open what is at the lock path without following links or blocking.
        Returns (fd or None, kind) where kind is 'none', 'file', 'symlink', 'directory', 'special'."""
        try:
            mode = os.O_RDWR if write else os.O_RDONLY
            fd = os.open(self.path, mode | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
        except FileNotFoundError:
            return None, "none"
        except OSError as e:
            if e.errno == errno.ELOOP:
                return None, "symlink"
            if e.errno == errno.EISDIR:
                return None, "directory"
            if e.errno in (errno.EACCES, errno.EPERM):
                raise Locked(f"cannot open the lock file {self.path}: {e.strerror}",
                             "run ledger as the user that owns the store") from None
            if e.errno in (errno.ENXIO, errno.EOPNOTSUPP):
                return None, "special"
            raise
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            os.close(fd)
            return None, "special"
        return fd, "file"

    def _judge(self, fd: int) -> tuple[str, bytes]:
        """Is the lock open in fd held by someone? Takes the kernel lock if it is free (so
        the caller then holds it). Returns ('live'|'free', raw content). The lock is exclusive,
        so two breakers never both pass the same-file check before an unlink, and a creator
        that has not locked its fresh file yet then fails to, and starts over."""
        raw = os.pread(fd, _MAX_READ, 0)
        return ("free" if ofd_lock(fd) else "live"), raw

    def _same_file(self, fd: int) -> bool:
        try:
            a, b = os.fstat(fd), os.lstat(self.path)
        except FileNotFoundError:
            return False
        return (a.st_dev, a.st_ino) == (b.st_dev, b.st_ino)

    def read(self) -> LockInfo | None:
        """What holds the lock now (None: nothing). Never changes anything."""
        fd, kind = self._open_existing(write=False)
        if kind == "none":
            return None
        if fd is None:
            return LockInfo(None, None, None, "invalid", kind)
        try:
            raw = os.pread(fd, _MAX_READ, 0)
            # F_OFD_GETLK asks without taking: l_type comes back F_UNLCK if no one holds it.
            res = fcntl.fcntl(fd, _F_OFD_GETLK, _flock_struct(fcntl.F_RDLCK))
            held = struct.unpack("hhqqi4x", res)[0] != fcntl.F_UNLCK
        finally:
            os.close(fd)
        pid, host, t = _parse(raw)
        return LockInfo(pid, host, t, "live" if held else self._free_state(host))

    @property
    def network_fs(self) -> bool:
        if self._network_fs is None:  # read /proc/mounts only when another host's lock is judged
            self._network_fs = fsio.fs_type(self.path.parent) in fsio.NETWORK_FS
        return self._network_fs

    def _free_state(self, host: str | None) -> str:
        # On a local filesystem the kernel lock is the whole truth, whatever host name a
        # container wrote; only a network filesystem can hide another host's lock from us.
        if host is not None and host != os.uname().nodename and self.network_fs:
            return "foreign"
        return "dead"

    # --- taking and giving back ---------------------------------------------------------------
    def acquire(self, wait: float = 0.0) -> None:
        me = {"pid": os.getpid(), "host": os.uname().nodename, "time": time.time(), "start": _proc_start(os.getpid())}
        data = json.dumps(me).encode()
        deadline = time.monotonic() + wait
        delay = 0.005
        while True:
            try:
                fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
            except FileExistsError:
                cleared, info = self.break_if_dead()
                if cleared:
                    self.broke = True
                    continue
                if time.monotonic() >= deadline:
                    self._refuse(info)
                time.sleep(delay)
                delay = min(delay * 2, 0.1)
                continue
            except FileNotFoundError:
                raise Locked(f"the store directory {self.path.parent} is gone", "check the store path") from None
            # A breaker may have judged this fresh, not yet locked file free and removed it:
            # then our lock is on an unlinked inode, and we start over.
            if not ofd_lock(fd) or not self._same_file(fd):
                os.close(fd)
                continue
            try:
                fsio.write_all(fd, data, "writing the lock file")
            except OSError as e:
                self._drop(fd)
                raise fsio.io_error(e, "writing the lock file") from e
            self._fd = fd
            self.held = True
            return

    def _refuse(self, info: LockInfo | None):
        if info is None:
            raise Locked("store is locked by a process that just finished", "retry")
        if info.kind != "file":
            raise Locked(f"store is locked by {info.describe()}",
                         "nothing holds it: run `ledger unlock` to remove it") from None
        hint = ("its holder wrote from another host on a network filesystem: if it is dead, "
                "`ledger unlock --force-other-host`" if info.state == "foreign"
                else "another ledger process is writing; retry shortly (or pass --wait SECONDS)")
        raise Locked(f"store is locked by {info.describe()}", hint) from None

    def _drop(self, fd: int) -> None:
        """Remove the lock file we hold the kernel lock of (if the path still names it)."""
        try:
            if self._same_file(fd):
                self.path.unlink()
        except FileNotFoundError:
            pass
        finally:
            os.close(fd)

    def release(self) -> None:
        if not self.held or self._fd is None:
            return
        fd, self._fd, self.held = self._fd, None, False
        self._drop(fd)

    def break_if_dead(self, force_foreign: bool = False, clear_invalid: bool = False) -> tuple[bool, LockInfo | None]:
        """Clear the lock if no one holds it. A non-file at the lock path is cleared only with
        clear_invalid (`ledger unlock`): a writer must not guess what it is."""
        fd, kind = self._open_existing(write=True)
        if kind == "none":
            return False, None
        if fd is None:
            info = LockInfo(None, None, None, "invalid", kind)
            if not clear_invalid:
                return False, info
            try:
                if kind == "directory":
                    os.rmdir(self.path)  # only an empty one: anything inside is someone's data
                else:
                    os.unlink(self.path)  # removes a link itself, never its target
            except FileNotFoundError:
                return False, None
            except OSError as e:
                raise Locked(f"cannot remove the {kind} at {self.path}: {e.strerror}",
                             f"remove {self.path} by hand") from None
            return True, info
        try:
            state, raw = self._judge(fd)
        except BaseException:
            os.close(fd)
            raise
        pid, host, t = _parse(raw)
        if state == "live":
            os.close(fd)
            return False, LockInfo(pid, host, t, "live")
        free = self._free_state(host)
        info = LockInfo(pid, host, t, free)
        if free == "foreign" and not force_foreign:
            os.close(fd)  # also gives back the kernel lock we just took
            return False, info
        self._drop(fd)
        return True, info
