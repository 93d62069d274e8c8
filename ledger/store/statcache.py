"""The stat cache, cache/stat/ (docs/store-format.md rule 11): an entry named by the hash of a
file's stat line — its real path, device, inode, size, mtime and ctime — holds the id of the bytes
committed from it. Store's stat_key / stat_cache_get / stat_cache_put are built on these functions.

Kept light (no store modules beyond fsio and ids, no dataclasses): an unchanged `ledger add FILE`
is answered from here (`unchanged_file`, through ledger/api/_quick.py) before the store's other
modules load — an unchanged re-add is all start-up, and those imports were half of it.

git's "racy" rule: a file's stat says nothing about a rewrite within the same timestamp tick. An
entry is trusted only if every file it covers was last modified strictly before the entry itself
was written (both times from the filesystem's clock, `fs_stat`): such an entry is never written,
and one that reads as racy is ignored.
"""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

from ledger.errors import BadInput
from ledger.store import chunks, compress, fsio
from ledger.store.ids import PREFIX, hash_bytes, is_id
from ledger.store.paths import FORMATS, find_root

CONFIG_MAX = 64 << 10   # config is ~100 bytes: never read more


def fs_stat(path) -> os.stat_result:
    """stat(2), in one place: the stat cache's keys and its racy check read the same clock."""
    return os.stat(path)


def stat_line(path: Path) -> tuple[str, os.stat_result]:
    """What names a file's entry, and its stat; BadInput if it cannot be read."""
    try:
        st = fs_stat(path)
        real = path.resolve()
    except FileNotFoundError:
        raise BadInput(f"{path} vanished while it was being added", "retry when nothing is changing it") from None
    except OSError as e:
        raise BadInput(f"cannot read {path}: {e.strerror}", "check its permissions") from None
    return f"{real}\0{st.st_dev}\0{st.st_ino}\0{st.st_size}\0{st.st_mtime_ns}\0{st.st_ctime_ns}", st


def entry_path(root: Path, text: str) -> Path:
    """The entry file of a stat line (or of a folder's lines) in store `root` (the .ledger folder)."""
    return root / "cache" / "stat" / hash_bytes(text.encode("utf-8", "surrogateescape"))[len(PREFIX):][:32]


def has_object(path: Path) -> bool:
    """A regular file holds the object whose whole-file path is `path`: the file itself, its chunk
    index or its compressed form (not a link, directory or FIFO)."""
    for p in (path, path.with_name(path.name + chunks.SUFFIX), path.with_name(path.name + compress.SUFFIX)):
        try:
            if stat.S_ISREG(os.lstat(p).st_mode):
                return True
        except (FileNotFoundError, NotADirectoryError):
            pass
    return False


def lookup(root: Path, entry: Path, newest_ns: int) -> str | None:
    """The id an entry holds, if the entry is a regular file written strictly after `newest_ns`
    (the newest mtime/ctime of what it covers) and names an object the store holds."""
    try:
        fd, st = fsio.open_regular(entry)
    except (OSError, fsio.NotRegular):
        return None
    try:
        data = os.read(fd, 128)
    finally:
        os.close(fd)
    # the fstat of what was read, not a stat of the path: the entry may be removed or swapped for
    # a link meanwhile (a FileNotFoundError here was an internal error, exit 1)
    if newest_ns >= st.st_mtime_ns:
        return None  # racy: written within the tick of the file's last change
    oid = data.decode("ascii", "replace").strip()
    if not is_id(oid):
        return None
    h = oid[len(PREFIX):]
    return oid if has_object(root / "objects" / h[:2] / h[2:]) else None


def unchanged_file(path: Path, where: str | None) -> tuple[str, int] | None:
    """(id, size) when `path` is a regular file the store at `where` (find_root's rule) committed
    unchanged: what `add` of it would answer without hashing or recording (rule 11). None when
    that is not certain here — not a regular file, no entry, a racy or stale one, or a config this
    ledger must refuse — and the caller runs the whole add, which answers, or raises, as always."""
    try:
        if not stat.S_ISREG(os.lstat(path).st_mode):
            return None
    except OSError:
        return None
    root = find_root(where)
    try:
        fmt = json.loads(fsio.read_small(root / "config", CONFIG_MAX))["format"]
    except (OSError, ValueError, KeyError, TypeError, RecursionError, fsio.NotRegular):
        return None   # Store.open says why (UnsupportedFormat); a config nested 30,000 deep was exit 1
    if fmt not in FORMATS or isinstance(fmt, bool):
        return None
    text, st = stat_line(path)
    oid = lookup(root, entry_path(root, text), max(st.st_mtime_ns, st.st_ctime_ns))
    return (oid, st.st_size) if oid is not None else None
