"""The terminal: colour-coded verdicts and loss sparklines in `gens` and `log`, panels for `show`
of plans, receipts, verdicts and comparisons, NO_COLOR, escaped user text, shell completion."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from ledger import generations
from ledger.cli.render import VERDICT_STYLE
from ledger.report.sparkline import sparkline
from ledger.store import Store
from tests.conftest import ledger_cmd

ESC = "\x1b"
# a forced terminal, wide enough that a table cell never wraps; NO_COLOR="" is "unset"
COLOUR = {"FORCE_COLOR": "1", "NO_COLOR": "", "COLUMNS": "220", "TERM": "xterm-256color"}
NO_COLOUR = {**COLOUR, "NO_COLOR": "1"}


def _sgr_before(text: str, word: str) -> set[str]:
    """The SGR parameter strings that directly style `word` in `text`."""
    return set(re.findall(r"\x1b\[([0-9;]+)m" + re.escape(word), text))


def _train_losses(s: Store) -> list[list[float]]:
    return [s.get_json(r["payload"]["receipt"])["losses"] for r in s.journal.records() if r["kind"] == "train"]


@pytest.mark.slow
def test_gens_colours_verdicts_and_shows_the_receipt_sparkline(demo_store):
    s = Store.open(demo_store)
    p = ledger_cmd("gens", cwd=demo_store, env=COLOUR, check=True)
    assert _sgr_before(p.stdout, "Accept"), "Accept is not colour-coded"
    committed = [g for g in (s.get_json(s.state.refs[f"gen-{n}"]) for n in generations.numbers(s)) if g["receipt"]]
    assert committed
    for g in committed:
        spark = sparkline(s.get_json(g["receipt"])["losses"], 10)
        assert spark and spark in p.stdout
    plain = ledger_cmd("gens", cwd=demo_store, env=NO_COLOUR, check=True).stdout
    assert ESC not in plain and "Accept" in plain and "HEAD →" in plain
    assert all(sparkline(s.get_json(g["receipt"])["losses"], 10) in plain for g in committed)


@pytest.mark.slow
def test_log_colours_each_verdict_differently_and_shows_train_sparklines(demo_store):
    s = Store.open(demo_store)
    recs = list(s.journal.records())
    p = ledger_cmd("log", "-n", str(len(recs)), cwd=demo_store, env=COLOUR, check=True)
    verdicts = {r["payload"]["verdict_name"] for r in recs if r["kind"] in ("commit", "refusal")}
    assert "Accept" in verdicts and len(verdicts) >= 2
    codes = {v: frozenset(_sgr_before(p.stdout, v)) for v in verdicts}
    assert all(codes.values()), f"not colour-coded: {[v for v, c in codes.items() if not c]}"
    assert len(set(codes.values())) == len(codes), "two verdicts share a colour"
    assert set(verdicts) <= set(VERDICT_STYLE)
    for losses in _train_losses(s):
        assert sparkline(losses, 12) in p.stdout
    plain = ledger_cmd("log", "-n", str(len(recs)), cwd=demo_store, env=NO_COLOUR, check=True).stdout
    assert ESC not in plain and all(v in plain for v in verdicts)
    assert all(sparkline(x, 12) in plain for x in _train_losses(s))


def _panel(out: str, title: str) -> None:
    lines = out.strip("\n").splitlines()
    assert lines[0].startswith("╭") and title in lines[0], lines[0]
    assert lines[-1].startswith("╰") and all(line.startswith("│") for line in lines[1:-1])


@pytest.mark.slow
def test_show_renders_plans_receipts_and_verdicts_as_panels(demo_store):
    s = Store.open(demo_store)
    train = [r for r in s.journal.records() if r["kind"] == "train"][-1]["payload"]
    rid, plan = train["receipt"], train["plan"]
    vid = [r for r in s.journal.records() if r["kind"] == "judge"][-1]["payload"]["verdict"]
    receipt = s.get_json(rid)
    for env in (COLOUR, NO_COLOUR):
        out = ledger_cmd("show", rid, cwd=demo_store, env=env, check=True).stdout
        plain = re.sub(r"\x1b\[[0-9;]*m", "", out)
        _panel(plain, f"receipt · {receipt['rung']}")
        assert rid in plain and sparkline(receipt["losses"], 40) in plain
        assert (ESC in out) == (env is COLOUR)
    out = ledger_cmd("show", plan, cwd=demo_store, env=NO_COLOUR, check=True).stdout
    _panel(out, "plan")
    assert plan in out and "memory line" in out and ESC not in out
    out = ledger_cmd("show", vid, cwd=demo_store, env=NO_COLOUR, check=True).stdout
    _panel(out, "verdict")
    assert s.get_json(vid)["verdict"] in out and ESC not in out


@pytest.mark.slow
def test_show_renders_a_comparison_as_a_panel(reproduced):
    root, rid, res = reproduced
    out = ledger_cmd("show", res["comparison"], cwd=root, env=NO_COLOUR, check=True).stdout
    _panel(out, "comparison · MissingInputs")
    assert rid in out and res["missing"] and all(m in out for m in res["missing"])


def test_user_text_is_not_rich_markup(tmp_path):
    """Notes and reasons are user data: shown verbatim, never interpreted (an unbalanced closing
    tag would otherwise crash the renderer)."""
    s = Store.init(tmp_path)
    with s.transaction("genesis") as tx:
        generations.new_generation(tx, s, base=tx.put_bytes(b"w"), note="[bold]zero[/] [/nope]")
    with s.transaction("commit") as tx:
        generations.new_generation(tx, s, note="[red]one[/red]")
    generations.rollback(s, reason="[link=https://x]why[/link] [/]")
    log = ledger_cmd("log", cwd=tmp_path, env=COLOUR, check=True).stdout
    assert "reason=[link=https://x]why[/link] [/]" in re.sub(r"\x1b\[[0-9;]*m", "", log)
    gens = ledger_cmd("gens", cwd=tmp_path, env=NO_COLOUR, check=True).stdout
    assert "[bold]zero[/] [/nope]" in gens and "[red]one[/red]" in gens
    show = ledger_cmd("show", "gen-0", cwd=tmp_path, env=NO_COLOUR, check=True).stdout
    assert "[bold]zero[/] [/nope]" in show


def test_no_color_means_no_escapes_on_a_forced_terminal(tmp_path):
    Store.init(tmp_path)
    coloured = ledger_cmd("log", cwd=tmp_path, env=COLOUR, check=True).stdout
    assert ESC in coloured  # the forced terminal really is coloured…
    plain = ledger_cmd("log", cwd=tmp_path, env=NO_COLOUR, check=True).stdout
    assert ESC not in plain and "init" in plain  # …and NO_COLOR removes every escape
    err = ledger_cmd("show", "nothing-here", cwd=tmp_path, env=NO_COLOUR)
    assert err.returncode == 2 and ESC not in err.stderr and "error:" in err.stderr


def _entry_script() -> Path:
    # completion is keyed on the program name, so it must be the installed `ledger` script
    p = Path(sys.executable).with_name("ledger")
    assert p.exists(), f"the `ledger` entry point is not installed next to {sys.executable}"
    return p


def test_shell_completion_script_and_completions():
    exe = _entry_script()
    env = {k: v for k, v in os.environ.items() if not k.startswith("_LEDGER")}
    # `--show-completion` detects the calling shell from the parent process (CI runs under sh), so
    # call it the way a user does: from bash. The trailing `; true` keeps bash from exec-ing ledger.
    p = subprocess.run(["bash", "-c", f"'{exe}' --show-completion; true"], capture_output=True, text=True,
                       env=env, timeout=60)
    assert p.returncode == 0 and "complete " in p.stdout and "_LEDGER_COMPLETE=complete_bash" in p.stdout
    p = subprocess.run([exe], capture_output=True, text=True, timeout=60,
                       env={**env, "_LEDGER_COMPLETE": "complete_bash", "COMP_WORDS": "ledger rep", "COMP_CWORD": "1"})
    assert p.returncode == 0 and set(p.stdout.split()) == {"repack", "repair", "report", "reproduce"}
    p = subprocess.run([exe], capture_output=True, text=True, timeout=60,
                       env={**env, "_LEDGER_COMPLETE": "complete_bash", "COMP_WORDS": "ledger report --o", "COMP_CWORD": "2"})
    assert "--output" in p.stdout.split()


def test_log_into_a_pipe_is_one_plain_line_per_record_without_rich(demo_store):
    """Piped, `ledger log` prints one unwrapped line per record, no escapes — and does not
    load rich to do it (a third of its start-up)."""
    recs = Store.open(demo_store).journal.records()
    env = {k: v for k, v in os.environ.items() if k not in ("FORCE_COLOR", "TTY_COMPATIBLE")}
    p = subprocess.run([sys.executable, "-c", "import sys; from ledger.cli.main import main; main(sys.argv[1:]); "
                        "print('rich' in sys.modules, file=sys.stderr)", "--store", str(demo_store), "log", "-n",
                        str(len(recs))], capture_output=True, text=True, env={**env, "COLUMNS": "60"}, check=True)
    lines = p.stdout.splitlines()
    assert p.stderr.strip() == "False" and ESC not in p.stdout
    assert len(lines) == len(recs) + 1 and lines[0].split() == ["seq", "time", "kind", "id", "what"]
    refusal = next(ln for ln in lines if " refusal " in ln)
    assert len(refusal) > 60 and "NoImprovement" in refusal  # not wrapped at the width
