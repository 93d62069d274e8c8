"""`ledger seal`, `ledger judge`, `ledger dpo` as users run them: output, --json, exit codes."""

from __future__ import annotations

import json

import pytest

from ledger.gate import seal
from tests.conftest import ledger_cmd
from tests.gate.test_seal import _base, _docs


def test_seal_cli_pins_refuses_and_repins(store, tmp_path):
    base = _base(store)
    d1 = seal.write_suite_dir(tmp_path / "s1", *_docs())
    d2 = seal.write_suite_dir(tmp_path / "s2", *_docs(4, 2))
    cwd = store.root.parent
    p = ledger_cmd("seal", d1, "--base", base, "--json", cwd=cwd)
    assert p.returncode == 0, p.stderr
    out = json.loads(p.stdout)
    assert out["new"] and out["scored"] == 3 and out["canaries"] == 2 and out["budget"] == 6
    assert "canary_string" not in p.stdout  # the canary string is not printed
    p = ledger_cmd("seal", d1, "--base", base, cwd=cwd)
    assert p.returncode == 0 and "already pinned" in p.stdout
    p = ledger_cmd("seal", d2, "--base", base, cwd=cwd)
    assert p.returncode == 3 and "--repin" in p.stderr
    p = ledger_cmd("seal", d2, "--base", base, "--repin", cwd=cwd)
    assert p.returncode == 2 and "--reason" in p.stderr
    p = ledger_cmd("seal", d2, "--base", base, "--repin", "--reason", "rotate", "--json", cwd=cwd)
    assert p.returncode == 0, p.stderr
    assert json.loads(p.stdout)["repinned"] is True
    p = ledger_cmd("seal", cwd=cwd)
    assert p.returncode == 2 and "suite folder" in p.stderr
    p = ledger_cmd("seal", tmp_path / "nope", "--base", base, cwd=cwd)
    assert p.returncode == 2 and "no suite folder" in p.stderr


def test_seal_restore_cli(store, tmp_path):
    import shutil

    base = _base(store)
    d1 = seal.write_suite_dir(tmp_path / "s1", *_docs())
    res = seal.seal(store, d1, base=base)
    shutil.rmtree(seal.sealed_dir(store, res.suite.id))
    p = ledger_cmd("seal", "--restore", "--json", cwd=store.root.parent)
    assert p.returncode == 0, p.stderr
    assert seal.sealed_dir(store, res.suite.id).is_dir()
    p = ledger_cmd("seal", d1, "--restore", cwd=store.root.parent)
    assert p.returncode == 2


@pytest.mark.slow
def test_judge_cli_verdicts_are_exit_0_and_a_spent_budget_is_exit_3(world, wstore, tmp_path):
    cwd = wstore.root.parent
    p = ledger_cmd("judge", world.A, "--against", world.base, "--json", cwd=cwd)
    assert p.returncode == 0, p.stderr
    out = json.loads(p.stdout)
    assert out["verdict"] == "Accept" and out["budget"] == {"counted": True, "of": 20, "used": 1}
    assert "sealed" not in out  # per-document losses stay in the verdict object
    assert wstore.get_json(out["verdict_id"])["sealed"]["scored"]
    assert wstore.get_json(out["learner_view_id"])["verdict"] == "Accept"
    p = ledger_cmd("show", out["verdict_id"], cwd=cwd)
    assert p.returncode == 0 and "significant_improvement" in p.stdout and "wins/n" in p.stdout
    # A refusal is a verdict too: exit 0, with the colour-coded panel.
    p = ledger_cmd("judge", world.G, "--against", world.A, cwd=cwd)
    assert p.returncode == 0, p.stderr
    assert "GamedTheEvaluator" in p.stdout and "canary_divergence" in p.stdout and "1 of 20" not in p.stdout
    # Spend a small suite's budget, then the CLI refuses with exit 3 and says why.
    scored, canaries = seal.demo_docs(1, 1, 0)
    d = seal.write_suite_dir(tmp_path / "tiny", scored, canaries, settings={"budget_multiplier": 1})
    assert ledger_cmd("seal", d, "--base", world.base, "--repin", "--reason", "tiny", cwd=cwd).returncode == 0
    assert ledger_cmd("judge", world.A, "--against", world.base, "--json", cwd=cwd).returncode == 0
    p = ledger_cmd("judge", world.A, "--against", world.base, cwd=cwd)
    assert p.returncode == 3 and "budget is spent" in p.stderr and "1 of 1" in p.stderr
    p = ledger_cmd("judge", "b3:" + "e" * 64, cwd=cwd)
    assert p.returncode == 2


@pytest.mark.slow
def test_dpo_cli(world, wstore):
    cwd = wstore.root.parent
    p = ledger_cmd("dpo", world.pairs_file, "--sft", world.A, "--steps", "2", "--json", cwd=cwd)
    assert p.returncode == 0, p.stderr
    out = json.loads(p.stdout)
    assert out["sft_adapter"] == world.A and out["sandboxed"] and out["dpo"]["beta"] == 0.1
    assert wstore.get_json(out["receipt"])["config"]["steps"] == 2
    p = ledger_cmd("show", out["receipt"], cwd=cwd)
    assert p.returncode == 0 and "reward margin" in p.stdout
    p = ledger_cmd("dpo", world.pairs_file, "--sft", world.A, "--beta", "0", cwd=cwd)
    assert p.returncode == 2 and "beta" in p.stderr
