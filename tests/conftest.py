import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def ledger_cmd(*args, cwd=None, env=None, check=False, input=None, timeout=300):
    """Run the real CLI in a fresh process (what users run)."""
    e = dict(os.environ)
    e.pop("LEDGER_DIR", None)
    for k in ("LEDGER_FAULT_AT", "LEDGER_FAULT_ERRNO", "LEDGER_FAULT_TRACE", "LEDGER_DEBUG"):
        e.pop(k, None)
    if env:
        e.update(env)
    p = subprocess.run([sys.executable, "-m", "ledger.cli.main", *map(str, args)], cwd=cwd, env=e,
                       capture_output=True, text=True, input=input, timeout=timeout)
    if check and p.returncode != 0:
        raise AssertionError(f"ledger {' '.join(map(str, args))} failed ({p.returncode}):\n{p.stdout}\n{p.stderr}")
    return p


@pytest.fixture
def store(tmp_path):
    from ledger.store import Store

    return Store.init(tmp_path)


def pytest_collection_modifyitems(config, items):
    try:
        import cupy  # noqa: F401

        has_gpu = cupy.cuda.runtime.getDeviceCount() > 0
    except Exception:
        has_gpu = False
    if not has_gpu:
        skip = pytest.mark.skip(reason="needs an NVIDIA GPU with cupy")
        for item in items:
            if "gpu" in item.keywords:
                item.add_marker(skip)


# Shared by tests/plan and tests/train: one store with a compiled tiny plan and one finished
# training run (training children cost a few seconds each, mostly importing torch).
TINY = """
[data]
steps = 12
micro_batch = 8
[optimizer]
lr = 1e-2
[train]
checkpoint_every = 4
"""


@pytest.fixture(scope="session")
def tiny_text():
    return TINY


@pytest.fixture(scope="session")
def trained(tmp_path_factory):
    from ledger.plan import compile as comp
    from ledger.plan import spec, targets
    from ledger.store import Store
    from ledger.train import run as trainlib

    d = tmp_path_factory.mktemp("trained")
    store = Store.init(d)
    plan = comp.compile_spec(store, spec.parse(TINY), targets.get("cpu")).plan
    seen = []
    res = trainlib.train(store, plan.id, progress=seen.append)
    return {"dir": d, "store": store, "plan": plan, "result": res, "progress": seen}
