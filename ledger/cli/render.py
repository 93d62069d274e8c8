"""Human views of records and structured objects (rich). JSON mode never comes here.

Structured objects are rendered by their "kind"; modules that own a kind register a
renderer in RENDERERS as "module:function" so that it is imported only when needed.
"""

from __future__ import annotations

import importlib
import json
import sys

from ledger import api
from ledger.cli import common

RENDERERS: dict[str, str] = {
    "generation": "ledger.cli.render:generation",
    "verdict": "ledger.cli.gate_cmds:render_verdict_obj",
    "dpo-receipt": "ledger.cli.gate_cmds:render_dpo_receipt_obj",
    "plan": "ledger.cli.render:plan",
    "receipt": "ledger.cli.render:receipt",
    "comparison": "ledger.cli.render:comparison",
}

VERDICT_STYLE = {"Accept": "bold green", "Regressed": "red", "NoImprovement": "yellow",
                 "GamedTheEvaluator": "bold magenta", "SuiteChanged": "bold red", "TrainingFailed": "red"}
OUTCOME_STYLE = {"Reproduced": "bold green", "WithinTolerance": "green", "Diverged": "bold red", "MissingInputs": "bold red"}
RUNG_STYLE = {"Learned": "green", "Judged": "bold green", "Ran": "yellow", "Emitted": "yellow", "Checked": "red"}


def styled(name, styles: dict) -> str:
    """`name` (data: escaped) in its colour; unknown names plain."""
    from rich.markup import escape

    text = escape(str(name))
    style = styles.get(name)
    return f"[{style}]{text}[/]" if style else text


Segment = tuple[str, "str | None"]  # (text, rich style or None); text is data, never markup


def loss_segments(losses, width: int = 16, numbers: bool = True) -> list[Segment]:
    """`▇▅▃▂▁ 2.70→0.39`: a receipt's loss trace in one cell (first→last loss with `numbers`)."""
    vals = [v for v in (losses or []) if isinstance(v, (int, float))]
    if not vals:
        return []
    return [(api.sparkline(vals, width), "cyan")] + ([(f" {vals[0]:.3g}→{vals[-1]:.3g}", None)] if numbers else [])


def loss_spark(losses, width: int = 16, numbers: bool = True) -> str:
    """loss_segments as rich markup (sparkline glyphs and numbers: nothing to escape)."""
    return "".join(f"[{style}]{text}[/]" if style else text for text, style in loss_segments(losses, width, numbers))


def _summary(r: dict, losses=None) -> list[Segment]:
    """What a record did, as styled segments (the `what` column of `ledger log`)."""
    p = r["payload"]
    bits: list[list[Segment]] = []
    refs = p.get("refs")  # a well-chained record may still be ill-formed: `log` shows it, verify names it
    for name, target in sorted(refs.items() if isinstance(refs, dict) else []):
        bits.append([(f"{name}→{common.short(str(target), 8) if target else 'deleted'}", None)])
    if isinstance(p.get("verdict_name"), str) and p["verdict_name"]:
        bits.append([(p["verdict_name"], VERDICT_STYLE.get(p["verdict_name"]))])
        codes = p.get("reasons") if r["kind"] == "refusal" else p.get("reason_codes")
        if p["verdict_name"] != "Accept" and isinstance(codes, list) and codes:
            bits.append([(f"({', '.join(map(str, codes))})", "dim")])
    if r["kind"] == "reproduce" and isinstance(p.get("outcome"), str):
        bits.append([(p["outcome"], OUTCOME_STYLE.get(p["outcome"]))])
    if r["kind"] in ("train", "track") and isinstance(p.get("rung"), str):
        bits.append([(p["rung"], RUNG_STYLE.get(p["rung"]))])
    if r["kind"] == "track-start" and isinstance(p.get("run"), str):  # a tracked run (ledger.track) began
        params = p.get("params") if isinstance(p.get("params"), dict) else {}
        shown = ", ".join(f"{k}={v}" for k, v in list(params.items())[:4])
        bits.append([(f"run {p['run']}" + (f" ({shown})" if shown else ""), None)])
    if r["kind"] == "track" and isinstance(p.get("status"), str):
        bits.append([(p["status"], "green" if p["status"] == "finished" else "red")])
    if r["kind"] == "track-metrics" and isinstance(p.get("rows"), int):
        bits.append([(f"{p['rows']} metric rows, steps {p.get('first_step')}–{p.get('last_step')}", None)])
    for k in ("name", "kind", "reason", "note"):
        if isinstance(p.get(k), str) and p[k]:
            bits.append([(f"{k}={p[k]}", None)])
    spark = loss_segments(losses, 12)
    if spark:
        bits.append(spark)
    if not bits and r["outputs"]:
        bits.append([("→ " + ", ".join(common.short(o, 8) for o in r["outputs"][:3]), None)])
    out: list[Segment] = []
    for i, bit in enumerate(bits):
        out += ([("  ", None)] if i else []) + bit
    return out


def records(recs, losses) -> None:
    """The journal as a table: seq, time, kind, id, and what the record did (`losses`: seq -> the
    loss trace of the receipt a record names, from api.log). On a terminal the `what` column
    wraps under itself, in colour; into a pipe each record is one plain line (what a script or
    grep wants), written without loading rich at all — a third of `ledger log`'s start-up."""
    rows = [(str(r["seq"]), r["time"][:19].replace("T", " "), r["kind"], common.short(r["id"], 10),
             _summary(r, losses.get(r["seq"]))) for r in recs]
    head = ("seq", "time", "kind", "id")
    widths = [max(len(h), *(len(row[i]) for row in rows)) if rows else len(h) for i, h in enumerate(head)]

    def cells(values) -> str:
        return " " + "".join(v.ljust(w) + "  " for v, w in zip(values, widths))

    if common.plain_stdout():
        out = [cells(head) + "what"]
        # one line a record, also when a payload string holds line breaks
        out += [cells(fixed) + " ".join("".join(text for text, _ in what).splitlines()) for *fixed, what in rows]
        sys.stdout.write("\n".join(out) + "\n")
        return
    from rich.text import Text

    c = common.console()
    indent = " " * len(cells(head))
    room = max(20, c.width - len(indent) - 1)
    lines = [Text(cells(head) + "what", style="bold")]
    for seq, time_, kind, rid, what in rows:
        first, *rest = Text.assemble(*what).wrap(c, room) or [Text()]
        for t in (first, *rest):
            t.rstrip()  # a wrapped line keeps the space it broke at
        lead = Text(" " + seq.ljust(widths[0]) + "  " + time_.ljust(widths[1]) + "  ")
        lead.append(kind, style="cyan").append(" " * (widths[2] - len(kind) + 2))
        lines.append(lead.append(rid.ljust(widths[3]) + "  ").append_text(first))
        lines += [Text(indent).append_text(more) for more in rest]
    c.print(Text("\n").join(lines), soft_wrap=True)  # laid out already: no second wrap


def record(r: dict) -> None:
    from rich.panel import Panel
    from rich.pretty import Pretty

    common.console().print(Panel(Pretty(r), title=f"journal record {r['seq']} ({r['kind']})"))


def obj(oid: str, o) -> None:
    kind = o.get("kind") if isinstance(o, dict) else None
    target = RENDERERS.get(kind or "")
    if target:
        mod, fn = target.split(":")
        getattr(importlib.import_module(mod), fn)(oid, o)
        return
    from rich.panel import Panel
    from rich.syntax import Syntax

    text = json.dumps(o, indent=2, sort_keys=True, ensure_ascii=False)
    common.console().print(Panel(Syntax(text, "json", word_wrap=True), title=f"{kind or 'object'} {common.short(oid)}"))


def generation(oid: str, g: dict) -> None:
    from rich.panel import Panel
    from rich.table import Table

    t = Table.grid(padding=(0, 2))
    for k in ("parent", "base", "adapter", "receipt", "verdict"):
        t.add_row(k, common.short(g.get(k), 16))
    caps = g.get("capabilities") or {}
    t.add_row("capabilities", ", ".join(sorted(caps)) or "-")
    t.add_row("kernels", ", ".join(sorted(g.get("kernels") or {})) or "-")
    if g.get("note"):
        from rich.markup import escape

        t.add_row("note", escape(g["note"]))
    common.console().print(Panel(t, title=f"gen-{g.get('n')}  {common.short(oid)}"))


def _boxed(title: str, border: str, draw, extra=()) -> None:
    """Draw a renderer that prints line by line (shared with `train`, `compile`, `reproduce`)
    inside a panel for `ledger show`: capture it 4 columns narrower (the panel's border and
    padding), then box the captured text with any extra lines."""
    from rich.console import Group
    from rich.panel import Panel
    from rich.text import Text

    c = common.console()
    width = c.width
    c.width = max(40, width - 4)
    try:
        with c.capture() as cap:
            draw()
    finally:
        c.width = width
    body = Text.from_ansi(cap.get().rstrip("\n"))
    c.print(Panel(Group(body, *extra), title=title, title_align="left", border_style=border))


def plan(oid: str, obj: dict) -> None:
    from ledger.cli.train_cmds import render_plan

    _boxed("plan", "cyan", lambda: render_plan(obj, oid))


def receipt(oid: str, obj: dict) -> None:
    from rich.text import Text

    from ledger.cli.train_cmds import render_receipt

    spark = loss_spark(obj.get("losses"), 40)
    extra = [Text.from_markup(f"[dim]loss curve[/]  {spark}")] if spark else []
    rung = obj.get("rung")
    _boxed(f"receipt · {rung}", RUNG_STYLE.get(rung, "white").split()[-1], lambda: render_receipt(obj, oid), extra)


def comparison(oid: str, obj: dict) -> None:
    from ledger.cli.train_cmds import render_comparison

    outcome = obj.get("outcome")
    _boxed(f"comparison · {outcome}", OUTCOME_STYLE.get(outcome, "white").split()[-1], lambda: render_comparison(obj, oid))
