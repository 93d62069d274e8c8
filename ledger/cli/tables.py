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


Cell = "str | tuple[str, str | None]"  # text, or (text, rich style) for a coloured terminal


def _split(cell) -> tuple[str, str | None]:
    text, style = cell if isinstance(cell, tuple) else (cell, None)
    return ("" if text is None else str(text)).replace("\n", " "), style


def lines(columns: list[Column], rows: list[list], width: int | None = None) -> list[list[tuple[str, str | None]]]:
    """The table as lines of (text, style) segments: a header, a rule, the rows (wrapped cells
    continue on the next lines), and a note naming any columns left out."""
    cells = [[_split(c) for c in r] for r in rows]
    shown, widths, dropped = layout(columns, [[t for t, _ in r] for r in cells], width)
    out: list[list[tuple[str, str | None]]] = []

    def emit(row: list[tuple[str, str | None]], bold: bool = False):
        cols = []
        for i, w, (text, style) in zip(shown, widths, row):
            parts = (textwrap.wrap(text, w, break_long_words=False, break_on_hyphens=False) or [""]
                     if columns[i].wrap else [text])
            cols.append((parts, "bold" if bold else style))
        for k in range(max(len(c[0]) for c in cols)):
            segs = []
            for n, (i, w, (parts, style)) in enumerate(zip(shown, widths, cols)):
                t = parts[k] if k < len(parts) else ""
                pad = w - len(t)
                if n:
                    segs.append((GAP, None))
                if columns[i].align == "right":
                    segs += [(" " * pad, None), (t, style)]
                else:
                    segs += [(t, style), (" " * pad, None)]
            while segs and not segs[-1][0].strip():  # no trailing blanks
                segs.pop()
            out.append(segs)

    emit([(columns[i].header, None) for i in shown], bold=True)
    out.append([(GAP.join("-" * w for w in widths), None)])
    for r in cells:
        emit([r[i] for i in shown])
    if dropped:
        out.append([(f"({len(dropped)} column(s) left out to fit {width} columns: {', '.join(dropped)}; "
                     f"widen the terminal or use --json)", "dim")])
    return out


def render(columns: list[Column], rows: list[list], width: int | None = None) -> str:
    """The table as plain text, fitted to `width` when given."""
    return "".join("".join(t for t, _ in line) + "\n" for line in lines(columns, rows, width))


def print_table(console, columns: list[Column], rows: list[list], width: int | None) -> None:
    """The table on a rich console: styles where it has colour, plain text where it has none
    (NO_COLOR, a pipe). Laid out here already, so rich must not wrap it again."""
    from rich.text import Text  # rich is loaded by the console that prints this anyway

    for line in lines(columns, rows, width):
        console.print(Text.assemble(*[(t, style or "") for t, style in line]), soft_wrap=True, highlight=False)


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
