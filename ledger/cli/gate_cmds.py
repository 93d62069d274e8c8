"""The gate's commands: `ledger seal`, `ledger judge`, `ledger dpo`.

Parsing and rendering only; the work is ledger.api's. torch loads inside the verbs that score
or train, never at start-up.

Exit codes: any verdict that was reached is 0 -- the verdict is data, in the output and the
journal (SuiteChanged, GamedTheEvaluator, Regressed and NoImprovement included); a spent suite
budget is 3 (Refused); sealing a different suite without --repin is 3; bad input is 2.
"""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Annotated, Optional

import typer

from ledger import api
from ledger.cli import common
from ledger.cli.common import JsonOpt, finish, short
from ledger.cli.render import VERDICT_STYLE
from ledger.errors import BadInput


def register(app: typer.Typer) -> None:
    app.command("seal")(seal)
    app.command("judge")(judge)
    app.command("dpo")(dpo)


# --- seal ------------------------------------------------------------------------------------------
def seal(
    suite_dir: Annotated[Optional[Path], typer.Argument(help="Suite folder: eval/ and canary/ documents, optional settings.toml.")] = None,
    base: Annotated[Optional[str], typer.Option("--base", help="Base weights (or a generation) to pin against; default HEAD's base.")] = None,
    repin: Annotated[bool, typer.Option("--repin", help="Replace the pinned suite with a different one (needs --reason).")] = False,
    reason: Annotated[Optional[str], typer.Option("--reason", help="Why the suite changes (kept in the record).")] = None,
    restore: Annotated[bool, typer.Option("--restore", help="Rewrite the pinned suite's sealed copy from its objects.")] = False,
    json_: JsonOpt = False,
):
    """Seal a suite where training cannot read it, and pin its hash (one `seal` record)."""
    if restore:
        if suite_dir is not None or repin:
            raise BadInput("--restore takes no suite folder and no --repin", "run `ledger seal --restore` alone")
        res = api.seal_restore(store=common.store_dir())
        finish(json_, res, lambda: common.console().print(
            f"restored the sealed copy of suite {short(res.suite.id)} ({res.path})"))
        return
    if suite_dir is None:
        raise BadInput("give a suite folder to seal", "ledger seal SUITE_DIR (or --restore)")
    res = api.seal(suite_dir, base=base, repin=repin, reason=reason, store=common.store_dir())
    finish(json_, res, lambda: _render_seal(res.result))


def _render_seal(res) -> None:
    from rich.panel import Panel
    from rich.table import Table

    s = res.suite.summary()
    t = Table.grid(padding=(0, 2))
    t.add_row("suite hash", s["suite_hash"])
    t.add_row("manifest", s["manifest"])
    t.add_row("documents", f"{s['scored']} scored + {s['canaries']} canary")
    t.add_row("pinned to", f"base {short(s['base'], 16)}, tokenizer {short(s['tokenizer'], 16)}")
    t.add_row("budget", f"{s['budget']} gate runs on this hash")
    for part, ch in sorted(res.changes.items()):
        t.add_row(f"changed: {part}", str(ch))
    title = ("re-pinned" if res.repinned else "sealed and pinned") if res.new else "already pinned (nothing written)"
    common.console().print(Panel(t, title=title, border_style="green" if res.new else "dim"))
    for w in res.warnings:
        common.console().print(f"[yellow]warning:[/] {w}")


# --- judge -----------------------------------------------------------------------------------------
def judge(
    candidate: Annotated[str, typer.Argument(help="Adapter tree, receipt, generation (gen-N, HEAD) or base to judge.")],
    against: Annotated[Optional[str], typer.Option("--against", help="Incumbent (default HEAD; the bare base before any commit).")] = None,
    export: Annotated[Optional[str], typer.Option("--export", help="Training export (dataset object) to check for contamination, "
                                                  "in addition to what the candidate's receipt names.")] = None,
    json_: JsonOpt = False,
):
    """Score candidate and incumbent on the sealed suite and record the verdict (one `judge` record)."""
    say = (lambda msg: common.err_console().print(f"[dim]{msg}[/]")) if not json_ else None
    res = api.judge(candidate, against=against, export=export, progress=say, store=common.store_dir())
    finish(json_, res, lambda: render_verdict(res.body, res.verdict_id))


def render_verdict(v: dict, vid: str | None = None) -> None:
    """The verdict panel: colour-coded verdict, reasons, statistics, budget (also `ledger show`)."""
    from rich.markup import escape
    from rich.panel import Panel
    from rich.table import Table

    style = VERDICT_STYLE.get(v.get("verdict"), "bold")
    t = Table.grid(padding=(0, 2))
    t.add_column(style="dim")
    t.add_column()
    t.add_row("verdict", f"[{style}]{v.get('verdict')}[/]")
    for r in v.get("reasons") or []:
        t.add_row("reason", f"{r['code']}: {escape(r['message'])}")
    st = (v.get("statistics") or {}).get("scored")
    if st:
        t.add_row("mean Δ", f"{st['mean']:+.4f} nats/token  (η {st['eta']:.4f}; candidate {st['candidate_mean_loss']:.4f} "
                            f"vs incumbent {st['incumbent_mean_loss']:.4f})")
        t.add_row("p", f"{st['p_better']:.3g} better, {st['p_worse']:.3g} worse ({st['test']['method']}, "
                       f"{st['test']['patterns']} patterns)")
        t.add_row("wins/n", f"{st['wins']}/{st['n']} (need {st['wins_needed']})")
        bi = st.get("bootstrap") or {}
        if bi:
            t.add_row("interval", f"[{bi['low']:+.4f}, {bi['high']:+.4f}] ({bi['level']:.0%} bootstrap, display only)")
    ck = (v.get("statistics") or {}).get("canary")
    if ck:
        t.add_row("canaries", f"mean Δ {ck['mean_delta']:+.4f}, {ck['worse']}/{ck['k']} worse (τ_K {ck['tau_k']:.4f})")
    b = v.get("budget")
    if b:
        t.add_row("budget", f"{b['used']} of {b['of']} runs on this suite" + ("" if b.get("counted") else " (not counted)"))
    else:
        t.add_row("budget", "not counted (decided before scoring)")
    suite = v.get("suite") or {}
    t.add_row("suite", f"{short(suite.get('pinned_hash'), 16)}" + ("" if suite.get("matches") else
                                                                   f" [red]≠ now {short(suite.get('recomputed_hash'), 16)}[/]"))
    changes = ((v.get("context") or {}).get("suite") or {}).get("changes")
    for part, ch in sorted((changes or {}).items()):
        t.add_row("changed", f"{part}: {ch}")
    t.add_row("candidate", str(v.get("candidate")))
    t.add_row("incumbent", str(v.get("incumbent")))
    dpo = v.get("dpo")
    if dpo:
        t.add_row("dpo", f"β {dpo.get('beta')}, reward margin {dpo['reward_margin']['mean']:+.3f}, accuracy "
                         f"{dpo['accuracy']:.0%}, chosen reward {dpo['chosen_reward']['mean']:+.3f}")
    tr = (v.get("context") or {}).get("training") or {}
    if tr.get("protected_attempt_count"):
        t.add_row("training", f"[red]{tr['protected_attempt_count']} attempt(s) on protected paths were denied[/] "
                              f"(receipt {short(tr.get('receipt'))})")
    for n in v.get("notes") or []:
        t.add_row("note", f"[dim]{escape(n['message'])}[/]")
    lv = v.get("learner_view") or {}
    t.add_row("learner sees", f"{lv.get('verdict')}, best score {lv.get('best_score')}")
    common.console().print(Panel(t, title=f"verdict {short(vid)}" if vid else "verdict", border_style=style.split()[-1]))


def render_verdict_obj(oid: str, obj: dict) -> None:
    render_verdict(obj, oid)


# --- dpo -------------------------------------------------------------------------------------------
def dpo(
    pairs: Annotated[str, typer.Argument(help="Preference pairs: a .jsonl file ({situation, chosen, rejected} per line), "
                                              "a .parquet file, or a stored Parquet object.")],
    sft: Annotated[str, typer.Option("--sft", help="The SFT adapter to tune (its policy is the DPO reference).")],
    beta: Annotated[float, typer.Option("--beta", help="DPO β.")] = 0.1,
    lr: Annotated[float, typer.Option("--lr", help="AdamW learning rate.")] = 1e-4,
    steps: Annotated[int, typer.Option("--steps", help="Optimizer steps.")] = 50,
    batch: Annotated[int, typer.Option("--batch", help="Pairs per step.")] = 8,
    seed: Annotated[int, typer.Option("--seed", help="Data order seed.")] = 0,
    threads: Annotated[int, typer.Option("--threads", help="CPU threads of the child.")] = 1,
    unsandboxed: Annotated[bool, typer.Option("--unsandboxed", help="Run the child without Landlock (recorded in the receipt).")] = False,
    json_: JsonOpt = False,
):
    """Train a DPO adapter on top of an SFT adapter in a sandboxed child (one `train` record)."""
    show = not json_ and common.err_console().is_terminal

    def progress(p: dict) -> None:
        if show:
            common.err_console().print(f"[dim]step {p['step']}/{p['steps']}  loss {p['loss']:.4f}  "
                                       f"margin {p['margin']:+.3f}  accuracy {p['accuracy']:.0%}[/]")

    res = api.dpo(pairs, sft=sft, beta=beta, lr=lr, steps=steps, batch=batch, seed=seed, threads=threads,
                  unsandboxed=unsandboxed, progress=progress, store=common.store_dir())
    finish(json_, res, lambda: _render_dpo(res.result))


def _render_dpo(res) -> None:
    from rich.panel import Panel
    from rich.table import Table

    r = res.receipt
    d = r["dpo"]
    t = Table.grid(padding=(0, 2))
    t.add_column(style="dim")
    t.add_column()
    t.add_row("receipt", res.receipt_id)
    t.add_row("adapter", str(r["adapter"] or "none (stopped)"))
    t.add_row("rung", r["rung"])
    t.add_row("reference", f"SFT adapter {short(r['sft_adapter'], 16)}")
    t.add_row("pairs", f"{d['pairs']} ({short(r['dataset'], 16)})")
    t.add_row("β", str(d["beta"]))
    t.add_row("reward margin", f"mean {d['reward_margin']['mean']:+.4f}, min {d['reward_margin']['min']:+.4f}")
    t.add_row("accuracy", f"{d['accuracy']:.1%}")
    t.add_row("chosen reward", f"mean {d['chosen_reward']['mean']:+.4f} [{d['chosen_reward']['min']:+.4f}, "
                               f"{d['chosen_reward']['max']:+.4f}]")
    if r["losses"]:
        t.add_row("loss", f"{r['losses'][0]:.4f} → {r['losses'][-1]:.4f} over {len(r['losses'])} steps")
    sb = r["sandbox"]
    t.add_row("sandbox", f"landlock ABI {sb.get('landlock_abi')}" if sb.get("sandboxed") else "[red]UNSANDBOXED[/]")
    common.console().print(Panel(t, title="DPO", border_style="green" if r["adapter"] else "red"))


def render_dpo_receipt_obj(oid: str, obj: dict) -> None:
    _render_dpo(SimpleNamespace(receipt=obj, receipt_id=oid))
