"""The CLI's table layout (ledger/cli/tables.py) against golden renderings at 160, 80 and 40
columns and into a pipe: words are never cut, columns are left out by priority and named."""

from pathlib import Path

import pytest

from ledger.cli.tables import Column, render, short_id

GOLDEN = Path(__file__).parent / "golden"
COLS = [Column("gen"), Column("verdict"), Column("score", 1, "right"), Column("when", 2),
        Column("note", 0, wrap=True)]
ROWS = [["gen-0", "-", "-", "2026-12-01 08:00", "the built-in tiny Llama (random init), no adapter yet"],
        ["gen-1", "Accept", "0.6040", "2026-12-01 08:05",
         "cycle 1: 150 turns t1–t150, loss 2.31 → 0.84, 10/10 documents better"],
        ["gen-2", "Accept", "0.5512", "2026-12-01 08:09", "adopted team/gen-7 (forced: inspected by hand)"]]
WORDS = {w for r in ROWS for cell in r for w in cell.split()}


@pytest.mark.parametrize("width,name", [(160, "160"), (80, "80"), (40, "40"), (None, "pipe")])
def test_golden(width, name):
    assert render(COLS, ROWS, width) == (GOLDEN / f"table-{name}.txt").read_text()


@pytest.mark.parametrize("width", [100, 80, 60, 40, 30])
def test_fits_and_never_cuts_a_word(width):
    out = render(COLS, ROWS, width).splitlines()
    body = [line for line in out if not line.startswith("(")]
    assert all(len(line) <= width for line in body), "\n".join(body)
    assert {w for line in body[2:] for w in line.split()} <= WORDS | {"-"}  # every word whole


def test_a_pipe_gets_one_line_per_row():
    out = render(COLS, ROWS, None).splitlines()
    assert len(out) == 2 + len(ROWS) and ROWS[1][4] in out[3]


def test_short_ids_are_prefixes_commands_accept():
    assert short_id("b3:" + "a" * 64) == "b3:" + "a" * 10
    assert short_id("run:" + "b" * 64) == "run:" + "b" * 10
    assert short_id(None) == "-"


def _fake_gens():
    from types import SimpleNamespace

    rows = [dict(head=False, name="gen-0", id="b3:" + "0a" * 32, parent=None, adapter=None, verdict=None,
                 mean_delta=None, receipt=None, note="genesis: the base model, no adapter"),
            dict(head=False, name="gen-1", id="b3:" + "1b" * 32, parent="gen-0", adapter="b3:" + "2c" * 32,
                 verdict="Accept", mean_delta=-0.4213, receipt="r1", note="cycle 1: Accept"),
            dict(head=True, name="gen-2", id="b3:" + "3d" * 32, parent="gen-1", adapter="b3:" + "4e" * 32,
                 verdict="Accept", mean_delta=-0.0871, receipt="r2",
                 note="adopted team/gen-7 (forced: inspected by hand on the team cluster)")]
    return SimpleNamespace(rows=rows, losses={"r1": [2.7, 2.1, 1.6, 1.2, 0.9, 0.7, 0.5, 0.45, 0.4, 0.39],
                                              "r2": [0.5, 0.45, 0.41, 0.4]})


@pytest.mark.parametrize("width,name", [(160, "160"), (80, "80"), (None, "pipe")])
def test_gens_golden(width, name):
    from ledger.cli.cycle_cmds import GENS_COLUMNS, gens_cells

    assert render(GENS_COLUMNS, gens_cells(_fake_gens()), width) == (GOLDEN / f"gens-{name}.txt").read_text()
