"""`ledger capability add | grant | call | list`: wasm capabilities in generations.

Parsing and rendering only; the work is ledger.api's (wasmtime loads only inside the verbs that
need it)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated, Optional

import typer

from ledger import api
from ledger.cli import common
from ledger.cli.common import JsonOpt, WaitOpt, finish, short


def register(app: typer.Typer) -> None:
    cap = typer.Typer(help="Wasm capabilities: admitted only after their tests pass with zero authority.",
                      no_args_is_help=True)
    cap.command("add")(add)
    cap.command("grant")(grant)
    cap.command("call", context_settings={"ignore_unknown_options": True})(call)
    cap.command("list")(list_)
    app.add_typer(cap, name="capability")


def _grants_text(grants) -> str:
    return ", ".join(str(g) for g in grants) or "none"


def add(
    source: Annotated[Path, typer.Argument(help="WAT text (.wat), a wasm binary (.wasm) or C source (.c).")],
    manifest: Annotated[Path, typer.Option("--manifest", "-m", help="The manifest (TOML): exports, handles, tests, limits.")],
    grant: Annotated[Optional[list[str]], typer.Option("--grant", help="Grant only this handle (repeatable): dir:PATH:ro|rw, stdout, stderr. Default: what the manifest declares.")] = None,
    no_grants: Annotated[bool, typer.Option("--no-grants", help="Admit it holding no handles at all.")] = False,
    replace: Annotated[bool, typer.Option("--replace", help="Replace a live capability of the same name (grants may only narrow).")] = False,
    note: Annotated[str, typer.Option("--note", help="A note for the new generation.")] = "",
    regrant_reason: Annotated[Optional[str], typer.Option("--regrant-reason", help="Why this module may regain a grant it was attenuated out of (grants belong to its content id, not its name; the record keeps the reason).")] = None,
    wait: WaitOpt = 0.0,
    json_: JsonOpt = False,
):
    """Compile, test with zero authority, and admit a capability as a new generation."""
    out = api.capability_add(source, manifest, grants=grant, no_grants=no_grants, replace=replace, note=note, wait=wait,
                             store=common.store_dir(), regrant_reason=regrant_reason)
    res = out.result

    def render():
        c = common.console()
        c.print(f"admitted [bold]{res.name}[/] as gen-{res.generation.n}: {len(res.outcomes)} test"
                f"{'s' if len(res.outcomes) != 1 else ''} passed with no authority")
        c.print(f"  module {short(res.module)}  manifest {short(res.manifest)}  grants: {_grants_text(res.grants)}")
    finish(json_, out, render)


def grant(
    name: Annotated[str, typer.Argument(help="A live capability.")],
    handles: Annotated[Optional[list[str]], typer.Argument(help="The complete new set of handles: dir:PATH:ro|rw, stdout, stderr.")] = None,
    none: Annotated[bool, typer.Option("--none", help="Drop every handle.")] = False,
    note: Annotated[str, typer.Option("--note", help="A note for the new generation.")] = "",
    wait: WaitOpt = 0.0,
    json_: JsonOpt = False,
):
    """Set a capability's handles in a new generation. Grants only narrow: a sub-path, ro
    instead of rw, or dropped; anything wider is refused (exit 3)."""
    res = api.capability_grant(name, handles or (), none=none, note=note, wait=wait, store=common.store_dir())
    finish(json_, res, lambda: common.console().print(
        f"gen-{res.generation.n}: [bold]{name}[/] now holds {_grants_text(res.grants)} (was {_grants_text(res.previous)})"))


def call(
    name: Annotated[str, typer.Argument(help="A capability live in HEAD.")],
    export: Annotated[str, typer.Argument(help="One of its declared exports.")],
    args: Annotated[Optional[list[str]], typer.Argument(help="Arguments, parsed by the export's signature (i32/i64/f32/f64).")] = None,
    fuel: Annotated[Optional[int], typer.Option("--fuel", help="Fuel for this call (default: the manifest's).")] = None,
    timeout_ms: Annotated[Optional[int], typer.Option("--timeout-ms", help="Time limit in ms (default: the manifest's).")] = None,
    json_: JsonOpt = False,
):
    """Run an export with exactly its granted handles, under fuel and time limits; print the result."""
    out = api.capability_call(name, export, args or (), fuel=fuel, timeout_ms=timeout_ms, store=common.store_dir())
    res = out.result
    if json_:
        finish(True, out)
        return
    common.print_warnings(out.warnings)
    # The guest's own output passes through verbatim (it was captured within the call's limits).
    if res.stdout:
        sys.stdout.buffer.write(res.stdout)
        sys.stdout.flush()
    if res.stderr:
        sys.stderr.buffer.write(res.stderr)
        sys.stderr.flush()
    out = res.to_json()["results"]
    if out:
        sys.stdout.write(" ".join(out) + "\n")


def list_(
    gen: Annotated[str, typer.Option("--gen", help="Which generation (default HEAD).")] = "HEAD",
    json_: JsonOpt = False,
):
    """Capabilities live in a generation, with their grants and the generation that admitted each."""
    res = api.capability_list(gen, store=common.store_dir())
    data, items = res.details, res.entries

    def render():
        c = common.console()
        if not data:
            c.print(f"no capabilities in {gen}")
            return
        from rich.table import Table

        t = Table(box=None, pad_edge=False)
        for col in ("name", "exports", "grants", "admitted", "module"):
            t.add_column(col)
        for d, e in zip(data, items):
            t.add_row(e.name, ", ".join(x["name"] for x in d["exports"]), _grants_text(e.grants),
                      f"gen-{e.admitted_in}", short(e.module))
        c.print(t)
    finish(json_, res, render)
