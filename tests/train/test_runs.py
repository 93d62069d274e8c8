"""`ledger runs`: ledger's own and tracked runs in one table, with --where, sort, JSON and CSV."""

import csv
import io
import json
import os
import signal
import subprocess
import sys
import textwrap

import pytest

import ledger
from ledger import runs as runslib
from ledger.errors import BadInput
from ledger.plan import compile as comp
from ledger.plan import spec, targets
from ledger.store import Store
from ledger.train import run as trainlib
from tests.conftest import ledger_cmd

SPEC = """
[data]
steps = 6
micro_batch = 4
[optimizer]
lr = 5e-3
[lora]
r = 4
alpha = 8.0
"""

INTERRUPTED = textwrap.dedent("""
    import sys, time
    import ledger
    with ledger.track("killed", params={"lr": 0.5}, store=sys.argv[1]) as run:
        print("started", flush=True)
        time.sleep(60)
""")


@pytest.fixture(scope="module")
def mixed(tmp_path_factory):
    """A store with one SFT run, three tracked runs (finished, failed, interrupted)."""
    d = tmp_path_factory.mktemp("runs")
    store = Store.init(d)
    plan = comp.compile_spec(store, spec.parse(SPEC), targets.get("cpu")).plan
    sft = trainlib.train(store, plan.id)
    with ledger.track("sweep-a", params={"learning_rate": 1e-3, "lora_r": 16, "max_steps": 30,
                                         "per_device_train_batch_size": 8, "model": "smol"},
                      seeds={"torch": 3}, store=store) as run:
        for step in range(30):
            run.log(step, loss=3.0 - step * 0.05, acc=step / 30)
    try:
        with ledger.track("sweep-b", params={"lr": 1e-2, "r": 8}, store=store) as bad:
            bad.log(0, loss=9.0)
            raise RuntimeError("diverged")
    except RuntimeError:
        pass
    script = d / "killed.py"
    script.write_text(INTERRUPTED)
    p = subprocess.Popen([sys.executable, str(script), str(store.root)], stdout=subprocess.PIPE, text=True,
                         env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert p.stdout.readline().strip() == "started"
    os.kill(p.pid, signal.SIGKILL)
    p.wait(timeout=30)
    p.stdout.close()
    return {"store": Store.open(store.root), "sft": sft, "tracked": run.receipt, "plan": plan}


def test_every_kind_of_run_is_listed_with_its_key_params(mixed):
    rows = {r.name if r.trainer == "tracked" else "sft": r for r in runslib.list_runs(mixed["store"])}
    assert set(rows) == {"sft", "sweep-a", "sweep-b", "killed"}
    sft = rows["sft"]
    assert (sft.trainer, sft.status, sft.lr, sft.r, sft.alpha, sft.steps, sft.batch) == ("sft", "finished", 5e-3, 4,
                                                                                          8.0, 6, 4)
    assert sft.receipt == mixed["sft"].receipt_id and sft.final_loss is not None
    a = rows["sweep-a"]
    assert (a.status, a.rung, a.lr, a.r, a.steps, a.batch, a.seed, a.base) == ("finished", "Learned", 1e-3, 16, 30,
                                                                               8, 3, "smol")
    assert a.metrics == {"acc": 29 / 30, "loss": pytest.approx(3.0 - 29 * 0.05)}
    assert rows["sweep-b"].status == "failed"
    assert rows["killed"].status == "interrupted" and rows["killed"].lr == 0.5


def test_where_sort_and_limit(mixed):
    store = mixed["store"]
    assert {r.name for r in runslib.list_runs(store, where="lr >= 1e-2")} == {"sweep-b", "killed"}
    assert [r.name for r in runslib.list_runs(store, where="trainer = 'tracked'", sort="lr", descending=True)] == \
        ["killed", "sweep-b", "sweep-a"]
    assert len(runslib.list_runs(store, limit=2)) == 2
    with pytest.raises(BadInput, match="not a condition over the runs columns"):
        runslib.list_runs(store, where="learning_rat > 1")
    with pytest.raises(BadInput, match="cannot sort"):
        runslib.list_runs(store, sort="params; drop table runs")
    with pytest.raises(BadInput, match="one SQL condition"):
        runslib.list_runs(store, where="1=1; select 1")


def test_the_runs_view_is_in_the_index(mixed):
    cols, rows = mixed["store"].query("select name, status from runs where trainer = 'tracked' order by seq")
    assert rows == [("sweep-a", "finished"), ("sweep-b", "failed"), ("killed", "started")]
    cols, rows = mixed["store"].query("select count(*) from metrics where name = 'acc'")
    assert rows == [(30,)]  # a tracked run's metrics reach the metrics table


def test_index_rebuild_gives_the_same_runs(mixed, tmp_path):
    store = mixed["store"]
    before = [r.to_json() for r in runslib.list_runs(store)]
    store.rebuild_index()
    assert [r.to_json() for r in runslib.list_runs(Store.open(store.root))] == before


def test_the_cli_renders_json_csv_and_a_table(mixed):
    root = mixed["store"].root
    p = ledger_cmd("--store", root, "runs", "--json", "--where", "trainer = 'tracked'")
    assert p.returncode == 0, p.stderr
    assert [r["name"] for r in json.loads(p.stdout)["runs"]] == ["sweep-a", "sweep-b", "killed"]
    p = ledger_cmd("--store", root, "runs", "--csv")
    assert p.returncode == 0, p.stderr
    table = list(csv.DictReader(io.StringIO(p.stdout)))
    assert len(table) == 4 and json.loads(table[1]["params"])["learning_rate"] == 1e-3
    p = ledger_cmd("--store", root, "runs", env={"COLUMNS": "80"})
    assert p.returncode == 0, p.stderr
    assert all(len(line) <= 80 for line in p.stdout.splitlines() if not line.startswith("("))
    assert "interrupted" in p.stdout and "sweep-a" in p.stdout
    p = ledger_cmd("--store", root, "runs", "--where", "nope = 1")
    assert p.returncode == 2 and "columns:" in p.stderr


def test_the_report_has_the_runs_table_and_tracked_curves(mixed):
    from ledger import report as reportlib

    m = reportlib.gather(mixed["store"])
    assert [(r.name, r.status) for r in m.runs if r.trainer == "tracked"] == [
        ("sweep-a", "finished"), ("sweep-b", "failed"), ("killed", "interrupted")]
    tracked = [r for r in m.receipts if r.trainer == "tracked"]
    assert len(tracked) == 2 and len(tracked[0].losses) == 30  # the curve of sweep-a is plotted
    html = reportlib.render(m)
    assert '<section id="runs">' in html and "sweep-a" in html and "interrupted" in html
