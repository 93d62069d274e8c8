"""`ledger kernel list | build | test | bench | gate`: GPU kernels as checked artefacts.

Parsing and rendering only; the work is ledger.api's (ledger.kernels underneath: one transaction
per command). cupy, numpy and torch load inside the verbs that need them.

Exit codes: 0 recorded (gate: Accepted); 3 the gate refused (after its record is committed), or
a realization that cannot run here -- no cupy, no NVRTC, no GPU, a target below the kernel's
compute capability (RealizationUnavailable); 2 unknown kernel / target / missing build.
"""

from __future__ import annotations

from typing import Annotated, Optional

import typer

from ledger import api
from ledger.cli import common
from ledger.cli.common import JsonOpt, finish, short

kernel_app = typer.Typer(help="GPU kernels: build with NVRTC, test against float64 oracles, bench against torch, gate.",
                         no_args_is_help=True)

TargetOpt = Annotated[Optional[str], typer.Option("--target", "-t", help="Target profile (h200), sm_XY, or 'local'.")]


def register(app: typer.Typer) -> None:
    app.add_typer(kernel_app, name="kernel")


@kernel_app.command("list")
def list_(json_: JsonOpt = False):
    """Registered kernels, their requirements, and per target the current build/test/bench/gate."""
    res = api.kernel_list(store=common.store_dir())
    data = res.kernels

    def render():
        con = common.console()
        for k in data:
            req = k["requirements"]
            con.print(f"[bold]{k['name']}[/]  {k['summary']}")
            con.print(f"  needs cc >= {req['min_compute_capability']}, K multiple of {req['k_multiple']}, M <= {req['max_m']}"
                      + (f", LoRA rank {req['lora_rank']}" if "lora_rank" in req else "")
                      + f"; tolerance {k['tolerance']:g}; baseline {k['baseline'].rsplit('.', 1)[-1]}")
            for key, refs in k["targets"].items():
                gate = "[green]gated[/] " + short(refs["gate"]) if refs["gate"] else "[yellow]not gated[/]"
                con.print(f"  {key}: build {short(refs['build'])}  test {short(refs['test'])}  "
                          f"bench {short(refs['bench'])}  {gate}")

    finish(json_, res, render)


@kernel_app.command("build")
def build(
    name: Annotated[str, typer.Argument(help="Kernel name (see `ledger kernel list`).")],
    target: TargetOpt = None,
    json_: JsonOpt = False,
):
    """Compile NAME for a target with NVRTC; store source, options, NVRTC version, arch, PTX and cubin."""
    out = api.kernel_build(name, target=target, store=common.store_dir())
    res = out.result

    def render():
        b = res.record
        con = common.console()
        con.print(f"{'built' if res.journal else 'unchanged'} [bold]{name}[/] for {res.target} ({b.arch}, NVRTC "
                  f"{b.nvrtc_version})  record {res.record_id}")
        con.print(f"  cubin {b.cubin_id} ({len(b.cubin):,} B)  ptx {b.ptx_id} ({len(b.ptx):,} B)")
        con.print(f"  options {' '.join(b.options)}; {len(b.entry_points)} entry points")
        if res.gate_dropped:
            con.print(f"  [yellow]the cubin changed: gate {short(res.gate_dropped)} no longer applies[/]")

    finish(json_, out, render)


@kernel_app.command("test")
def test(
    name: Annotated[str, typer.Argument(help="Kernel name.")],
    target: TargetOpt = None,
    shape: Annotated[Optional[list[str]], typer.Option("--shape", help="MxNxK[rR] (repeatable; default: the kernel's sweep).")] = None,
    seed: Annotated[int, typer.Option("--seed")] = 0,
    json_: JsonOpt = False,
):
    """Run the stored build on this GPU over a shape sweep; record the worst relative error vs the float64 oracle."""
    out = api.kernel_test(name, target=target, shapes=shape or None, seed=seed, store=common.store_dir())
    res = out.result

    def render():
        t = res.record
        ok = t.worst_rel_l2 is not None and t.worst_rel_l2 <= t.tolerance and not t.unwritten
        worst = "non-finite" if t.worst_rel_l2 is None else f"{t.worst_rel_l2:.3g}"
        common.console().print(f"tested [bold]{name}[/] on {t.device.get('name')} ({res.target}): {len(t.cases)} cases, "
                               f"worst rel_l2 {worst} (tolerance {t.tolerance:g}), {t.unwritten} unwritten  "
                               + ("[green]within tolerance[/]" if ok else "[red]WRONG[/]") + f"  record {res.record_id}")

    finish(json_, out, render)


@kernel_app.command("bench")
def bench(
    name: Annotated[str, typer.Argument(help="Kernel name.")],
    target: TargetOpt = None,
    shape: Annotated[Optional[str], typer.Option("--shape", help="MxNxK[rR] (default 1x8192x8192, r16 for LoRA).")] = None,
    launches: Annotated[int, typer.Option("--launches", help="Timed launches per realization (>= 20).")] = 50,
    warmup: Annotated[int, typer.Option("--warmup")] = 10,
    json_: JsonOpt = False,
):
    """Time the stored build beside its torch baseline (CUDA events, same run); record medians and bandwidth fractions."""
    out = api.kernel_bench(name, target=target, shape=shape, launches=launches, warmup=warmup, store=common.store_dir())
    res = out.result

    def render():
        b = res.record
        common.console().print(
            f"bench [bold]{name}[/] {b.shape} on {b.device.get('name')}: candidate {b.candidate.median_s * 1e6:.2f} us "
            f"({b.candidate_fraction:.1%} of copy bandwidth), baseline {b.baseline.entry} {b.baseline.median_s * 1e6:.2f} us "
            f"({b.baseline_fraction:.1%}); {b.speedup:.2f}x; copy {b.copy_bytes_per_s / 1e12:.2f} TB/s  record {res.record_id}")

    finish(json_, out, render)


@kernel_app.command("gate")
def gate(
    name: Annotated[str, typer.Argument(help="Kernel name.")],
    target: TargetOpt = None,
    test_ref: Annotated[Optional[str], typer.Option("--test", help="Test record (default: the latest for the current build).")] = None,
    bench_ref: Annotated[Optional[str], typer.Option("--bench", help="Bench record (default: the latest for the current build).")] = None,
    json_: JsonOpt = False,
):
    """Admit or refuse the current build: wrong or not faster than its baseline is refused (exit 3, recorded)."""
    out = api.kernel_gate(name, target=target, test=test_ref, bench=bench_ref, store=common.store_dir())
    res = out.result
    d = res.record

    def render():
        style = "bold green" if d.accepted else "bold red"
        common.console().print(f"[{style}]{d.code}[/] {name} for {res.target}: {d.reason}  record {res.record_id}")
        if d.accepted:
            common.console().print(f"  ref {out.ref} → {short(res.record_id)} "
                                   "(plans for this target may now select cupy-fused)")

    finish(json_, out, render)
