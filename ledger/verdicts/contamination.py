"""Contamination: did the training export see the sealed suite?

The trainer never sees the suite, so it cannot check this; the gate can, because it holds both
sides. Two checks (docs/gate.md, rule 2), on *folded* text:

- the suite's canary string appears in a training row (any window of `canary_window` folded
  characters of it: a copy that was cut, spaced out or disguised still carries one), and
- a training row holds a suite document: it shares a window of `window` folded characters with
  the document, or it holds every segment (line: situation, action) of the document close
  together. The second form checks documents shorter than a window (13 of the demo suite's 14),
  and catches a document re-rendered through another template (text put between or around its
  situation and action).

Folding makes disguises irrelevant. In order: NFKC; look-alike characters mapped to the ASCII
letter they imitate (`confusables.json`: Cyrillic, Greek, Armenian, Cherokee, Latin small
capitals); Unicode case folding; canonical decomposition with every combining mark, format
character (Cf: U+00AD, zero-width spaces and joiners, tag characters) and control character (Cc)
removed, and the blank letters of `confusables.json` (Hangul fillers, the blank braille
pattern) too; apostrophes deleted ("don't" = "dont"); every other non-alphanumeric character a
separator. Tokens are the runs between separators; the *stream* of a text is its tokens joined
with nothing between them, so spacing, punctuation and line breaks inserted into a copied text
do not hide it either.

Text every training row shares by construction (a chat template's fixed parts, a system
prompt) is not evidence: `shared_text` lists it, and its folded tokens are cut out of rows and
documents before anything is compared, so a template neither triggers the check nor, sitting
between a document's situation and action, hides a copy.
"""

from __future__ import annotations

import bisect
import json
import re
import unicodedata
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from importlib import resources

import numpy as np

from ledger.errors import BadInput

CANARY_STRING_IN_EXPORT = "canary_string_in_export"
NGRAM_OVERLAP = "ngram_overlap"

# How many training-row keys a report lists for the canary string (the count is always exact).
_MAX_LISTED_ROWS = 20
# Rows are compared a chunk at a time: the chunk's streams are joined into one string (one
# str.find / one numpy pass per document instead of one per row) and memory stays bounded.
_CHUNK_CHARS = 1 << 21
_ROW_SEP = "\x00"  # never in a stream (streams hold letters and digits only)


def _load_table() -> tuple[dict[int, str | None], int]:
    data = json.loads(resources.files("ledger.verdicts").joinpath("confusables.json").read_text("utf-8"))
    table: dict[int, str | None] = {int(cp, 16): ascii_ for cp, ascii_, _name in data["map"]}
    table.update({int(cp, 16): None for cp, _name in data["invisible"]})
    return table, len(data["map"])


_CONFUSABLES, _ = _load_table()
# Combining marks, format and control characters: removed (after NFKD, so "é" becomes "e").
_DROP = frozenset(("Mn", "Me", "Cf", "Cc"))
_NON_ASCII = re.compile(r"[^\x00-\x7f]+")
# Apostrophe-like characters are deleted rather than split on, and "_" (a word character to
# the regex engine) becomes a separator; then every run of word characters is a token.
_FOLD_TABLE = str.maketrans({**{c: None for c in "'\u2019\u02bc\u2018`\u00b4"}, "_": " "})
_TOKEN = re.compile(r"\w+")


def _fold_run(m: re.Match) -> str:
    # Only non-ASCII runs take the slow path; ASCII text (almost all of it) is only lowercased.
    # The table is applied before NFKC too: NFKC turns some look-alikes into other letters
    # (lunate sigma ϲ into σ) before the table would see them.
    t = unicodedata.normalize("NFKC", m.group().translate(_CONFUSABLES)).translate(_CONFUSABLES).casefold()
    t = "".join(c for c in unicodedata.normalize("NFKD", t) if unicodedata.category(c) not in _DROP)
    # Decomposition can expose a base letter that is itself a look-alike (Cyrillic й = и + ̆).
    return t.translate(_CONFUSABLES)


def _fold(text: str) -> str:
    # ASCII control characters are not word characters, so the token regex drops them.
    return _NON_ASCII.sub(_fold_run, text).lower().translate(_FOLD_TABLE)


def fold_tokens(text: str) -> list[str]:
    """Folded tokens of `text` (see the module docstring)."""
    return _TOKEN.findall(_fold(text))


def fold_text(text: str) -> str:
    """Text as the contamination check compares it: NFKC, confusables, case, no format/control characters."""
    return " ".join(fold_tokens(text))


def fold_stream(text: str) -> str:
    """The folded tokens joined with nothing between them: what the checks compare."""
    return "".join(fold_tokens(text))


def ngrams(tokens: list[str], n: int = 13) -> set[tuple[str, ...]]:
    """All contiguous n-token windows; empty when there are fewer than n tokens."""
    return {tuple(tokens[i:i + n]) for i in range(len(tokens) - n + 1)}


class _Shared:
    """Folded token sequences of the shared text, cut out of a token list in one pass."""

    def __init__(self, texts: Sequence[str]):
        by_first: dict[str, list[list[str]]] = {}
        for t in texts:
            seq = fold_tokens(t)
            if seq:
                by_first.setdefault(seq[0], []).append(seq)
        for seqs in by_first.values():
            seqs.sort(key=len, reverse=True)  # longest first: "system prompt" before "system"
        self.by_first = by_first

    def cut(self, tokens: list[str]) -> list[str]:
        if not self.by_first:
            return tokens
        out, i, n = [], 0, len(tokens)
        while i < n:
            for seq in self.by_first.get(tokens[i], ()):
                if tokens[i:i + len(seq)] == seq:
                    i += len(seq)
                    break
            else:
                out.append(tokens[i])
                i += 1
        return out

    def stream(self, text: str) -> str:
        return "".join(self.cut(fold_tokens(text)))


_HASH_MULTIPLIER = np.uint64(0x100000001B3)  # the 64-bit FNV prime; any large odd constant works


def _codes(s: str) -> np.ndarray:
    return np.frombuffer(s.encode("utf-32-le"), dtype="<u4").astype(np.uint64)


def _window_hashes(codes: np.ndarray, n: int) -> np.ndarray:
    """Polynomial hash (mod 2^64, wrapping) of every n-character window of `codes`.
    uint64 array arithmetic wraps silently, which is what a hash wants."""
    starts = codes.size - n + 1
    if starts <= 0:
        return np.zeros(0, dtype=np.uint64)
    h = np.zeros(starts, dtype=np.uint64)
    for j in range(n):
        h = h * _HASH_MULTIPLIER + codes[j:j + starts]
    return h


@dataclass(frozen=True)
class NgramOverlap:
    """One piece of suite text found in a training row: which document, which row, what matched."""
    doc_id: str  # the suite document
    first_row: str | int  # the first training row that holds it
    rows: int  # how many training rows hold it
    # How: "window" (a shared window of folded characters) or "segments" (every segment of the
    # document close together in one row).
    how: str
    example: str  # the shared folded text (suite text: it stays in the sealed record)

    def to_json(self, *, include_example: bool = True) -> dict:
        out = {"doc_id": self.doc_id, "first_row": self.first_row, "rows": self.rows, "how": self.how}
        if include_example:
            out["example"] = self.example
        return out


@dataclass(frozen=True)
class ContaminationReport:
    """What the contamination check found in a training export (canary string, overlaps)."""
    window: int  # folded characters in a shared window
    min_doc_chars: int  # documents with fewer folded characters are not checked
    canary_window: int
    training_rows: int
    suite_docs: int
    shared_texts: int  # how many shared (boilerplate) texts were cut out before comparing
    canary_string_checked: bool  # False when no canary string was given
    canary_string_found: bool
    canary_rows: tuple[str | int, ...]  # the first rows containing it (at most 20 listed)
    canary_row_count: int
    overlaps: tuple[NgramOverlap, ...]  # one per contaminated suite document, by doc id
    unchecked_docs: tuple[str, ...]  # fewer than min_doc_chars folded characters: not checked
    whole_only_docs: tuple[str, ...]  # shorter than a window: checked as a whole (segments)

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
            "window_chars": self.window, "min_doc_chars": self.min_doc_chars,
            "canary_window": self.canary_window, "training_rows": self.training_rows,
            "suite_docs": self.suite_docs, "shared_texts": self.shared_texts,
            "contaminated": self.contaminated, "reason_codes": list(self.reason_codes),
            "canary_string": {"checked": self.canary_string_checked,
                              "found": self.canary_string_found,
                              "rows": list(self.canary_rows), "row_count": self.canary_row_count},
            "ngram_overlaps": [o.to_json(include_example=include_examples) for o in self.overlaps],
            "unchecked_docs": list(self.unchecked_docs),
            "whole_only_docs": list(self.whole_only_docs),
        }


def _rows(training_texts) -> Iterator[tuple[str | int, str]]:
    """(key, text) of each row: a mapping's items; else each element is a text (named by its
    position) or a (key, text) pair."""
    if isinstance(training_texts, Mapping):
        items: Iterable = training_texts.items()
    else:
        items = ((item if isinstance(item, tuple) and len(item) == 2 else (i, item))
                 for i, item in enumerate(training_texts))
    for key, text in items:
        if not isinstance(text, str):
            raise BadInput(f"training row {key!r} is not text (got {type(text).__name__})")
        yield key, text


@dataclass(frozen=True)
class _Doc:
    id: str
    stream: str
    segments: tuple[str, ...]  # folded segment streams, rarest-first order decided per chunk


def _segments(text: str | Sequence[str]) -> list[str]:
    # A document is its segments (situation, action): a str is split at its line breaks.
    return text.splitlines() if isinstance(text, str) else list(text)


def _positions(hay: str, needle: str) -> Iterator[int]:
    i = hay.find(needle)
    while i >= 0:
        yield i
        i = hay.find(needle, i + 1)


class _Matcher:
    """The suite, indexed once; `chunk` compares one chunk of training rows against it."""

    def __init__(self, docs: list[_Doc], window: int, canary: str | None, canary_window: int):
        self.window = window
        self.docs = docs
        self.index: dict[str, list[str]] = {}  # window text -> doc ids
        for d in docs:
            for i in range(len(d.stream) - window + 1):
                ids = self.index.setdefault(d.stream[i:i + window], [])
                if not ids or ids[-1] != d.id:
                    ids.append(d.id)
        # Every window of a document hashed in one numpy pass per document.
        self.hashes = (np.unique(np.concatenate([_window_hashes(_codes(d.stream), window) for d in docs]))
                       if self.index else np.zeros(0, dtype=np.uint64))
        self.canary_pieces: list[str] = []
        if canary:
            n = min(canary_window, len(canary))
            self.canary_pieces = sorted({canary[i:i + n] for i in range(len(canary) - n + 1)})

    def chunk(self, joined: str, starts: list[int]) -> tuple[dict[str, dict[int, tuple[str, str]]], set[int]]:
        """{doc id: {row ordinal in chunk: (how, shared text)}}, rows holding the canary."""
        def row_of(pos: int) -> int:
            return bisect.bisect_right(starts, pos) - 1

        found: dict[str, dict[int, tuple[str, str]]] = {}
        if self.hashes.size:
            h = _window_hashes(_codes(joined), self.window)
            for pos in np.flatnonzero(np.isin(h, self.hashes)).tolist():
                # Exact comparison: a hash collision never reports an overlap that is not there.
                w = joined[pos:pos + self.window]
                for doc_id in self.index.get(w, ()):
                    found.setdefault(doc_id, {}).setdefault(row_of(pos), ("window", w))
        ends = [s - 1 for s in starts[1:]] + [len(joined)]
        for d in self.docs:
            segs = [s for s in d.segments if s]
            if not segs or any(s not in joined for s in segs):
                continue
            # Anchor on the rarest segment; the others must be within the document's length
            # plus a window of it (room for a template around or between them), in one row.
            segs.sort(key=joined.count)
            anchor, rest, span = segs[0], segs[1:], len(d.stream) + self.window
            for pos in _positions(joined, anchor):
                r = row_of(pos)
                near = joined[max(starts[r], pos - span):min(ends[r], pos + len(anchor) + span)]
                if all(s in near for s in rest):
                    found.setdefault(d.id, {}).setdefault(r, ("segments", d.stream))
        canary_rows = {row_of(p) for piece in self.canary_pieces for p in _positions(joined, piece)}
        return found, canary_rows


def check_contamination(training_texts: Iterable[str] | Mapping[str, str],
                        suite_texts: Mapping[str, str | Sequence[str]], canary_string: str | None,
                        *, window: int = 50, min_doc_chars: int = 16, canary_window: int = 24,
                        shared_text: Sequence[str] = ()) -> ContaminationReport:
    """Check a training export against the suite (S and K together, doc id -> text).

    A document's text is a str (its lines are its segments: situation, action) or a sequence
    of segments. `training_texts` is an iterable of row texts (rows are named by position) or
    a mapping of row id -> text; it is consumed once, so a generator over a large export is
    fine. `shared_text`: text every row holds by construction (a chat template's fixed parts),
    cut out of rows and documents before comparing.
    """
    for name, v, lo in (("window", window, 1), ("min_doc_chars", min_doc_chars, 1),
                        ("canary_window", canary_window, 8)):
        if not isinstance(v, int) or isinstance(v, bool) or v < lo:
            raise BadInput(f"contamination {name} must be an integer >= {lo}, got {v!r}")
    if not isinstance(suite_texts, Mapping):
        raise BadInput("suite texts must be a mapping of doc id -> text")
    if canary_string is not None and (not isinstance(canary_string, str) or not canary_string.strip()):
        raise BadInput("the canary string must be non-empty text (or None when the suite has none)")
    if isinstance(shared_text, str) or not all(isinstance(t, str) for t in shared_text):
        raise BadInput("shared_text must be a list of strings (the template's fixed parts)")
    shared = _Shared(list(shared_text))

    docs: list[_Doc] = []
    unchecked: list[str] = []
    whole_only: list[str] = []
    for doc_id in sorted(suite_texts, key=str):
        if not isinstance(doc_id, str):
            raise BadInput(f"suite doc id must be a string, got {doc_id!r}")
        text = suite_texts[doc_id]
        segs = _segments(text) if isinstance(text, (str, list, tuple)) else None
        if segs is None or not all(isinstance(s, str) for s in segs):
            raise BadInput(f"suite document {doc_id!r} is not text (got {type(text).__name__})")
        seg_streams = tuple(shared.stream(s) for s in segs)
        stream = "".join(seg_streams)
        if len(stream) < min_doc_chars:
            unchecked.append(doc_id)
            continue
        if len(stream) < window:
            whole_only.append(doc_id)
        docs.append(_Doc(doc_id, stream, seg_streams))

    canary_stream = shared.stream(canary_string) if canary_string is not None else None
    matcher = _Matcher(docs, window, canary_stream, canary_window)
    first: dict[str, tuple[int, str | int, tuple[str, str]]] = {}
    row_counts: dict[str, int] = {}
    canary_rows: list[str | int] = []
    canary_count = 0
    rows = 0

    def flush(keys: list, streams: list[str], raw_canary_hits: set[int], base: int) -> None:
        nonlocal canary_count
        if not keys:
            return
        starts, pos = [], 0
        for s in streams:
            starts.append(pos)
            pos += len(s) + 1
        found, canary_hits = matcher.chunk(_ROW_SEP.join(streams), starts)
        for doc_id, hits in found.items():
            row_counts[doc_id] = row_counts.get(doc_id, 0) + len(hits)
            r = min(hits)
            if doc_id not in first or base + r < first[doc_id][0]:
                first[doc_id] = (base + r, keys[r], hits[r])
        for r in sorted(canary_hits | raw_canary_hits):
            canary_count += 1
            if len(canary_rows) < _MAX_LISTED_ROWS:
                canary_rows.append(keys[r])

    keys: list = []
    streams: list[str] = []
    raw_hits: set[int] = set()
    size, base = 0, 0
    for key, text in _rows(training_texts):
        if canary_string is not None and canary_string in text:
            raw_hits.add(len(keys))  # verbatim, whatever folding makes of its surroundings
        s = shared.stream(text)
        keys.append(key)
        streams.append(s)
        rows += 1
        size += len(s) + 1
        if size >= _CHUNK_CHARS:
            flush(keys, streams, raw_hits, base)
            base += len(keys)
            keys, streams, raw_hits, size = [], [], set(), 0
    flush(keys, streams, raw_hits, base)

    overlaps = tuple(NgramOverlap(doc_id=doc_id, first_row=first[doc_id][1], rows=row_counts[doc_id],
                                  how=first[doc_id][2][0], example=first[doc_id][2][1])
                     for doc_id in sorted(first))
    return ContaminationReport(
        window=window, min_doc_chars=min_doc_chars, canary_window=canary_window,
        training_rows=rows, suite_docs=len(suite_texts), shared_texts=len(shared_text),
        canary_string_checked=canary_string is not None,
        canary_string_found=canary_count > 0, canary_rows=tuple(canary_rows),
        canary_row_count=canary_count, overlaps=overlaps, unchecked_docs=tuple(unchecked),
        whole_only_docs=tuple(whole_only))
