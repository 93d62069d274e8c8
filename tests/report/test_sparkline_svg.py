"""Pure parts: text sparklines, tick choice, escaping and class names."""

from __future__ import annotations

import math

import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from ledger.report import plots, svg
from ledger.report.sparkline import BARS, buckets, sparkline


def test_sparkline_shape():
    assert sparkline([]) == "" and sparkline([math.nan, math.inf]) == ""
    assert sparkline([3.0, 3.0, 3.0]) == BARS[3] * 3
    s = sparkline([8, 7, 6, 5, 4, 3, 2, 1], 8)
    assert s == BARS[::-1]
    assert sparkline([1, 2], 8) == BARS[0] + BARS[-1]
    assert sparkline([1, math.nan, 2]) == BARS[0] + BARS[-1]  # non-finite steps are skipped


def test_buckets_are_means_of_equal_chunks():
    assert buckets(list(range(10)), 5) == [0.5, 2.5, 4.5, 6.5, 8.5]
    assert buckets([1, 2, 3], 10) == [1.0, 2.0, 3.0]
    assert buckets([1, 2, 3], 0) == []


@given(st.lists(st.floats(allow_nan=True, allow_infinity=True), max_size=300), st.integers(1, 40))
@example(values=[8.988465674311579e+307, 8.98846567431158e+307], width=1)  # a bucket mean that overflowed
def test_sparkline_properties(values, width):
    s = sparkline(values, width)
    finite = [v for v in values if math.isfinite(v)]
    assert len(s) == min(width, len(finite)) and set(s) <= set(BARS)
    if len(finite) <= width:
        lo, hi = min(finite, default=0), max(finite, default=0)
        size = max(abs(lo), abs(hi))
        if hi - lo > 1e-9 * size:  # clearly not flat
            assert BARS[0] in s and BARS[-1] in s  # the extremes are shown as the extremes
        elif hi - lo <= 1e-13 * size:  # flat to within float noise
            assert set(s) <= {BARS[3]}


def test_nice_ticks_cover_the_range_with_round_steps():
    assert svg.nice_ticks(0, 1, 5) == [0, 0.2, 0.4, 0.6, 0.8, 1.0]
    assert svg.nice_ticks(-5.7, 2.9, 5) == [-4, -2, 0, 2]
    ticks = svg.nice_ticks(0.0123, 0.0181, 4)
    assert all(0.0123 <= t <= 0.0181 for t in ticks) and len(ticks) >= 2
    assert svg.nice_ticks(3, 3) == [3]


def test_linear_scale_and_degenerate_domains():
    s = svg.Linear(0, 10, 100, 200)
    assert s(0) == 100 and s(10) == 200 and s(5) == 150
    one = svg.Linear(4, 4, 0, 100)  # a single value sits mid-axis instead of dividing by zero
    assert one(4) == pytest.approx(50)


def test_escaping_and_class_names():
    assert svg.esc('<a href="x">&\'') == "&lt;a href=&quot;x&quot;&gt;&amp;&#x27;"
    assert svg.cls('Accept" onload="x') == "Acceptonloadx" and svg.cls(None) == "none"
    t = svg.text(1, 2, "<script>", klass='a"b')
    assert "<script>" not in t and 'class="a&quot;b"' in t
    assert "<title>&lt;b&gt;</title>" in svg.circle(0, 0, 1, "v", "<b>")


def test_spark_svg_and_empty_plots():
    assert plots.spark((1.0,)) == ""
    out = plots.spark((3.0, 2.0, 1.0))
    assert out.startswith("<svg") and "<path" in out and out.count("L") == 2
    for f in (plots.score_history, plots.deltas, plots.loss_curves):
        assert f(()).startswith('<p class="empty">')
    assert plots.lineage((), (), None).startswith('<p class="empty">')
    assert plots.verdict_timeline((), ()).startswith('<p class="empty">')
