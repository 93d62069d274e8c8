"""Core store commands: init, add, cat, show, log, verify, gc, query, index rebuild, unlock."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Annotated, Optional

import typer

from ledger.cli import common
from ledger.cli.common import JsonOpt, WaitOpt, emit, flush_warnings, human_bytes, open_store, short


def register(app: typer.Typer) -> None:
    app.command("init")(init)
    app.command("add")(add)
    app.command("cat")(cat)
    app.command("show")(show)
    app.command("log")(log)
    app.command("verify")(verify)
    app.command("gc")(gc)
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
    from ledger.store import Store

    d = directory or Path(common.store_dir() or ".")
    store = Store.init(d)
    data = {"store": str(store.root), "head": store.state.head, "seq": store.state.seq}
    emit(json_, data, lambda: common.console().print(f"Initialised empty ledger store in [bold]{store.root}[/]"))


def add(
    path: Annotated[Path, typer.Argument(help="File or directory to store.", exists=False)],
    kind: Annotated[str, typer.Option("--kind", help="What it is: weights, dataset, suite, blob, ...")] = "",
    name: Annotated[Optional[str], typer.Option("--name", help="A name to refer to it by (a ref).")] = None,
    wait: WaitOpt = 0.0,
    json_: JsonOpt = False,
):
    """Store a file or directory as immutable objects and record it in the journal."""
    from ledger.store.add import add_path

    store = open_store()
    if json_:
        res = add_path(store, path, kind=kind or None, name=name, wait=wait)
    else:
        with common.byte_progress(f"adding {path.name}", _tree_size(path)) as advance:
            res = add_path(store, path, kind=kind or None, name=name, wait=wait, bar=advance)
    flush_warnings(store)

    def render():
        verb = "unchanged" if res["unchanged"] else "added"
        # one line whatever the width: scripts read the id from it
        common.line(f"{verb} {res['id']}  {human_bytes(res['size'])}  {res['kind']}" + (f"  name={name}" if name else ""))
    emit(json_, res, render)


def _tree_size(path: Path) -> int:
    if path.is_file():
        return path.stat().st_size
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file() and not f.is_symlink())


def cat(ref: Annotated[str, typer.Argument(help="Object id, prefix or name.")], json_: JsonOpt = False):
    """Write an object's verified bytes to stdout (--json: id, size, and text or base64)."""
    store = open_store()
    oid = store.resolve(ref)
    size = store.objects.size(oid)
    if json_:
        import base64

        from ledger.errors import BadInput

        if size > (64 << 20):
            raise BadInput(f"{oid} is {human_bytes(size)}; --json carries objects up to 64 MiB", "use `ledger cat` without --json")
        data = store.get_bytes(oid)
        try:
            body = {"text": data.decode("utf-8")}
        except UnicodeDecodeError:
            body = {"base64": base64.b64encode(data).decode()}
        emit(True, {"id": oid, "size": size, **body})
        return
    if size > (64 << 20):
        # Stream large objects through a verified temporary copy, never whole in memory.
        import tempfile, shutil

        with tempfile.TemporaryDirectory() as td:
            tmp = Path(td) / "obj"
            store.export_file(oid, tmp)
            with open(tmp, "rb") as f:
                shutil.copyfileobj(f, sys.stdout.buffer, 1 << 20)
        return
    sys.stdout.buffer.write(store.get_bytes(oid))


def show(ref: Annotated[str, typer.Argument(help="Object id, prefix, name, gen-N, HEAD, or a journal record id.")],
         json_: JsonOpt = False):
    """Describe an object: structured objects rendered by kind, blobs by size."""
    from ledger.cli import render
    from ledger.errors import UnknownRef

    store = open_store()
    try:
        oid = store.resolve(ref)
    except UnknownRef:
        rec = next((r for r in store.journal.scan().records if r["id"].startswith(ref) or r["id"][3:].startswith(ref)), None)
        if rec is None or len(ref.removeprefix("b3:")) < 8:
            raise
        emit(json_, rec, lambda: render.record(rec))
        return
    size = store.objects.size(oid)
    data = store.get_bytes(oid) if size <= (64 << 20) else None
    obj = None
    if data is not None and data[:1] == b"{":
        from ledger.store import canonical
        from ledger.errors import BadInput

        try:
            obj = canonical.loads(data)
        except BadInput:
            obj = None
    if obj is None:
        info = {"id": oid, "size": size, "structured": False}
        emit(json_, info, lambda: common.console().print(f"{oid}  blob  {human_bytes(size)}"))
        return
    emit(json_, {"id": oid, "size": size, "structured": True, "object": obj}, lambda: render.obj(oid, obj))


def log(
    n: Annotated[int, typer.Option("-n", "--max-count", help="How many records, newest last.")] = 20,
    kind: Annotated[Optional[str], typer.Option("--kind", help="Only records of this kind.")] = None,
    json_: JsonOpt = False,
):
    """The journal, newest records last."""
    from ledger.store.paths import find_root
    from ledger.store.journal import Journal

    # Reads only the end of the journal file: fast on a journal of millions of records.
    root = find_root(common.store_dir())
    j = Journal(root)
    if kind:
        recs = [r for r in j.scan().records if r["kind"] == kind][-n:]
    else:
        recs = j.tail(n)
    if json_:
        emit(True, recs)
        return
    from ledger.cli import render

    render.records(recs)


def verify(
    read_data: Annotated[bool, typer.Option("--read-data", help="Also rehash every object's bytes.")] = False,
    json_: JsonOpt = False,
):
    """Check the journal chain, the caches and every object (exit 4 on faults)."""
    from ledger.errors import StoreCorrupt
    from ledger.store.verify import verify as run_verify

    store = open_store()
    rep = run_verify(store, read_data=read_data)
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
        c.print(f"{verdict}: {st.get('records', 0)} records, {st.get('objects', 0)} objects, "
                f"{human_bytes(st.get('bytes', 0))}" + (" (data rehashed)" if read_data else " (structure; --read-data rehashes)"))
    emit(json_, rep.to_json(), render)
    if not rep.ok:
        first = rep.errors[0]
        raise StoreCorrupt(f"verify found {len(rep.errors)} fault(s); first: {first['message']}",
                           "restore the named objects or records from a remote or bundle")


def gc(
    prune: Annotated[bool, typer.Option("--prune", help="Actually delete (default: dry run).")] = False,
    json_: JsonOpt = False,
):
    """List (or with --prune delete) objects that no journal record reaches."""
    from ledger.store import gc as gcmod

    store = open_store()
    p = gcmod.prune(store) if prune else gcmod.plan(store)
    def render():
        c = common.console()
        verb = "removed" if prune else "would remove"
        for oid, size in p.unreachable[:50]:
            c.print(f"  {oid}  {human_bytes(size)}")
        if len(p.unreachable) > 50:
            c.print(f"  … and {len(p.unreachable) - 50} more")
        c.print(f"{verb} {len(p.unreachable)} unreachable object(s), {human_bytes(p.bytes)}; "
                f"{len(p.tmp_files)} temporary file(s); kept {p.reachable} reachable"
                + ("" if prune else "  [dim](dry run: pass --prune)[/]"))
    emit(json_, p.to_json(), render)


def query(
    sql: Annotated[str, typer.Argument(help="SQL over the index: journal, objects, refs, generations, receipts, metrics, verdicts, turns.")],
    json_: JsonOpt = False,
    csv: Annotated[bool, typer.Option("--csv", help="CSV on stdout.")] = False,
):
    """Run read-only SQL against the DuckDB index."""
    store = open_store()
    _ensure_index_current(store)
    cols, rows = store.query(sql)
    if json_:
        emit(True, [dict(zip(cols, r)) for r in rows])
    elif csv:
        import csv as csvmod

        w = csvmod.writer(sys.stdout)
        w.writerow(cols)
        w.writerows(rows)
    else:
        from rich.table import Table

        t = Table(*cols, show_lines=False)
        for r in rows:
            t.add_row(*("NULL" if v is None else str(v) for v in r))
        common.console().print(t)


def _ensure_index_current(store) -> None:
    """A reader never takes the lock to wait; if the index lags the journal (a crash after a
    commit) and nobody is writing, bring it up to date first, else warn."""
    from ledger.errors import Locked
    from ledger.store import index

    seq = index.indexed_seq(store.root)
    if seq == store.state.seq:
        return
    try:
        with store.locked():
            store.sync_index()
    except Locked:
        common.err_console().print(f"[yellow]warning:[/] the index is behind the journal ({seq} < {store.state.seq}) and a writer holds the lock")


def index_rebuild(json_: JsonOpt = False):
    """Recreate the DuckDB index by replaying the journal."""
    store = open_store()
    store.rebuild_index()
    flush_warnings(store)
    emit(json_, {"rebuilt": True, "seq": store.state.seq},
         lambda: common.console().print(f"index rebuilt from {store.state.seq} journal records"))


def unlock(
    force_foreign: Annotated[bool, typer.Option("--force-other-host", help="Also clear a lock held from another host (you must know it is dead).")] = False,
    json_: JsonOpt = False,
):
    """Clear the store lock if (and only if) its holder is dead."""
    from ledger.errors import Locked
    from ledger.store.paths import find_root
    from ledger.store.lock import Lock

    lock = Lock(find_root(common.store_dir()))
    # clear_invalid: a symlink, FIFO or empty directory at the lock path is no one's lock
    cleared, info = lock.break_if_dead(force_foreign, clear_invalid=True)
    data = {"cleared": cleared, "holder": None if info is None else {"pid": info.pid, "host": info.host, "status": info.status(),
                                                                    "kind": info.kind}}
    if info is not None and not cleared:
        status = info.status()
        emit(json_, data)
        if status == "live":
            raise Locked(f"lock is held by a live process ({info.describe()}); not cleared", "wait for it to finish")
        raise Locked(f"lock is held from another host ({info.describe()}); not cleared",
                     "if you know that process is dead, pass --force-other-host")
    emit(json_, data, lambda: common.console().print("lock cleared" if cleared else "store was not locked"))
