"""Compile and train commands: targets, compile, train, reproduce, import-base.

Parsing and rendering only; the work is ledger.api's. torch/transformers/peft load inside the
verbs that train, never at start-up.

Exit codes: compile rejection 3; train stopped by a non-finite loss 3 (after its receipt is
committed); reproduce Diverged or MissingInputs 3 (after the comparison is committed);
a realization that cannot run here 3 (RealizationUnavailable).
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

from ledger import api
from ledger.cli import common
from ledger.cli.common import JsonOpt, finish, human_bytes, short


def register(app: typer.Typer) -> None:
    app.command("targets")(targets)
    app.command("compile")(compile_)
    app.command("train")(train)
    app.command("reproduce")(reproduce)
    app.command("import-base")(import_base)


TargetsFileOpt = Annotated[Optional[Path], typer.Option("--targets", help="A TOML file of extra target profiles.")]


# --- targets ------------------------------------------------------------------------------------
def targets(file: TargetsFileOpt = None, json_: JsonOpt = False):
    """List target profiles (built-in, plus --targets FILE)."""
    res = api.targets(file)

    def render():
        from rich.table import Table

        tb = Table("name", "device", "memory", "dtypes", "cc", "smem/block", "description", box=None, header_style="bold")
        for x in res.targets:
            tb.add_row(x.name, x.device, human_bytes(x.memory_bytes), ",".join(x.dtypes), x.compute_capability or "-",
                       human_bytes(x.shared_memory_bytes) if x.shared_memory_bytes else "-", x.description)
        common.console().print(tb)

    finish(json_, res, render)


# --- compile ------------------------------------------------------------------------------------
def compile_(
    spec: Annotated[Path, typer.Argument(help="Experiment spec (TOML).")],
    target: Annotated[Optional[str], typer.Option("--target", "-t", help="Target profile (default: the spec's compile.target).")] = None,
    targets_file: TargetsFileOpt = None,
    explain: Annotated[Optional[str], typer.Option("--explain", help="Another plan: list which derived parts changed.")] = None,
    json_: JsonOpt = False,
):
    """Compile a spec for a target into a plan, or reject it (exit 3) naming what does not fit."""
    res = api.compile(spec, target=target, targets_file=targets_file, explain=explain, store=common.store_dir())

    def render():
        render_plan(res.plan.body, res.plan.id)
        if res.explain is not None:
            render_explain(res.explain)

    finish(json_, res, render)


def render_plan(obj: dict, oid: str | None = None) -> None:
    """Human view of a plan object (also used by `ledger show`)."""
    from rich.table import Table

    con = common.console()
    b = obj
    c = b["config"]
    if oid:
        con.print(f"plan [bold]{oid}[/]")
    con.print(f"target [bold]{b['target']['name']}[/] ({b['target']['device']})  spec {short(b['spec'])}  "
              f"base {short(b['inputs']['base'])}  dataset {short(b['inputs']['dataset'])}  tokenizer {short(b['inputs']['tokenizer'])}")
    a = b["shapes"]["arch"]
    con.print(f"model: {a['layers']} layers, hidden {a['hidden']}, {a['heads']} heads ({a['kv_heads']} kv), "
              f"intermediate {a['intermediate']}, vocab {a['vocab']}")
    p = b["parameters"]
    con.print(f"parameters: {p['total']:,} total, {p['trainable']:,} trainable "
              f"({100 * p['trainable'] / max(1, p['total']):.2f}%)  LoRA r={c['lora']['r']} on {', '.join(c['lora']['target_modules'])}")
    sh = b["shapes"]
    con.print(f"batch: micro-batch {sh['micro_batch']} x {sh['seq_len']} tokens x accum {sh['grad_accum']}, "
              f"{sh['steps']} steps, {b['runtime']['threads']} thread(s), checkpoint every {b['runtime']['checkpoint_every']}")
    t = Table("memory line", "bytes", "", "formula", box=None, header_style="bold")
    for line in b["memory"]["lines"]:
        t.add_row(line["name"], f"{line['bytes']:,}", human_bytes(line["bytes"]), line["formula"])
    t.add_row("[bold]total[/]", f"[bold]{b['memory']['total_bytes']:,}[/]", human_bytes(b["memory"]["total_bytes"]), "")
    con.print(t)
    f = b["fit"]
    con.print(f"fit: [green]fits[/] — {human_bytes(f['needed_bytes'])} of {human_bytes(f['usable_bytes'])} usable "
              f"({f['memory_fraction']:g} x {human_bytes(f['target_bytes'])}), headroom {human_bytes(f['headroom_bytes'])}")
    names = sorted({r["name"] for r in b["realizations"].values()})
    con.print("realizations: " + "; ".join(
        f"{n} ({', '.join(op for op, r in sorted(b['realizations'].items()) if r['name'] == n)})" for n in names))


def render_explain(diff: dict) -> None:
    con = common.console()
    if diff["same"]:
        con.print("explain: the plans are identical")
        return
    con.print(f"explain: from {short(diff['from'])} to {short(diff['to'])}")
    for x in diff["config"]:
        con.print(f"  config  [yellow]{x['field']}[/]: {x['old']!r} → {x['new']!r}")
    for x in diff["derived"]:
        con.print(f"  derived [cyan]{x['part']}[/]: {x['old']!r} → {x['new']!r}")


# --- train --------------------------------------------------------------------------------------
def train(
    plan: Annotated[str, typer.Argument(help="Plan id/prefix/name, or a spec .toml (compiled first).")],
    resume: Annotated[Optional[str], typer.Option("--resume", help="Checkpoint id to resume from.")] = None,
    unsandboxed: Annotated[bool, typer.Option("--unsandboxed", help="Run the child without Landlock (recorded in the receipt).")] = False,
    compile_cache: Annotated[Optional[str], typer.Option("--compile-cache", help="Compile cache id to use (refused if built for another shape, device or library version).")] = None,
    json_: JsonOpt = False,
):
    """Run a plan in a sandboxed child; commit adapter, checkpoints and a receipt."""
    with common.TrainingBar(not json_) as prog:
        res = api.train(plan, resume=resume, unsandboxed=unsandboxed, progress=prog, store=common.store_dir(),
                        say=common.err_console().print, compile_cache=compile_cache)
    finish(json_, res, lambda: render_receipt(res.result.receipt, res.result.receipt_id))


def render_receipt(obj: dict, oid: str | None = None) -> None:
    """Human view of a receipt object (also used by `ledger show`)."""
    from rich.table import Table

    con = common.console()
    r = obj
    rung_style = {"Learned": "bold green", "Ran": "yellow", "Emitted": "yellow", "Checked": "red", "Judged": "bold green"}
    if oid:
        con.print(f"receipt [bold]{oid}[/]")
    con.print(f"rung [{rung_style.get(r['rung'], 'bold')}]{r['rung']}[/]"
              + (f"  [red]stopped: {r['stopped']['reason']} at step {r['stopped']['step']}[/]" if r.get("stopped") else ""))
    t = Table(box=None, show_header=False)
    t.add_column(style="dim")
    t.add_column()
    rows = [("plan", r["plan"]), ("spec", r["spec"]), ("target", f"{r['target']['name']} {short(r['target']['id'])}"),
            ("base", r["base"]), ("tokenizer", r["tokenizer"]), ("dataset", r["dataset"]),
            ("adapter", r["adapter"] or "none (no adapter offered)"), ("final checkpoint", r["final_checkpoint"]),
            ("resumed from", r.get("resumed_from") or "-"),
            ("cursor", f"steps {r['cursor']['start_step']}→{r['cursor']['end_step']}, next {r['cursor']['next_step']}"),
            ("seeds", ", ".join(f"{k}={v}" for k, v in sorted(r["seeds"].items()))),
            ("realizations", ", ".join(sorted(set(r["realizations"].values())))),
            ("source", f"{short(r['source']['hash'])} ({r['source']['files']} files)"),
            ("versions", ", ".join(f"{k} {v}" for k, v in sorted(r["versions"].items()) if v)),
            ("device", r["device"].get("cpu", "") + (f"; {r['device']['cuda']['device']}" if r["device"].get("cuda") else "")),
            ("sandbox", ("landlock ABI " + str(r["sandbox"].get("landlock_abi"))) if r["sandbox"].get("sandboxed") else "[red]UNSANDBOXED[/]")]
    m = r["memory"]
    obs = m["observed"]
    rows.append(("memory", f"predicted {human_bytes(m['predicted_bytes'])}, observed peak growth "
                           f"{human_bytes(obs['peak_growth_bytes'])} ({obs['method']})"))
    tm = r["timings"]
    rows.append(("timings", f"train {tm['train_s']:.2f} s, setup {tm['setup_s']:.2f} s, "
                            f"{(tm.get('tokens_per_s') or 0):,.0f} tokens/s"))
    ls = r["losses"]
    if ls:
        rows.append(("loss", f"{ls[0]:.4f} → {ls[-1]:.4f} over {len(ls)} steps"))
    for k, v in rows:
        t.add_row(k, str(v))
    con.print(t)


def render_plan_obj(oid: str, obj: dict) -> None:
    render_plan(obj, oid)


def render_receipt_obj(oid: str, obj: dict) -> None:
    render_receipt(obj, oid)


# --- reproduce ----------------------------------------------------------------------------------
def reproduce(
    receipt: Annotated[str, typer.Argument(help="Receipt id/prefix.")],
    override: Annotated[Optional[list[str]], typer.Option("--override", help="Re-run with section.field=VALUE changed (recorded).")] = None,
    loss_tol: Annotated[float, typer.Option("--loss-tol", help="Largest |loss difference| still WithinTolerance.")] = 1e-4,
    weight_tol: Annotated[float, typer.Option("--weight-tol", help="Largest |adapter weight difference| still WithinTolerance.")] = 1e-4,
    unsandboxed: Annotated[bool, typer.Option("--unsandboxed", help="Run the child without Landlock (recorded).")] = False,
    from_: Annotated[Optional[str], typer.Option("--from", help="First fetch the receipt's closure from a remote, bundle file, remote directory or s3:// URL (docs/sharing.md).")] = None,
    json_: JsonOpt = False,
):
    """Re-execute a receipt from its pinned inputs in a fresh process and compare (exit 3 unless it reproduced)."""
    ov = dict(api.parse_override(o) for o in (override or []))
    with common.TrainingBar(not json_) as prog:
        res = api.reproduce(receipt, overrides=ov, loss_tol=loss_tol, weight_tol=weight_tol, unsandboxed=unsandboxed,
                            source=from_, progress=prog, store=common.store_dir())
    finish(json_, res, lambda: render_comparison(res.result.comparison, res.result.comparison_id))


def render_comparison(obj: dict, oid: str | None = None) -> None:
    con = common.console()
    style = {"Reproduced": "bold green", "WithinTolerance": "green", "Diverged": "bold red", "MissingInputs": "bold red"}
    con.print(f"[{style.get(obj['outcome'], 'bold')}]{obj['outcome']}[/]" + (f"  comparison {oid}" if oid else ""))
    con.print(f"receipt {obj['receipt']}" + (f"  re-run receipt {obj['rerun_receipt']}" if obj.get("rerun_receipt") else ""))
    if obj.get("overrides"):
        con.print("overrides: " + ", ".join(f"{k}={v!r}" for k, v in obj["overrides"].items()))
    if obj.get("missing"):
        pruned = {p["id"]: p for p in obj.get("pruned") or []}
        for m in obj["missing"]:
            p = pruned.get(m)
            con.print(f"  missing {m}" + (f"  ({p['role']}: removed by retention policy {p['policy']}, "
                                          f"prune record {p['seq']})" if p else ""))
    if obj.get("first_difference"):
        f = obj["first_difference"]
        con.print(f"first difference: step {f['step']}, field {f['field']}"
                  + (f" ({f.get('original')!r} vs {f.get('rerun')!r})" if "original" in f else ""))
    if obj.get("largest_deviation") and obj["largest_deviation"].get("field"):
        d = obj["largest_deviation"]
        con.print(f"largest deviation: {d['value']:.3g} in {d['field']} at step {d['step']}")


def render_comparison_obj(oid: str, obj: dict) -> None:
    render_comparison(obj, oid)


# --- import-base --------------------------------------------------------------------------------
def import_base(
    path: Annotated[Path, typer.Argument(help="A Hugging Face model directory, or a .gguf file.")],
    name: Annotated[Optional[str], typer.Option("--name", help="Name the base (then model.base = NAME in a spec).")] = None,
    json_: JsonOpt = False,
):
    """Import base weights (Llama architecture) as objects; prints the base id."""
    err = common.err_console()
    res = api.import_base(path, name=name, store=common.store_dir(), progress=lambda msg: err.print(f"[dim]{msg}…[/]"))
    finish(json_, res, lambda: common.console().print(f"imported base {res.base}" + (f"  name={name}" if name else "")))
