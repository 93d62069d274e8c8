"""The suite hash: one id for "the same suite, scored the same way".

It covers everything that could change a document's score without the candidate changing: which
documents are scored (S) and which are canaries (K), each document's content, the scorer version
(e.g. how the action span is cut out), the tokenizer, the chat template and the base weights. If
any of them differs from the pinned hash the gate answers SuiteChanged before scoring anything.
The template is named directly, not only through the base manifest that pins it: a suite's hash
says by itself which rendering its documents were scored under.

The hashed form is canonical JSON (sorted keys, no insignificant whitespace, UTF-8, no NaN; the
same rules as the store's structured objects) of sorted (doc id, content hash) pairs, so the hash
depends on neither the order documents were listed in nor the machine.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping

import blake3

from ledger.errors import BadInput

# Part of the hashed object: a future change to what the hash covers must change every hash.
SUITE_HASH_FORMAT = "ledger.suite-hash/2"  # /2: the chat template's id is covered


def canonical_json(obj: object) -> bytes:
    """Canonical JSON bytes (sorted keys, compact, UTF-8) for hashing."""
    try:
        return json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=False,
                          allow_nan=False).encode("utf-8")
    except (TypeError, ValueError) as e:
        raise BadInput(f"not canonical-JSON serialisable: {e}") from None


def b3(data: bytes) -> str:
    """`b3:` + the BLAKE3 hex digest of `data`."""
    return "b3:" + blake3.blake3(data).hexdigest()


def content_hash(text: str) -> str:
    """Content hash of a suite document's text (UTF-8), in the store's id format."""
    if not isinstance(text, str):
        raise BadInput(f"document content must be text, got {type(text).__name__}")
    return b3(text.encode("utf-8"))


def _pairs(name: str, docs: Mapping[str, str] | Iterable[tuple[str, str]]) -> list[list[str]]:
    items = list(docs.items()) if isinstance(docs, Mapping) else list(docs)
    seen: set[str] = set()
    out = []
    for item in items:
        if not (isinstance(item, (tuple, list)) and len(item) == 2):
            raise BadInput(f"{name}: expected (doc id, content hash) pairs, got {item!r}")
        doc_id, h = item
        if not isinstance(doc_id, str) or not doc_id:
            raise BadInput(f"{name}: doc id must be a non-empty string, got {doc_id!r}")
        if not isinstance(h, str) or not h:
            raise BadInput(f"{name}: content hash of {doc_id!r} must be a non-empty string")
        if doc_id in seen:
            raise BadInput(f"{name}: duplicate doc id {doc_id!r}")
        seen.add(doc_id)
        out.append([doc_id, h])
    out.sort()
    return out


def suite_hash_payload(scored: Mapping[str, str] | Iterable[tuple[str, str]],
                       canaries: Mapping[str, str] | Iterable[tuple[str, str]], *,
                       scorer_version: str, tokenizer_id: str, template_id: str, base_weights_id: str) -> dict:
    """The object that is hashed (exposed so a re-pin record can show what changed)."""
    s = _pairs("scored documents", scored)
    k = _pairs("canary documents", canaries)
    both = {d for d, _ in s} & {d for d, _ in k}
    if both:
        raise BadInput(f"documents both scored and canary: {', '.join(sorted(both))}")
    if not s:
        raise BadInput("a suite needs at least one scored document")
    for name, v in (("scorer_version", scorer_version), ("tokenizer_id", tokenizer_id),
                    ("template_id", template_id), ("base_weights_id", base_weights_id)):
        if not isinstance(v, str) or not v:
            raise BadInput(f"{name} must be a non-empty string, got {v!r}")
    return {"format": SUITE_HASH_FORMAT, "scored": s, "canaries": k,
            "scorer_version": scorer_version, "tokenizer_id": tokenizer_id, "template_id": template_id,
            "base_weights_id": base_weights_id}


def suite_hash(scored: Mapping[str, str] | Iterable[tuple[str, str]],
               canaries: Mapping[str, str] | Iterable[tuple[str, str]], *,
               scorer_version: str, tokenizer_id: str, template_id: str, base_weights_id: str) -> str:
    """`b3:<hex>` over the canonical JSON of `suite_hash_payload`. Doc ids map to content hashes
    (use `content_hash(text)` or the store's object id of the document)."""
    return b3(canonical_json(suite_hash_payload(
        scored, canaries, scorer_version=scorer_version, tokenizer_id=tokenizer_id, template_id=template_id,
        base_weights_id=base_weights_id)))
