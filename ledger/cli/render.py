"""Human views of records and structured objects (rich). JSON mode never comes here.

Structured objects are rendered by their "kind"; modules that own a kind register a
renderer in RENDERERS as "module:function" so that it is imported only when needed.
"""

from __future__ import annotations

import importlib
import json

from ledger.cli import common

RENDERERS: dict[str, str] = {
    "generation": "ledger.cli.render:generation",
    "verdict": "ledger.cli.gate_cmds:render_verdict_obj",
    "dpo-receipt": "ledger.cli.gate_cmds:render_dpo_receipt_obj",
}

VERDICT_STYLE = {"Accept": "bold green", "Regressed": "red", "NoImprovement": "yellow",
                 "GamedTheEvaluator": "bold magenta", "SuiteChanged": "bold red"}


def _summary(r: dict) -> str:
    p = r["payload"]
    bits = []
    for name, target in sorted((p.get("refs") or {}).items()):
        bits.append(f"{name}→{common.short(target, 8) if target else 'deleted'}")
    for k in ("verdict_name", "name", "kind", "reason", "note"):
        if isinstance(p.get(k), str) and p[k]:
            bits.append(f"{k}={p[k]}")
    if not bits and r["outputs"]:
        bits.append("→ " + ", ".join(common.short(o, 8) for o in r["outputs"][:3]))
    return "  ".join(bits)


def records(recs: list[dict]) -> None:
    from rich.table import Table

    t = Table("seq", "time", "kind", "id", "what", box=None, header_style="bold")
    for r in recs:
        t.add_row(str(r["seq"]), r["time"][:19].replace("T", " "), f"[cyan]{r['kind']}[/]", common.short(r["id"], 10), _summary(r))
    common.console().print(t)


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
        t.add_row("note", g["note"])
    common.console().print(Panel(t, title=f"gen-{g.get('n')}  {common.short(oid)}"))
