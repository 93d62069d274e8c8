"""Inline text sparklines (▁▂▃▄▅▆▇█) for loss traces in terminal tables.

Pure and dependency-free: the terminal renderers import this at `ledger log` / `ledger gens`
time, so it must stay cheap. Long traces are reduced to `width` buckets by their mean (a
loss trace's shape is its trend; the max of a bucket would exaggerate single noisy steps).
"""

from __future__ import annotations

import math

BARS = "▁▂▃▄▅▆▇█"


def buckets(values, width: int) -> list[float]:
    """`values` reduced to at most `width` bucket means, ignoring non-finite entries."""
    vals = [float(v) for v in values if isinstance(v, (int, float)) and math.isfinite(v)]
    if width <= 0 or not vals:
        return []
    if len(vals) <= width:
        return vals
    out = []
    for i in range(width):
        lo = i * len(vals) // width
        hi = max(lo + 1, (i + 1) * len(vals) // width)
        chunk = vals[lo:hi]
        out.append(sum(v / len(chunk) for v in chunk))  # divided first: near float max, sum() overflows
    return out


def sparkline(values, width: int = 16) -> str:
    """A one-line bar chart of `values`: lowest ▁, highest █; a flat trace is all ▄."""
    b = buckets(values, width)
    if not b:
        return ""
    # scaled by the largest magnitude first: no overflow for huge values, and flatness is
    # relative (a trace that varies by one part in 10^12 is flat at any magnitude)
    scale = max(abs(min(b)), abs(max(b)))
    if scale == 0:
        return BARS[3] * len(b)
    b = [v / scale for v in b]
    lo, hi = min(b), max(b)
    if hi - lo <= 1e-12:
        return BARS[3] * len(b)
    top = len(BARS) - 1
    return "".join(BARS[min(top, int(round((v - lo) / (hi - lo) * top)))] for v in b)
