"""Plain-text tables that stay readable at 80 columns and in pipes.

rich's tables squeeze every column to fit and cut words mid-way (a note column of 6 characters,
words stacked a few letters a line). This layout gives each column its natural width and, when the
table does not fit, first wraps the columns marked `wrap` at word boundaries (never inside a
word), then leaves out the least important columns (highest `priority` number) and says which.
Into a pipe there is no width to fit: every column is shown whole, one line per row, so that
`grep` and `cut` see whole values.
"""

from __future__ import annotations

import os
import shutil
import sys
import textwrap
from dataclasses import dataclass


@dataclass(frozen=True)
class Column:
    """One column: its header, how important it is (0 = never left out), alignment, wrapping."""

    header: str
    priority: int = 0
    align: str = "left"      # left | right
    wrap: bool = False       # may wrap at word boundaries when the table is too wide


GAP = "  "
COMFORTABLE = 24  # a wrapped column is not squeezed below this before other columns are left out


def terminal_width() -> int | None:
    """The width to fit, or None for a pipe (no fitting). COLUMNS wins, as for every CLI."""
    if os.environ.get("COLUMNS", "").isdigit():
        return max(20, int(os.environ["COLUMNS"]))
    try:
        if not sys.stdout.isatty():
            return None
    except (AttributeError, ValueError):
        return None
    return shutil.get_terminal_size((80, 24)).columns


def _longest_word(text: str) -> int:
    return max((len(w) for w in text.split()), default=0)


def layout(columns: list[Column], rows: list[list[str]], width: int | None) -> tuple[list[int], list[int], list[str]]:
    """(indices of the columns shown, their widths, headers left out)."""
    shown = list(range(len(columns)))
    natural = [max([len(columns[i].header)] + [len(r[i]) for r in rows]) for i in shown]
    floor = [max(len(columns[i].header), max([_longest_word(r[i]) for r in rows], default=0)) if columns[i].wrap
             else natural[i] for i in shown]
    widths = dict(zip(shown, natural))
    dropped: list[str] = []
    if width is None:
        return shown, [widths[i] for i in shown], dropped

    def total():
        return sum(widths[i] for i in shown) + len(GAP) * (len(shown) - 1)

    # Three passes, in order: wrap the wrap-columns down to a comfortable width; leave out the
    # least important columns; wrap further, down to the longest word (never inside a word).
    comfortable = {i: max(floor[i], min(natural[i], COMFORTABLE)) for i in shown}
    for limit in (comfortable, None, floor):
        while total() > width:
            if limit is None:
                optional = [i for i in shown if columns[i].priority > 0]
                if not optional:
                    break
                i = max(optional, key=lambda k: (columns[k].priority, k))
                shown.remove(i)
                dropped.append(columns[i].header)
                continue
            wrappable = [i for i in shown if columns[i].wrap and widths[i] > limit[i]]
            if not wrappable:
                break
            i = max(wrappable, key=lambda k: widths[k] - limit[k])
            widths[i] = max(limit[i], widths[i] - (total() - width))
    return shown, [widths[i] for i in shown], dropped


def render(columns: list[Column], rows: list[list[str]], width: int | None = None) -> str:
    """The table as text (a header line, a rule, the rows), fitted to `width` when given."""
    rows = [[("" if c is None else str(c)).replace("\n", " ") for c in r] for r in rows]
    shown, widths, dropped = layout(columns, rows, width)
    out = []

    def emit(cells: list[str]):
        cols = []
        for i, w, text in zip(shown, widths, cells):
            cols.append(textwrap.wrap(text, w, break_long_words=False, break_on_hyphens=False) or [""]
                        if columns[i].wrap else [text])
        for k in range(max(len(c) for c in cols)):
            parts = []
            for i, w, c in zip(shown, widths, cols):
                t = c[k] if k < len(c) else ""
                parts.append(t.rjust(w) if columns[i].align == "right" else t.ljust(w))
            out.append(GAP.join(parts).rstrip())

    emit([columns[i].header for i in shown])
    out.append(GAP.join("-" * w for w in widths))
    for r in rows:
        emit([r[i] for i in shown])
    if dropped:
        out.append(f"({len(dropped)} column(s) left out to fit {width} columns: {', '.join(dropped)}; "
                   f"widen the terminal or use --json)")
    return "\n".join(out) + "\n"


def short_id(oid: str | None, n: int = 10) -> str:
    """An id shortened for a table: the prefix any command accepts (`ledger show b3:1a2b3c4d5e`)."""
    if not oid:
        return "-"
    for prefix in ("b3:", "run:"):
        if oid.startswith(prefix):
            return oid[:len(prefix) + n]
    return oid


def number(v, digits: int = 4) -> str:
    if v is None:
        return "-"
    if isinstance(v, float):
        return f"{v:.{digits}g}"
    return str(v)
