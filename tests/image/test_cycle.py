"""The cycle drives the image: stop -> cycle -> start on HEAD.

`ledger serve --learn` runs the trigger policy itself: when the image's own turns make a cycle
due, it stops the image, runs the cycle (ledger.cycle.run_cycle, a small spec), and serves the new
generation after Accept -- a request sent during the cycle waits and is answered by the new
generation. Then the image records a turn that carries the sealed suite's canary string, and
`ledger run --force` is refused (GamedTheEvaluator, decided by rule, so the test is
deterministic): the image is stopped and started again, on the same generation."""

import json
import shutil
import threading
import time
from importlib import resources

import pytest

from ledger import experience, generations
from ledger.options import LearnOptions, ServeOptions
from ledger.store import Store
from tests.conftest import ledger_cmd
from tests.image.conftest import Served

pytestmark = pytest.mark.slow


def _seed(root):
    from ledger.cycle import ensure_genesis, load_spec
    from ledger.demo.story import good_turns
    from ledger.gate import seal as seallib

    s = Store.init(root)
    ensure_genesis(s, load_spec(None))
    seallib.seal(s, seallib.write_demo_suite(root / "suite-src"))
    shutil.rmtree(root / "suite-src")
    experience.record(s, experience.parse_turns("\n".join(json.dumps(t) for t in good_turns(160, seed=1))))
    text = resources.files("ledger.demo").joinpath("cycle.toml").read_text()
    (root / "small.toml").write_text(text.replace("steps = 80", "steps = 30").replace("checkpoint_every = 40", "checkpoint_every = 10"))
    return s


def _wait(cond, timeout, what):
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, what
        time.sleep(0.5)


def test_stop_cycle_start_switches_weights(tmp_path):
    from ledger.demo.story import good_turns

    s = _seed(tmp_path)
    g0 = generations.head(s)
    served = Served(tmp_path)
    try:
        served.start(ServeOptions(learn=LearnOptions(min_turns=162, min_hours=0, spec=str(tmp_path / "small.toml"))))
        first = served.image_pid
        for a, b in ((3, 4), (10, 20)):   # the image's own turns make the cycle due (160 + 2)
            t = served.act(f"user: what is {a} plus {b}?", action=f"call adder.add({a}, {b})")["turn"]
            assert t["generation"] == g0.id
        _wait(lambda: served.status().get("state") == "learning", 60, "the trigger policy never fired")
        box = {}
        th = threading.Thread(target=lambda: box.update(r=served.act("user: what is 5 plus 6?", max_new=8, timeout=900)))
        th.start()                                   # waits in the socket's backlog during the cycle
        _wait(lambda: served.status().get("state") == "serving", 900, "the image did not come back")
        th.join(120)
        g1 = generations.head(Store.open(tmp_path))
        assert g1.n == 1 and g1.verdict, "the cycle committed gen-1 (Accept)"
        assert box["r"]["turn"]["generation"] == g1.id and box["r"]["turn"]["gen"] == 1
        st = served.status()
        assert st["generation"] == g1.id and st["image_pid"] != first

        # a refused cycle, driven by `ledger run`: the image is restarted on the same generation
        experience.record(Store.open(tmp_path), experience.parse_turns(
            "\n".join(json.dumps(t) for t in good_turns(150, seed=3))), wait=30)
        canary = s.get_json(Store.open(tmp_path).state.refs["suite"])["canary_string"]
        served.act(canary, action="refuse: no")   # fits seq_len 96
        before = served.status()["image_pid"]
        p = ledger_cmd("run", "--spec", "small.toml", "--force", "--refusal-ok", "--json", cwd=tmp_path, check=True,
                       timeout=900)   # a refusal exits 3 unless --refusal-ok
        res = json.loads(p.stdout)
        assert res["outcome"] == "refusal" and res["verdict"] == "GamedTheEvaluator", res
        t = served.act("user: what is 1 plus 2?", max_new=8)["turn"]
        assert t["generation"] == g1.id
        st = served.status()
        assert st["image_pid"] != before and st["generation"] == g1.id
    finally:
        served.stop()
    recs = Store.open(tmp_path).journal.records()
    timeline = [(r["kind"], r["payload"].get("event")) for r in recs
                if r["kind"] in ("image", "export", "commit", "refusal")]
    assert timeline == [("image", "start"), ("image", "pause"), ("export", None), ("commit", None), ("image", "resume"),
                        ("image", "pause"), ("export", None), ("refusal", None), ("image", "resume"), ("image", "stop")]
    gens = [r["payload"]["gen"] for r in recs if r["kind"] == "image"]
    assert gens == [0, 0, 1, 1, 1, 1]
