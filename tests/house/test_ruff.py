"""ruff (pyflakes, pycodestyle, isort; docstrings on store/, verdicts/, sharing/, api.py) is clean."""

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def test_ruff_is_clean():
    ruff = shutil.which("ruff", path=str(Path(sys.executable).parent)) or shutil.which("ruff")
    if ruff is None:
        pytest.fail("ruff is not installed: it is in the [test] extras (`make test` installs it)")
    p = subprocess.run([ruff, "check", "--no-cache", "--output-format", "concise", "ledger", "tests", "benchmarks"],
                       cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stdout[-6000:] + p.stderr[-2000:]
