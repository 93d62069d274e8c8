"""Durable file primitives: every write the store makes goes through here.

Why: the crash invariants in docs/store-format.md depend on the order
`write tmp -> fsync file -> rename -> fsync directory`, and fault injection needs one
place to hook writes.
"""

from __future__ import annotations

import errno
import os
from pathlib import Path

from ledger.errors import LedgerError
from ledger.store import faults


class StorageIOError(LedgerError):
    exit_code = 1
    default_hint = "check free disk space and the filesystem; the store was left consistent"


def io_error(e: OSError, what: str) -> StorageIOError:
    if e.errno == errno.ENOSPC:
        return StorageIOError(f"no space left on device while {what}", "free disk space and retry; nothing was committed")
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
                if len(parts) >= 3 and (real == parts[1] or real.startswith(parts[1].rstrip("/") + "/")) and len(parts[1]) > len(best):
                    best, fstype = parts[1], parts[2]
        return fstype
    except OSError:
        return None


def write_all(fd: int, data, what: str = "write") -> None:
    faults.io_check(what)
    view = memoryview(data)
    while view:
        n = os.write(fd, view)
        view = view[n:]


def fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def tmp_path(tmp_dir: Path) -> Path:
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
