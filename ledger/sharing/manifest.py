"""What is shared: a manifest (refs, roots, the closure's objects) and the journal segment.

A *manifest* is the table of contents that a bundle carries in its header and that a push
leaves on a remote as an object. It is canonical JSON, so the same refs over the same objects
give the same manifest id on every machine — that is what lets a re-push of an up-to-date
store stop after one existence check.

A *journal segment* is the list of records (with their original ids, seq and prev) whose
outputs or refs touch the shared closure: the provenance of what is shared. It travels as a
blob whose first line is a magic line, not as a structured JSON object, because records name
record ids (`prev`) and objects that are not part of the closure; a structured object naming
them would make the receiver's store look incomplete to `verify` and `gc`. Its integrity is
checkable on its own: every record's id recomputes and consecutive records link by `prev`.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ledger.errors import BadInput, StoreCorrupt, UnknownRef, UnsupportedFormat
from ledger.sharing import keys, signing
from ledger.store import canonical, schema
from ledger.store.ids import hash_bytes, is_id
from ledger.store.journal import FIELDS as RECORD_FIELDS
from ledger.store.journal import parse_line

VERSION = 1
ALGORITHM = "blake3"
SEGMENT_MAGIC = b"ledger-journal-segment 1\n"
MAX_OBJECTS = 10_000_000        # a claim beyond this is refused before any allocation follows it
MAX_OBJECT_SIZE = 1 << 50       # 1 PiB: sizes above are nonsense, not data
MAX_SEGMENT = 256 << 20         # the segment blob is parsed in memory


@dataclass(frozen=True)
class Manifest:
    """A share manifest: refs, roots, the closure's objects with offsets and sizes, segment, absent ids."""

    refs: dict                      # ref name (as named by the sender) -> object id
    roots: tuple                    # ids the sender named (ref targets and raw ids), sorted
    objects: tuple                  # ((id, offset, size), ...): data order; offset is cumulative
    segment: str | None             # id of the journal-segment blob (one of `objects`), if any
    absent: tuple = ()              # ids the closure names that the sender does not hold (closure_of)

    def to_json(self) -> dict:
        return {"kind": "share-manifest", "version": VERSION, "algorithm": ALGORITHM,
                "refs": dict(sorted(self.refs.items())), "roots": list(self.roots),
                "objects": [list(o) for o in self.objects], "segment": self.segment, "absent": list(self.absent)}

    def canonical(self) -> bytes:
        return canonical.dumps(self.to_json())

    @property
    def id(self) -> str:
        return hash_bytes(self.canonical())

    @property
    def total_bytes(self) -> int:
        return sum(o[2] for o in self.objects)

    def sizes(self) -> dict:
        return {o[0]: o[2] for o in self.objects}

    @classmethod
    def from_json(cls, m) -> "Manifest":
        """Parse a manifest defensively: every field typed, every id well formed, offsets
        contiguous from 0. A foreign algorithm or version is refused, not guessed at."""
        if not isinstance(m, dict) or m.get("kind") != "share-manifest":
            raise StoreCorrupt("not a share manifest", "the bundle or remote holds something else under this name")
        if m.get("algorithm") != ALGORITHM:
            raise UnsupportedFormat(f"manifest uses hash algorithm {m.get('algorithm')!r}; "
                                    f"this ledger knows only {ALGORITHM!r}",
                                    "ask the sender to share from a ledger that uses blake3 ids")
        if m.get("version") != VERSION:
            raise UnsupportedFormat(f"manifest version {m.get('version')!r} is not understood (knows {VERSION})",
                                    "upgrade ledger to read this bundle or remote")
        if set(m) != {"kind", "version", "algorithm", "refs", "roots", "objects", "segment", "absent"}:
            raise StoreCorrupt("manifest has unexpected fields")
        refs, roots, objs, seg, absent = m["refs"], m["roots"], m["objects"], m["segment"], m["absent"]
        if not isinstance(refs, dict) or not all(isinstance(k, str) and k and is_id(v) for k, v in refs.items()):
            raise StoreCorrupt("manifest refs are malformed")
        for k in refs:
            check_ref_name(k)
        if not isinstance(roots, list) or not all(is_id(r) for r in roots):
            raise StoreCorrupt("manifest roots are malformed")
        if not isinstance(objs, list) or len(objs) > MAX_OBJECTS:
            raise StoreCorrupt("manifest object table is malformed or claims too many objects")
        out, offset, seen = [], 0, set()
        for o in objs:
            if not (isinstance(o, list) and len(o) == 3 and is_id(o[0]) and all(type(x) is int for x in o[1:])):
                raise StoreCorrupt("manifest object entry is malformed")
            oid, off, size = o
            if off != offset or not 0 <= size <= MAX_OBJECT_SIZE:
                raise StoreCorrupt(f"manifest entry for {oid} claims offset {off} / size {size}; "
                                   f"expected offset {offset}",
                                   "the table of contents was altered")
            if oid in seen:
                raise StoreCorrupt(f"manifest lists {oid} twice")
            seen.add(oid)
            out.append((oid, off, size))
            offset += size
        if not (seg is None or (is_id(seg) and seg in seen)):
            raise StoreCorrupt("manifest segment is not one of its objects")
        missing = [r for r in list(roots) + list(refs.values()) if r not in seen]
        if missing:
            raise StoreCorrupt(f"manifest names {missing[0]} but does not carry it")
        if not isinstance(absent, list) or len(absent) > MAX_OBJECTS \
                or not all(is_id(a) and a not in seen for a in absent):
            raise StoreCorrupt("manifest's list of absent ids is malformed")
        return cls(refs=dict(refs), roots=tuple(roots), objects=tuple(out), segment=seg, absent=tuple(absent))


def check_ref_name(name: str) -> str:
    """Ref names that are safe as path components on a remote and as namespace suffixes."""
    ok = isinstance(name, str) and 0 < len(name) <= 200 and not name.startswith(("/", "b3:"))
    if ok:
        for part in name.split("/"):
            if part in ("", ".", "..") or not all(c.isalnum() or c in "._-:" for c in part):
                ok = False
                break
    if not ok:
        raise BadInput(f"ref name {name!r} cannot be shared",
                       "shared ref names use letters, digits and . _ - : separated by /")
    return name


# --- building what to share -------------------------------------------------------------
def select(store, names) -> tuple[dict, list[str]]:
    """Resolve REF arguments into (refs to carry, root ids). Raw ids and prefixes are carried
    as roots under the ref name `id/<hex>` so that a remote can find them again."""
    refs: dict[str, str] = {}
    for name in names:
        oid = store.resolve(name)
        if name in store.state.refs or f"name/{name}" in store.state.refs:
            refname = name if name in store.state.refs else f"name/{name}"
        else:
            refname = "id/" + oid[3:]
        refs[check_ref_name(refname)] = oid
    if not refs:
        raise BadInput("nothing to share", "name at least one ref (HEAD, gen-N, a name) or object id")
    return refs, sorted(set(refs.values()))


def closure_of(store, roots) -> tuple[set[str], set[str]]:
    """(objects held, ids named but not held). A named root must be held; an id deeper in the
    closure that this store does not hold is carried as *absent* — listed in the manifest,
    reported to both sides — because the store cannot tell a digest written as `b3:…` (a
    suite hash, a source identity) from a lost object, and refusing would make every such
    receipt unshareable. The receiver's store is then exactly as complete as the sender's."""
    missing: set[str] = set()
    ids = store.closure(roots, missing)
    lost_roots = sorted(set(roots) & missing)
    if lost_roots:
        raise UnknownRef(f"{lost_roots[0]} is named but not in this store",
                         "pull it from where it came from, or share something this store holds")
    return ids - missing, missing


def segment_records(store, objects: set[str]) -> list[dict]:
    """The journal records whose outputs or ref targets touch `objects`, in journal order.
    Streamed (bounded memory whatever the journal's length): only the selected records are kept."""
    out = []
    for rec in store.journal.stream():
        refs = schema.refs_of(rec)
        if any(o in objects for o in rec["outputs"]) or any(t in objects for t in refs.values() if t):
            out.append(rec)
    return out


def encode_segment(records: list[dict], signatures: dict | None = None) -> bytes:
    """The segment blob: the magic line, then canonical JSON of the records and their signatures."""
    body = {"records": records, "signatures": dict(sorted((signatures or {}).items()))}
    return SEGMENT_MAGIC + canonical.dumps(body) + b"\n"


@dataclass(frozen=True)
class Segment:
    """A checked journal segment: its records and their signatures."""

    records: tuple
    signatures: dict = field(default_factory=dict)   # record id -> [signature dicts]


def decode_segment(data: bytes) -> Segment:
    """Parse and check a segment: each record names itself correctly, seq strictly rises and
    consecutive records link by prev. Raises StoreCorrupt on any damage."""
    if not data.startswith(SEGMENT_MAGIC) or not data.endswith(b"\n") or len(data) > MAX_SEGMENT:
        raise StoreCorrupt("journal segment is malformed")
    try:
        body = canonical.loads(data[len(SEGMENT_MAGIC):-1], strict=True)
    except BadInput as e:
        raise StoreCorrupt(f"journal segment is not canonical JSON: {e.message}") from None
    if not isinstance(body, dict) or set(body) != {"records", "signatures"} or not isinstance(body["records"], list) \
            or not isinstance(body["signatures"], dict):
        raise StoreCorrupt("journal segment has the wrong shape")
    recs, prev = [], None
    for raw in body["records"]:
        if not isinstance(raw, dict) or set(raw) != set(RECORD_FIELDS) | {"id"}:
            raise StoreCorrupt("journal segment holds a record with the wrong fields")
        try:
            rec = parse_line(canonical.dumps(raw))
        except BadInput as e:
            raise StoreCorrupt(f"journal segment record {raw.get('seq')!r}: {e.message}",
                               "the segment was altered after it was made") from None
        if prev is not None:
            if rec["seq"] <= prev["seq"]:
                raise StoreCorrupt(f"journal segment is out of order at record {rec['seq']}")
            if rec["seq"] == prev["seq"] + 1 and rec["prev"] != prev["id"]:
                raise StoreCorrupt(f"journal segment chain is broken at record {rec['seq']}: "
                                   f"prev does not name record {prev['seq']}",
                                   "the segment was altered after it was made")
        recs.append(rec)
        prev = rec
    ids = {r["id"] for r in recs}
    for rid, sigs in body["signatures"].items():
        if rid not in ids or not isinstance(sigs, list):
            raise StoreCorrupt("journal segment signs a record it does not hold")
    return Segment(records=tuple(recs), signatures=body["signatures"])


@dataclass(frozen=True)
class Selection:
    """What sharing some refs carries (manifest.gather)."""

    refs: dict          # ref name -> id, as they will be named on the other side
    roots: tuple        # the ids named
    objects: frozenset  # their closure (what this store holds of it)
    absent: frozenset   # ids the closure names that this store does not hold
    records: tuple      # the journal segment's records


def gather(store, names) -> Selection:
    """What sharing REF names carries: their closure and the records that made it."""
    refs, roots = select(store, names)
    objects, absent = closure_of(store, roots)
    return Selection(refs=refs, roots=tuple(roots), objects=frozenset(objects), absent=frozenset(absent),
                     records=tuple(segment_records(store, objects)))


def assemble(store, refs: dict, roots: list, objects: set, segment_blob: bytes | None, absent=()) -> Manifest:
    """The manifest of `objects` (plus the segment blob, if any), offsets in id order."""
    sized = {oid: store.objects.size(oid) for oid in objects}
    seg = None
    if segment_blob is not None:
        seg = hash_bytes(segment_blob)
        sized[seg] = len(segment_blob)
    table, offset = [], 0
    for oid in sorted(sized):
        table.append((oid, offset, sized[oid]))
        offset += sized[oid]
    return Manifest(refs=dict(refs), roots=tuple(sorted(roots)), objects=tuple(table), segment=seg,
                    absent=tuple(sorted(absent)))


# --- signing what we share (the sender's side of a push or a bundle) -----------------------
def _signer(store, key_name: str | None):
    if key_name is None:
        return None
    sk = keys.private_key(store, key_name)
    return sk, keys.own_keys(store)[key_name]


def make_segment(sel: Selection, signer) -> bytes | None:
    """The segment blob for a selection, each record signed when there is a signer."""
    if not sel.records:
        return None
    sigs = {}
    if signer:
        sk, pub = signer
        sigs = {r["id"]: [signing.sign(sk, pub, "record", r)] for r in sel.records}
    return encode_segment(list(sel.records), sigs)


def prepare(store, names, key_name: str | None):
    """(selection, manifest, segment blob, manifest signatures, signer public key)."""
    sel = gather(store, names)
    signer = _signer(store, key_name)
    seg = make_segment(sel, signer)
    man = assemble(store, sel.refs, sel.roots, sel.objects, seg, sel.absent)
    sigs = [signing.sign(signer[0], signer[1], "manifest", man.to_json())] if signer else []
    return sel, man, seg, sigs, (signer[1] if signer else None)


def verify_segment(trusted: dict, data: bytes) -> Segment:
    """decode_segment, and every record signature it carries must verify (tampering otherwise)."""
    seg = decode_segment(data)
    for rec in seg.records:
        for c in signing.verify(trusted, "record", rec, seg.signatures.get(rec["id"], [])):
            if not c.valid:
                raise StoreCorrupt(f"journal segment record {rec['seq']} carries a signature that does not verify",
                                   "the segment was altered after it was signed")
    return seg
