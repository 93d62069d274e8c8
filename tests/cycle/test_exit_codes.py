"""`ledger run` exits as the README's table says: 0 on a commit, 3 when the gate refuses (HEAD
unchanged, the refusal kept), and `--refusal-ok` makes a refusal 0 for scripts that want that."""

import json
import shutil

import pytest

from ledger import experience
from ledger.store import Store
from tests.conftest import ledger_cmd

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def bad(tmp_path_factory):
    """The demo's story up to its refusal: gen-1 learned from good turns, then turns whose actions
    are wrong, which the gate refuses against gen-1."""
    from ledger.cycle import ensure_genesis, load_spec, run_cycle
    from ledger.demo.story import BAD_TURNS, GOOD_TURNS, bad_turns, good_turns
    from ledger.gate import seal as seallib
    from ledger.options import LearnOptions

    root = tmp_path_factory.mktemp("bad")
    s = Store.init(root)
    ensure_genesis(s, load_spec(None))
    seallib.seal(s, seallib.write_demo_suite(root / "suite-src"))
    shutil.rmtree(root / "suite-src")
    experience.record(s, experience.parse_turns("\n".join(json.dumps(t) for t in good_turns(GOOD_TURNS, seed=1))))
    assert run_cycle(s, LearnOptions(min_hours=0)).outcome == "commit"
    experience.record(s, experience.parse_turns("\n".join(json.dumps(t) for t in bad_turns(BAD_TURNS, seed=2))))
    return root


def test_a_refused_cycle_exits_3_and_refusal_ok_exits_0(bad, tmp_path):
    w = tmp_path / "a"
    shutil.copytree(bad, w)
    head = Store.open(w).state.refs["HEAD"]
    p = ledger_cmd("run", "--force", "--json", cwd=w, timeout=900)
    assert p.returncode == 3, (p.stdout, p.stderr)
    lines = [line for line in p.stdout.splitlines() if line.strip()]
    result = json.loads(lines[0])
    assert result["outcome"] == "refusal" and result["verdict"] != "Accept"
    assert Store.open(w).state.refs["HEAD"] == head
    assert "refused" in p.stderr
    w2 = tmp_path / "b"
    shutil.copytree(bad, w2)
    p = ledger_cmd("run", "--force", "--refusal-ok", cwd=w2, timeout=900)
    assert p.returncode == 0, (p.stdout, p.stderr)
    assert "refused; HEAD stays gen-1" in p.stdout
