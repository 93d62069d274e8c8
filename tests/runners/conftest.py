"""Shared fixtures: one store with a compiled tiny plan and one finished training run.

Training children cost a few seconds each (mostly importing torch), so the tests that only
read a finished run share this module-scoped one."""

import pytest

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
    from ledger.runners import compile as comp
    from ledger.runners import spec, targets
    from ledger.runners import train as trainlib
    from ledger.store import Store

    d = tmp_path_factory.mktemp("trained")
    store = Store.init(d)
    plan = comp.compile_spec(store, spec.parse(TINY), targets.get("cpu")).plan
    seen = []
    res = trainlib.train(store, plan.id, progress=seen.append)
    return {"dir": d, "store": store, "plan": plan, "result": res, "progress": seen}
