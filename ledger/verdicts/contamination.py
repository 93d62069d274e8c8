"""Contamination: did the training export see the sealed suite?

The trainer never sees the suite, so it cannot check this; the gate can, because it holds both
sides. Two checks (GATE.md rule 2):

- the suite's canary string appears in a training row (verbatim, or after folding), and
- a training row shares an n-gram (default 13 tokens) of *folded* text with a suite document.

Folding makes trivial rewrites (case, punctuation, spacing, Unicode look-alikes) irrelevant:
NFKC normalisation, Unicode case folding, apostrophes deleted (so "don't" and "dont" agree),
every other non-alphanumeric character a separator. 13 tokens is long enough that ordinary
shared phrases ("i will now act on the ...") do not trigger, and short enough that a pasted
sentence of a suite document does.
"""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

import numpy as np

from ledger.errors import BadInput

# Apostrophe-like characters are deleted rather than split on, and "_" (a word character to
# the regex engine) becomes a separator; then every run of word characters is a token.
# (\w+ after a translate is markedly faster than the equivalent class [^\W_]+.)
_FOLD_TABLE = str.maketrans({**{c: None for c in "'\u2019\u02bc\u2018`\u00b4"}, "_": " "})
_TOKEN = re.compile(r"\w+")

CANARY_STRING_IN_EXPORT = "canary_string_in_export"
NGRAM_OVERLAP = "ngram_overlap"

# How many training-row keys a report lists for the canary string (the count is always exact).
_MAX_LISTED_ROWS = 20


def fold_tokens(text: str) -> list[str]:
    """Case- and punctuation-folded, whitespace-normalised tokens of `text`."""
    t = unicodedata.normalize("NFKC", text).casefold().translate(_FOLD_TABLE)
    return _TOKEN.findall(t)


def fold_text(text: str) -> str:
    return " ".join(fold_tokens(text))


_HASH_MULTIPLIER = np.uint64(0x100000001B3)  # the 64-bit FNV prime; any large odd constant works


def _window_hashes(ids: np.ndarray, n: int, stride: int = 1) -> np.ndarray:
    """Polynomial hash (mod 2^64, wrapping) of the n-token windows starting every `stride`
    tokens of `ids`. uint64 array arithmetic wraps silently, which is what a hash wants."""
    starts = (ids.size - n) // stride + 1
    h = np.zeros(starts, dtype=np.uint64)
    for j in range(n):
        h = h * _HASH_MULTIPLIER + ids[j:j + (starts - 1) * stride + 1:stride]
    return h


def ngrams(tokens: list[str], n: int = 13) -> set[tuple[str, ...]]:
    """All contiguous n-token windows; empty when there are fewer than n tokens."""
    return {tuple(tokens[i:i + n]) for i in range(len(tokens) - n + 1)}


@dataclass(frozen=True)
class NgramOverlap:
    doc_id: str  # the suite document
    first_row: str | int  # the first training row that shares an n-gram with it
    rows: int  # how many training rows share at least one n-gram with it
    example: str  # one shared n-gram, folded (suite text: keep it in the sealed record)

    def to_json(self, *, include_example: bool = True) -> dict:
        out = {"doc_id": self.doc_id, "first_row": self.first_row, "rows": self.rows}
        if include_example:
            out["example"] = self.example
        return out


@dataclass(frozen=True)
class ContaminationReport:
    ngram_n: int
    training_rows: int
    suite_docs: int
    canary_string_checked: bool  # False when no canary string was given
    canary_string_found: bool
    canary_rows: tuple[str | int, ...]  # the first rows containing it (at most 20 listed)
    canary_row_count: int
    overlaps: tuple[NgramOverlap, ...]  # one per contaminated suite document, by doc id
    unchecked_docs: tuple[str, ...]  # suite documents with fewer than ngram_n tokens

    @property
    def contaminated(self) -> bool:
        return self.canary_string_found or bool(self.overlaps)

    @property
    def reason_codes(self) -> tuple[str, ...]:
        codes = []
        if self.canary_string_found:
            codes.append(CANARY_STRING_IN_EXPORT)
        if self.overlaps:
            codes.append(NGRAM_OVERLAP)
        return tuple(codes)

    def to_json(self, *, include_examples: bool = True) -> dict:
        return {
            "ngram_n": self.ngram_n, "training_rows": self.training_rows,
            "suite_docs": self.suite_docs, "contaminated": self.contaminated,
            "reason_codes": list(self.reason_codes),
            "canary_string": {"checked": self.canary_string_checked,
                              "found": self.canary_string_found,
                              "rows": list(self.canary_rows), "row_count": self.canary_row_count},
            "ngram_overlaps": [o.to_json(include_example=include_examples) for o in self.overlaps],
            "unchecked_docs": list(self.unchecked_docs),
        }


def _rows(training_texts: Iterable[str] | Mapping[str, str]) -> Iterable[tuple[str | int, str]]:
    items = training_texts.items() if isinstance(training_texts, Mapping) else enumerate(training_texts)
    for key, text in items:
        if not isinstance(text, str):
            raise BadInput(f"training row {key!r} is not text (got {type(text).__name__})")
        yield key, text


def check_contamination(training_texts: Iterable[str] | Mapping[str, str],
                        suite_texts: Mapping[str, str], canary_string: str | None,
                        *, n: int = 13) -> ContaminationReport:
    """Check a training export against the suite (S and K together, doc id -> text).

    `training_texts` is an iterable of row texts (rows are named by position) or a mapping of
    row id -> text; it is consumed once, so a generator over a large export is fine.
    """
    if not isinstance(n, int) or isinstance(n, bool) or n < 1:
        raise BadInput(f"n-gram length must be a positive integer, got {n!r}")
    if not isinstance(suite_texts, Mapping):
        raise BadInput("suite texts must be a mapping of doc id -> text")
    if canary_string is not None and (not isinstance(canary_string, str) or not canary_string.strip()):
        raise BadInput("the canary string must be non-empty text (or None when the suite has none)")

    # Index the suite. Tokens become small ints, and every n-token window gets a 64-bit
    # polynomial hash computed with numpy (n vectorised multiply-adds per row instead of a
    # Python tuple per window). Only windows whose hash is a suite hash are then compared
    # exactly, as tuples, so a hash collision can never report an overlap that is not there.
    vocab: dict[str, int] = {}
    index: dict[tuple[int, ...], list[str]] = {}
    unchecked: list[str] = []
    for doc_id in sorted(suite_texts):
        text = suite_texts[doc_id]
        if not isinstance(doc_id, str):
            raise BadInput(f"suite doc id must be a string, got {doc_id!r}")
        if not isinstance(text, str):
            raise BadInput(f"suite document {doc_id!r} is not text (got {type(text).__name__})")
        ids = [vocab.setdefault(t, len(vocab)) for t in fold_tokens(text)]
        if len(ids) < n:
            unchecked.append(doc_id)
            continue
        for g in {tuple(ids[i:i + n]) for i in range(len(ids) - n + 1)}:
            index.setdefault(g, []).append(doc_id)
    inverse = {i: t for t, i in vocab.items()}
    suite_hashes = set(_window_hashes(np.array(list(index), dtype=np.uint64).reshape(-1, n)
                                      .ravel(), n, stride=n).tolist()) if index else set()
    unknown = len(vocab)  # one id for every token the suite never uses: it is in no suite n-gram

    canary_folded = fold_text(canary_string) if canary_string is not None else ""
    canary_rows: list[str | int] = []
    canary_count = 0
    first: dict[str, tuple[str | int, tuple[int, ...]]] = {}
    row_counts: dict[str, int] = {}
    rows = 0

    for key, text in _rows(training_texts):
        rows += 1
        tokens = fold_tokens(text)
        if canary_string is not None:
            # Verbatim, or folded with token boundaries on both sides (so a canary "abc 123"
            # does not match inside "xabc 1234").
            hit = canary_string in text or (
                bool(canary_folded) and f" {canary_folded} " in f" {' '.join(tokens)} ")
            if hit:
                canary_count += 1
                if len(canary_rows) < _MAX_LISTED_ROWS:
                    canary_rows.append(key)
        if not index or len(tokens) < n:
            continue
        ids = [vocab.get(t, unknown) for t in tokens]
        hashes = _window_hashes(np.array(ids, dtype=np.uint64), n).tolist()
        if suite_hashes.isdisjoint(hashes):
            continue
        docs_here: set[str] = set()
        for i, h in enumerate(hashes):
            if h in suite_hashes:
                g = tuple(ids[i:i + n])
                for doc_id in index.get(g, ()):
                    if doc_id not in first:
                        first[doc_id] = (key, g)
                    docs_here.add(doc_id)
        for doc_id in docs_here:
            row_counts[doc_id] = row_counts.get(doc_id, 0) + 1

    overlaps = tuple(
        NgramOverlap(doc_id=doc_id, first_row=first[doc_id][0], rows=row_counts[doc_id],
                     example=" ".join(inverse[i] for i in first[doc_id][1]))
        for doc_id in sorted(first))
    return ContaminationReport(
        ngram_n=n, training_rows=rows, suite_docs=len(suite_texts),
        canary_string_checked=canary_string is not None,
        canary_string_found=canary_count > 0, canary_rows=tuple(canary_rows),
        canary_row_count=canary_count, overlaps=overlaps, unchecked_docs=tuple(unchecked))
