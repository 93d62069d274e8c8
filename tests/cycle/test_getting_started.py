"""From an empty store to the first cycle, as README's "Your own first cycle" says, through the
real CLI: init, seal the example suite, record the example turns, run. Every precondition is
checked before any work: nothing trains before the store can judge it."""

import json
import shutil
from pathlib import Path

import pytest

from tests.conftest import ledger_cmd

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def test_run_checks_its_preconditions_before_any_work(tmp_path):
    assert ledger_cmd("init", cwd=tmp_path).returncode == 0
    p = ledger_cmd("record", EXAMPLES / "turns.jsonl", cwd=tmp_path)
    assert p.returncode == 0, p.stderr
    p = ledger_cmd("run", cwd=tmp_path)
    assert p.returncode == 2 and "no suite is sealed" in p.stderr, p.stderr
    kinds = [json.loads(line)["kind"] for line in (tmp_path / ".ledger" / "journal").read_text().splitlines()]
    assert "export" not in kinds and "train" not in kinds  # refused before exporting or training


@pytest.mark.slow
def test_init_seal_record_run_from_an_empty_store(tmp_path):
    shutil.copytree(EXAMPLES / "suite", tmp_path / "suite")
    steps = [("init",), ("seal", "suite"), ("record", EXAMPLES / "turns.jsonl"), ("run", "--json")]
    for args in steps:
        p = ledger_cmd(*args, cwd=tmp_path, timeout=900)
        assert p.returncode == 0, f"ledger {args}: {p.stdout}\n{p.stderr}"
    res = json.loads(p.stdout)
    assert res["outcome"] == "commit", res
    p = ledger_cmd("gens", "--json", cwd=tmp_path)
    gens = json.loads(p.stdout)
    assert [g["name"] for g in gens] == ["gen-0", "gen-1"] and gens[-1]["head"]
