"""The object store: immutable blobs named by the BLAKE3 hash of their bytes.

Layout: objects/<first 2 hex>/<remaining 62 hex>. Write once: an object is written to tmp/,
fsynced, made read-only, renamed into place and its directory fsynced. An existing object is
never rewritten. Every read re-checks the hash (BLAKE3 is cheap), so nothing corrupt is served.
"""

from __future__ import annotations

import errno
import mmap
import os
import stat
from pathlib import Path

import blake3

from ledger.errors import AmbiguousRef, BadInput, CorruptObject, MissingObject, UnknownRef
from ledger.store import canonical, faults, fsio
from ledger.store.ids import PREFIX, PREFIX_RE, hash_bytes, hex_of, is_id

CHUNK = 16 << 20  # 16 MiB: large enough for multi-threaded hashing, small enough for the 200 MiB budget
MMAP_MIN = 4 << 20


def hash_file(path: Path) -> str:
    """Rehash a file as fast as b3sum does: memory-mapped and multi-threaded for large files."""
    size = os.stat(path).st_size
    h = blake3.blake3(max_threads=blake3.blake3.AUTO)
    if size >= MMAP_MIN:
        h.update_mmap(path)
    else:
        with open(path, "rb") as f:
            h.update(f.read())
    return PREFIX + h.hexdigest()


def _hash_window(h, fd: int, off: int, n: int) -> None:
    """Feed bytes [off, off+n) of fd to the hasher through a memory map of just that window."""
    start = off - off % mmap.ALLOCATIONGRANULARITY  # maps must start on a granule boundary
    with mmap.mmap(fd, n + off - start, offset=start, access=mmap.ACCESS_READ) as m:
        with memoryview(m) as view:
            h.update(view[off - start:])


class ObjectStore:
    def __init__(self, root: Path):
        self.dir = root / "objects"
        self.tmp = root / "tmp"

    # --- naming -------------------------------------------------------------------------
    def path(self, oid: str) -> Path:
        if not is_id(oid):
            raise BadInput(f"not an object id: {oid!r}", "ids look like b3:<64 hex>")
        h = hex_of(oid)
        return self.dir / h[:2] / h[2:]

    def has(self, oid: str) -> bool:
        return self.path(oid).is_file()

    def size(self, oid: str) -> int:
        try:
            return self.path(oid).stat().st_size
        except FileNotFoundError:
            raise MissingObject(oid) from None

    def iter_ids(self):
        """Every object file present (for verify and gc only — state comes from the journal)."""
        if not self.dir.is_dir():
            return
        for sub in sorted(self.dir.iterdir()):
            if sub.is_dir() and len(sub.name) == 2:
                for f in sorted(sub.iterdir()):
                    yield PREFIX + sub.name + f.name, f

    def resolve_prefix(self, prefix: str) -> str:
        p = prefix[len(PREFIX):] if prefix.startswith(PREFIX) else prefix
        if not PREFIX_RE.match(p):
            raise UnknownRef(f"unknown name or id: {prefix!r}")
        sub = self.dir / p[:2]
        matches = [PREFIX + p[:2] + f.name for f in sub.iterdir() if f.name.startswith(p[2:])] if sub.is_dir() else []
        if not matches:
            raise UnknownRef(f"no object matches {prefix!r}")
        if len(matches) > 1:
            raise AmbiguousRef(f"{prefix!r} matches {len(matches)} objects: {', '.join(sorted(matches)[:3])}…")
        return matches[0]

    # --- reading (always verified) ------------------------------------------------------
    def get_bytes(self, oid: str) -> bytes:
        try:
            data = self.path(oid).read_bytes()
        except FileNotFoundError:
            raise MissingObject(oid) from None
        if hash_bytes(data) != oid:
            raise CorruptObject(oid)
        return data

    def get_json(self, oid: str):
        data = self.get_bytes(oid)
        try:
            return canonical.loads(data)
        except BadInput as e:
            raise BadInput(f"object {oid} is not a structured (JSON) object", "use `ledger cat` for blobs") from e

    def verify_file(self, oid: str) -> None:
        p = self.path(oid)
        if not p.is_file():
            raise MissingObject(oid)
        if hash_file(p) != oid:
            raise CorruptObject(oid)

    def export_file(self, oid: str, dest: Path) -> None:
        """Stream an object to `dest`, verifying while copying; dest appears only if it is good."""
        src = self.path(oid)
        dest = Path(dest)
        tmp = dest.with_name(f".{dest.name}.ledger-tmp-{os.getpid()}")
        h = blake3.blake3(max_threads=blake3.blake3.AUTO)
        try:
            with open(src, "rb") as fi, open(tmp, "wb") as fo:
                buf = bytearray(CHUNK)
                while n := fi.readinto(buf):
                    view = memoryview(buf)[:n]
                    h.update(view)
                    fo.write(view)
                fo.flush()
                os.fsync(fo.fileno())
            if PREFIX + h.hexdigest() != oid:
                raise CorruptObject(oid)
            os.replace(tmp, dest)
        except FileNotFoundError:
            raise MissingObject(oid) from None
        finally:
            if tmp.exists():
                tmp.unlink()

    # --- writing (lock holder only) -----------------------------------------------------
    def _install(self, tmp: Path, oid: str) -> bool:
        """Rename a complete, fsynced tmp file into place. Returns False if it already existed."""
        dest = self.path(oid)
        if dest.exists():
            tmp.unlink()
            return False
        os.chmod(tmp, stat.S_IRUSR | stat.S_IRGRP | stat.S_IROTH)
        new_dir = not dest.parent.is_dir()
        dest.parent.mkdir(parents=True, exist_ok=True)
        faults.point("object.before-rename")
        os.rename(tmp, dest)
        faults.point("object.after-rename")
        fsio.fsync_dir(dest.parent)
        if new_dir:
            fsio.fsync_dir(self.dir)
        return True

    def put_bytes(self, data: bytes) -> tuple[str, bool]:
        oid = hash_bytes(data)
        if self.has(oid):
            return oid, False
        tmp = fsio.tmp_path(self.tmp)
        try:
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
            try:
                fsio.write_all(fd, data, "writing an object")
                faults.point("object.before-fsync")
                os.fsync(fd)
            finally:
                os.close(fd)
            return oid, self._install(tmp, oid)
        except OSError as e:
            tmp.unlink(missing_ok=True)
            raise fsio.io_error(e, "writing an object") from e
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise

    def put_file(self, src: Path, progress=None) -> tuple[str, int, bool]:
        """Copy a file into the store, hashing while copying. Memory stays small.

        The copy is done by the kernel (copy_file_range, as `cp` does), so its cost is the
        disk's. A worker thread hashes each copied window of the *destination* straight from
        the page cache through a short-lived memory map (no extra copy; multi-threaded BLAKE3,
        GIL released), so the id is the hash of exactly the bytes stored. The destination is
        ours alone, so no one can truncate it under the map. A source that changes during the
        copy is refused.
        """
        src = Path(src)
        st0 = os.stat(src)
        tmp = fsio.tmp_path(self.tmp)
        h = blake3.blake3(max_threads=blake3.blake3.AUTO)
        try:
            fd = os.open(tmp, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o644)
            try:
                from concurrent.futures import ThreadPoolExecutor  # only large files need it (import: ~9 ms)

                with ThreadPoolExecutor(1) as pool:  # one worker: windows are hashed in order
                    pending = []
                    self._copy(src, fd, st0.st_size, progress,
                               on_window=lambda off, n: pending.append(pool.submit(_hash_window, h, fd, off, n)))
                    for f in pending:
                        f.result()
                faults.point("object.before-fsync")
                os.fsync(fd)
            finally:
                os.close(fd)
            st1 = os.stat(src)
            if (st0.st_size, st0.st_mtime_ns) != (st1.st_size, st1.st_mtime_ns) or os.stat(tmp).st_size != st0.st_size:
                raise BadInput(f"{src} changed while it was being added", "retry when nothing is writing to it")
            oid = PREFIX + h.hexdigest()
            return oid, st0.st_size, self._install(tmp, oid)
        except OSError as e:
            tmp.unlink(missing_ok=True)
            raise fsio.io_error(e, f"adding {src}") from e
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise

    @staticmethod
    def _copy(src: Path, fd_out: int, size: int, progress, on_window) -> None:
        step = 64 << 20
        with open(src, "rb", buffering=0) as fi:
            fd_in = fi.fileno()
            done = 0
            kernel = True
            while done < size:
                faults.io_check("copying a file into the store")
                if kernel:
                    try:
                        n = os.copy_file_range(fd_in, fd_out, min(step, size - done))
                    except OSError as e:
                        if e.errno not in (errno.EXDEV, errno.ENOSYS, errno.EOPNOTSUPP, errno.EINVAL) or done:
                            raise
                        kernel = False  # this filesystem pair can't copy in-kernel: plain reads and writes
                        continue
                else:
                    data = os.pread(fd_in, min(CHUNK, size - done), done)
                    n = len(data)
                    if n:
                        fsio.write_all(fd_out, data, "copying a file into the store")
                if n == 0:
                    break  # the file shrank: caught by the size check after the copy
                on_window(done, n)
                done += n
                if progress:
                    progress(n)

    def remove(self, oid: str) -> None:
        p = self.path(oid)
        p.unlink()


