"""The image's buffer: turns made durable one by one, before they reach the journal in batches.

Why a buffer of its own: a store transaction (objects, journal append, refs cache, DuckDB index)
costs tens to hundreds of milliseconds, most of it the index; a reply cannot wait for one per
turn. The image appends each turn here and fsyncs it -- that is the point where the turn exists
and a reply may be sent -- and the keeper commits what has accumulated as ONE `record`
transaction (group commit), whose payload carries the buffer cursor (session, last entry). So:

  * a turn is in the journal exactly once: the cursor commits with the turns it covers, and a
    keeper that restarts folds only entries after the committed cursor;
  * a turn acknowledged to a client is never lost: it was fsynced here before the reply;
  * a crash mid-append leaves at most one incomplete last line, which was never acknowledged
    and is dropped (the client's retry, same request id, records it then).

Layout: <store>/run/image/spool-<session>-<part>.jsonl; a session is one run of the image
process; a part rolls over at PART_BYTES. Each line is `<32 hex BLAKE3> <canonical JSON>`:
{"n": 1, 2, ... within the session, "session", "turn": the experience row, "meta": {...}}.
Damage anywhere but in an unfinished last line is StoreCorrupt: the keeper stops rather than
guess which turns happened.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path

from ledger.errors import BadInput, StoreCorrupt
from ledger.store import canonical, fsio
from ledger.store.ids import hash_bytes

PART_BYTES = 8 << 20
NAME_RE = re.compile(r"^spool-([0-9a-f]{16,32})-(\d{6})\.jsonl$")


class SpoolCorrupt(StoreCorrupt):
    default_hint = ("the image's buffer was damaged; move the named file out of .ledger/run/image/ to drop its "
                    "unrecorded turns, then start the image again")


def _sum(body: bytes) -> str:
    return hash_bytes(body)[3:35]


def encode_entry(session: str, n: int, turn: dict, meta: dict) -> bytes:
    body = canonical.dumps({"n": n, "session": session, "turn": turn, "meta": meta})
    return _sum(body).encode() + b" " + body + b"\n"


def part_path(directory: Path, session: str, part: int) -> Path:
    return Path(directory) / f"spool-{session}-{part:06d}.jsonl"


class SpoolWriter:
    """Appends entries of one session. `append` writes; `sync` makes everything appended so far
    durable (one fdatasync for all of them: group commit); nothing may be acknowledged before."""

    def __init__(self, directory: Path, session: str, part_bytes: int = PART_BYTES):
        self.dir, self.session, self.part_bytes = Path(directory), session, part_bytes
        self.n, self.synced, self.part, self.fd = 0, 0, -1, -1
        self._roll()

    def _roll(self) -> None:
        if self.fd >= 0:
            os.fdatasync(self.fd)
            os.close(self.fd)
        self.part += 1
        self.fd = os.open(part_path(self.dir, self.session, self.part), os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_APPEND, 0o600)
        fsio.fsync_dir(self.dir)   # the file's name is durable before any entry in it counts
        self.size = 0

    def append(self, turn: dict, meta: dict) -> int:
        n = self.n + 1
        line = encode_entry(self.session, n, turn, meta)
        try:
            fsio.write_all(self.fd, line, "appending to the image's buffer")
        except OSError as e:
            # Nothing half-written may stay: the next entry must start on a line boundary.
            try:
                os.ftruncate(self.fd, self.size)
            except OSError:
                pass
            raise fsio.io_error(e, "appending to the image's buffer") from e
        self.n, self.size = n, self.size + len(line)
        if self.size >= self.part_bytes:
            self._roll()
            self.synced = n
        return n

    def sync(self) -> None:
        if self.synced == self.n:
            return
        try:
            os.fdatasync(self.fd)
        except OSError as e:
            raise fsio.io_error(e, "syncing the image's buffer") from e
        self.synced = self.n

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1


@dataclass(frozen=True)
class Entry:
    session: str
    n: int
    turn: dict
    meta: dict


def sessions(directory: Path) -> dict[str, list[Path]]:
    """Every session with buffer files present, its parts in order."""
    out: dict[str, list[tuple[int, Path]]] = {}
    try:
        names = os.listdir(directory)
    except FileNotFoundError:
        return {}
    for name in names:
        m = NAME_RE.match(name)
        if m:
            out.setdefault(m.group(1), []).append((int(m.group(2)), Path(directory) / name))
    return {s: [p for _, p in sorted(parts)] for s, parts in out.items()}


class SpoolReader:
    """Reads one session's entries incrementally, in order, checking every line.

    `read(final)`: the complete entries appended since the last call. With final=False (the
    writer may be mid-append) an unterminated last line is left for later; with final=True (the
    writer has exited) it is reported in `.torn` and dropped."""

    def __init__(self, directory: Path, session: str):
        self.dir, self.session = Path(directory), session
        self.part, self.offset, self.n = 0, 0, 0
        self.torn = b""
        self.done_parts: list[Path] = []

    def _bad(self, path: Path, offset: int, why: str):
        return SpoolCorrupt(f"image buffer {path.name} is damaged at byte {offset}: {why}", path=str(path))

    def read(self, final: bool = False) -> list[Entry]:
        out: list[Entry] = []
        reread = False
        while True:
            path = part_path(self.dir, self.session, self.part)
            try:
                with open(path, "rb") as f:
                    f.seek(self.offset)
                    data = f.read()
            except FileNotFoundError:
                return out
            pos = 0
            while True:
                nl = data.find(b"\n", pos)
                if nl < 0:
                    break
                line = data[pos:nl]
                at = self.offset + pos
                try:
                    digest, body = line.split(b" ", 1)
                    if digest.decode() != _sum(body):
                        raise ValueError("checksum mismatch")
                    rec = canonical.loads(body)
                    if not (isinstance(rec, dict) and rec.get("session") == self.session and isinstance(rec.get("turn"), dict)
                            and isinstance(rec.get("meta"), dict)):
                        raise ValueError("not an entry of this session")
                except (ValueError, UnicodeDecodeError, BadInput) as e:   # BadInput: canonical.loads
                    last = data[nl + 1:].strip() == b"" and not part_path(self.dir, self.session, self.part + 1).exists()
                    if final and last:   # written but never fsynced whole: never acknowledged
                        self.torn = data[pos:]
                        self.offset += len(data)
                        return out
                    raise self._bad(path, at, getattr(e, "message", None) or str(e)) from None
                if rec.get("n") != self.n + 1:
                    raise self._bad(path, at, f"entry {rec.get('n')} follows entry {self.n}")
                self.n += 1
                out.append(Entry(self.session, self.n, rec["turn"], rec["meta"]))
                pos = nl + 1
            self.offset += pos
            rest = data[pos:]
            nxt = part_path(self.dir, self.session, self.part + 1)
            if nxt.exists():
                if rest and not reread:
                    # The writer finishes a part before it creates the next one, so this read
                    # raced with the last append: read the rest of the part again.
                    reread = True
                    continue
                if rest:
                    raise self._bad(path, self.offset, "an unfinished line before the next part")
                self.done_parts.append(path)
                self.part, self.offset, reread = self.part + 1, 0, False
                continue
            if rest and final:
                self.torn = rest
                self.offset += len(rest)
            return out
