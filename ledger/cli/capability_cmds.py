"""`ledger capability add | grant | call | list`: wasm capabilities in generations.

Parsing and rendering only; the logic is ledger.capabilities (imported inside each command so
that wasmtime never loads for other commands)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated, Optional

import typer

from ledger.cli import common
from ledger.cli.common import JsonOpt, WaitOpt, emit, flush_warnings, open_store, short


def register(app: typer.Typer) -> None:
    cap = typer.Typer(help="Wasm capabilities: admitted only after their tests pass with zero authority.",
                      no_args_is_help=True)
    cap.command("add")(add)
    cap.command("grant")(grant)
    cap.command("call", context_settings={"ignore_unknown_options": True})(call)
    cap.command("list")(list_)
    app.add_typer(cap, name="capability")


def _handles(texts):
    from ledger.capabilities.manifest import Handle

    return [Handle.parse(t) for t in texts]


def _grants_text(grants) -> str:
    return ", ".join(str(g) for g in grants) or "none"


def add(
    source: Annotated[Path, typer.Argument(help="WAT text (.wat), a wasm binary (.wasm) or C source (.c).")],
    manifest: Annotated[Path, typer.Option("--manifest", "-m", help="The manifest (TOML): exports, handles, tests, limits.")],
    grant: Annotated[Optional[list[str]], typer.Option("--grant", help="Grant only this handle (repeatable): dir:PATH:ro|rw, stdout, stderr. Default: what the manifest declares.")] = None,
    no_grants: Annotated[bool, typer.Option("--no-grants", help="Admit it holding no handles at all.")] = False,
    replace: Annotated[bool, typer.Option("--replace", help="Replace a live capability of the same name (grants may only narrow).")] = False,
    note: Annotated[str, typer.Option("--note", help="A note for the new generation.")] = "",
    wait: WaitOpt = 0.0,
    json_: JsonOpt = False,
):
    """Compile, test with zero authority, and admit a capability as a new generation."""
    from ledger.capabilities import admission
    from ledger.errors import BadInput

    if no_grants and grant:
        raise BadInput("--no-grants and --grant contradict each other")
    grants = [] if no_grants else (_handles(grant) if grant else None)
    store = open_store()
    res = admission.admit(store, source, manifest, grants=grants, replace=replace, note=note, wait=wait)
    flush_warnings(store)

    def render():
        c = common.console()
        c.print(f"admitted [bold]{res.name}[/] as gen-{res.generation.n}: {len(res.outcomes)} test"
                f"{'s' if len(res.outcomes) != 1 else ''} passed with no authority")
        c.print(f"  module {short(res.module)}  manifest {short(res.manifest)}  grants: {_grants_text(res.grants)}")
    emit(json_, res.to_json(), render)


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
    from ledger.capabilities import registry
    from ledger.errors import BadInput

    if not handles and not none:
        raise BadInput("give the new set of handles, or --none to drop them all",
                       "e.g. `ledger capability grant notes dir:data/sub:ro stdout`")
    if handles and none:
        raise BadInput("--none and handles contradict each other")
    store = open_store()
    gen, old, new = registry.grant(store, name, [] if none else _handles(handles), note=note, wait=wait)
    flush_warnings(store)
    data = {"name": name, "generation": gen.n, "generation_id": gen.id,
            "grants": [h.to_json() for h in new], "previous": [h.to_json() for h in old]}
    emit(json_, data, lambda: common.console().print(
        f"gen-{gen.n}: [bold]{name}[/] now holds {_grants_text(new)} (was {_grants_text(old)})"))


def call(
    name: Annotated[str, typer.Argument(help="A capability live in HEAD.")],
    export: Annotated[str, typer.Argument(help="One of its declared exports.")],
    args: Annotated[Optional[list[str]], typer.Argument(help="Arguments, parsed by the export's signature (i32/i64/f32/f64).")] = None,
    fuel: Annotated[Optional[int], typer.Option("--fuel", help="Fuel for this call (default: the manifest's).")] = None,
    timeout_ms: Annotated[Optional[int], typer.Option("--timeout-ms", help="Time limit in ms (default: the manifest's).")] = None,
    json_: JsonOpt = False,
):
    """Run an export with exactly its granted handles, under fuel and time limits; print the result."""
    from ledger.capabilities import registry

    store = open_store()
    res = registry.call(store, name, export, list(args or []), fuel=fuel, time_ms=timeout_ms)
    flush_warnings(store)
    if json_:
        emit(True, res.to_json())
        return
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
    from ledger.capabilities import registry

    store = open_store()
    items = registry.entries(store, gen)
    flush_warnings(store)
    data = []
    for e in items:
        m = registry.load_manifest(store, e)
        data.append({**e.to_json(), "exports": [x.to_json() for x in m.exports], "description": m.description,
                     "declared": [h.to_json() for h in m.handles], "limits": m.limits.to_json()})

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
    emit(json_, {"generation": items[0].generation if items else None, "capabilities": data}, render)
