"""The CLI as users run it: targets, compile (plan, rejection, explain), train, import-base."""

import json
from pathlib import Path

import pytest

from tests.conftest import ledger_cmd

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def test_targets_json():
    p = ledger_cmd("targets", "--json")
    assert p.returncode == 0, p.stderr
    names = {t["name"] for t in json.loads(p.stdout)}
    assert {"cpu", "h200", "a100-40gb", "rtx3070-8gb"} <= names


def test_too_big_example_is_rejected_with_the_memory_requirement(tmp_path):
    ledger_cmd("init", cwd=tmp_path, check=True)
    p = ledger_cmd("compile", EXAMPLES / "too-big.toml", "--target", "rtx3070-8gb", "--json", cwd=tmp_path)
    assert p.returncode == 3
    assert json.loads(p.stdout)["error"] == "CompileRejected"   # --json: the error as JSON on stdout
    assert "memory: the plan needs" in p.stderr and "rtx3070-8gb has 8.00 GiB" in p.stderr
    assert "largest micro-batch that fits" in p.stderr


def test_compile_prints_plan_id_and_explains(tmp_path):
    ledger_cmd("init", cwd=tmp_path, check=True)
    (tmp_path / "a.toml").write_text("[data]\nsteps = 3\n")
    (tmp_path / "b.toml").write_text("[data]\nsteps = 3\nmicro_batch = 4\n")
    a = ledger_cmd("compile", "a.toml", "--json", cwd=tmp_path)
    assert a.returncode == 0, a.stderr
    pa = json.loads(a.stdout)["plan"]
    assert pa.startswith("b3:") and len(pa) == 67
    again = json.loads(ledger_cmd("compile", "a.toml", "--json", cwd=tmp_path).stdout)
    assert again["plan"] == pa and again["new"] is False
    b = ledger_cmd("compile", "b.toml", "--explain", pa[:20], cwd=tmp_path)
    assert b.returncode == 0, b.stderr
    assert "data.micro_batch" in b.stdout and "memory.activations" in b.stdout and "plan b3:" in b.stdout
    bad = ledger_cmd("compile", "a.toml", "--target", "tpu9", cwd=tmp_path)
    assert bad.returncode == 2 and "unknown target" in bad.stderr
    (tmp_path / "c.toml").write_text("[data]\nsteps = 3\nbatch = 4\n")
    c = ledger_cmd("compile", "c.toml", cwd=tmp_path)
    assert c.returncode == 2 and "`data.batch` (line 3)" in c.stderr


def test_renderers_cover_plan_receipt_and_comparison(trained, capsys):
    from ledger.cli import train_cmds

    store, res = trained["store"], trained["result"]
    train_cmds.render_plan(store.get_json(res.receipt["plan"]), res.receipt["plan"])
    train_cmds.render_receipt(res.receipt, res.receipt_id)
    train_cmds.render_comparison({"outcome": "Diverged", "receipt": res.receipt_id, "rerun_receipt": None,
                                  "first_difference": {"step": 3, "field": "loss", "original": 1.0, "rerun": 2.0},
                                  "largest_deviation": {"field": "loss", "step": 3, "value": 1.0}})
    out = capsys.readouterr().out
    assert "Learned" in out and "torch-eager" in out and "first difference: step 3, field loss" in out


@pytest.mark.slow
def test_tiny_example_trains_right_after_init(tmp_path):
    """The demo spec as shipped: init, then train (compiling first); it must learn."""
    ledger_cmd("init", cwd=tmp_path, check=True)
    p = ledger_cmd("train", EXAMPLES / "tiny.toml", "--json", cwd=tmp_path)
    assert p.returncode == 0, p.stderr
    out = json.loads(p.stdout)
    assert out["receipt"].startswith("b3:") and out["rung"] == "Learned" and out["adapter"]
    assert out["final_loss"] < 1.5  # from about 6.7 nats/byte at the base


def test_import_hf_dir_and_train_from_it(tmp_path):
    from ledger.artefacts import model
    from ledger.plan import spec

    src = tmp_path / "hf"
    model.build_builtin_files(spec.parse("[model]\nhidden = 32\nintermediate = 64\n").config["model"], src)
    ledger_cmd("init", cwd=tmp_path, check=True)
    p = ledger_cmd("import-base", src, "--name", "mini", "--json", cwd=tmp_path)
    assert p.returncode == 0, p.stderr
    base = json.loads(p.stdout)["base"]
    (tmp_path / "s.toml").write_text('[model]\nbase = "mini"\n[data]\nsteps = 2\nmicro_batch = 2\n')
    c = ledger_cmd("compile", "s.toml", "--json", cwd=tmp_path)
    assert c.returncode == 0, c.stderr
    plan = json.loads(c.stdout)["plan"]
    from ledger.store import Store

    body = Store.open(tmp_path).get_json(plan)
    assert body["inputs"]["base"] == base and body["shapes"]["arch"]["hidden"] == 32
    t = ledger_cmd("train", plan, "--json", cwd=tmp_path)
    assert t.returncode == 0, t.stderr
    assert json.loads(t.stdout)["steps"] == 2
    # an unreadable tokenizer (bad input) and pickled weights (refused: never unpickled) are named
    (src / "tokenizer.json").write_text("{}")
    p = ledger_cmd("import-base", src, cwd=tmp_path)
    assert p.returncode == 2 and "tokenizer" in p.stderr
    (src / "tokenizer.json").unlink()
    (src / "model.safetensors").rename(src / "pytorch_model.bin")
    p = ledger_cmd("import-base", src, cwd=tmp_path)
    assert p.returncode == 3 and "never unpickles" in p.stderr
