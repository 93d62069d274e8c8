"""The journal: an append-only file of hash-chained records, one canonical-JSON line each.

A record is {seq, prev, time, kind, inputs, outputs, actor, payload, id}; `id` is the hash of
the canonical form of the other fields and `prev` is the previous record's id, so editing,
deleting, reordering or duplicating any past record breaks the chain at that record.

Appending one line and fsyncing it is the commit point of a transaction. A crash can leave a
partial last line (a torn tail): readers ignore it; the next writer moves it aside before
appending; `verify` reports it.
"""

from __future__ import annotations

import getpass
import os
import stat
import time as _time
from dataclasses import dataclass, field
from pathlib import Path

import blake3

from ledger.errors import BadInput, JournalConflict, JournalCorrupt
from ledger.store import canonical, faults, fsio
from ledger.store.ids import PREFIX, hash_bytes, is_id
from ledger.store.lock import ofd_lock_wait

FIELDS = ("seq", "prev", "time", "kind", "inputs", "outputs", "actor", "payload")


def record_id(body: dict) -> str:
    """The id of a record: the hash of the canonical form of its fields other than `id`."""
    return hash_bytes(canonical.dumps({k: body[k] for k in FIELDS}))


def now() -> str:
    """The record timestamp: UTC, ISO 8601 with microseconds."""
    t = _time.time_ns()
    return _time.strftime("%Y-%m-%dT%H:%M:%S", _time.gmtime(t // 1_000_000_000)) + f".{t // 1000 % 1_000_000:06d}Z"


def default_actor() -> str:
    """Who writes a record: LEDGER_ACTOR, else user@host."""
    actor = os.environ.get("LEDGER_ACTOR")
    if actor:
        return actor
    try:
        user = getpass.getuser()
    except Exception:  # no passwd entry in some containers; the actor is informational
        user = str(os.getuid())
    return f"{user}@{os.uname().nodename}"


def make_record(seq: int, prev: str | None, kind: str, inputs, outputs, actor: str, payload: dict) -> dict:
    """A journal record with its id computed."""
    body = {"seq": seq, "prev": prev, "time": now(), "kind": kind, "inputs": list(inputs),
            "outputs": list(outputs), "actor": actor, "payload": payload}
    body["id"] = record_id(body)
    return body


def parse_line(line: bytes) -> dict:
    """Decode one journal line and check it names itself correctly. Raises BadInput."""
    rec = canonical.loads(line, strict=True)
    if not isinstance(rec, dict) or set(rec) != set(FIELDS) | {"id"}:
        raise BadInput("journal record has the wrong fields")
    if not (isinstance(rec["seq"], int) and not isinstance(rec["seq"], bool) and rec["seq"] >= 1):
        raise BadInput("journal record has a bad seq")
    if not (rec["prev"] is None or is_id(rec["prev"])):
        raise BadInput("journal record has a bad prev")
    if not (isinstance(rec["kind"], str) and isinstance(rec["actor"], str) and isinstance(rec["time"], str)
            and isinstance(rec["payload"], dict) and isinstance(rec["inputs"], list)
            and isinstance(rec["outputs"], list)
            and all(is_id(x) for x in rec["inputs"] + rec["outputs"])):
        raise BadInput("journal record has ill-typed fields")
    if record_id(rec) != rec["id"]:
        raise BadInput("journal record does not hash to its id")
    return rec


@dataclass
class Scan:
    """The result of reading the journal: whole records, where they end, and any damage."""
    records: list = field(default_factory=list)
    end: int = 0                 # byte offset just after the last good record
    torn: bytes = b""            # bytes after the last good record that are not a whole record
    broken_at: int | None = None  # seq position (1-based) of the first record that breaks the chain
    problem: str | None = None


class Journal:
    """The journal file: scanning, walking backwards, and compare-and-append."""
    def __init__(self, root: Path):
        self.path = root / "journal"
        self.tmp = root / "tmp"

    def open(self):
        """The journal file for reading, as a binary file object: never through a link, never
        blocking on a FIFO, and only a regular file (JournalCorrupt otherwise). Raises
        FileNotFoundError if there is none."""
        try:
            fd, _ = fsio.open_regular(self.path)
        except fsio.NotRegular as e:
            raise JournalCorrupt(f"{self.path} is a {e.kind}, not the journal file",
                                 "restore .ledger/journal from a bundle or backup") from None
        return os.fdopen(fd, "rb")

    def scan(self, start_offset: int = 0, expect_seq: int = 1, expect_prev: str | None = None,
             keep: bool = True) -> Scan:
        """Read and check records from `start_offset`. Damage in the middle is a broken chain;
        damage only at the end is a torn tail."""
        out = Scan(end=start_offset)
        try:
            with self.open() as f:
                f.seek(start_offset)
                data = f.read()
        except FileNotFoundError:
            return out
        pos = 0
        seq, prev = expect_seq, expect_prev
        n = len(data)
        while pos < n:
            nl = data.find(b"\n", pos)
            if nl < 0:
                out.torn = data[pos:]
                break
            line = data[pos:nl]
            try:
                rec = parse_line(line)
                if rec["seq"] != seq:
                    raise BadInput(f"expected seq {seq}, found {rec['seq']}")
                if rec["prev"] != prev:
                    raise BadInput("prev does not name the previous record")
            except BadInput as e:
                # A bad final line with nothing after it is a torn tail; otherwise tampering.
                if data[nl + 1:].strip() == b"":
                    out.torn = data[pos:]
                else:
                    out.broken_at = seq
                    out.problem = f"record {seq}: {e.message}"
                    out.torn = data[pos:]
                break
            if keep:
                out.records.append(rec)
            seq, prev = seq + 1, rec["id"]
            pos = nl + 1
            out.end = start_offset + pos
        out.last_seq, out.last_id = seq - 1, prev  # type: ignore[attr-defined]
        return out

    def records(self):
        s = self.scan()
        if s.broken_at is not None:
            raise JournalCorrupt(f"journal chain is broken at {s.problem}")
        return s.records

    def backwards(self, strict: bool = True):
        """Records newest first, read from the end of the file in growing blocks: a search
        for the latest record of some kind costs what it reads, not the journal's length.

        Each record is checked against its own id, and against its neighbour (seq one less,
        `prev` its id): at damage it walks over a strict reader raises JournalCorrupt, a
        lenient one (`log`) just stops. The chain as a whole is `verify`'s job. A torn last
        line is skipped, as on open."""
        try:
            f = self.open()
        except FileNotFoundError:
            return
        with f:
            pos = f.seek(0, os.SEEK_END)
            block, rest, newer, newest = 1 << 16, b"", None, True
            while pos > 0:
                step = min(block, pos)
                pos -= step
                f.seek(pos)
                lines = (f.read(step) + rest).split(b"\n")
                block = min(block * 2, 16 << 20)
                # the first piece may be the end of a line that starts in the next block back
                rest = lines.pop(0) if pos > 0 else b""
                for line in reversed(lines):
                    if not line:
                        continue
                    try:
                        rec = parse_line(line)
                    except BadInput as e:
                        if newest:
                            newest = False
                            continue  # a torn tail
                        if not strict:
                            return
                        where = f"before record {newer['seq']}" if newer else "at its end"
                        raise JournalCorrupt(f"the journal is damaged {where}: {e}", "run `ledger verify`") from None
                    newest = False
                    if newer is not None and (rec["seq"] != newer["seq"] - 1 or newer["prev"] != rec["id"]):
                        if not strict:
                            return
                        raise JournalCorrupt(f"journal chain is broken before record {newer['seq']}",
                                             "run `ledger verify`")
                    newer = rec
                    yield rec

    def tail(self, n: int) -> list[dict]:
        """The last n whole records, oldest first (fast on a huge journal); fewer where damage
        stops the walk."""
        out = []
        for rec in self.backwards(strict=False):
            if len(out) == n:
                break
            out.append(rec)
        return out[::-1]

    def prefix_digest(self, length: int) -> str:
        h = blake3.blake3(max_threads=blake3.blake3.AUTO)
        with self.open() as f:
            remaining = length
            while remaining:
                chunk = f.read(min(remaining, 16 << 20))
                if not chunk:
                    break
                h.update(chunk)
                remaining -= len(chunk)
        return PREFIX + h.hexdigest()

    def set_aside_tail(self, end: int) -> Path | None:
        """Move a torn tail out of the journal (kept beside it for forensics) so the next append
        starts on a record boundary. Caller holds the lock."""
        size = self.path.stat().st_size
        if size <= end:
            return None
        with self.open() as f:
            f.seek(end)
            torn = f.read()
        aside = self.path.parent / f"journal.torn-{int(_time.time())}-{end}"
        fsio.atomic_write(aside, torn, self.tmp)
        fd = os.open(self.path, os.O_WRONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
        try:
            os.ftruncate(fd, end)
            os.fsync(fd)
        finally:
            os.close(fd)
        return aside

    def record_id_before(self, end: int) -> str | None:
        """The id of the whole record that ends at byte `end` (None if there is none there)."""
        try:
            fd = os.open(self.path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
        except OSError:
            return None
        try:
            if not stat.S_ISREG(os.fstat(fd).st_mode) or end <= 0 or os.pread(fd, 1, end - 1) != b"\n":
                return None
            return parse_line(self.last_line_before(fd, end))["id"]
        except BadInput:
            return None
        finally:
            os.close(fd)

    def last_line_before(self, fd: int, end: int) -> bytes:
        """The last whole line of the file ending at offset `end` (which is a record boundary)."""
        if end == 0:
            return b""
        block, buf = 1 << 12, b""
        pos = end
        while pos > 0:
            step = min(block, pos)
            pos -= step
            buf = os.pread(fd, step, pos) + buf
            nl = buf.rfind(b"\n", 0, len(buf) - 1)
            if nl >= 0:
                return buf[nl + 1:-1]
            block = min(block * 2, 16 << 20)
        return buf[:-1]

    def append(self, rec: dict, expect_end: int) -> int:
        """Append one record and fsync: the commit point. Returns the new end offset.

        Compare-and-append: the record is written only if the journal still ends exactly at
        `expect_end` and its last record is `rec["prev"]` — the state the writer read. The check
        and the write happen under a kernel (OFD) lock on the journal file itself, so even two
        writers that both believe they hold the store lock (a lock file removed by hand, a
        broken lock) cannot both append after the same record: the chain never forks."""
        line = canonical.dumps(rec) + b"\n"
        fd = os.open(self.path, os.O_RDWR | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
        try:
            ofd_lock_wait(fd)  # released when fd is closed
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode):
                raise JournalCorrupt(f"{self.path} is not a regular file",
                                     "restore the journal from a bundle or backup")
            start = st.st_size
            if start != expect_end:
                raise JournalConflict(
                    f"the journal changed while this transaction ran (it ends at byte {start}, not {expect_end}); "
                    "nothing was committed")
            if rec["prev"] is not None:
                try:
                    last = parse_line(self.last_line_before(fd, start))
                except BadInput:
                    last = None
                if last is None or last["id"] != rec["prev"] or last["seq"] != rec["seq"] - 1:
                    raise JournalConflict(f"the journal's last record is no longer record {rec['seq'] - 1} "
                                          "that this transaction read; nothing was committed")
            elif start:
                raise JournalConflict("the journal is no longer empty; nothing was committed")
            try:
                if faults.active():
                    # Let the crash tests tear a record in half.
                    half = len(line) // 2
                    fsio.write_all(fd, line[:half], "appending to the journal")
                    os.fsync(fd)
                    faults.point("journal.torn")
                    fsio.write_all(fd, line[half:], "appending to the journal")
                else:
                    fsio.write_all(fd, line, "appending to the journal")
                faults.point("journal.before-fsync")
                os.fsync(fd)
            except OSError:
                # Nothing half-written may stay visible: cut back to where we started.
                os.ftruncate(fd, start)
                raise
            return os.fstat(fd).st_size
        finally:
            os.close(fd)
