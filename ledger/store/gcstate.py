"""gc's reach state: the two closures gc computed (ledger/store/reach.py), saved with the journal
record they were folded to, so the next gc reads only the records after it (docs/store-format.md,
rule 22).

`cache/reach.bin` — one line of canonical JSON, then three arrays of little-endian uint64 keys:

    {"format":1, "store", "seq", "id", "offset", "state" (the fold there), "counts": [reach,
     not_kept, inputs], "unresolved": [ids], "special": [ids], "digest"}\\n <reach> <not_kept> <inputs>

`digest` is the BLAKE3 of the line without it and the arrays. `cache/reach.seal` is written
after it: {"store", "digest", "file": [dev, inode, size, mtime_ns, ctime_ns] of reach.bin}.
The state is used only if it is this store's, hashes to its digest, the seal names this very
file (any rewrite of reach.bin changes its ctime, which no process can set back: a state
rewritten by anything but gc — a forged "this object has no children" among it — is not
used), the journal's record ending at its offset is its record, and refs.json does not show
the journal changed other than by appends (rule 19). Otherwise gc says why and walks
everything: the answer of a full walk, never a silent fallback.
"""

from __future__ import annotations

import contextlib
import json
import os

import blake3
import numpy as np  # the key arrays (reach.py)

from ledger.errors import LedgerError
from ledger.store import canonical, fsio
from ledger.store.ids import PREFIX, is_id
from ledger.store.journal import stat_identity
from ledger.store.state import State

STATE = ("cache", "reach.bin")
SEAL = ("cache", "reach.seal")
FORMAT = 1
HEADER_MAX = 64 << 20
SEAL_MAX = 64 << 10


class Saved:
    """A usable saved state: where it was folded to, and its arrays."""

    def __init__(self, header: dict, state: State, reach, not_kept, inputs):
        self.header, self.state = header, state
        self.offset: int = header["offset"]
        self.reach, self.not_kept, self.inputs = reach, not_kept, inputs
        self.unresolved: list[str] = header["unresolved"]
        self.special: list[str] = header["special"]


def _digest(header: dict, arrays) -> str:
    """BLAKE3 of the header line without its digest, then the arrays (bytes or arrays, hashed
    in place: no copy of ten million keys is made to hash them)."""
    h = blake3.blake3()
    h.update(canonical.dumps({k: v for k, v in header.items() if k != "digest"}) + b"\n")
    for a in (arrays if isinstance(arrays, (list, tuple)) else (arrays,)):
        h.update(memoryview(a).cast("B") if isinstance(a, np.ndarray) else a)
    return PREFIX + h.hexdigest()


def _read(fd: int, size: int) -> tuple[bytes, np.ndarray]:
    """(the header line, the keys) of reach.bin: the keys read straight into their array, so
    loading costs 8 bytes a key once (a whole-file read and a copy would cost it twice)."""
    head = b""
    while b"\n" not in head and len(head) < min(size, HEADER_MAX):
        chunk = os.pread(fd, min(1 << 20, size - len(head)), len(head))
        if not chunk:
            break
        head += chunk
    nl = head.find(b"\n")
    if nl <= 0:
        raise ValueError("no header line")
    rest = size - nl - 1
    if rest % 8:
        raise ValueError("the arrays are not whole keys")
    keys = np.empty(rest // 8, dtype="<u8")
    view, got = memoryview(keys).cast("B"), 0
    while got < rest:
        n = os.preadv(fd, [view[got:]], nl + 1 + got)
        if n <= 0:
            raise ValueError("shorter than its size")
        got += n
    return head[:nl], keys


def load(store) -> tuple[Saved | None, str | None]:
    """The saved state and None, or None and why it cannot be used (None, None: there is none)."""
    path = store.root.joinpath(*STATE)
    try:
        seal = json.loads(fsio.read_small(store.root.joinpath(*SEAL), SEAL_MAX))
        fd, st = fsio.open_regular(path)
    except FileNotFoundError:
        return None, (None if not path.exists() else "its seal is missing")
    except (OSError, ValueError, RecursionError, fsio.NotRegular):   # a seal nested 3,000 deep was exit 1
        return None, "it is unreadable"
    try:
        if not isinstance(seal, dict) or seal.get("file") != stat_identity(st):
            return None, "it was rewritten since gc wrote it (its seal names another file)"
        line, keys = _read(fd, st.st_size)
    except (OSError, ValueError, MemoryError):   # a sparse 200 GiB of "keys" under a forged seal was exit 1
        return None, "it is unreadable"
    finally:
        os.close(fd)
    try:
        h = json.loads(line)
        if not isinstance(h, dict) or h.get("format") != FORMAT:
            raise ValueError("format")
        counts, offset, seq = h["counts"], h["offset"], h["seq"]
        if not (isinstance(counts, list) and len(counts) == 3 and all(type(c) is int and c >= 0 for c in counts)
                and type(offset) is int and type(seq) is int and offset >= 0
                and isinstance(h["unresolved"], list) and all(is_id(x) for x in h["unresolved"])
                and isinstance(h["special"], list) and all(is_id(x) for x in h["special"])):
            raise ValueError("fields")
        st0 = State.from_cache(h["state"])
    except (ValueError, KeyError, TypeError, AttributeError, RecursionError):
        return None, "it is unreadable"
    if h.get("store") != store.store_id or seal.get("store") != store.store_id:
        return None, "it belongs to another store"
    if len(keys) != sum(counts) or _digest(h, keys) != h.get("digest") or seal.get("digest") != h["digest"] \
            or (st0.seq, st0.head) != (seq, h.get("id")):
        return None, "it does not match its digest"
    why = position_problem(store, offset, seq, h["id"])
    if why:
        return None, why
    a, b = counts[0], counts[0] + counts[1]
    return Saved(h, st0, keys[:a], keys[a:b], keys[b:]), None


def position_problem(store, offset: int, seq: int, rid: str | None) -> str | None:
    """Why a cache folded to record `seq` (id `rid`) ending at byte `offset` no longer describes
    the journal's first records, or None: the journal must still hold that record there, and
    refs.json must not show the file changed other than by appends (rule 19) — the conditions
    of the verify watermark (rule 20), shared by gc's and the report's saved states."""
    if offset:
        rec = store.journal.record_before(offset)
        if rec is None or rec["id"] != rid or rec["seq"] != seq:
            return f"the journal no longer holds its record {seq} at byte {offset}"
    elif seq:
        return f"the journal no longer holds its record {seq} at byte {offset}"
    # refs.json at the journal's end, yet the file is not the one its last writer left: bytes
    # were changed in place (rule 19), so the records before the state are not known to be the
    # ones it was folded from.
    c = store._load_cache()
    ident = store.journal.identity()
    if c and ident is not None and c.get("journal") and c["offset"] == ident[2] and not store._cache_vouches(c, ident):
        return "the journal file changed since its last commit, not by an append"
    return None


def save(store, st: State, offset: int, reach, not_kept, inputs, unresolved, special) -> str | None:
    """Write the state (whole or not at all: a temporary file renamed into place), then its seal.
    The arrays are written from memory as they are (no joined copy). Returns why it could not,
    or None."""
    arrays = [np.ascontiguousarray(a, dtype="<u8") for a in (reach, not_kept, inputs)]
    h = {"format": FORMAT, "store": store.store_id, "seq": st.seq, "id": st.head, "offset": offset,
         "state": st.to_json(), "counts": [len(a) for a in arrays],
         "unresolved": sorted(unresolved), "special": sorted(special)}
    h["digest"] = _digest(h, arrays)
    path, seal = store.root.joinpath(*STATE), store.root.joinpath(*SEAL)
    tmp = None
    try:
        path.parent.mkdir(exist_ok=True)
        seal.unlink(missing_ok=True)   # a seal never names a file it was not written for
        tmp = fsio.tmp_path(store.tmp)
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o644)
        try:
            fsio.write_all(fd, canonical.dumps(h) + b"\n", "writing gc's reach state")
            for a in arrays:
                fsio.write_all(fd, memoryview(a).cast("B"), "writing gc's reach state")
        finally:
            os.close(fd)
        os.replace(tmp, path)
        tmp = None
        ident = stat_identity(os.lstat(path))
        fsio.atomic_write(seal, canonical.dumps({"store": store.store_id, "digest": h["digest"], "file": ident}),
                          store.tmp, durable=False)
    except OSError as e:
        return e.strerror or str(e)
    except LedgerError as e:   # fsio's typed I/O error (ENOSPC, EIO) while writing
        return e.message
    finally:
        if tmp is not None:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
    return None
