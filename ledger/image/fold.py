"""The keeper's writes to the journal: the image's buffer folded into `record` transactions, and
the lifecycle records (kind `image`), each carrying the image's new context.

The image appends every turn to its buffer (ledger/image/spool.py) and fsyncs it before it
replies; the keeper (ledger/image/keeper.py) calls `Fold.fold` to commit what has accumulated as
ONE `record` transaction per batch, with the image's context and buffer cursor (session, last
entry) in the same transaction. So a turn reaches the journal exactly once: a keeper that starts
folds only the entries after the committed cursor (`recover`).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Callable

from ledger import experience, generations, records
from ledger.errors import BadInput
from ledger.image import context as ctxlib
from ledger.image import spool

LOCK_WAIT = 30.0           # seconds a commit waits for the store lock (a rollback, a cycle stage)
MAX_BATCH = 10_000
# The keeper commits the image's buffer at most every FOLD_INTERVAL seconds (or at FOLD_MAX
# entries, or at once when a client waits for its turn id): each commit is a store transaction
# whose DuckDB index update costs ~100 ms of CPU, which would otherwise compete with the model.
FOLD_INTERVAL = 0.25
FOLD_MAX = 256

# (session, first turn number, from entry, upto entry): a batch of the session was committed
Folded = Callable[[str, int, int, int], None]


def fresh(store):
    """The store's state as the journal says now: another process may have committed since this
    Store object last folded it."""
    return store.refresh()


def journal_position(store):
    """(state, byte offset of the journal's end that state covers): what an image starts from."""
    st = fresh(store)
    return st, store.journal_end


class Fold:
    """The buffer of one store's image → its journal. Holds the image's context (ctx), which
    every record this class writes replaces."""

    def __init__(self, store, buffer: Path, say: Callable[[str], None]):
        self.store, self.buffer, self.say = store, Path(buffer), say
        self.ctx = ctxlib.load(store)
        self.readers: dict[str, spool.SpoolReader] = {}
        self.unfolded: dict[str, list] = {}

    def unrecorded(self) -> int:
        """Entries read from the buffer and not yet committed (the store was locked)."""
        return sum(len(q) for q in self.unfolded.values())

    def recover(self) -> None:
        """Commit what earlier images left in the buffer (entries after the committed cursor),
        and drop their markers and scratch folders."""
        for session, parts in spool.sessions(self.buffer).items():
            self.fold(session, final=True)
            for p in parts:
                p.unlink(missing_ok=True)
            self.readers.pop(session, None)
        for marker in self.buffer.glob("held-*"):
            marker.unlink()
        for old in self.buffer.glob("scratch-*"):
            shutil.rmtree(old, ignore_errors=True)

    def fold(self, session: str, final: bool = False, folded: Folded | None = None) -> None:
        """Commit the session's new buffer entries, MAX_BATCH per transaction. `final`: the image
        has exited, so a torn last entry is dropped (it was never acknowledged). Raises Locked
        when the store stays locked for LOCK_WAIT; the entries read stay queued for the next call."""
        reader = self.readers.get(session)
        if reader is None:
            reader = self.readers[session] = spool.SpoolReader(self.buffer, session)
            cur = self.ctx.cursor
            skip = cur.get("n", 0) if cur.get("session") == session else 0
            pending = [e for e in reader.read(final) if e.n > skip]
        else:
            pending = reader.read(final)
        if reader.torn:
            self.say(f"dropped an unfinished last entry of image session {session} ({len(reader.torn)} bytes): "
                     "it was never acknowledged")
            reader.torn = b""
        queue = self.unfolded.setdefault(session, [])
        queue.extend(pending)
        while queue:
            batch = queue[:MAX_BATCH]
            rows = "\n".join(json.dumps(e.turn) for e in batch)
            try:
                turns = experience.parse_turns(rows, f"image buffer {session}")
            except BadInput as e:   # checksummed, but not a turn: the image is broken, stop
                raise spool.SpoolCorrupt(f"the image's buffer holds an entry that is not a turn: {e.message}") from None
            new = {}

            def extra(tx, first, batch=batch):
                ctx = self.ctx.after(batch, first, self._generation)
                new["ctx"] = ctxlib.write(tx, ctx)
                records.write_field(tx, "requests", [e.turn.get("request") for e in batch])
                records.write_field(tx, "image", {"session": session, "from": batch[0].n, "upto": batch[-1].n})

            res = experience.record(self.store, turns, actor="image", wait=LOCK_WAIT, extra=extra)
            self.ctx = new["ctx"]
            del queue[:len(batch)]
            if folded is not None:
                folded(session, res["first"], batch[0].n, batch[-1].n)
        for p in reader.done_parts:       # parts read to the end and committed
            p.unlink(missing_ok=True)
        reader.done_parts.clear()

    def forget(self, session: str) -> None:
        """The session's image has exited and its buffer is committed: drop its parts."""
        for p in spool.sessions(self.buffer).get(session, []):
            p.unlink(missing_ok=True)
        self.readers.pop(session, None)
        self.unfolded.pop(session, None)

    def _generation(self, gid: str):
        return generations.from_manifest(gid, self.store.get_json(gid))

    def lifecycle(self, event: str, **payload) -> None:
        """One `image` record with a new context: the timeline `ledger log` shows."""
        with self.store.transaction("image", actor="image", wait=LOCK_WAIT) as tx:
            ctx = self.ctx
            if event in ("start", "resume", "restart"):
                head = generations.head(self.store)
                ctx = ctx.serving(head).bump(sessions=1, starts=int(event == "start"))
            self.ctx = ctxlib.write(tx, ctx)
            records.write(tx, records.Image(event=event, generation=self.ctx.generation, gen=self.ctx.gen,
                                            restored=ctx.id if event == "start" else None, context=self.ctx.id,
                                            extra=payload))
