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

from ledger.errors import BadInput

# Apostrophe-like characters are deleted rather than split on; everything else that is not a
# letter or digit separates tokens ([^\W_] is "word character except underscore").
_APOSTROPHES = str.maketrans("", "", "'\u2019\u02bc\u2018`\u00b4")
_TOKEN = re.compile(r"[^\W_]+")

CANARY_STRING_IN_EXPORT = "canary_string_in_export"
NGRAM_OVERLAP = "ngram_overlap"

# How many training-row keys a report lists for the canary string (the count is always exact).
_MAX_LISTED_ROWS = 20


def fold_tokens(text: str) -> list[str]:
    """Case- and punctuation-folded, whitespace-normalised tokens of `text`."""
    t = unicodedata.normalize("NFKC", text).casefold().translate(_APOSTROPHES)
    return _TOKEN.findall(t)


def fold_text(text: str) -> str:
    return " ".join(fold_tokens(text))


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

    # Index the suite. Tokens become small ints, and a window of the export is looked up only if
    # every token in it occurs somewhere in the suite: export text is split at unknown tokens,
    # and runs shorter than n are skipped without building a single tuple. On ordinary text most
    # windows contain some word the suite never uses, so the work is close to one pass.
    vocab: dict[str, int] = {}
    index: dict[tuple[int, ...], list[str]] = {}
    unchecked: list[str] = []
    for doc_id in sorted(suite_texts):
        text = suite_texts[doc_id]
        if not isinstance(text, str):
            raise BadInput(f"suite document {doc_id!r} is not text (got {type(text).__name__})")
        ids = [vocab.setdefault(t, len(vocab)) for t in fold_tokens(text)]
        if len(ids) < n:
            unchecked.append(doc_id)
            continue
        for g in {tuple(ids[i:i + n]) for i in range(len(ids) - n + 1)}:
            index.setdefault(g, []).append(doc_id)
    inverse = {i: t for t, i in vocab.items()}

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
        if not index:
            continue
        docs_here: set[str] = set()
        run: list[int] = []
        for tok in tokens + [None]:  # sentinel flushes the last run
            tid = vocab.get(tok) if tok is not None else None
            if tid is not None:
                run.append(tid)
                continue
            if len(run) >= n:
                for i in range(len(run) - n + 1):
                    g = tuple(run[i:i + n])
                    hit_docs = index.get(g)
                    if hit_docs:
                        for doc_id in hit_docs:
                            if doc_id not in first:
                                first[doc_id] = (key, g)
                            docs_here.add(doc_id)
            run = []
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
