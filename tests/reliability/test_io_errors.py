"""Injected ENOSPC / EIO at write N, once and always: a clean typed error, a consistent store,
and the store keeps working afterwards."""

import pytest

from ledger.store import Store
from tests.conftest import ledger_cmd
from tests.reliability.helpers import assert_consistent


@pytest.mark.parametrize("err", ["ENOSPC", "EIO"])
@pytest.mark.parametrize("mode", ["", "+"])
def test_injected_write_errors(tmp_path, err, mode):
    s = Store.init(tmp_path)
    (tmp_path / "f").write_bytes(b"z" * 50_000)
    n = 0
    saw_error = False
    while True:
        n += 1
        pre = Store.open(s.root).state.head
        (tmp_path / "f").write_bytes(b"z" * 50_000 + str(n).encode())
        p = ledger_cmd("add", "f", cwd=tmp_path, env={"LEDGER_FAULT_ERRNO": f"{err}:{n}{mode}"})
        if p.returncode == 0:
            break
        saw_error = True
        assert p.returncode == 6, p.stderr
        assert "Traceback" not in p.stderr
        assert ("no space" in p.stderr) if err == "ENOSPC" else ("I/O error" in p.stderr)
        store = assert_consistent(s.root)
        assert store.state.head == pre  # nothing committed
        assert not list(store.tmp.iterdir())  # nothing half-written left behind
        assert n < 20
    assert saw_error
    # afterwards the store works: gc and further transactions
    assert ledger_cmd("gc", "--prune", cwd=tmp_path).returncode == 0
    assert_consistent(s.root)


def test_gc_and_reads_work_while_writes_fail(tmp_path):
    Store.init(tmp_path)
    (tmp_path / "f").write_text("a")
    ledger_cmd("add", "f", "--name", "a", cwd=tmp_path, check=True)
    env = {"LEDGER_FAULT_ERRNO": "ENOSPC:1+"}
    assert ledger_cmd("gc", cwd=tmp_path, env=env).returncode == 0
    assert ledger_cmd("cat", "a", cwd=tmp_path, env=env).stdout == "a"
    assert ledger_cmd("verify", cwd=tmp_path, env=env).returncode == 0
