"""SIGKILL `ledger capability add` and `grant` at every fault point of their transactions
(a crash mid-transaction: tests/reliability/): the store stays consistent, the head is exactly the pre-
or post-transaction head, and whatever is live can be called."""

from __future__ import annotations

import signal

import pytest

from ledger.capabilities import registry
from ledger.store import Store
from tests.capabilities.helpers import ADDER_EXPORTS, ADDER_TESTS, ADDER_WAT, write_cap
from tests.conftest import ledger_cmd
from tests.reliability.helpers import assert_consistent


def _fault_points(tmp_path, work, args) -> list[str]:
    trace = tmp_path / "trace"
    trace.unlink(missing_ok=True)
    p = ledger_cmd(*args, cwd=work, env={"LEDGER_FAULT_TRACE": str(trace)})
    assert p.returncode == 0, p.stderr
    return [line.split()[1] for line in trace.read_text().splitlines()]


def _kill_at(work, make_args, at: list[int]) -> None:
    """Kill a fresh run at each of the 1-based fault points `at`; check the store after each."""
    for i, n in enumerate(at):
        pre = Store.open(work).state.head
        p = ledger_cmd(*make_args(i), cwd=work, env={"LEDGER_FAULT_AT": str(n)})
        assert p.returncode == -signal.SIGKILL, (n, p.returncode, p.stderr)
        store = assert_consistent(work / ".ledger")
        post = store.state.head
        assert post == pre or store.journal.records()[-1]["prev"] == pre
        for e in registry.entries(store):          # every live capability still works
            assert registry.call(store, e.name, "add", ["2", "3"]).values == (5,)


def _distinct(points: list[str]) -> list[int]:
    """The first point of each name, and the last one before the commit (the last object)."""
    first = {}
    for i, name in enumerate(points, 1):
        first.setdefault(name, i)
    chosen = set(first.values())
    if "tx.before-append" in first:
        chosen.add(first["tx.before-append"] - 1)
    return sorted(chosen)


def _setup(root, tmp_path):
    (root / "data" / "sub").mkdir(parents=True)
    Store.init(root)
    src, man = write_cap(tmp_path / f"base-{root.name}", "base", ADDER_WAT, ADDER_EXPORTS, ADDER_TESTS,
                         handles=[{"kind": "dir", "path": "data", "mode": "rw"}])
    ledger_cmd("capability", "add", src, "--manifest", man, cwd=root, check=True)


@pytest.mark.slow
def test_sigkill_at_every_fault_point_of_capability_add_and_grant(tmp_path):
    work, probe = tmp_path / "w", tmp_path / "probe"
    _setup(work, tmp_path)
    _setup(probe, tmp_path)

    def add_args(i):
        # A distinct module each time, so every run writes the same number of new objects.
        wat = ADDER_WAT[:-1] + f' (global (export "v") i32 (i32.const {i})))'
        src, man = write_cap(tmp_path / f"c{i}", f"adder{i}", wat, ADDER_EXPORTS, ADDER_TESTS)
        return ["capability", "add", src, "--manifest", man]
    points = _fault_points(tmp_path, probe, add_args(999))
    assert {"tx.before-append", "tx.committed", "index.before-sync"} <= set(points), points
    _kill_at(work, add_args, _distinct(points))

    grant = ["capability", "grant", "base", "dir:data/sub:ro"]   # an equal grant attenuates too
    points = _fault_points(tmp_path, probe, grant)
    # The object-write points are the same store code as above; kill at the commit boundary.
    boundary = {"object.before-rename", "tx.before-append", "journal.torn", "tx.committed", "tx.cache-written"}
    _kill_at(work, lambda i: grant, [n for n in _distinct(points) if points[n - 1] in boundary])
    assert_consistent(work / ".ledger")
