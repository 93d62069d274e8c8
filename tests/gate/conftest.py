"""Fixtures of the gate tests. The world (a base and four adapters, tests/gate/world.py) takes
about half a minute to build on one core, so it is built once per session; each test that
writes works on its own copy of the store."""

import pytest


@pytest.fixture(scope="session")
def world(tmp_path_factory):
    from tests.gate.world import build

    return build(tmp_path_factory.mktemp("gate-world"))


@pytest.fixture
def wstore(world, tmp_path):
    """A private copy of the world's store (judge runs append records and spend budget)."""
    from ledger.store import Store

    return Store.open(world.copy_to(tmp_path / "w"))
