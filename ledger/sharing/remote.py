"""Remotes: where shared objects live — a plain directory, or anything fsspec serves (S3, GCS,
Azure, SFTP, memory; HTTP(S) read-only).

Both backends sit behind one small protocol (`Backend`) and share one layout:

  LEDGER-REMOTE            {"format": "ledger-remote", "version": 1, "algorithm": "blake3"}
  objects/ab/cdef…         content-addressed objects, exactly as in a store
  refs/<name>              {"kind": "remote-ref", "target", "manifest", "signatures", ...}
  tmp/                     (directory remotes) partial uploads; harmless, never read

Every write is atomic. A directory remote stages objects in tmp/ and makes a batch of them
durable and visible together (durable.py: sync, rename, sync); small files (refs, manifests)
are written tmp → fsync → rename → fsync dir. S3 makes an object visible only when its PUT
(or multipart upload) completes. An object upload hashes exactly the bytes it sends and
commits only if they hash to the object's id, so a remote never names wrong bytes, and an
interrupted upload leaves nothing visible: a retry simply continues with what is missing.

Remotes are configured in the store as refs `remote:NAME` naming a small object
{"kind": "remote", "name", "url", "options"} — adding or removing one is a journal record.
Credentials are never stored: S3 reads them from the usual AWS environment/config.
"""

from __future__ import annotations

import os
import re
import stat
import threading
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterable, Protocol

import blake3

from ledger import records
from ledger.errors import BadInput, CorruptObject, RemoteError, StoreCorrupt, UnknownRef, UnsupportedFormat
from ledger.sharing import durable
from ledger.store import canonical, faults, fsio
from ledger.store.ids import PREFIX, hash_bytes, hex_of

MARKER = "LEDGER-REMOTE"
MARKER_BODY = {"format": "ledger-remote", "version": 1, "algorithm": "blake3"}
CHUNK = 8 << 20
NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")


def object_key(oid: str) -> str:
    """Where an object lives on a remote: objects/<2 hex>/<62 hex>."""
    h = hex_of(oid)
    return f"objects/{h[:2]}/{h[2:]}"


class Backend(Protocol):
    """What push and the sources need of a remote: small atomic files, staged objects, bounded reads."""

    url: str

    def read_small(self, key: str, limit: int) -> bytes | None: ...       # None if absent
    def write_small(self, key: str, data: bytes) -> None: ...             # atomic replace
    def exists(self, key: str) -> bool: ...
    def list(self, prefix: str) -> list[str]: ...                         # keys under prefix
    def has_objects(self, oids: Iterable[str]) -> set[str]: ...
    def put_object(self, oid: str, src: Path, on_bytes: Callable[[int], None]) -> None: ...  # staged
    def flush(self) -> None: ...                                          # staged → durable, visible
    def get_object(self, oid: str, dest, on_bytes: Callable[[int], None], *, expect: int | None = None,
                   limit: int = 0) -> str: ...  # -> hash of what arrived; bounded (check_size)
    def delete(self, key: str) -> None: ...


def check_size(url: str, oid: str, have: int, expect: int | None, limit: int) -> int:
    """How many bytes a download of `oid` may deliver, decided before the first byte moves:
    exactly the announced size (a different size at the remote is damage or hostility), or,
    when nothing announced one, at most `limit` (the receiving store's free space)."""
    if expect is not None:
        if have != expect:
            raise CorruptObject(oid, f"object {oid} on {url} has {have} bytes; {expect} were announced",
                                "the remote is damaged or hostile; nothing was written from it")
        return expect
    if have > limit:
        raise fsio.StorageIOError(f"object {oid} on {url} is {have} bytes; the store has room for {limit}",
                                  "free disk space; nothing was written")
    return have


def copy_capped(oid: str, url: str, read, cap: int, dest, on_bytes, h) -> None:
    """Copy from `read(n)` to `dest` until EOF, hashing; more than `cap` bytes is refused (the
    source grew while being read) after at most CHUNK bytes beyond the bound."""
    total = 0
    while chunk := read(min(CHUNK, cap - total + 1)):
        total += len(chunk)
        if total > cap:
            raise CorruptObject(oid, f"object {oid} on {url} grew beyond its {cap} bytes while being read",
                                "the remote is being written to or is hostile; nothing was written from it")
        h.update(chunk)
        dest.write(chunk)
        on_bytes(len(chunk))


def _not_regular(url: str, key: str, kind: str) -> StoreCorrupt:
    """A link or special file where the remote layout has a file: the remote is damaged (exit 4)."""
    hint = "the remote is damaged or hostile; ledger never follows links or reads special files there"
    if key.startswith("objects/"):
        oid = PREFIX + key[len("objects/"):].replace("/", "")
        return CorruptObject(oid, f"remote {url}: object {oid} is a {kind}, not a regular file", hint)
    return StoreCorrupt(f"remote {url}: {key} is a {kind}, not a regular file", hint)


def open_local(oid: str, src: Path) -> int:
    """A store object to upload, opened safely (fsio.open_regular): a special file is damage."""
    try:
        return fsio.open_regular(src)[0]
    except fsio.NotRegular as e:
        raise CorruptObject(oid, f"object {oid} in this store is a {e.kind}, not a regular file",
                            "`ledger repair --from REMOTE|BUNDLE` replaces it with a verified copy") from None


def _hash_mismatch(oid: str, got: str) -> CorruptObject:
    return CorruptObject(oid, f"object {oid} hashed to {got} in transit; nothing was written under its name",
                         "rerun; if it repeats, `ledger verify --read-data` the source")


# --- a directory (local disk or a shared filesystem) ------------------------------------
class DirBackend:
    """A remote in a directory (local disk or a shared filesystem)."""

    def __init__(self, root: Path):
        self.root = Path(root)
        self.url = str(self.root)
        self.tmp = self.root / "tmp"
        self._staged: list[tuple[Path, Path]] = []
        self._lock = threading.Lock()
        self._tmp_ready = False

    def _p(self, key: str) -> Path:
        return self.root / key

    def _wrap(self, e: OSError, what: str) -> RemoteError:
        return RemoteError(f"remote {self.url}: {what} failed: {e.strerror or e}")

    def _open(self, key: str) -> int:
        """Never follow a link or block on a FIFO in the remote (fsio.open_regular)."""
        try:
            return fsio.open_regular(self._p(key))[0]
        except fsio.NotRegular as e:
            raise _not_regular(self.url, key, e.kind) from None

    def read_small(self, key, limit):
        try:
            with open(self._open(key), "rb") as f:
                data = f.read(limit + 1)
        except FileNotFoundError:
            return None
        except OSError as e:
            raise self._wrap(e, f"reading {key}") from None
        if len(data) > limit:
            raise RemoteError(f"remote {self.url}: {key} is larger than {limit} bytes",
                              "the remote holds something that is not ledger's")
        return data

    def write_small(self, key, data):
        p = self._p(key)
        try:
            p.parent.mkdir(parents=True, exist_ok=True)
            self.tmp.mkdir(parents=True, exist_ok=True)
            fsio.atomic_write(p, data, self.tmp)
        except OSError as e:
            raise self._wrap(e, f"writing {key}") from None

    def exists(self, key):
        # lstat: a link is not a file of this remote (and is refused when read)
        try:
            return stat.S_ISREG(os.lstat(self._p(key)).st_mode)
        except FileNotFoundError:
            return False
        except OSError as e:
            raise self._wrap(e, f"checking {key}") from None

    def list(self, prefix):
        base = self._p(prefix)
        out = []
        for dirpath, _, names in os.walk(base):
            for f in names:
                out.append(Path(dirpath, f).relative_to(self.root).as_posix())
        return sorted(out)

    def has_objects(self, oids):
        # A stat per id: cheaper than listing a large remote when few ids are asked about.
        return {o for o in oids if self.exists(object_key(o))}

    def put_object(self, oid, src, on_bytes):
        """Copy into tmp/, hashing what is written; staged for the next flush() if it matches."""
        dest = self._p(object_key(oid))
        if self.exists(object_key(oid)):
            return
        tmp = None
        try:
            if not self._tmp_ready:
                self.tmp.mkdir(parents=True, exist_ok=True)
                self._tmp_ready = True
            tmp = fsio.tmp_path(self.tmp)
            h = blake3.blake3(max_threads=blake3.blake3.AUTO)
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
            try:
                with open(open_local(oid, src), "rb", buffering=0) as fi:
                    buf = bytearray(min(CHUNK, os.fstat(fi.fileno()).st_size + 1))  # small objects: small buffers
                    while n := fi.readinto(buf):
                        view = memoryview(buf)[:n]
                        h.update(view)
                        fsio.write_all(fd, view, "uploading an object")
                        on_bytes(n)
            finally:
                os.close(fd)
            got = PREFIX + h.hexdigest()
            if got != oid:
                raise _hash_mismatch(oid, got)
            with self._lock:
                self._staged.append((tmp, dest))
            tmp = None
            faults.point("remote.object-staged")
        except OSError as e:
            raise self._wrap(e, f"uploading {oid}") from None
        finally:
            if tmp is not None:
                tmp.unlink(missing_ok=True)

    def flush(self):
        with self._lock:
            staged, self._staged = self._staged, []
        try:
            durable.install(self.root, staged, "remote.batch-installed")
        except OSError as e:
            raise self._wrap(e, "making uploaded objects durable") from None

    def get_object(self, oid, dest, on_bytes, *, expect=None, limit=0):
        h = blake3.blake3(max_threads=blake3.blake3.AUTO)
        try:
            with open(self._open(object_key(oid)), "rb", buffering=0) as fi:
                cap = check_size(self.url, oid, os.fstat(fi.fileno()).st_size, expect, limit)
                copy_capped(oid, self.url, fi.read, cap, dest, on_bytes, h)
        except FileNotFoundError:
            raise
        except OSError as e:
            raise self._wrap(e, f"downloading {oid}") from None
        return PREFIX + h.hexdigest()

    def delete(self, key):
        try:
            self._p(key).unlink(missing_ok=True)
        except OSError as e:
            raise self._wrap(e, f"deleting {key}") from None


# --- S3-compatible object storage (s3fs / fsspec) ---------------------------------------
SMALL_PUT = 16 << 20   # below this an object is sent in one PUT (read, hashed, then sent)
LIST_WHOLE = 32        # has_objects: more fan-out folders than this to list -> list objects/ once


# --- remotes through fsspec ----------------------------------------------------------------
# Remotes on anything fsspec serves: S3, GCS, Azure, SFTP, memory — and HTTP(S), read-only.
#
# One backend for every fsspec filesystem, behind remote.py's `Backend` protocol. ledger's own
# checks sit on top: every object is hashed as it arrives and refused unless it hashes to its id,
# reads are bounded by the announced size, and a remote that is not ledger's (no LEDGER-REMOTE
# marker) is refused.
#
# How a write becomes visible depends on what the filesystem can promise, and the choice is made
# when the backend opens, from the protocol (never by trying one way and falling back):
#
#   transactional   s3, gs/gcs, az/abfs: an upload is staged (multipart, `autocommit=False`) and
#                   appears only when committed, after the bytes sent hashed to the id
#   rename          sftp, memory, file: written under tmp/ then moved into place (a rename)
#   read-only       http, https: pull, fetch and repair only; a push is refused before any byte moves
#
# Credentials are never stored in the store: options given to `ledger remote add --option k=v`
# are passed to the filesystem (endpoint_url, anon, host names); secrets come from each service's
# usual environment and configuration files.
TRANSACTIONAL = ("s3", "gs", "gcs", "az", "abfs")
RENAME = ("sftp", "memory", "file")
READ_ONLY = ("http", "https")
PROTOCOLS = TRANSACTIONAL + RENAME + READ_ONLY
PACKAGES = {"s3": "s3fs", "gs": "gcsfs", "gcs": "gcsfs", "az": "adlfs", "abfs": "adlfs", "sftp": "paramiko",
            "http": "aiohttp", "https": "aiohttp"}


def protocol_of(url: str) -> str | None:
    """The fsspec protocol of a remote URL, or None for a plain directory path."""
    if "://" not in url:
        return None
    return url.split("://", 1)[0].lower()


def check_url(url: str) -> str:
    """A remote URL as stored: scheme lower-cased, no trailing slash; unknown schemes refused."""
    proto = protocol_of(url)
    if proto not in PROTOCOLS:
        raise BadInput(f"unsupported remote URL {url!r}",
                       "use a directory path, file:///path, s3://, gs://, az://, sftp://, memory:// or "
                       "http(s):// (read-only)")
    rest = url.split("://", 1)[1].rstrip("/")
    if not rest:
        raise BadInput(f"remote URL {url!r} names no bucket, host or path", f"e.g. {proto}://NAME/PREFIX")
    return f"{proto}://{rest}"


class FsspecBackend:
    """A ledger remote on an fsspec filesystem (see the module docstring for the write modes)."""

    def __init__(self, url: str, options: dict | None = None):
        # fsspec and the protocol's package are imported here, when a remote is opened: they
        # cost 0.1-0.3 s that commands without a remote must not pay
        import fsspec

        self.url = check_url(url)
        self.protocol = protocol_of(self.url)
        rest = self.url.split("://", 1)[1]
        opts = dict(options or {})
        kw: dict = {}
        if self.protocol == "s3":
            # s3fs caches listings and instances; a remote must see what another process just wrote
            kw.update(skip_instance_cache=True, use_listings_cache=False)
            if "endpoint_url" in opts:
                kw["endpoint_url"] = opts.pop("endpoint_url")
            if opts:
                kw["client_kwargs"] = opts
            opts = {}
        if self.protocol == "sftp":
            kw["host"] = rest.partition("/")[0]
        kw.update(opts)
        try:
            self.fs = fsspec.filesystem(self.protocol, **kw)
        except ImportError:
            pkg = PACKAGES.get(self.protocol, "the fsspec backend")
            raise BadInput(f"{self.protocol}:// remotes need the `{pkg}` package", f"pip install {pkg}") from None
        except (TypeError, ValueError) as e:
            raise BadInput(f"remote {self.url}: bad options: {e}",
                           "check `ledger remote add --option` values") from None
        self.read_only = self.protocol in READ_ONLY
        self.transactional = self.protocol in TRANSACTIONAL
        # paths as the filesystem itself spells them (memory:// and sftp:// root them at "/";
        # HTTP paths are whole URLs), so that listings strip back to keys
        self.base = self.url if self.read_only else self.fs._strip_protocol(self.url).rstrip("/")
        self._listed: dict[str, set[str]] = {}   # has_objects: fan-out folder -> ids listed there
        self.list_calls = 0                       # listings has_objects made (tests count them)

    # --- plumbing --------------------------------------------------------------------------
    def _p(self, key: str) -> str:
        return f"{self.base}/{key}"

    def _call(self, what: str, fn, *a, **kw):
        try:
            return fn(*a, **kw)
        except FileNotFoundError:
            raise
        except (OSError, ValueError) as e:
            raise RemoteError(f"remote {self.url}: {what} failed: {e}") from None
        except Exception as e:  # the services' own errors: botocore, aiohttp, google, azure, paramiko
            if type(e).__module__.split(".")[0] in ("botocore", "aiobotocore", "aiohttp", "google", "azure",
                                                    "paramiko", "fsspec", "gcsfs", "adlfs", "s3fs"):
                raise RemoteError(f"remote {self.url}: {what} failed: {type(e).__name__}: {e}") from None
            raise

    def _writable(self, what: str) -> None:
        if self.read_only:
            raise RemoteError(f"remote {self.url} is read-only ({self.protocol}://): cannot {what}",
                              "push to an s3://, gs://, az://, sftp:// or directory remote; pull from this one")

    def _is_file(self, key: str) -> bool:
        info = self._call(f"checking {key}", self.fs.info, self._p(key))
        return info.get("type", "file") == "file"

    # --- the Backend protocol (ledger/sharing/remote.py) -----------------------------------
    def read_small(self, key, limit):
        def go():
            with self.fs.open(self._p(key), "rb") as f:
                return f.read(limit + 1)
        try:
            data = self._call(f"reading {key}", go)
        except FileNotFoundError:
            return None
        if len(data) > limit:
            raise RemoteError(f"remote {self.url}: {key} is larger than {limit} bytes",
                              "the remote holds something that is not ledger's")
        return data

    def write_small(self, key, data):
        self._writable(f"write {key}")
        if self.transactional:
            self._call(f"writing {key}", self.fs.pipe_file, self._p(key), data)
        else:
            self._renamed(key, lambda f: f.write(data))

    def exists(self, key):
        return self._call(f"checking {key}", self.fs.exists, self._p(key))

    def list(self, prefix):
        try:
            found = self._call(f"listing {prefix}", self.fs.find, self._p(prefix))
        except FileNotFoundError:
            return []
        strip = self.base.rstrip("/") + "/"
        return sorted(p[len(strip):] if p.startswith(strip) else p for p in found)

    def has_objects(self, oids):
        # Few ids: one existence check each. Many: listings, each made once per backend (one
        # push): a fan-out folder objects/ab/ the first time an id falls in it, or all of
        # objects/ at once when a call touches more than LIST_WHOLE folders not listed yet.
        # A chunked push asks 1000 ids a call (chunked.ASK): it used to list the whole prefix
        # on every call, i.e. the remote's every key once per 1000 chunks pushed.
        oids = list(oids)
        if len(oids) <= 64 or self.read_only:
            return {o for o in oids if self.exists(object_key(o))}
        todo = sorted({object_key(o)[:len("objects/ab/")] for o in oids} - self._listed.keys())
        if len(todo) > LIST_WHOLE:
            todo = ["objects/"]
            for k in (f"objects/{i:02x}/" for i in range(256)):
                self._listed.setdefault(k, set())
        for prefix in todo:
            for k in self.list(prefix):
                if k.startswith("objects/") and len(k) == len("objects/ab/") + 62:
                    self._listed.setdefault(k[:len("objects/ab/")], set()).add(PREFIX + k[8:10] + k[11:])
            self._listed.setdefault(prefix, set())
        self.list_calls += len(todo)
        return {o for o in oids if o in self._listed.get(object_key(o)[:len("objects/ab/")], ())}

    def _note_present(self, oid: str) -> None:
        """An upload of ours committed: a listing made before it still answers right."""
        fan = object_key(oid)[:len("objects/ab/")]
        if fan in self._listed:
            self._listed[fan].add(oid)

    def put_object(self, oid, src, on_bytes):
        self._writable(f"upload {oid}")
        key = object_key(oid)
        h = blake3.blake3(max_threads=blake3.blake3.AUTO)

        def stream(f):
            with open(open_local(oid, src), "rb") as fi:
                while chunk := fi.read(CHUNK):
                    h.update(chunk)
                    f.write(chunk)
                    on_bytes(len(chunk))
            got = PREFIX + h.hexdigest()
            if got != oid:
                raise _hash_mismatch(oid, got)

        if not self.transactional:
            self._renamed(key, stream)
            self._note_present(oid)
            return
        size = os.lstat(src).st_size
        if size <= SMALL_PUT:  # one PUT: read, hash, then send
            with open(open_local(oid, src), "rb") as fi:
                data = fi.read(size + 1)
            h.update(data)
            got = PREFIX + h.hexdigest()
            if got != oid:
                raise _hash_mismatch(oid, got)
            self._call(f"uploading {oid}", self.fs.pipe_file, self._p(key), data)
            on_bytes(size)
            self._note_present(oid)
            return

        def staged():
            # autocommit=False: the parts are uploaded but the object appears only at commit(),
            # which happens after the bytes sent hash to the id
            f = self.fs.open(self._p(key), "wb", autocommit=False, block_size=max(5 << 20, CHUNK))
            try:
                stream(f)
                f.close()
                f.commit()
            except BaseException:
                f.discard()
                raise
        self._call(f"uploading {oid}", staged)
        self._note_present(oid)

    def _renamed(self, key: str, write) -> None:
        """Write under tmp/ and move into place, so a reader sees the whole file or none."""
        tmp = self._p(f"tmp/{uuid.uuid4().hex}")

        def go():
            try:
                with self.fs.open(tmp, "wb") as f:
                    write(f)
                self.fs.mv(tmp, self._p(key))
            except BaseException:
                try:
                    self.fs.rm_file(tmp)
                except Exception:  # noqa: BLE001 - best effort: tmp/ is never read
                    pass
                raise
        self._call(f"writing {key}", go)

    def flush(self):
        pass  # every write above is complete and visible when it returns

    def get_object(self, oid, dest, on_bytes, *, expect=None, limit=0):
        key = object_key(oid)
        h = blake3.blake3(max_threads=blake3.blake3.AUTO)

        def go():
            if not self._is_file(key):
                raise RemoteError(f"remote {self.url}: {key} is not a file", "the remote is damaged or hostile")
            with self.fs.open(self._p(key), "rb", block_size=CHUNK) as f:
                size = getattr(f, "size", None)
                if size is None:
                    raise RemoteError(f"remote {self.url} does not say how large {oid} is",
                                      "a ledger remote must serve sizes (Content-Length for HTTP)")
                cap = check_size(self.url, oid, int(size), expect, limit)
                copy_capped(oid, self.url, f.read, cap, dest, on_bytes, h)
        self._call(f"downloading {oid}", go)
        return PREFIX + h.hexdigest()

    def delete(self, key):
        self._writable(f"delete {key}")
        try:
            self._call(f"deleting {key}", self.fs.rm_file, self._p(key))
        except FileNotFoundError:
            pass


# --- configuration and opening ----------------------------------------------------------
@dataclass(frozen=True)
class RemoteConfig:
    """A configured remote: the object behind the ref `remote:NAME`."""

    name: str
    url: str
    options: dict = field(default_factory=dict)

    def to_json(self) -> dict:
        return {"kind": "remote", "name": self.name, "url": self.url, "options": dict(sorted(self.options.items()))}

    @property
    def id(self) -> str:
        return hash_bytes(canonical.dumps(self.to_json()))


def normalise_url(url: str) -> str:
    """A remote URL as stored: an absolute directory path, or SCHEME://… for fsspec remotes."""
    proto = protocol_of(url)
    if proto is not None and proto != "file":
        return check_url(url)
    path = url[len("file://"):] if proto == "file" else url
    if not path:   # "" and file:// resolved to the current folder: say so instead of guessing
        raise BadInput(f"remote URL {url!r} names no path", "give the remote's folder, e.g. /mnt/share/ledger")
    p = Path(path).expanduser().resolve()
    if p.exists() and not p.is_dir():
        raise BadInput(f"remote path {p} is not a folder", "give a folder (new or existing) for the remote")
    return str(p)


def open_backend(url: str, options: dict | None = None) -> Backend:
    """The backend for a directory (or file://) path, or an fsspec URL (s3://, gs://, az://,
    sftp://, memory://, http(s):// read-only)."""
    proto = protocol_of(url)
    if proto is not None and proto != "file":
        return FsspecBackend(url, options)
    return DirBackend(Path(url[len("file://"):] if proto == "file" else url))


def check_marker(backend: Backend, create: bool) -> None:
    """Refuse a remote written by a ledger with another format or algorithm; on push, create
    the marker on an empty remote."""
    data = backend.read_small(MARKER, 4096)
    if data is None:
        if not create:
            raise UnknownRef(f"{backend.url} is not a ledger remote (no {MARKER})",
                             "push to it first, or check the URL")
        backend.write_small(MARKER, canonical.dumps(MARKER_BODY) + b"\n")
        return
    try:
        body = canonical.loads(data)
    except BadInput:
        raise UnsupportedFormat(f"{backend.url}/{MARKER} is unreadable") from None
    if not isinstance(body, dict) or body.get("format") != "ledger-remote":
        raise UnsupportedFormat(f"{backend.url} is not a ledger remote")
    if body.get("algorithm") != MARKER_BODY["algorithm"] or body.get("version") != MARKER_BODY["version"]:
        raise UnsupportedFormat(f"remote {backend.url} uses {body.get('algorithm')!r} v{body.get('version')!r}; "
                                f"this ledger knows blake3 v1", "use a ledger that understands that remote")


def check_name(name: str) -> str:
    """A remote name: letters, digits, . _ - (up to 64)."""
    if not isinstance(name, str) or not NAME_RE.match(name):
        raise BadInput(f"bad remote name {name!r}", "remote names use letters, digits, . _ - (up to 64)")
    return name


def add(store, name: str, url: str, options: dict | None = None) -> RemoteConfig:
    """Configure a remote (one `remote` record)."""
    check_name(name)
    if f"remote:{name}" in store.state.refs:
        raise BadInput(f"a remote named {name!r} already exists", f"`ledger remote remove {name}` first")
    cfg = RemoteConfig(name=name, url=normalise_url(url), options=dict(options or {}))
    with store.transaction("remote") as tx:
        oid = tx.put_json(cfg.to_json())
        tx.outputs.append(oid)
        tx.refs[f"remote:{name}"] = oid
        records.write(tx, records.Remote(remote={"name": name, "action": "add"}))
    return cfg


def remove(store, name: str) -> None:
    """Forget a remote (one `remote` record; the remote itself is untouched)."""
    if f"remote:{check_name(name)}" not in store.state.refs:
        raise UnknownRef(f"no remote named {name!r}", "see `ledger remote list`")
    with store.transaction("remote") as tx:
        tx.refs[f"remote:{name}"] = None
        records.write(tx, records.Remote(remote={"name": name, "action": "remove"}))


def configured(store) -> dict[str, RemoteConfig]:
    """The configured remotes, by name."""
    out = {}
    for ref, oid in sorted(store.state.refs.items()):
        if ref.startswith("remote:"):
            o = store.get_json(oid)
            out[ref[len("remote:"):]] = RemoteConfig(name=o["name"], url=o["url"], options=dict(o.get("options") or {}))
    return out


def get(store, name: str) -> RemoteConfig:
    """One configured remote (UnknownRef if there is none of that name)."""
    cfgs = configured(store)
    if name not in cfgs:
        raise UnknownRef(f"no remote named {name!r}", "see `ledger remote list`, or `ledger remote add NAME URL`")
    return cfgs[name]
