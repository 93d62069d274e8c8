"""Durable file primitives: every write the store makes goes through here.

Why: the crash invariants in docs/store-format.md depend on the order
`write tmp -> fsync file -> rename -> fsync directory`, and fault injection needs one
place to hook writes.
"""

from __future__ import annotations

import errno
import os
import stat
from pathlib import Path

from ledger.errors import BadInput, LedgerError
from ledger.store import faults


class StorageIOError(LedgerError):
    """The disk failed a write (ENOSPC, EIO): typed, and the store was left consistent. Exit 6:
    the environment failed, not ledger (1 is kept for ledger's own bugs)."""
    exit_code = 6
    default_hint = "check free disk space and the filesystem; the store was left consistent"


def io_error(e: OSError, what: str) -> StorageIOError:
    """The typed error for an OSError met while doing `what`."""
    if e.errno == errno.ENOSPC:
        return StorageIOError(f"no space left on device while {what}",
                              "free disk space and retry; nothing was committed")
    return StorageIOError(f"I/O error while {what}: {e.strerror or e}")


NETWORK_FS = {"nfs", "nfs4", "cifs", "smb3", "smbfs", "9p", "fuse.sshfs", "afs", "ceph", "glusterfs", "lustre"}


def fs_type(path: Path) -> str | None:
    """The filesystem type /proc/mounts gives for the mount holding `path`."""
    try:
        best, fstype = "", None
        real = str(Path(path).resolve())
        with open("/proc/mounts") as f:
            for line in f:
                parts = line.split()
                under = real == parts[1] or real.startswith(parts[1].rstrip("/") + "/") if len(parts) >= 3 else False
                if under and len(parts[1]) > len(best):
                    best, fstype = parts[1], parts[2]
        return fstype
    except OSError:
        return None


class NotRegular(Exception):
    """What is at a path is not a regular file (callers turn this into their typed error)."""

    def __init__(self, path, kind: str):
        super().__init__(f"{path} is a {kind}, not a regular file")
        self.path, self.kind = path, kind


def file_kind(mode: int) -> str:
    """A file type in words (for messages), from an st_mode."""
    for test, name in ((stat.S_ISDIR, "directory"), (stat.S_ISFIFO, "FIFO"), (stat.S_ISLNK, "symbolic link"),
                       (stat.S_ISSOCK, "socket"), (stat.S_ISCHR, "character device"), (stat.S_ISBLK, "block device")):
        if test(mode):
            return name
    return "special file" if not stat.S_ISREG(mode) else "regular file"


def refuse_special_output(out) -> None:
    """An output the user names, written atomically (a temporary file renamed over it), must not
    be a FIFO or a device: the rename would replace the special file itself (as root,
    `ledger report -o /dev/null` replaced /dev/null with a regular file). A link is replaced as
    a name, like any file; a missing path is left to the write to report."""
    try:
        mode = os.lstat(out).st_mode
    except OSError:
        return
    if not (stat.S_ISREG(mode) or stat.S_ISLNK(mode) or stat.S_ISDIR(mode)):
        raise BadInput(f"{out} is a {file_kind(mode)}, not a regular file; it is never replaced",
                       "give the path of a new or regular file")


def open_regular(path) -> tuple[int, os.stat_result]:
    """Open a file for reading that may be hostile: never follow a link, never block (a FIFO
    opened with O_NONBLOCK returns at once), and accept only a regular file (fstat of what was
    opened, so nothing can be swapped in between). Raises NotRegular, FileNotFoundError or
    another OSError. The caller closes the fd and reads at most st_size bytes."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as e:
        if e.errno == errno.ELOOP:
            raise NotRegular(path, "symbolic link") from None
        if e.errno == errno.ENXIO:
            raise NotRegular(path, "socket") from None
        raise
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode):
        os.close(fd)
        raise NotRegular(path, file_kind(st.st_mode))
    return fd, st


def read_small(path, limit: int) -> bytes:
    """The bytes of a small store file (config, refs.json, a cache entry), opened safely and
    refused (NotRegular / ValueError) if it is not a regular file or is larger than `limit`."""
    fd, st = open_regular(path)
    try:
        if st.st_size > limit:
            raise ValueError(f"{path} is {st.st_size} bytes, more than the {limit} it can be")
        return read_bounded(fd, st.st_size)
    finally:
        os.close(fd)


def read_user_file(path, limit: int) -> bytes:
    """The bytes of a small file the user names (a spec, a targets file, a key): a link is
    followed (the user chose it), but a FIFO or device is refused, never waited on (opened
    O_NONBLOCK, then fstat), and a file over `limit` is refused unread. Raises NotRegular,
    ValueError (too large) or OSError."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise NotRegular(path, file_kind(st.st_mode))
        if st.st_size > limit:
            raise ValueError(f"{path} is {st.st_size} bytes, more than the {limit} it can be")
        return read_bounded(fd, st.st_size)
    finally:
        os.close(fd)


def read_bounded(fd: int, size: int) -> bytes:
    """Read exactly `size` bytes from fd (a regular file): fewer means it shrank under us."""
    parts, got = [], 0
    while got < size:
        b = os.pread(fd, min(size - got, 64 << 20), got)
        if not b:
            break
        parts.append(b)
        got += len(b)
    return b"".join(parts)


def read_bounded_at(fd: int, size: int, offset: int) -> bytes:
    """Read `size` bytes at `offset` (fewer if the file ends first: the caller checks)."""
    parts, got = [], 0
    while got < size:
        b = os.pread(fd, min(size - got, 64 << 20), offset + got)
        if not b:
            break
        parts.append(b)
        got += len(b)
    return parts[0] if len(parts) == 1 else b"".join(parts)


def write_all(fd: int, data, what: str = "write") -> None:
    """Write all of `data` to fd (through the fault-injection hook)."""
    faults.io_check(what)
    view = memoryview(data)
    while view:
        n = os.write(fd, view)
        view = view[n:]


def fsync_dir(path: Path) -> None:
    """fsync a directory, so a rename or create in it is durable."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def tmp_path(tmp_dir: Path) -> Path:
    """A fresh, unique name in the store's tmp/ directory."""
    return tmp_dir / f"{os.getpid()}-{os.urandom(8).hex()}"


def atomic_write(path: Path, data: bytes, tmp_dir: Path, *, durable: bool = True, mode: int = 0o644) -> None:
    """Write `data` to `path` so that readers see either the old or the new file, never half."""
    tmp = tmp_path(tmp_dir)
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, mode)
    try:
        try:
            write_all(fd, data, f"writing {path.name}")
            if durable:
                os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, path)
        if durable:
            fsync_dir(path.parent)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise


class Warmer:
    """Asks the kernel to read ahead the object files a whole-history pass is about to open, from
    a few threads, while those files come from the disk.

    Why: a pass over a year of history (verify --full, gc's first walk) opens one object file per
    record, and at ten million records their ~46 GB are never in the page cache. Cold, an object
    cost ~80 us here, nearly all of it waiting for the disk one read at a time; with the next
    objects' reads in flight, ~48-54 us (benchmarks/RESULTS.md, session 15). Warm, the same
    threads only contend for the GIL (two threads reading: 6.5 us an object against 4.75), so the
    caller turns them on only while its own reads are slow (`took`).

    A warm-up opens the object's name in its fan-out directory — a descriptor the warmer opened
    itself without following a link, so nothing outside objects/ is touched — without blocking,
    tells the kernel it will be needed (POSIX_FADV_WILLNEED starts the read and returns) and
    closes it. Nothing is read into Python and every failure is left to the caller's own open,
    which reports it: a pass says exactly what it says without the warmer."""

    SLOW = 30e-6      # seconds an object above which the caller's reads are taken to come from the disk
    THREADS = 8
    # (not O_NOATIME: open(2) refuses it with EPERM on a file the caller does not own, and every
    # warm-up of another user's store would fail without a word)
    _FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC

    def __init__(self, objects_dir):
        self.dir = os.fspath(objects_dir)
        self.on = False
        self._pool = None
        self._pending: list = []
        self._dirs: dict[str, int | None] = {}

    def _fan(self, fan: str) -> int | None:
        fd = self._dirs.get(fan, -1)
        if fd == -1:
            try:
                fd = os.open(f"{self.dir}/{fan}", os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
            except OSError:
                fd = None   # a link, a file or nothing in the directory's place: not warmed
            self._dirs[fan] = fd
        return fd

    def ahead(self, hexes) -> None:
        """Warm the objects named by these 64-hex digests, in order; the warm-ups of an earlier
        call not started yet are dropped (the caller has read those objects meanwhile)."""
        self.drop()
        if self._pool is None:
            from concurrent.futures import ThreadPoolExecutor  # ~9 ms, only for a pass reading from the disk

            self._pool = ThreadPoolExecutor(self.THREADS, thread_name_prefix="ledger-warm")
        items = [(self._fan(h[:2]), h[2:]) for h in hexes]
        self._pending = [self._pool.submit(_warm, d, n) for d, n in items if d is not None]

    def took(self, count: int, seconds: float) -> None:
        """The caller read `count` objects in `seconds`: warm-ups on while that is slow."""
        if count >= 32:
            self.on = seconds / count > self.SLOW

    def drop(self) -> None:
        for f in self._pending:
            f.cancel()
        self._pending = []

    def close(self) -> None:
        """Stop: nothing queued starts, every thread is joined, the directories are closed."""
        self.drop()
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)
            self._pool = None
        for fd in self._dirs.values():
            if fd is not None:
                os.close(fd)
        self._dirs = {}


def _warm(dir_fd: int, name: str) -> None:
    try:
        fd = os.open(name, Warmer._FLAGS, dir_fd=dir_fd)
    except OSError:
        return
    try:
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_WILLNEED)
    except OSError:
        pass   # not a regular file (a FIFO: ESPIPE): the caller's own open says what it is
    finally:
        os.close(fd)
