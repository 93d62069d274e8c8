"""Hand-written SVG: scales, nice ticks, axes and the few shapes the plots use.

No plotting library and nothing fetched: every chart is a string of inline SVG. Every piece of
text that reaches the markup goes through `esc` (attribute-safe HTML escaping), and CSS class
names derived from data go through `cls`, so a store's contents can never inject markup.
Colours live in the page's stylesheet (classes), not here.
"""

from __future__ import annotations

import html
import math
import re


def esc(s) -> str:
    return html.escape("" if s is None else str(s), quote=True)


def cls(s) -> str:
    """A CSS class name from data (a verdict name): letters, digits and dashes only."""
    return re.sub(r"[^A-Za-z0-9-]", "", str(s or "")) or "none"


def num(x: float) -> str:
    """A coordinate: two decimals, no trailing zeros (small, stable markup)."""
    s = f"{x:.2f}".rstrip("0").rstrip(".")
    return "0" if s in ("-0", "") else s


def fmt(x: float | None, digits: int = 4) -> str:
    if x is None:
        return "-"
    return f"{x:.{digits}g}" if abs(x) < 1e-3 or abs(x) >= 1e5 else f"{x:.{digits}f}".rstrip("0").rstrip(".")


class Linear:
    """Maps the domain [d0, d1] onto the pixel range [r0, r1]."""

    def __init__(self, d0: float, d1: float, r0: float, r1: float):
        if not (math.isfinite(d0) and math.isfinite(d1)):
            d0, d1 = 0.0, 1.0
        if d1 == d0:  # one value: give it some room so it sits mid-axis
            pad = abs(d0) * 0.1 or 1.0
            d0, d1 = d0 - pad, d1 + pad
        self.d0, self.d1, self.r0, self.r1 = d0, d1, r0, r1

    def __call__(self, v: float) -> float:
        return self.r0 + (v - self.d0) / (self.d1 - self.d0) * (self.r1 - self.r0)

    def ticks(self, n: int = 5) -> list[float]:
        return nice_ticks(self.d0, self.d1, n)


def nice_ticks(lo: float, hi: float, n: int = 5) -> list[float]:
    """Round tick values (1, 2, 2.5, 5 × 10^k) covering [lo, hi]."""
    if hi < lo:
        lo, hi = hi, lo
    span = hi - lo
    if span <= 0 or not math.isfinite(span):
        return [lo]
    raw = span / max(1, n)
    mag = 10 ** math.floor(math.log10(raw))
    step = next(m * mag for m in (1, 2, 2.5, 5, 10) if m * mag >= raw)
    start = math.ceil(lo / step - 1e-9) * step
    out, v = [], start
    while v <= hi + step * 1e-9:
        out.append(round(v, 12))
        v += step
    return out


def padded(values, frac: float = 0.08, include_zero: bool = False) -> tuple[float, float]:
    vals = [v for v in values if v is not None and math.isfinite(v)]
    if include_zero:
        vals.append(0.0)
    if not vals:
        return 0.0, 1.0
    lo, hi = min(vals), max(vals)
    pad = (hi - lo) * frac or (abs(hi) * frac or 1.0)
    return lo - pad, hi + pad


# --- shapes --------------------------------------------------------------------------------
def svg(width: int, height: int, body: str, label: str, klass: str = "plot") -> str:
    # No xmlns: the HTML parser places <svg> in the SVG namespace itself, and the page then
    # carries no URL at all.
    return (f'<svg class="{esc(klass)}" viewBox="0 0 {width} {height}" width="{width}" height="{height}" '
            f'role="img" aria-label="{esc(label)}">{body}</svg>')


def title(text: str) -> str:
    """A native tooltip (no script needed)."""
    return f"<title>{esc(text)}</title>" if text else ""


def path(points, klass: str, tip: str = "") -> str:
    pts = [(x, y) for x, y in points if math.isfinite(x) and math.isfinite(y)]
    if not pts:
        return ""
    d = "M" + " L".join(f"{num(x)},{num(y)}" for x, y in pts)
    return f'<path class="{esc(klass)}" d="{d}">{title(tip)}</path>'


def polygon(points, klass: str, tip: str = "") -> str:
    d = "M" + " L".join(f"{num(x)},{num(y)}" for x, y in points) + " Z"
    return f'<path class="{esc(klass)}" d="{d}">{title(tip)}</path>'


def circle(x: float, y: float, r: float, klass: str, tip: str = "") -> str:
    return f'<circle class="{esc(klass)}" cx="{num(x)}" cy="{num(y)}" r="{num(r)}">{title(tip)}</circle>'


def rect(x: float, y: float, w: float, h: float, klass: str, tip: str = "") -> str:
    if h < 0:
        y, h = y + h, -h
    if w < 0:
        x, w = x + w, -w
    return (f'<rect class="{esc(klass)}" x="{num(x)}" y="{num(y)}" width="{num(w)}" height="{num(h)}">'
            f'{title(tip)}</rect>')


def line(x1: float, y1: float, x2: float, y2: float, klass: str) -> str:
    return f'<line class="{esc(klass)}" x1="{num(x1)}" y1="{num(y1)}" x2="{num(x2)}" y2="{num(y2)}"/>'


def text(x: float, y: float, s: str, klass: str = "lbl", anchor: str = "start", rotate: float | None = None) -> str:
    rot = f' transform="rotate({num(rotate)} {num(x)} {num(y)})"' if rotate is not None else ""
    return f'<text class="{esc(klass)}" x="{num(x)}" y="{num(y)}" text-anchor="{esc(anchor)}"{rot}>{esc(s)}</text>'


def y_axis(scale: Linear, x: float, x_end: float, label: str = "", n: int = 5) -> str:
    """Horizontal grid lines with tick labels on the left, and a rotated axis label."""
    out = []
    for t in scale.ticks(n):
        y = scale(t)
        out.append(line(x, y, x_end, y, "grid"))
        out.append(text(x - 6, y + 4, fmt(t, 3), "tick", "end"))
    if label:
        mid = (scale.r0 + scale.r1) / 2
        out.append(text(14, mid, label, "axis", "middle", rotate=-90))
    return "".join(out)


def x_axis(scale: Linear, y: float, label: str = "", n: int = 6, integer: bool = False) -> str:
    out = [line(scale.r0, y, scale.r1, y, "axisline")]
    ticks = scale.ticks(n)
    if integer:
        ticks = sorted({int(round(t)) for t in ticks if abs(t - round(t)) < 1e-9})
    for t in ticks:
        x = scale(t)
        out.append(line(x, y, x, y + 4, "axisline"))
        out.append(text(x, y + 16, fmt(t, 3) if not integer else str(int(t)), "tick", "middle"))
    if label:
        out.append(text((scale.r0 + scale.r1) / 2, y + 32, label, "axis", "middle"))
    return "".join(out)
