"""The report in a real browser: headless Chromium (Debian's `chromium`) loads the file offline,
the DOM it builds holds the SVG plots, and the screenshot shows them painted.

The plots use colours nothing else on the page uses (the loss/scored-bar blue and the canary
orange), so counting those pixels tells "the SVG was drawn" apart from "the page has text".
Skips, saying why, only if Chromium is absent and cannot be installed.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from ledger.report import gather, write
from ledger.store import Store
from tests.report import png

pytestmark = pytest.mark.slow

FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
         "--disable-sync", "--no-first-run", "--hide-scrollbars", "--disable-extensions"]
PLOT_BLUE = (0x1f, 0x77, 0xb4)    # svg .c0 / .bar-s / .sparkpath
CANARY_ORANGE = (0xff, 0x7f, 0x0e)  # svg .bar-k


def _chromium() -> str:
    for name in ("chromium", "chromium-browser"):
        if shutil.which(name):
            return shutil.which(name)
    why = "not on PATH"
    if os.geteuid() == 0 and shutil.which("apt-get"):
        p = subprocess.run(["apt-get", "install", "-y", "chromium"], capture_output=True, text=True, timeout=900,
                           env={**os.environ, "DEBIAN_FRONTEND": "noninteractive"})
        if shutil.which("chromium"):
            return shutil.which("chromium")
        why = f"`apt-get install -y chromium` failed: {(p.stderr or p.stdout).strip().splitlines()[-1:]}"
    elif os.geteuid() != 0:
        why = "not on PATH, and not root to `apt-get install -y chromium`"
    pytest.skip(f"headless Chromium unavailable ({why})")


def _run(chrome: str, profile: Path, *args: str, timeout: int = 180) -> subprocess.CompletedProcess:
    return subprocess.run([chrome, *FLAGS, f"--user-data-dir={profile}", *args], capture_output=True, text=True,
                          timeout=timeout, env={**os.environ, "HOME": str(profile)})


def _screenshot(chrome: str, page: Path, out: Path, size: str) -> tuple[int, int, int, bytes]:
    p = _run(chrome, out.parent / f"profile-{out.stem}", f"--screenshot={out}", f"--window-size={size}", page.as_uri())
    assert out.exists(), f"no screenshot (exit {p.returncode}): {p.stderr[-2000:]}"
    return png.read(out)


def _pixels(px: bytes, ch: int):
    import numpy as np

    return np.frombuffer(px, dtype=np.uint8).reshape(-1, ch)[:, :3].astype(np.int32)


def _near(px: bytes, ch: int, rgb: tuple[int, int, int], tol: int = 14) -> int:
    import numpy as np

    return int((np.abs(_pixels(px, ch) - np.array(rgb, dtype=np.int32)) <= tol).all(axis=1).sum())


def _stats(px: bytes, ch: int) -> tuple[float, float]:
    """(standard deviation of luminance, fraction of non-white pixels)."""
    p = _pixels(px, ch)
    lum = (p[:, 0] * 299 + p[:, 1] * 587 + p[:, 2] * 114) / 1000
    return float(lum.std()), float((lum < 245).mean())


def test_report_renders_in_headless_chromium(demo_store, tmp_path):
    chrome = _chromium()
    html = tmp_path / "report.html"
    write(Store.open(demo_store), html)

    # the DOM Chromium builds from the file: real SVG elements, nothing loaded from anywhere
    p = _run(chrome, tmp_path / "profile-dom", "--dump-dom", html.as_uri())
    assert p.returncode == 0, p.stderr[-2000:]
    dom = p.stdout
    receipts = len(gather(Store.open(demo_store)).receipts)
    assert dom.count("<svg") == 5 + receipts  # 5 plots + a loss sparkline per receipt
    assert dom.count("<path") >= 10 and dom.count("<circle") >= 4
    assert "<script" not in dom

    w, h, ch, px = _screenshot(chrome, html, tmp_path / "demo.png", "1100,2400")
    assert (w, h) == (1100, 2400)
    sd, ink = _stats(px, ch)
    assert sd > 15 and ink > 0.02, f"the page looks blank (luminance sd {sd:.1f}, {ink:.1%} non-white)"
    blue, orange = _near(px, ch, PLOT_BLUE), _near(px, ch, CANARY_ORANGE)
    assert blue > 400, f"loss curves / scored bars not painted ({blue} blue pixels)"
    assert orange > 200, f"canary bars not painted ({orange} orange pixels)"

    # the same checks on an empty store's report: a real page, but no plot colours at all
    empty = tmp_path / "empty"
    Store.init(empty)
    write(Store.open(empty), tmp_path / "empty.html")
    w, h, ch, px = _screenshot(chrome, tmp_path / "empty.html", tmp_path / "empty.png", "1100,900")
    sd, ink = _stats(px, ch)
    assert sd > 5 and ink > 0.005, "the empty report should still show its sections"
    assert _near(px, ch, PLOT_BLUE) < 20 and _near(px, ch, CANARY_ORANGE) < 20
