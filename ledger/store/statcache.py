"""The stat cache, cache/stat/ (docs/store-format.md rule 11): an entry named by the hash of the
store's id and a file's stat line — its real path, device, inode, size, mtime and ctime — holds
the id and size of the bytes committed from it. Store's stat_key / stat_cache_get /
stat_cache_put are built on these functions.

Kept light (no store modules beyond fsio and ids, no dataclasses): an unchanged `ledger add FILE`
is answered from here (`unchanged_file`, through ledger/api/_quick.py) before the store's other
modules load — an unchanged re-add is all start-up, and those imports were half of it.

git's "racy" rule: a file's stat says nothing about a rewrite within the same timestamp tick. An
entry is trusted only if every file it covers was last modified strictly before the entry itself
was written (both times from the filesystem's clock: the file's lstat, the entry's fstat): such
an entry is never written, and one that reads as racy is ignored.

An entry lets `add` skip both the hash and the record, so it is the one cache not checked against
the journal; what it may make `add` believe is bounded here (rule 11, H18S's holes): it is found
only under this store's id (another store's entries, copied in, are never looked up); it is
believed only for a file of the size it records, and, for a file, only if the object it names is
in the store at that size; the file's stat is lstat's (a link in the file's place is never
followed, so a file swapped for a link is not answered for the link's target); and cache/ and
cache/stat/ are opened without following links, so no entry is read from, or written to, a
folder outside the store.
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


def _not_regular(path, kind: str) -> BadInput:
    return BadInput(f"{path} is a {kind}, not a regular file",
                    "ledger stores regular files only; remove links and special files")


def stat_line(path: Path) -> tuple[str, os.stat_result]:
    """What names a file's entry, and its stat; BadInput if it cannot be read or is not a regular
    file. The stat is lstat's, never a link's target's: a file swapped for a link to a committed
    file after a caller's check must not be answered for that file (the full add reads the
    source with O_NOFOLLOW and checks this very stat against what it opened, objects.put_file)."""
    try:
        st = os.lstat(path)
        if not stat.S_ISREG(st.st_mode):
            raise _not_regular(path, fsio.file_kind(st.st_mode))
        real = path.resolve()
    except FileNotFoundError:
        raise BadInput(f"{path} vanished while it was being added", "retry when nothing is changing it") from None
    except OSError as e:
        raise BadInput(f"cannot read {path}: {e.strerror}", "check its permissions") from None
    return f"{real}\0{st.st_dev}\0{st.st_ino}\0{st.st_size}\0{st.st_mtime_ns}\0{st.st_ctime_ns}", st


def entry_path(root: Path, text: str, store_id: str | None) -> Path:
    """The entry file of a stat line (or of a folder's lines) in store `root` (the .ledger folder)
    whose config names it `store_id` (None: a store made before ids)."""
    key = f"{store_id or ''}\0{text}"
    return root / "cache" / "stat" / hash_bytes(key.encode("utf-8", "surrogateescape"))[len(PREFIX):][:32]


def entry_text(oid: str, size: int) -> bytes:
    """An entry's bytes: the id committed and the size it covers (a file's, or a folder's total)."""
    return f"{oid} {size}\n".encode("ascii")


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


def object_size(path: Path) -> int | None:
    """The size of the object whose whole-file path is `path`, as the store holds it: the file's,
    or what its chunk index's or compressed form's header declares; None if no regular file holds it
    (or its header is not one: the full add then stores it again)."""
    try:
        st = os.lstat(path)
        if stat.S_ISREG(st.st_mode):
            return st.st_size
    except (FileNotFoundError, NotADirectoryError):
        pass
    for suffix, head, magic in ((chunks.SUFFIX, chunks.HEAD, chunks.MAGIC), (compress.SUFFIX, compress.HEADER, compress.MAGIC)):
        try:
            fd, _ = fsio.open_regular(path.with_name(path.name + suffix))
        except (OSError, fsio.NotRegular):
            continue
        try:
            data = os.pread(fd, head.size, 0)
        except OSError:
            continue
        finally:
            os.close(fd)
        if len(data) == head.size and data[:len(magic)] == magic:
            return head.unpack_from(data)[1]
    return None


_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


def _open_folder(folder: Path, create: bool = False) -> int:
    """An fd of cache/stat/ (`folder`), it and cache/ opened without following a link: O_NOFOLLOW
    on the entry guards its last name only, and a link in place of either folder would read (and
    write) entries outside the store. OSError (ELOOP for a link) otherwise."""
    up = os.open(folder.parent, _DIR)
    try:
        if create:
            try:
                os.mkdir(folder.name, 0o755, dir_fd=up)
            except FileExistsError:
                pass
        return os.open(folder.name, _DIR, dir_fd=up)
    finally:
        os.close(up)


def lookup(root: Path, entry: Path, newest_ns: int, size: int, blob: bool = True) -> str | None:
    """The id an entry holds, if the entry is a regular file written strictly after `newest_ns`
    (the newest mtime/ctime of what it covers), records `size` (the bytes it covers) and names an
    object the store holds — for a file (`blob`), at that size."""
    try:
        folder = _open_folder(entry.parent)
    except OSError:
        return None
    try:
        fd = os.open(entry.name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=folder)
    except OSError:
        return None
    finally:
        os.close(folder)
    try:
        st = os.fstat(fd)
        data = os.read(fd, 128) if stat.S_ISREG(st.st_mode) else b""
    finally:
        os.close(fd)
    # the fstat of what was read, not a stat of the path: the entry may be removed or swapped for
    # a link meanwhile (a FileNotFoundError here was an internal error, exit 1)
    if not data or newest_ns >= st.st_mtime_ns:
        return None  # not an entry, or racy: written within the tick of the file's last change
    parts = data.decode("ascii", "replace").split()
    if len(parts) != 2 or not is_id(parts[0]) or not (parts[1].isascii() and parts[1].isdigit()) or int(parts[1]) != size:
        return None
    oid = parts[0]
    h = oid[len(PREFIX):]
    obj = root / "objects" / h[:2] / h[2:]
    # an entry naming another object than the file's is believed only where nothing cheap can tell:
    # a file's object must hold the file's size (a folder's tree is not read: its entry's size is)
    if blob:
        return oid if object_size(obj) == size else None
    return oid if has_object(obj) else None


def put(root: Path, tmp_dir: Path, entry: Path, newest_ns: int, oid: str, size: int) -> None:
    """Write an entry, after its commit (Store.commit): never a racy one, never through a linked
    cache/ or cache/stat/. A cache: an entry that cannot be written only costs a rehash."""
    tmp = None
    try:
        (root / "cache").mkdir(exist_ok=True)
        folder = _open_folder(entry.parent, create=True)
        try:
            tmp = fsio.tmp_path(tmp_dir)
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o644)
            try:
                fsio.write_all(fd, entry_text(oid, size), "writing the stat cache")
                written = os.fstat(fd).st_mtime_ns
            finally:
                os.close(fd)
            if newest_ns >= written:
                return  # racy: the next add re-hashes rather than trust this stat
            os.replace(tmp, entry.name, dst_dir_fd=folder)
            tmp = None
        finally:
            os.close(folder)
    except OSError:
        pass
    finally:
        if tmp is not None:
            try:
                os.unlink(tmp)
            except OSError:
                pass


def unchanged_file(path: Path, where: str | None) -> tuple[str, int] | None:
    """(id, size) when `path` is a regular file the store at `where` (find_root's rule) committed
    unchanged: what `add` of it would answer without hashing or recording (rule 11). None when
    that is not certain here — not a regular file, no entry, a racy or stale one, or a config this
    ledger must refuse — and the caller runs the whole add, which answers, or raises, as always."""
    try:
        text, st = stat_line(path)
    except BadInput:
        return None   # not a regular file, or gone: the whole add says so
    root = find_root(where)
    try:
        cfg = json.loads(fsio.read_small(root / "config", CONFIG_MAX))
        fmt = cfg["format"]
    except (OSError, ValueError, KeyError, TypeError, RecursionError, fsio.NotRegular):
        return None   # Store.open says why (UnsupportedFormat); a config nested 30,000 deep was exit 1
    if fmt not in FORMATS or isinstance(fmt, bool):
        return None
    sid = cfg.get("id")   # as Store.store_id reads it
    oid = lookup(root, entry_path(root, text, sid if isinstance(sid, str) else None), max(st.st_mtime_ns, st.st_ctime_ns),
                 st.st_size)
    return (oid, st.st_size) if oid is not None else None
