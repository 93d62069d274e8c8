"""Chunked objects over a remote: only the chunks the other side lacks move.

A remote holds a chunked object (ledger/store/chunks.py) as a *chunk list* plus its chunks:

  chunked/ab/<62 hex>      the chunk list of object b3:ab…: LIST_HEAD (magic, size, count, 0)
                           + count × LIST_ENTRY (chunk digest, length); big-endian
  objects/<chunk id>       each chunk, an ordinary content-addressed object (id = b3 of its bytes)

The list names chunks by digest and length only — never a pack, an offset or a path — so a
receiver maps each entry to `objects/<hex>` and nowhere else. Push asks which chunk ids the
remote has (`has_objects`, ASK ids a call), uploads the missing chunks in durable batches,
and writes the list only after they are all durable (then the manifest, then the refs: the
remote invariant of push.py). Pull reads the list (bounded by the object's announced size),
takes each chunk it already holds from its own packs (verified), downloads only the others
(each verified against its id as it arrives), and writes the reassembled bytes to tmp/,
hashing them: admit.Arrivals keeps the copy only if the whole hashes to the object's id, and
the store then writes only the chunks it lacks. A list that lies is refused (CorruptObject)
before anything becomes visible. Rules: docs/store-format.md, C7–C9.
"""

from __future__ import annotations

import io

import blake3

from ledger.errors import CorruptObject, StoreCorrupt
from ledger.sharing.pool import batches, run_all
from ledger.store import chunks
from ledger.store.ids import PREFIX, hex_of

# the chunk list's format is the store's (verify hashes it too: docs/store-format.md C12)
LIST_MAGIC, LIST_HEAD, LIST_ENTRY = chunks.LIST_MAGIC, chunks.LIST_HEAD, chunks.LIST_ENTRY
LIST_MAX = 64 << 20                    # a list read for an object of unknown size is at most this
ASK = 1000                             # chunk ids asked about in one has_objects call


def list_key(oid: str) -> str:
    """Where a chunked object's chunk list lives on a remote."""
    h = hex_of(oid)
    return f"chunked/{h[:2]}/{h[2:]}"


def chunk_id(digest: bytes) -> str:
    """A chunk's id on a remote: the object id of its bytes."""
    return PREFIX + digest.hex()


def list_limit(size: int) -> int:
    """The most bytes the chunk list of a `size`-byte object may have: every chunk but the last
    is at least chunks.MIN_SIZE (FastCDC's minimum), so at most size // MIN_SIZE + 1 entries."""
    return LIST_HEAD.size + LIST_ENTRY.size * (size // chunks.MIN_SIZE + 1)


encode = chunks.chunk_list   # (size, [(digest, length)]) -> the list's bytes


def decode(data: bytes, oid: str, where: str, expect: int | None = None,
           limit: int = 0) -> tuple[int, list[tuple[bytes, int]]]:
    """(size, [(digest, length)]) of a chunk list from a sender; CorruptObject unless it is
    exactly well formed: the announced size (or at most `limit` bytes), a count the size
    allows, every length in (0, MAX_SIZE], and lengths summing to the size."""
    def bad(why: str) -> CorruptObject:
        return CorruptObject(oid, f"the chunk list of {oid} on {where} {why}",
                             "the remote is damaged or hostile; nothing from it was stored")

    if len(data) < LIST_HEAD.size:
        raise bad("is truncated")
    magic, size, count, reserved = LIST_HEAD.unpack_from(data)
    if magic != LIST_MAGIC or reserved:
        raise bad("is not a chunk list")
    if expect is not None and size != expect:
        raise bad(f"says {size} bytes; {expect} were announced")
    if expect is None and limit and size > limit:
        raise bad(f"says {size} bytes, more than the {limit} that may arrive")
    if len(data) > list_limit(size) or count > size // chunks.MIN_SIZE + 1:
        raise bad(f"lists {count} chunks for {size} bytes (at most {size // chunks.MIN_SIZE + 1})")
    if len(data) != LIST_HEAD.size + count * LIST_ENTRY.size:
        raise bad(f"has {len(data)} bytes for {count} chunks")
    entries = [LIST_ENTRY.unpack_from(data, LIST_HEAD.size + i * LIST_ENTRY.size) for i in range(count)]
    if any(n == 0 or n > chunks.MAX_SIZE for _, n in entries) or sum(n for _, n in entries) != size:
        raise bad("does not add up")
    return size, entries


# --- outbound ------------------------------------------------------------------------------
def push_objects(store, backend, oids, on_bytes, jobs: int) -> None:
    """Send chunked objects `oids` to `backend`: the chunks it lacks (asked in batches of ASK,
    uploaded in durable batches, each read verified from its pack), then each chunk list —
    only after every chunk it names is durable on the remote."""
    lists: dict[str, bytes] = {}
    want: dict[str, tuple] = {}       # chunk id -> (digest, location, object id)
    for oid in sorted(oids):
        entries = store.objects.chunk_entries(oid)    # pages verified as read
        lists[oid] = encode(sum(loc[2] for _, loc in entries), ((d, loc[2]) for d, loc in entries))
        for d, loc in entries:
            want.setdefault(chunk_id(d), (d, loc, oid))
    ids = sorted(want)
    present: set[str] = set()
    for i in range(0, len(ids), ASK):
        present |= backend.has_objects(ids[i:i + ASK])
    todo = [c for c in ids if c not in present]
    if todo:
        # the backend uploads from a file (hashing what it sends): each chunk is copied, verified,
        # into a work folder of ours (flocked: a gc meanwhile leaves it alone) and removed once staged
        work = store.work_folder("push")
        try:
            def send(cid):
                d, loc, oid = want[cid]
                p = work / cid[len(PREFIX):]
                p.write_bytes(store.objects.packs.read(loc, d, oid))
                try:
                    backend.put_object(cid, p, on_bytes)
                finally:
                    p.unlink(missing_ok=True)

            for batch in batches(todo, {c: want[c][1][2] for c in todo}):
                run_all(send, batch, jobs)
                backend.flush()       # the chunks are durable before any list names them
        finally:
            store.discard_work_folder(work)
    for oid, body in lists.items():
        backend.write_small(list_key(oid), body)
        on_bytes(len(body))


def held_as_list(backend, oids) -> set[str]:
    """Which of `oids` the remote holds as a chunk list (written only after its chunks)."""
    return {o for o in oids if backend.exists(list_key(o))}


# --- inbound -------------------------------------------------------------------------------
class LocalChunks:
    """The chunks this store holds (from its pack trailers, read once), each read verified:
    what a pull need not download. A damaged local chunk is CorruptObject, never skipped."""

    def __init__(self, store):
        self.packs = store.objects.packs
        self.known = self.packs.known()   # the persistent chunk index (chunks.ChunkIndex), bounded memory

    def get(self, digest: bytes, n: int, oid: str) -> bytes | None:
        loc = self.known.get(digest)
        if loc is None or loc[2] != n:
            return None
        return self.packs.read(loc, digest, oid)


def read_listed(backend, oid: str, data: bytes, size: int | None, limit: int, dest, on_bytes,
                local: LocalChunks | None) -> str:
    """Reassemble object `oid` from its chunk list `data` into `dest`: chunks held locally are
    read from the packs, the others downloaded, each checked against its id. Returns the hash
    of everything written (the caller keeps the copy only if it equals `oid`)."""
    _, entries = decode(data, oid, backend.url, expect=size, limit=limit)
    h = blake3.blake3(max_threads=blake3.blake3.AUTO)
    for d, n in entries:
        buf = local.get(d, n, oid) if local is not None else None
        if buf is None:
            cid, got = chunk_id(d), io.BytesIO()
            try:
                have = backend.get_object(cid, got, on_bytes, expect=n)
            except FileNotFoundError:
                raise StoreCorrupt(f"remote {backend.url} lacks chunk {cid} that the chunk list of {oid} names",
                                   "the remote is incomplete; `ledger push --full` again from the source") from None
            if have != cid:
                raise CorruptObject(oid, f"a chunk of {oid} arrived from {backend.url} with the wrong content "
                                         f"(it hashes to {have}, not {cid})",
                                    "the remote is damaged or hostile; nothing from it was stored")
            buf = got.getvalue()
        h.update(buf)
        dest.write(buf)
    return PREFIX + h.hexdigest()
