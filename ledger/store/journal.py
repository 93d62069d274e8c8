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

import orjson

from ledger.errors import BadInput, InternalError, JournalConflict, JournalCorrupt
from ledger.store import blockcheck, canonical, faults, fsio
from ledger.store.ids import hash_bytes
from ledger.store.lock import ofd_lock_wait
from ledger.store.scan import check_line

FIELDS = ("seq", "prev", "time", "kind", "inputs", "outputs", "actor", "payload")


def record_id(body: dict) -> str:
    """The id of a record: the hash of the canonical form of its fields other than `id`."""
    return hash_bytes(canonical.dumps({k: body[k] for k in FIELDS}))


def stat_identity(st: os.stat_result) -> list:
    """[dev, inode, size, mtime_ns, ctime_ns]: equal only if nothing wrote the file in between."""
    return [st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns]


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
    """Decode one journal line and check it names itself correctly. Raises BadInput.
    (store/scan.py's check_line: the one per-line check every reader and pass shares.)"""
    return check_line(line)


@dataclass
class Scan:
    """The result of reading the journal: whole records, where they end, and any damage."""
    records: list = field(default_factory=list)
    end: int = 0                 # byte offset just after the last good record
    torn: bytes = b""            # bytes after the last good record that are not a whole record
    broken_at: int | None = None  # seq position (1-based) of the first record that breaks the chain
    problem: str | None = None
    last_seq: int = 0            # seq and id of the last good record (those the scan started after
    last_id: str | None = None   # when it read none)
    line: bytes = b""            # the line of the record being yielded (verify reads ids off the bytes)


SCAN_BLOCK = 8 << 20  # a scan reads this much at a time: its memory does not grow with the journal
TORN_MAX = 256 << 20  # damaged bytes a scan keeps to report (a whole journal of garbage is not kept)


class Journal:
    """The journal file: scanning, walking backwards, and compare-and-append."""
    def __init__(self, root: Path):
        self.path = root / "journal"
        self.tmp = root / "tmp"
        self.appended: os.stat_result | None = None  # the file's stat right after this object's last append

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

    def identity(self) -> list | None:
        """What says the journal file is the one a cache saw: [dev, inode, size, mtime_ns,
        ctime_ns] of the regular file (None if there is none). Any write, truncation, rename over
        it or utime changes ctime, which no process can set back (docs/store-format.md, rule 19)."""
        try:
            fd, st = fsio.open_regular(self.path)
        except FileNotFoundError:
            return None
        except fsio.NotRegular as e:
            raise JournalCorrupt(f"{self.path} is a {e.kind}, not the journal file",
                                 "restore .ledger/journal from a bundle or backup") from None
        os.close(fd)
        return stat_identity(st)

    def scan(self, start_offset: int = 0, expect_seq: int = 1, expect_prev: str | None = None,
             keep: bool = True, each=None, lines: bool = False, bulk: dict | None = None) -> Scan:
        """Read and check records from `start_offset`. Damage in the middle is a broken chain;
        damage only at the end is a torn tail.

        The file is read a block at a time; `each(rec)` is called for every good record in order
        (`each(rec, line)` with `lines`: the record's exact bytes, checked canonical and hashing to
        its id) and `keep=False` keeps no list of them, so a scan of any length runs in bounded memory.

        `bulk` ({kind: fn(run)}, with keep=False): a run of proved usual lines of such a kind
        (store/blockcheck.py) that continues the chain is handed to fn whole, as a
        blockcheck.Run of columns, and `each` is not called for its records; a line that breaks
        the chain goes the usual way, so damage is reported as without `bulk`."""
        if bulk and keep:
            raise InternalError("a scan with `bulk` keeps no records", "pass keep=False (this is a bug)")
        out = Scan(end=start_offset, last_seq=expect_seq - 1, last_id=expect_prev)
        for rec in self._walk(out, start_offset, expect_seq, expect_prev, bulk):
            if keep:
                out.records.append(rec)
            if each is not None:
                if lines:
                    each(rec, out.line)
                else:
                    each(rec)
        out.line = b""
        return out

    def stream(self, start_offset: int = 0, expect_seq: int = 1, expect_prev: str | None = None):
        """Records oldest first, one at a time (bounded memory at any journal length), each checked
        against its id and its predecessor; a broken chain raises JournalCorrupt where it is met
        and a torn tail is skipped, as on open. For readers that walk history (gc, report, diff)."""
        out = Scan(end=start_offset)
        yield from self._walk(out, start_offset, expect_seq, expect_prev)
        if out.broken_at is not None:
            raise JournalCorrupt(f"journal chain is broken at {out.problem}", "run `ledger verify`")

    def _walk(self, out: Scan, start_offset: int, expect_seq: int, expect_prev: str | None, bulk=None):
        try:
            f = self.open()
        except FileNotFoundError:
            return
        seq, prev = expect_seq, expect_prev
        with f:
            f.seek(start_offset)
            base, data, pos, eof = start_offset, b"", 0, False
            block, proved, at = None, None, 0  # blockcheck's proof of data, its flag per whole line, the next line's
            while True:
                nl = data.find(b"\n", pos)
                if nl < 0:
                    if eof:
                        if pos < len(data):
                            out.torn = data[pos:]
                        break
                    chunk = f.read(SCAN_BLOCK)
                    base, data, pos = base + pos, data[pos:] + chunk, 0
                    block, at = blockcheck.prove(data), 0
                    proved = block.flags if block is not None else None
                    if not chunk:
                        eof = True
                    elif len(data) > TORN_MAX + SCAN_BLOCK and data.find(b"\n") < 0:
                        # one "line" longer than any record could be: damage, not a record
                        out.torn = data[:TORN_MAX]
                        rest = f.read(1)
                        if rest and not self._blank_after(f, rest):
                            out.broken_at, out.problem = seq, f"record {seq}: a line of more than {TORN_MAX} bytes"
                        break
                    continue
                if bulk and proved is not None and proved[at] and bulk.get(block.run_kind(at)):
                    run = block.run(at)
                    good = run.chained(seq, prev)
                    if good:
                        run = run.head(good)
                        bulk[run.kind](run)
                        at += good
                        seq, prev = seq + good, run.id(good - 1)
                        pos = run.end
                        out.end = base + pos
                        out.last_seq, out.last_id = seq - 1, prev
                        out.line = run.line(good - 1)
                        continue
                line = data[pos:nl]
                try:
                    if proved is not None and proved[at]:
                        rec = orjson.loads(line)    # proved canonical, well-typed, hashing to its id
                    else:
                        rec = parse_line(line)
                    at += 1
                    if rec["seq"] != seq:
                        raise BadInput(f"expected seq {seq}, found {rec['seq']}")
                    if rec["prev"] != prev:
                        raise BadInput("prev does not name the previous record")
                except BadInput as e:
                    # A bad final line with nothing after it is a torn tail; otherwise tampering.
                    after = data[nl + 1:]
                    if after.strip() == b"" and self._blank_after(f, b""):
                        out.torn = data[pos:]
                    else:
                        out.broken_at = seq
                        out.problem = f"record {seq}: {e.message}"
                        out.torn = data[pos:pos + TORN_MAX]
                    break
                seq, prev = seq + 1, rec["id"]
                pos = nl + 1
                out.end = base + pos
                out.last_seq, out.last_id = seq - 1, prev
                out.line = line
                yield rec

    @staticmethod
    def _blank_after(f, first: bytes) -> bool:
        """Whether `first` and the rest of file `f` hold only whitespace (read a block at a time)."""
        if first.strip():
            return False
        while True:
            chunk = f.read(SCAN_BLOCK)
            if not chunk:
                return True
            if chunk.strip():
                return False

    def records(self):
        s = self.scan()
        if s.broken_at is not None:
            raise JournalCorrupt(f"journal chain is broken at {s.problem}")
        return s.records

    def backwards(self, strict: bool = True, stopped: list | None = None):
        """Records newest first, read from the end of the file in growing blocks: a search
        for the latest record of some kind costs what it reads, not the journal's length.

        Each record is checked against its own id, and against its neighbour (seq one less,
        `prev` its id): at damage it walks over a strict reader raises JournalCorrupt, a
        lenient one (`log`) just stops — and appends what it would have raised to `stopped`,
        if given, so that what it showed is not taken for the whole journal. The chain as a
        whole is `verify`'s job. A torn tail is skipped, as on open: bytes after the last
        newline, or else a last line that does not parse."""
        try:
            f = self.open()
        except FileNotFoundError:
            return
        with f:
            pos = f.seek(0, os.SEEK_END)
            block, rest, newer, newest = 1 << 16, b"", None, True
            at_end = True   # the next piece is what follows the file's last newline
            while pos > 0:
                step = min(block, pos)
                pos -= step
                f.seek(pos)
                lines = (f.read(step) + rest).split(b"\n")
                block = min(block * 2, 16 << 20)
                # the first piece may be the end of a line that starts in the next block back
                rest = lines.pop(0) if pos > 0 else b""
                for line in reversed(lines):
                    if at_end:
                        # nothing (the last line ended), or a line without its newline: a torn
                        # append, as a scan and every writer take it, never a record (even one
                        # that parses); it is the one torn tail there can be
                        at_end = False
                        if line.strip():   # (blanks there are not a record either, as to a scan)
                            newest = False
                        continue
                    try:
                        rec = parse_line(line)   # an empty line inside the file is damage, as to a scan
                    except BadInput as e:
                        if newest:
                            newest = False
                            continue  # a torn tail
                        where = f"before record {newer['seq']}" if newer else "at its end"
                        message = f"the journal is damaged {where}: {e}"
                        if not strict:
                            if stopped is not None:
                                stopped.append(message)
                            return
                        raise JournalCorrupt(message, "run `ledger verify`") from None
                    newest = False
                    if newer is not None and (rec["seq"] != newer["seq"] - 1 or newer["prev"] != rec["id"]):
                        message = f"journal chain is broken before record {newer['seq']}"
                        if not strict:
                            if stopped is not None:
                                stopped.append(message)
                            return
                        raise JournalCorrupt(message, "run `ledger verify`")
                    newer = rec
                    yield rec

    def tail(self, n: int, stopped: list | None = None) -> list[dict]:
        """The last n whole records, oldest first (fast on a huge journal); fewer where damage
        stops the walk (said in `stopped`, if given: backwards)."""
        out = []
        for rec in self.backwards(strict=False, stopped=stopped):
            if len(out) == n:
                break
            out.append(rec)
        return out[::-1]

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

    def record_before(self, end: int) -> dict | None:
        """The whole record that ends at byte `end`, checked against its own id (None if there
        is none there): what a cache keyed by (offset, record id) compares with."""
        try:
            fd = os.open(self.path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
        except OSError:
            return None
        try:
            # `end` comes from a cache anyone in the store can write: beyond the file it names
            # no record (pread would fail on an offset past 2**63)
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode) or not 0 < end <= st.st_size or os.pread(fd, 1, end - 1) != b"\n":
                return None
            return parse_line(self.last_line_before(fd, end))
        except BadInput:
            return None
        finally:
            os.close(fd)

    def record_id_before(self, end: int) -> str | None:
        """The id of the whole record that ends at byte `end` (None if there is none there)."""
        rec = self.record_before(end)
        return None if rec is None else rec["id"]

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
            # Taken while this process still holds the journal's OFD lock: the cache written
            # after this commit records it, and the next writer trusts the bytes before its offset
            # only if the file still has exactly this identity (rule 19).
            self.appended = os.fstat(fd)
            return self.appended.st_size
        finally:
            os.close(fd)
