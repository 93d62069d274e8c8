"""End-to-end learn cycles through the CLI: the demo story, the trigger policy, SIGKILL at
stage boundaries and mid-training followed by a clean resume, and checkout loading in peft."""

import json
import shutil
import signal
from importlib import resources

import pytest

from ledger import experience
from ledger.store import Store
from tests.conftest import ledger_cmd
from tests.reliability.helpers import assert_consistent

pytestmark = pytest.mark.slow


def _small_spec(path):
    text = resources.files("ledger.demo").joinpath("cycle.toml").read_text()
    text = text.replace("steps = 80", "steps = 30").replace("checkpoint_every = 40", "checkpoint_every = 10")
    path.write_text(text)
    return path


@pytest.fixture(scope="module")
def seeded(tmp_path_factory):
    """A store with gen-0, a sealed demo suite and 160 good turns; copied per test."""
    from ledger.cycle import ensure_genesis, load_spec
    from ledger.demo.story import good_turns
    from ledger.gate import seal as seallib

    root = tmp_path_factory.mktemp("seeded")
    s = Store.init(root)
    ensure_genesis(s, load_spec(None))
    seallib.seal(s, seallib.write_demo_suite(root / "suite-src"))
    shutil.rmtree(root / "suite-src")
    experience.record(s, experience.parse_turns("\n".join(json.dumps(t) for t in good_turns(160, seed=1))))
    _small_spec(root / "small.toml")
    return root


def _copy(seeded, tmp_path):
    dst = tmp_path / "w"
    shutil.copytree(seeded, dst)
    return dst


def _ends(root):
    return [r for r in Store.open(root).journal.records() if r["kind"] in ("commit", "refusal")]


def test_policy_refusal_changes_nothing(seeded, tmp_path):
    w = _copy(seeded, tmp_path)
    before = Store.open(w).state
    p = ledger_cmd("run", "--spec", "small.toml", "--min-turns", "500", cwd=w)
    assert p.returncode == 3 and "160 new turns recorded, 500 needed" in p.stderr
    assert Store.open(w).state == before


def test_cycle_accepts_then_checkout_loads_in_peft(seeded, tmp_path):
    w = _copy(seeded, tmp_path)
    p = ledger_cmd("run", "--spec", "small.toml", "--json", cwd=w, check=True)
    res = json.loads(p.stdout)
    assert res["outcome"] == "commit" and res["verdict"] == "Accept" and res["generation"] == "gen-1"
    assert res["score"]["mean_delta"] < 0
    gens = json.loads(ledger_cmd("gens", "--json", cwd=w, check=True).stdout)
    assert [g["name"] for g in gens if g["head"]] == ["gen-1"] and gens[1]["verdict"] == "Accept"
    # the policy counts from the last cycle: nothing new recorded, so not due
    p = ledger_cmd("run", "--spec", "small.toml", "--min-hours", "0", cwd=w)
    assert p.returncode == 3 and "0 new turns" in p.stderr
    d = json.loads(ledger_cmd("diff", "gen-0", "gen-1", "--json", cwd=w, check=True).stdout)
    assert {f["field"] for f in d["fields"]} >= {"adapter", "receipt", "verdict", "parent"}
    assert d["adapter"] and all(r["change"] > 0 for r in d["adapter"])
    assert d["data"]["a"] is None and d["data"]["b"]["turns"] == "t1–t160"

    out = tmp_path / "co"
    ledger_cmd("checkout", "gen-1", out, cwd=w, check=True)
    import torch
    from peft import PeftModel
    from safetensors.torch import load_file
    from transformers import LlamaForCausalLM

    base = LlamaForCausalLM.from_pretrained(str(out / "base"), local_files_only=True)
    model = PeftModel.from_pretrained(base, str(out), local_files_only=True)
    saved = load_file(str(out / "adapter_model.safetensors"))
    live = {n: p for n, p in model.named_parameters() if "lora_" in n}
    assert len(live) == len(saved) > 0
    k = next(iter(saved))
    match = [n for n in live if n.replace(".default", "") == k]
    assert match and torch.equal(live[match[0]].detach(), saved[k])
    ids = torch.tensor([[1, 104, 105, 2]])
    assert torch.isfinite(model(input_ids=ids).logits).all()
    assert_consistent(w / ".ledger")


def _fault_points(w):
    trace = w.parent / "trace"
    probe = w.parent / "probe"
    shutil.copytree(w, probe)
    ledger_cmd("run", "--spec", "small.toml", "--force", cwd=probe, env={"LEDGER_FAULT_TRACE": str(trace)}, check=True)
    pts = [l.split() for l in trace.read_text().splitlines()]
    shutil.rmtree(probe)
    return [(int(n), name) for n, name in pts]


def test_sigkill_then_resume(seeded, tmp_path):
    """Kill `ledger run` right after each stage commits, and mid-run; each time the store is
    consistent, HEAD is gen-0 or gen-1, and the next `ledger run` finishes the same cycle."""
    w = _copy(seeded, tmp_path)
    points = _fault_points(w)
    committed = [n for n, name in points if name == "tx.committed"]
    # committed points: export, compile, checkpoint(s), train, judge, commit. Kill after the
    # first checkpoint (mid-training: export and compile are reused, training resumes) and
    # after the judge (the verdict is reused, so the gate budget is not spent twice).
    assert len(committed) >= 6
    chosen = [committed[2], committed[-2]]
    g0 = Store.open(w).state.refs["HEAD"]
    for n in chosen:
        x = tmp_path / f"k{n}"
        shutil.copytree(w, x)
        p = ledger_cmd("run", "--spec", "small.toml", "--force", cwd=x, env={"LEDGER_FAULT_AT": str(n)})
        assert p.returncode == -signal.SIGKILL, p.stderr
        st = assert_consistent(x / ".ledger").state
        assert st.refs["HEAD"] == g0 and not _ends(x)
        p = ledger_cmd("run", "--spec", "small.toml", "--json", cwd=x, check=True)  # resumes: no --force needed
        res = json.loads(p.stdout)
        assert res["cycle"] == 1 and res["outcome"] == "commit"
        assert any(v.get("reused") for v in res["stages"].values())
        ends = _ends(x)
        assert len(ends) == 1 and ends[0]["payload"]["cycle"] == 1
        # only one export, one train for the cycle: nothing was redone that had committed
        recs = Store.open(x).journal.records()
        assert sum(r["kind"] == "export" for r in recs) == 1
        assert sum(r["kind"] == "train" for r in recs) == 1
        assert_consistent(x / ".ledger")
        shutil.rmtree(x)
