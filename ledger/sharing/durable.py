"""Batched durability for many objects at once (the way git's `fsyncMethod=batch` works).

Making each object durable on its own costs an fsync of the file and of its directory —
on ext4 one journal commit each, a few milliseconds — which dominates a transfer of many
small objects. A batch instead:

  1. writes every object to a temporary file (verified by hash, not yet fsynced),
  2. syncfs() once: all those bytes are durable,
  3. renames each into its content-addressed name,
  4. syncfs() once more: the names are durable,

and only then may anything that names the objects (a remote manifest or ref, a journal
record) be written. A crash before 4 leaves only complete objects under their names (the
data was durable before any rename) plus temporary files nobody reads; so the ordering
rules of the store (docs/store-format.md: objects before the record) still hold, at two
syncs per batch instead of two per object.
"""

from __future__ import annotations

import ctypes
import os
import stat
from pathlib import Path

from ledger.store import faults

_libc = None


def syncfs(path: Path) -> None:
    """Flush every dirty page of the filesystem holding `path` (Linux syncfs(2));
    elsewhere os.sync(), which is a superset."""
    global _libc
    if _libc is None:
        try:
            _libc = ctypes.CDLL(None, use_errno=True)
            _libc.syncfs  # noqa: B018 - probe: AttributeError where there is none
        except (OSError, AttributeError):
            _libc = False
    faults.io_check("syncing the filesystem")
    if not _libc:
        os.sync()
        return
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        if _libc.syncfs(fd) != 0:
            e = ctypes.get_errno()
            raise OSError(e, os.strerror(e))
    finally:
        os.close(fd)


def install(root: Path, staged: list[tuple[Path, Path]], point: str) -> int:
    """Make staged (tmp, dest) pairs durable and visible: sync, rename, sync.
    Existing destinations win (content-addressed: same bytes). Returns how many were new."""
    if not staged:
        return 0
    syncfs(root)
    new = 0
    made: set[Path] = set()
    for tmp, dest in staged:
        if dest.exists():
            tmp.unlink(missing_ok=True)
            continue
        os.chmod(tmp, stat.S_IRUSR | stat.S_IRGRP | stat.S_IROTH)
        if dest.parent not in made:
            dest.parent.mkdir(parents=True, exist_ok=True)
            made.add(dest.parent)
        os.rename(tmp, dest)
        new += 1
    syncfs(root)
    faults.point(point)
    return new
