"""Core store commands: init, add, cat, show, log, verify, gc, query, index rebuild, unlock.
Parsing and rendering only: the work is ledger.api's."""

from __future__ import annotations

import csv as csvmod
import sys
from pathlib import Path
from typing import Annotated, Optional

import typer

from ledger import api
from ledger.cli import adding, common, render
from ledger.cli.common import JsonOpt, WaitOpt, finish, human_bytes
from ledger.cli.tables import Column, print_table, terminal_width


def register(app: typer.Typer) -> None:
    app.command("init")(init)
    app.command("add")(add)
    app.command("cat")(cat)
    app.command("show")(show)
    app.command("log")(log)
    app.command("verify")(verify)
    app.command("gc")(gc)
    app.command("repack")(repack)
    app.command("query")(query)
    app.command("unlock")(unlock)
    idx = typer.Typer(help="The DuckDB index (a rebuildable cache of the journal).", no_args_is_help=True)
    idx.command("rebuild")(index_rebuild)
    app.add_typer(idx, name="index")


def init(
    directory: Annotated[Path, typer.Argument(help="Where to create .ledger/ (default: here, or --store).")] = None,
    json_: JsonOpt = False,
):
    """Create an empty store (.ledger/) with its first journal record."""
    res = api.init(directory or Path(common.store_dir() or "."))
    finish(json_, res, lambda: common.console().print(f"Initialised empty ledger store in [bold]{res.store}[/]"))


def add(
    path: Annotated[Path, typer.Argument(help="File or directory to store.", exists=False)],
    kind: Annotated[str, typer.Option("--kind", help="What it is: weights, dataset, suite, blob, ...")] = "",
    name: Annotated[Optional[str], typer.Option("--name", help="A name to refer to it by (a ref).")] = None,
    wait: WaitOpt = 0.0,
    json_: JsonOpt = False,
):
    """Store a file or directory as immutable objects and record it in the journal."""
    adding.add(path, kind=kind, name=name, wait=wait, json_=json_)


def cat(ref: Annotated[str, typer.Argument(help="Object id, prefix or name.")], json_: JsonOpt = False):
    """Write an object's verified bytes to stdout (--json: id, size, and text or base64)."""
    if json_:
        finish(True, api.cat(ref, store=common.store_dir()))
        return
    res = api.cat(ref, sys.stdout.buffer, store=common.store_dir())
    common.print_warnings(res.warnings)


def show(ref: Annotated[str, typer.Argument(help="Object id, prefix, name, gen-N, HEAD, or a journal record id.")],
         json_: JsonOpt = False):
    """Describe an object: structured objects rendered by kind, blobs by size."""
    res = api.show(ref, store=common.store_dir())
    if res.record is not None:
        finish(json_, res, lambda: render.record(res.record))
    elif not res.structured:
        finish(json_, res, lambda: common.console().print(f"{res.id}  blob  {human_bytes(res.size)}"))
    else:
        finish(json_, res, lambda: render.obj(res.id, res.object))


def log(
    n: Annotated[int, typer.Option("-n", "--max-count", help="How many records, newest last.")] = 20,
    kind: Annotated[Optional[str], typer.Option("--kind", help="Only records of this kind.")] = None,
    json_: JsonOpt = False,
):
    """The journal, newest records last."""
    # Reads only the end of the journal file (of one kind: the index, store/lookup.py): fast on millions of records.
    res = api.log(n, kind=kind, losses=not json_, store=common.store_dir())
    if json_:
        finish(True, res)
        return
    common.print_warnings(res.warnings)
    render.records(res.records, res.losses)


def verify(
    read_data: Annotated[bool, typer.Option("--read-data", help="Also rehash every object's bytes (implies --full).")] = False,
    full: Annotated[bool, typer.Option("--full", help="Check every record, not only those after the last clean verify.")] = False,
    json_: JsonOpt = False,
):
    """Check the journal chain, the caches and the objects (exit 4 on faults): the records after
    the last clean verify, or all of them with --full."""
    res = api.verify(read_data=read_data, full=full, store=common.store_dir())
    rep = res.result

    def render():
        c = common.console()
        st = rep.stats
        for e in rep.errors:
            c.print(f"[red]error[/]    {e['message']}")
        for w in rep.warnings:
            c.print(f"[yellow]warning[/]  {w['message']}")
        for i in rep.info:
            c.print(f"[dim]info[/]     {i['message']}")
        verdict = "[green]clean[/]" if rep.ok else f"[red]{len(rep.errors)} fault(s)[/]"
        if st.get("mode") == "incremental":
            c.print(f"{verdict}: {st.get('records', 0)} records, {st.get('checked', 0)} of them new since the last "
                    f"verify (record {st.get('from_seq', 0)}), {st.get('objects', 0)} objects they reach, "
                    f"{human_bytes(st.get('bytes', 0))} (incremental; --full checks every record)")
            return
        c.print(f"{verdict}: {st.get('records', 0)} records, {st.get('objects', 0)} objects, "
                f"{human_bytes(st.get('bytes', 0))}" + (" (data rehashed)" if read_data else " (structure; --read-data rehashes)"))
    finish(json_, res, render)


def gc(
    prune: Annotated[bool, typer.Option("--prune", help="Actually delete (default: dry run).")] = False,
    policy: Annotated[str | None, typer.Option(
        "--policy", help="Retention policy for superseded training state: superseded-training-state (default), "
                         "final-adapters, or none (only what no record reaches).")] = None,
    json_: JsonOpt = False,
):
    """List (or with --prune delete) objects that no journal record reaches, and the superseded
    checkpoints and optimizer states the retention policy removes (recorded as a `prune` record);
    --prune also moves small objects into packs (docs/store-format.md, "Packed objects")."""
    res = api.gc(prune=prune, policy=policy, store=common.store_dir())
    p = res.result

    def render():
        c = common.console()
        verb = "removed" if prune else "would remove"
        for oid, size in p.unreachable[:50]:
            c.print(f"  {oid}  {human_bytes(size)}")
        if len(p.unreachable) > 50:
            c.print(f"  … and {len(p.unreachable) - 50} more")
        if p.retained:
            c.print(f"{verb} {len(p.retained)} superseded training object(s), {human_bytes(p.retained_bytes)} "
                    f"(policy {p.policy}" + (f", prune record {p.record})" if p.record else ")"))
        if p.packs:
            c.print(f"{verb} {len(p.packs)} unused pack(s) of chunks, {human_bytes(p.pack_bytes)}")
        if p.packing.objects or p.packing.replaced:
            c.print(f"packed {p.packing.objects} small object(s) into {p.packing.written} pack(s)"
                    + (f", replacing {p.packing.replaced}" if p.packing.replaced else ""))
        if p.packing.skipped:
            c.print(f"[yellow]packed nothing: {p.packing.skipped}[/]")
        c.print(f"{verb} {len(p.unreachable)} unreachable object(s), {human_bytes(p.bytes)}; "
                f"{len(p.tmp_files)} temporary file(s); kept {p.reachable} reachable"
                + ("" if prune else "  [dim](dry run: pass --prune)[/]"))
    finish(json_, res, render)


def repack(
    apply: Annotated[bool, typer.Option("--apply", help="Actually repack (default: dry run).")] = False,
    min_dead: Annotated[float, typer.Option("--min-dead", help="Repack a pack once this share of its chunk bytes is named by no object.")] = 0.5,
    json_: JsonOpt = False,
):
    """Rewrite packs of chunks that are mostly dead after gc: live chunks move to one new pack,
    the objects' indexes follow, the old packs go (ids and content never change)."""
    res = api.repack(apply=apply, min_dead=min_dead, store=common.store_dir())
    p = res.result

    def render():
        c = common.console()
        verb = "repacked" if apply else "would repack"
        for path, size, live in p.packs[:50]:
            c.print(f"  {path}  {human_bytes(live)} live of {human_bytes(size)}")
        c.print(f"{verb} {len(p.packs)} pack(s) named by {len(p.objects)} object(s), reclaiming "
                f"{human_bytes(p.reclaimed)}" + ("" if apply else "  [dim](dry run: pass --apply)[/]"))
    finish(json_, res, render)


def query(
    sql: Annotated[str, typer.Argument(help="SQL over the index: journal, objects, refs, generations, receipts, metrics, verdicts, turns.")],
    json_: JsonOpt = False,
    csv: Annotated[bool, typer.Option("--csv", help="CSV on stdout.")] = False,
):
    """Run read-only SQL against the DuckDB index."""
    res = api.query(sql, store=common.store_dir())
    if json_:
        finish(True, res)
        return
    common.print_warnings(res.warnings)
    if csv:
        w = csvmod.writer(sys.stdout)
        w.writerow(res.columns)
        w.writerows(res.rows)
    elif res.columns:   # a statement without a result (a comment) prints no table at all
        # every column wraps at words (values are never cut or shortened: they may be copied)
        cols = [Column(c, 0, wrap=True) for c in res.columns]
        print_table(common.console(), cols, [["NULL" if v is None else str(v) for v in r] for r in res.rows],
                    terminal_width())


def index_rebuild(json_: JsonOpt = False):
    """Recreate the DuckDB index by replaying the journal."""
    res = api.index_rebuild(store=common.store_dir())
    finish(json_, res, lambda: common.console().print(f"index rebuilt from {res.seq} journal records"))


def unlock(
    force_foreign: Annotated[bool, typer.Option("--force-other-host", help="Also clear a lock held from another host (you must know it is dead).")] = False,
    json_: JsonOpt = False,
):
    """Clear the store lock if (and only if) its holder is dead."""
    res = api.unlock(force_other_host=force_foreign, store=common.store_dir())
    finish(json_, res, None if res.failure() else (lambda: common.console().print(
        "lock cleared" if res.cleared else "store was not locked")))
