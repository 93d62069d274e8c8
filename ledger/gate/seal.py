"""Sealed suites: the documents the gate scores, kept where the training side cannot read them.

A suite folder, as a user writes it:

    SUITE_DIR/
      eval/     scored documents (S)
      canary/   canary documents (K)
      settings.toml   optional: gate settings (GateSettings field = value), top level or [gate]

Each document is a JSON object {"situation": str, "action": str} (optionally "outcome": str,
"refusal": bool). A `NAME.json` file holds one document whose id is NAME (or its "id" field);
a `NAME.jsonl` file holds one document per line, each with an "id". Ids match
[A-Za-z0-9][A-Za-z0-9._-]* and are unique across S and K. Nothing else may be in eval/ or canary/.

Sealing (`seal`) writes ONE `seal` transaction:
  - every document as a canonical-JSON object, and a suite manifest naming them, the base and
    tokenizer and chat template it is pinned against, the scorer version, the settings, the suite hash and the
    suite's canary string (a random GUID, written into every canary document as its "canary"
    field, so a copy of those documents anywhere carries it);
  - a plain copy of the documents under `.ledger/sealed/<manifest hex>/{eval,canary}/ID.json`
    (owner-only permissions), which is what the gate reads and re-hashes when it scores;
  - the ref `suite` -> manifest id, with the suite hash in the payload. That is the pin.
Training children are never granted the store or `.ledger/sealed/` (ledger.sandbox refuses a
policy that would reach them), so neither copy is readable from the training side.

Re-sealing the same documents against the same base is a no-op. Sealing a different suite
while one is pinned is refused unless the caller passes repin=True with a reason, which the
record keeps together with what changed. The gate recomputes the hash from the files on disk at
every run, so a suite edited in place is SuiteChanged before anything is scored.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import tomllib
import uuid
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from ledger import generations, records
from ledger.artefacts import model as modellib
from ledger.artefacts import template as templatelib
from ledger.artefacts import tokenizer as toklib
from ledger.artefacts.builtin_task import turns
from ledger.errors import BadInput, Refused, StoreCorrupt
from ledger.gate import score as scorelib
from ledger.store import canonical, fsio
from ledger.store.ids import hash_bytes, hex_of
from ledger.verdicts import GateSettings, budget_key, fold_stream, suite_hash, suite_hash_payload
from ledger.verdicts.suite_hash import SUITE_HASH_FORMAT

SUITE_FORMAT = "ledger.suite/1"
SUITE_REF = "suite"
SPLITS = {"eval": "scored", "canary": "canaries"}
DOC_ID_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")
_DOC_FIELDS = {"id", "situation", "action", "outcome", "refusal"}
CANARY_PREFIX = "LEDGER-CANARY"
# The sealed folder and its files are readable by their owner only (the gate's process).
_DIR_MODE, _FILE_MODE = 0o700, 0o600


# --- documents ------------------------------------------------------------------------------------
@dataclass(frozen=True)
class SuiteDoc:
    id: str
    split: str  # "eval" or "canary"
    situation: str
    action: str
    outcome: str | None = None
    refusal: bool | None = None
    canary: str | None = None  # the suite's canary string (canary documents only)

    def body(self) -> dict:
        b = {"kind": "suite-doc", "id": self.id, "split": self.split, "situation": self.situation,
             "action": self.action}
        for k in ("outcome", "refusal", "canary"):
            if getattr(self, k) is not None:
                b[k] = getattr(self, k)
        return b

    def data(self) -> bytes:
        return canonical.dumps(self.body())

    @property
    def content_id(self) -> str:
        """The store id of the document object, which is also its content hash in the suite hash."""
        return hash_bytes(self.data())

    @property
    def content_hash(self) -> str:
        """The document's content alone (situation, action, outcome, refusal): no id, split or
        canary string. The gate budget is keyed on it, so re-pinning the same documents (a new
        canary string, renamed ids) continues their budget."""
        body = {k: getattr(self, k) for k in ("situation", "action", "outcome", "refusal")
                if getattr(self, k) is not None}
        return hash_bytes(canonical.dumps(body))

    @property
    def text(self) -> str:
        """What the contamination check compares exports against: its segments, one a line."""
        return f"{self.situation}\n{self.action}"

    @classmethod
    def from_body(cls, b: object, where: str) -> "SuiteDoc":
        if not isinstance(b, dict) or b.get("kind") != "suite-doc":
            raise BadInput(f"{where} is not a sealed suite document")
        return cls(id=b["id"], split=b["split"], situation=b["situation"], action=b["action"],
                   outcome=b.get("outcome"), refusal=b.get("refusal"), canary=b.get("canary"))


def _doc(obj: object, split: str, default_id: str | None, where: str) -> SuiteDoc:
    if not isinstance(obj, dict):
        raise BadInput(f"{where}: a document must be a JSON object, got {type(obj).__name__}")
    unknown = sorted(set(obj) - _DOC_FIELDS)
    if unknown:
        raise BadInput(f"{where}: unknown field(s) {', '.join(unknown)}",
                       f"a document has {', '.join(sorted(_DOC_FIELDS))}")
    doc_id = obj.get("id", default_id)
    if not isinstance(doc_id, str) or not DOC_ID_RE.match(doc_id):
        raise BadInput(f"{where}: document id {doc_id!r} is missing or not [A-Za-z0-9][A-Za-z0-9._-]*")
    for k in ("situation", "action"):
        if not isinstance(obj.get(k), str) or not obj[k].strip():
            raise BadInput(f"{where}: document {doc_id!r} needs a non-empty string {k!r}")
    if "outcome" in obj and not isinstance(obj["outcome"], str):
        raise BadInput(f"{where}: document {doc_id!r}: outcome must be a string")
    if "refusal" in obj and not isinstance(obj["refusal"], bool):
        raise BadInput(f"{where}: document {doc_id!r}: refusal must be true or false")
    return SuiteDoc(id=doc_id, split=split, situation=obj["situation"], action=obj["action"],
                    outcome=obj.get("outcome"), refusal=obj.get("refusal"))


def _read_split(folder: Path, split: str) -> list[SuiteDoc]:
    if not folder.is_dir():
        raise BadInput(f"suite folder has no {split}/ subfolder ({folder})",
                       "a suite is a folder with eval/ and canary/ holding JSON or JSONL documents")
    docs: list[SuiteDoc] = []
    for p in sorted(folder.iterdir()):
        where = f"{split}/{p.name}"
        if p.is_symlink() or not p.is_file():
            raise BadInput(f"{where} is not a regular file", "eval/ and canary/ hold .json and .jsonl files only")
        try:
            text = p.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as e:
            raise BadInput(f"cannot read {where}: {e}") from None
        if p.suffix == ".json":
            try:
                obj = canonical.loads(text)
            except BadInput as e:
                raise BadInput(f"{where}: {e.message}") from None
            docs.append(_doc(obj, split, p.stem, where))
        elif p.suffix == ".jsonl":
            for n, line in enumerate(text.splitlines(), 1):
                if not line.strip():
                    continue
                try:
                    obj = canonical.loads(line)
                except BadInput as e:
                    raise BadInput(f"{where} line {n}: {e.message}") from None
                if isinstance(obj, dict) and "id" not in obj:
                    raise BadInput(f"{where} line {n}: a JSONL document needs an \"id\"")
                docs.append(_doc(obj, split, None, f"{where} line {n}"))
        else:
            raise BadInput(f"{where}: unexpected file (not .json or .jsonl)",
                           "eval/ and canary/ hold documents only; move other files out of the suite")
    return docs


def _read_settings(path: Path) -> dict:
    if not path.exists():
        return {}
    try:
        raw = tomllib.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as e:
        raise BadInput(f"settings.toml is not valid TOML: {e}") from None
    if set(raw) == {"gate"} and isinstance(raw["gate"], dict):
        raw = raw["gate"]
    GateSettings.from_json(raw)  # validates: unknown keys and bad values are BadInput
    return raw


@dataclass(frozen=True)
class SuiteSource:
    """A suite folder, read and validated (before any canary string is added)."""
    scored: tuple[SuiteDoc, ...]
    canaries: tuple[SuiteDoc, ...]
    settings_overrides: dict = field(default_factory=dict)

    @property
    def settings(self) -> GateSettings:
        return GateSettings.from_json(self.settings_overrides)

    @property
    def source_hash(self) -> str:
        """Hash of the documents and settings as the user wrote them: re-sealing the same folder
        gives the same value although every seal draws a fresh canary string."""
        body = {"scored": sorted(d.content_id for d in self.scored),
                "canaries": sorted(d.content_id for d in self.canaries),
                "settings": self.settings.to_json()}
        return hash_bytes(canonical.dumps(body))


def read_suite_dir(path: str | Path) -> SuiteSource:
    root = Path(path)
    if not root.is_dir():
        raise BadInput(f"no suite folder at {root}", "give a folder with eval/ and canary/ subfolders")
    scored = _read_split(root / "eval", "eval")
    canaries = _read_split(root / "canary", "canary")
    if not scored:
        raise BadInput(f"suite {root} has no scored documents in eval/", "the gate needs at least one")
    ids = [d.id for d in scored + canaries]
    dup = sorted({i for i in ids if ids.count(i) > 1})
    if dup:
        raise BadInput(f"suite {root}: duplicate document id(s) {', '.join(dup)}",
                       "ids are unique across eval/ and canary/")
    return SuiteSource(tuple(sorted(scored, key=lambda d: d.id)), tuple(sorted(canaries, key=lambda d: d.id)),
                       _read_settings(root / "settings.toml"))


# --- the sealed suite ---------------------------------------------------------------------------------
@dataclass(frozen=True)
class SealedSuite:
    id: str  # manifest id
    manifest: dict

    @property
    def suite_hash(self) -> str:
        return self.manifest["suite_hash"]

    @property
    def base(self) -> str:
        return self.manifest["base"]

    @property
    def tokenizer(self) -> str:
        return self.manifest["tokenizer"]

    @property
    def canary_string(self) -> str:
        return self.manifest["canary_string"]

    @property
    def settings(self) -> GateSettings:
        return GateSettings.from_json(self.manifest["settings"])

    @property
    def scored_ids(self) -> list[str]:
        return sorted(self.manifest["scored"])

    @property
    def canary_ids(self) -> list[str]:
        return sorted(self.manifest["canaries"])

    @property
    def hash_payload(self) -> dict:
        return self.manifest["hash_payload"]

    def budget_key(self, store) -> str:
        """The budget key of the pinned documents (read from their objects)."""
        docs = [SuiteDoc.from_body(store.get_json(oid), oid) for oid in self.manifest["scored"].values()]
        return budget_key_of(docs, self.manifest["scorer_version"], self.tokenizer, self.base)

    def summary(self) -> dict:
        return {"manifest": self.id, "suite_hash": self.suite_hash, "scored": len(self.manifest["scored"]),
                "canaries": len(self.manifest["canaries"]), "base": self.base, "tokenizer": self.tokenizer,
                "scorer_version": self.manifest["scorer_version"],
                "budget": self.settings.budget_for(len(self.manifest["scored"]))}


def _from_manifest(oid: str, m: object) -> SealedSuite:
    if not isinstance(m, dict) or m.get("kind") != "suite" or m.get("format") != SUITE_FORMAT:
        raise BadInput(f"{oid} is not a sealed suite manifest this ledger understands")
    return SealedSuite(oid, m)


def pinned(store) -> SealedSuite | None:
    """The suite the journal pins (ref `suite`), or None when nothing was sealed."""
    oid = store.state.refs.get(SUITE_REF)
    if oid is None:
        return None
    return _from_manifest(oid, store.get_json(oid))


def require_pinned(store) -> SealedSuite:
    s = pinned(store)
    if s is None:
        raise BadInput("no suite is sealed in this store", "seal one first: `ledger seal SUITE_DIR`")
    return s


def budget_key_of(scored: Iterable[SuiteDoc], scorer_version: str, tokenizer: str, base: str) -> str:
    return budget_key([d.content_hash for d in scored], scorer_version=scorer_version,
                      tokenizer_id=tokenizer, base_weights_id=base)


def sharpness_warnings(src: SuiteSource) -> list[str]:
    """What makes this suite a blunt gate (docs/gate-ops.md, "Small suites"): too few documents, or
    documents too short for the contamination check to find a partial copy."""
    s = src.settings
    out = []
    n, k = len(src.scored), len(src.canaries)
    if n < s.small_suite_scored or k < s.small_suite_canaries:
        out.append(f"small suite: {n} scored and {k} canary documents; with 10 scored documents only "
                   f"effects of about 0.85 sd are detectable and 4 canaries can never be significant "
                   f"({s.small_suite_scored}+ scored and {s.small_suite_canaries}+ canary documents "
                   "make the gate far sharper)")
    if n <= 4:
        out.append(f"{n} scored documents: the smallest possible p-value is 1/{2 ** n}, so nothing can be accepted")
    lengths = {d.id: len(fold_stream(d.text)) for d in src.scored + src.canaries}
    unchecked = sorted(i for i, c in lengths.items() if c < s.min_doc_chars)
    whole = sorted(i for i, c in lengths.items() if s.min_doc_chars <= c < s.ngram_chars)
    if unchecked:
        out.append(f"{len(unchecked)} documents have fewer than {s.min_doc_chars} folded characters and "
                   f"cannot be checked for contamination at all: {', '.join(unchecked[:10])}"
                   + ("…" if len(unchecked) > 10 else ""))
    if whole:
        out.append(f"{len(whole)} of {len(lengths)} documents are shorter than a contamination window "
                   f"({s.ngram_chars} folded characters): only a copy of the whole document (all its "
                   "lines in one training row) is found, not a partial one")
    return out


def sealed_dir(store, manifest_id: str) -> Path:
    return store.root / "sealed" / hex_of(manifest_id)


def new_canary_string() -> str:
    # uuid4 draws from os.urandom: unguessable, so it can only be in an export by copying.
    return f"{CANARY_PREFIX} {uuid.uuid4()}"


def template_of(store, base: str) -> str:
    """The id of the chat template a base's turns are rendered with (the scorer's `for_base`): its
    manifest's pin, or the plain format's for a manifest from before templates."""
    return modellib.load_manifest(store, base).get("template") or templatelib.template_id(templatelib.PLAIN)


def _hash_payload(scored: Mapping[str, str], canaries: Mapping[str, str], tokenizer: str, template: str,
                  base: str) -> dict:
    return suite_hash_payload(scored, canaries, scorer_version=scorelib.SCORER_VERSION,
                              tokenizer_id=tokenizer, template_id=template, base_weights_id=base)


def _materialise(store, manifest_id: str, docs: Iterable[SuiteDoc]) -> Path:
    """Write the sealed plain copy (owner-only) next to the final name, then rename it in."""
    final = sealed_dir(store, manifest_id)
    parent = final.parent
    parent.mkdir(mode=_DIR_MODE, parents=True, exist_ok=True)
    os.chmod(parent, _DIR_MODE)
    tmp = parent / f".tmp-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    try:
        tmp.mkdir(mode=_DIR_MODE)
        for split in SPLITS:
            (tmp / split).mkdir(mode=_DIR_MODE)
        for d in docs:
            fsio.atomic_write(tmp / d.split / f"{d.id}.json", d.data(), store.tmp, mode=_FILE_MODE)
        for split in SPLITS:
            fsio.fsync_dir(tmp / split)
        if final.exists():
            shutil.rmtree(final)
        os.rename(tmp, final)
        fsio.fsync_dir(parent)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return final


def _default_base(store, base: str | None) -> str:
    if base is not None:
        oid = store.resolve(base)
        obj = store.get_json(oid)
        if isinstance(obj, dict) and obj.get("kind") == "generation":
            oid = obj.get("base") or ""
        modellib.load_manifest(store, oid)
        return oid
    head = generations.head(store)
    if head is not None and head.base:
        return head.base
    raise BadInput("no base weights to pin the suite against: HEAD has none",
                   "pass --base BASE (a base id or a generation), or commit a generation first")


def _changes(old: dict | None, new: dict) -> dict:
    """What differs between two suite-hash payloads (ids only, never document text)."""
    if old is None:
        return {}
    out: dict = {}
    for key in ("scored", "canaries"):
        a, b = dict(map(tuple, old[key])), dict(map(tuple, new[key]))
        ch = {"added": sorted(b.keys() - a.keys()), "removed": sorted(a.keys() - b.keys()),
              "changed": sorted(k for k in a.keys() & b.keys() if a[k] != b[k])}
        if any(ch.values()):
            out[key] = ch
    for key in ("scorer_version", "tokenizer_id", "template_id", "base_weights_id"):
        if old.get(key) != new.get(key):
            out[key] = {"pinned": old.get(key), "now": new.get(key)}
    return out


def _scored_the_same_way(suite: SealedSuite, tokenizer: str, template: str) -> bool:
    """Whether a pin was made by this hash format and scorer with this tokenizer and template: the
    same folder sealed again is then the same pin; otherwise (a pin from an older ledger, say) it
    would be SuiteChanged at every judge, so sealing it again is a re-pin."""
    p = suite.hash_payload
    return (p.get("format"), p.get("scorer_version"), p.get("tokenizer_id"), p.get("template_id")) == \
        (SUITE_HASH_FORMAT, scorelib.SCORER_VERSION, tokenizer, template)


@dataclass(frozen=True)
class SealResult:
    suite: SealedSuite
    new: bool  # False: the same suite was already pinned; nothing was written
    repinned: bool
    record: dict | None
    changes: dict
    warnings: tuple[str, ...] = ()  # sharpness_warnings: what makes this gate blunt

    def to_json(self) -> dict:
        return {**self.suite.summary(), "new": self.new, "repinned": self.repinned,
                "record": self.record["id"] if self.record else None, "changes": self.changes,
                "warnings": list(self.warnings)}


def seal(store, suite_dir: str | Path, *, base: str | None = None, repin: bool = False,
         reason: str | None = None) -> SealResult:
    """Seal the suite in `suite_dir` and pin it (one `seal` transaction), or refuse."""
    src = read_suite_dir(suite_dir)
    base_id = _default_base(store, base)
    tokenizer = modellib.load_manifest(store, base_id)["tokenizer"]
    template = template_of(store, base_id)
    if reason is not None and not reason.strip():
        raise BadInput("the re-pin reason is empty", "say why the suite changes: --reason \"...\"")
    current = pinned(store)
    warnings = tuple(sharpness_warnings(src))
    if current is not None and current.manifest.get("source_hash") == src.source_hash and current.base == base_id \
            and _scored_the_same_way(current, tokenizer, template):
        return SealResult(current, False, False, None, {}, warnings)
    if current is not None and not repin:
        raise Refused(f"a different suite is already pinned ({current.suite_hash[:19]}…); "
                      "sealing another one is an explicit re-pin",
                      "pass --repin --reason \"why the suite changes\" (the record keeps both)")
    if repin and current is not None and reason is None:
        raise BadInput("--repin needs --reason", "say why the suite changes: --reason \"...\"")

    canary = new_canary_string()
    scored = list(src.scored)
    canaries = [SuiteDoc(**{**d.__dict__, "canary": canary}) for d in src.canaries]
    payload = _hash_payload({d.id: d.content_id for d in scored}, {d.id: d.content_id for d in canaries},
                            tokenizer, template, base_id)
    h = suite_hash(payload["scored"], payload["canaries"], scorer_version=payload["scorer_version"],
                   tokenizer_id=tokenizer, template_id=template, base_weights_id=base_id)
    settings = src.settings
    changes = _changes(current.hash_payload if current else None, payload)
    with store.transaction("seal") as tx:
        if tokenizer == toklib.ByteTokenizer().id:
            # The pin names the tokenizer; make sure what it names is in the store.
            tx.put_json(toklib.ByteTokenizer().definition())
        if template == templatelib.template_id(templatelib.PLAIN):
            tx.put_json(dict(templatelib.PLAIN))  # likewise the template it names
        ids = {}
        for d in scored + canaries:
            ids[d.id] = tx.put_bytes(d.data(), "suite-doc")
            assert ids[d.id] == d.content_id
        manifest = {"kind": "suite", "format": SUITE_FORMAT, "suite_hash": h, "hash_payload": payload,
                    "scored": {d.id: ids[d.id] for d in scored}, "canaries": {d.id: ids[d.id] for d in canaries},
                    "canary_string": canary, "settings": settings.to_json(),
                    "settings_overrides": dict(sorted(src.settings_overrides.items())),
                    "scorer_version": scorelib.SCORER_VERSION, "tokenizer": tokenizer, "template": template,
                    "base": base_id, "source_hash": src.source_hash}
        mid = tx.put_json(manifest)
        _materialise(store, mid, scored + canaries)
        tx.inputs.append(base_id)
        tx.outputs.append(mid)
        tx.refs[SUITE_REF] = mid
        records.write(tx, records.Seal(suite=mid, suite_hash=h, scored=len(scored), canaries=len(canaries),
                                       repin=current is not None, reason=reason,
                                       previous=({"suite": current.id, "suite_hash": current.suite_hash}
                                                 if current is not None else None),
                                       changes=changes))
    return SealResult(_from_manifest(mid, manifest), True, current is not None, tx.record, changes, warnings)


# --- what the gate reads at judge time ---------------------------------------------------------------
@dataclass(frozen=True)
class OnDisk:
    """The sealed copy as it is on disk now: each file's content hash, and the parsed documents
    (a file that no longer parses has a hash but no document)."""
    hashes: dict  # split -> {doc id: content hash}
    docs: dict  # doc id -> SuiteDoc

    def payload(self, tokenizer: str, template: str, base: str) -> dict:
        return _hash_payload(self.hashes["eval"], self.hashes["canary"], tokenizer, template, base)


def read_sealed(store, suite: SealedSuite) -> OnDisk:
    folder = sealed_dir(store, suite.id)
    if not folder.is_dir():
        raise StoreCorrupt(f"the sealed copy of the pinned suite is missing ({folder})",
                           "`ledger seal --restore` writes it again from the pinned manifest")
    hashes: dict = {"eval": {}, "canary": {}}
    docs: dict = {}
    for split in SPLITS:
        d = folder / split
        if not d.is_dir():
            continue
        for p in sorted(d.iterdir()):
            doc_id = p.name[:-5] if p.name.endswith(".json") else p.name
            if p.is_symlink() or not p.is_file():
                hashes[split][doc_id] = "not-a-regular-file"
                continue
            data = p.read_bytes()
            hashes[split][doc_id] = hash_bytes(data)
            try:
                docs[doc_id] = SuiteDoc.from_body(canonical.loads(data), f"sealed {split}/{p.name}")
            except (BadInput, KeyError, TypeError):
                pass  # its hash no longer matches the pin, so the gate stops before scoring
    return OnDisk(hashes, docs)


def recompute(store, suite: SealedSuite, *, base: str, tokenizer: str,
              template: str | None = None) -> tuple[str, dict, OnDisk]:
    """The suite hash of what is on disk now, scored by this scorer with this base, tokenizer and
    chat template (default: the one `base` pins, which the scorer renders with), plus what changed
    against the pin (empty when nothing did)."""
    template = template or template_of(store, base)
    disk = read_sealed(store, suite)
    raw = {"format": suite.hash_payload.get("format"),
           "scored": sorted(map(list, disk.hashes["eval"].items())),
           "canaries": sorted(map(list, disk.hashes["canary"].items())),
           "scorer_version": scorelib.SCORER_VERSION, "tokenizer_id": tokenizer, "template_id": template,
           "base_weights_id": base}
    try:
        payload = disk.payload(tokenizer, template, base)
        h = suite_hash(payload["scored"], payload["canaries"], scorer_version=payload["scorer_version"],
                       tokenizer_id=tokenizer, template_id=template, base_weights_id=base)
    except BadInput:
        # An emptied eval/ or an id in both splits is not a valid suite: it is a changed one.
        # Its hash is still well defined (and cannot equal a valid suite's pinned hash).
        payload, h = raw, "invalid:" + hash_bytes(canonical.dumps(raw))
    return h, _changes(suite.hash_payload, payload), disk


def restore(store) -> Path:
    """Write the pinned suite's sealed copy again from its objects (e.g. after a restore from a
    bundle, which carries objects but not `.ledger/sealed/`). A cache repair: no journal record."""
    suite = require_pinned(store)
    docs = []
    for split, key in SPLITS.items():
        for doc_id, oid in sorted(suite.manifest[key].items()):
            d = SuiteDoc.from_body(store.get_json(oid), oid)
            if d.id != doc_id or d.split != split:
                raise StoreCorrupt(f"suite manifest {suite.id} names {oid} as {split}/{doc_id}, but it is not")
            docs.append(d)
    with store.locked():
        return _materialise(store, suite.id, docs)


# --- writing suite folders (tests, benchmarks, the demo) ---------------------------------------------
def write_suite_dir(dest: str | Path, scored: Iterable[Mapping], canaries: Iterable[Mapping],
                    settings: Mapping | None = None) -> Path:
    """Write a suite folder: one NAME.json per document ({"id", "situation", "action", ...})."""
    root = Path(dest)
    for split, docs in (("eval", scored), ("canary", canaries)):
        (root / split).mkdir(parents=True, exist_ok=True)
        for d in docs:
            d = dict(d)
            _doc(d, split, None, f"{split} document")
            (root / split / f"{d['id']}.json").write_text(json.dumps(d, sort_keys=True, ensure_ascii=False) + "\n")
    if settings:
        lines = [f"{k} = {json.dumps(v)}" for k, v in sorted(settings.items())]
        (root / "settings.toml").write_text("\n".join(lines) + "\n")
    return root


def demo_docs(n_scored: int = 10, n_canary: int = 4, seed: int = 0) -> tuple[list[dict], list[dict]]:
    """The built-in task's eval and canary splits as suite documents (disjoint from training)."""

    def docs(split, prefix, n):
        return [{"id": f"{prefix}{i:03d}", "situation": t.situation, "action": t.action, "outcome": t.outcome,
                 "refusal": t.refusal} for i, t in enumerate(turns(split, n, seed))]

    return docs("eval", "s", n_scored), docs("canary", "k", n_canary)


def write_demo_suite(dest: str | Path, n_scored: int = 10, n_canary: int = 4, seed: int = 0) -> Path:
    scored, canaries = demo_docs(n_scored, n_canary, seed)
    return write_suite_dir(dest, scored, canaries)
