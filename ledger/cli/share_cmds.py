"""Sharing commands: bundle create|import|ls, remote add|list|remove, push, pull, fetch,
key create|list|export|trust|untrust|require. Parsing and rendering only: the work is
ledger.api's (ledger.sharing underneath)."""

from __future__ import annotations

import sys
import threading
from pathlib import Path
from typing import Annotated, List, Optional

import typer

from ledger import api
from ledger.cli import common
from ledger.cli.common import JsonOpt, finish, human_bytes, short
from ledger.errors import BadInput

SignOpt = Annotated[Optional[str], typer.Option("--sign", help="Sign with this key of yours (`ledger key list`).")]
JobsOpt = Annotated[int, typer.Option("--jobs", "-j", min=1, max=64, help="Objects moved concurrently.")]
AsOpt = Annotated[Optional[str], typer.Option("--as", help="Namespace for the imported refs (e.g. alice → alice/gen-3).")]


def register(app: typer.Typer) -> None:
    b = typer.Typer(help="Bundles: a closure of objects plus its journal segment in one file.", no_args_is_help=True)
    b.command("create")(bundle_create)
    b.command("import")(bundle_import)
    b.command("ls")(bundle_ls)
    app.add_typer(b, name="bundle")
    r = typer.Typer(help="Remotes: a directory or S3-compatible storage to push to and pull from.", no_args_is_help=True)
    r.command("add")(remote_add)
    r.command("list")(remote_list)
    r.command("remove")(remote_remove)
    app.add_typer(r, name="remote")
    app.command("push")(push)
    app.command("pull")(pull)
    app.command("fetch")(fetch)
    app.command("repair")(repair)
    k = typer.Typer(help="Signing keys (ed25519) and the keys you trust.", no_args_is_help=True)
    k.command("create")(key_create)
    k.command("list")(key_list)
    k.command("export")(key_export)
    k.command("trust")(key_trust)
    k.command("untrust")(key_untrust)
    k.command("require")(key_require)
    app.add_typer(k, name="key")


class RichProgress:
    """Bytes and objects on stderr (sharing.pool.Progress). Thread-safe: transfers run on a pool."""

    def __init__(self):
        self._p = None
        self._lock = threading.Lock()
        self._done = 0

    def start(self, label: str, objects: int, nbytes: int) -> None:
        from rich.progress import BarColumn, DownloadColumn, Progress, TextColumn, TimeRemainingColumn, TransferSpeedColumn

        # Live bars only on a terminal: in logs and pipes the summary line says it all.
        if self._p is not None or not common.err_console().is_terminal \
                or (objects == 0 and nbytes == 0 and not label.startswith("fetch")):
            return
        self._done = 0
        self._p = Progress(TextColumn("{task.description}"), BarColumn(), DownloadColumn(),
                           TextColumn("{task.fields[done]}/{task.fields[objs]} objects"), TransferSpeedColumn(),
                           TimeRemainingColumn(), console=common.err_console())
        self._task = self._p.add_task(label, total=nbytes or None, done=0, objs=objects or "?")
        self._p.start()

    def advance(self, objects: int = 0, nbytes: int = 0) -> None:
        if self._p is None:
            return
        with self._lock:
            self._done += objects
            self._p.update(self._task, advance=nbytes, done=self._done)

    def finish(self) -> None:
        if self._p is not None:
            self._p.stop()
            self._p = None


def _signers(checks) -> str:
    if not checks:
        return "[yellow]unsigned[/]"
    out = []
    for c in checks:
        if not c.valid:
            out.append(f"[bold red]INVALID signature[/] claiming {c.claimed_name} ({c.key[:24]}…)")
        elif c.trusted:
            out.append(f"[green]signed by {c.trusted_as}[/] ({c.key[:24]}…, trusted)")
        else:
            out.append(f"[yellow]signed by untrusted key[/] claiming {c.claimed_name} ({c.key[:24]}…)")
    return "; ".join(out)


def _render_import(res) -> None:
    c = common.console()
    if res.absent:
        c.print(f"[yellow]note:[/] the sender does not hold {len(res.absent)} id(s) its objects name "
                f"(digests or lost objects), e.g. {short(res.absent[0])}")
    c.print(f"imported from {res.source} into [bold]{res.namespace}/[/]: {res.objects_new} new of {res.objects_total} "
            f"objects ({human_bytes(res.bytes_new)} of {human_bytes(res.bytes_total)}), "
            f"{res.segment_records} journal record(s) in the segment")
    c.print(f"  {_signers(res.signers)}")
    for name, oid in sorted(res.refs.items()):
        c.print(f"  {name} → {short(oid)}")
    if res.repaired:
        c.print(f"[green]repaired[/] {len(res.repaired)} damaged object(s) here with verified copies, "
                f"e.g. {short(res.repaired[0])}")


# --- bundle --------------------------------------------------------------------------------
def bundle_create(
    refs: Annotated[List[str], typer.Argument(help="Generations, receipts, names or object ids to share.")],
    output: Annotated[Path, typer.Option("--output", "-o", help="Bundle file to write.")],
    sign: SignOpt = None,
    origin: Annotated[Optional[str], typer.Option("--origin", help="Suggested namespace for the receiver (default: your user name).")] = None,
    since: Annotated[Optional[List[str]], typer.Option("--since", metavar="REF", help="A ref or id the receiver already holds (repeatable): its closure is left out, and of a large object only the chunks it lacks are carried.")] = None,
    json_: JsonOpt = False,
):
    """Write the closure of REFs plus the journal records that made them into one file."""
    out = api.bundle_create(refs, output, sign=sign, origin=origin, since=since or (),
                            progress=None if json_ else RichProgress(), store=common.store_dir())
    res = out.result
    finish(json_, out, lambda: common.console().print(
        f"wrote {res.path}: {res.objects} objects, {human_bytes(res.bytes)}, {res.segment_records} journal record(s), "
        + (f"{human_bytes(res.data_bytes)} carried for a receiver holding {len(res.base)} base ref(s) "
           f"({res.chunks_carried} chunk(s)), " if res.base else "")
        + f"manifest {short(res.manifest)}" + (f", signed by {res.signed_by}" if res.signed_by else ", unsigned")
        + (f"\n[yellow]note:[/] {len(res.absent)} id(s) the shared objects name are not held here (digests or lost "
           f"objects), e.g. {short(res.absent[0])}" if res.absent else "")))


def bundle_import(
    file: Annotated[Path, typer.Argument(help="Bundle file.")],
    as_: AsOpt = None,
    jobs: JobsOpt = 4,
    json_: JsonOpt = False,
):
    """Verify a bundle whole, then import it into a namespace (local HEAD never changes).

    Every object hash, the journal segment and signatures are checked first; a damaged or
    tampered bundle changes nothing."""
    out = api.bundle_import(file, namespace=as_, jobs=jobs, progress=None if json_ else RichProgress(),
                            store=common.store_dir())
    finish(json_, out, lambda: _render_import(out.result))


def bundle_ls(
    file: Annotated[Path, typer.Argument(help="Bundle file.")],
    json_: JsonOpt = False,
):
    """Show a bundle's table of contents, signers and journal segment (imports nothing)."""
    out = api.bundle_ls(file, store=common.store_dir())  # no store needed: signers then read as untrusted
    lst = out.result

    def render():
        c = common.console()
        h = lst.header
        c.print(f"[bold]{file}[/]  origin={h.origin}  created {h.created[:19].replace('T', ' ')} by {h.actor}")
        c.print(f"  {len(h.manifest.objects)} objects, {human_bytes(h.manifest.total_bytes)}, manifest {short(h.manifest.id)}")
        if h.base:
            c.print(f"  for a store holding {', '.join(short(b) for b in h.base)}: carries "
                    f"{human_bytes(h.file_size - h.data_start)} (" + ", ".join(
                        f"{n} {k}(s)" for k, n in h.to_json()["pieces"].items() if n) + ")")
        c.print(f"  {_signers(lst.signers)}")
        for name, oid in sorted(h.manifest.refs.items()):
            c.print(f"  ref {name} → {short(oid)}")
        for r in lst.records:
            c.print(f"  [dim]record {r['seq']:>6}  {r['kind']:<10} {short(r['id'], 10)}  {r['actor']}  {r['time'][:19]}[/]")
    finish(json_, out, render)


# --- remotes -------------------------------------------------------------------------------
def remote_add(
    name: Annotated[str, typer.Argument(help="Short name, e.g. origin or alice.")],
    url: Annotated[str, typer.Argument(help="A directory, file:///path, s3://, gs://, az://, sftp://host/path, or http(s):// (read-only).")],
    endpoint_url: Annotated[Optional[str], typer.Option("--endpoint-url", help="S3-compatible endpoint (MinIO, Ceph, …).")] = None,
    option: Annotated[Optional[List[str]], typer.Option("--option", help="Extra filesystem option KEY=VALUE (e.g. region_name=eu-west-1 for S3, anon=true).")] = None,
    json_: JsonOpt = False,
):
    """Configure a remote (recorded in the journal; credentials are never stored)."""
    out = api.remote_add(name, url, endpoint_url=endpoint_url, options=option or (), store=common.store_dir())
    cfg = out.result
    finish(json_, out, lambda: common.console().print(f"remote {cfg.name} → {cfg.url}"))


def remote_list(json_: JsonOpt = False):
    """Configured remotes."""
    res = api.remote_list(store=common.store_dir())

    def render():
        if not res.remotes:
            common.console().print("no remotes (`ledger remote add NAME URL`)")
        for c in res.remotes:
            extra = "  " + " ".join(f"{k}={v}" for k, v in sorted(c.options.items())) if c.options else ""
            common.console().print(f"{c.name}\t{c.url}{extra}")
    finish(json_, res, render)


def remote_remove(name: Annotated[str, typer.Argument()], json_: JsonOpt = False):
    """Forget a remote (a journal record; nothing on the remote is touched)."""
    res = api.remote_remove(name, store=common.store_dir())
    finish(json_, res, lambda: common.console().print(f"removed remote {name}"))


def push(
    remote_name: Annotated[str, typer.Argument(metavar="REMOTE", help="A configured remote.")],
    refs: Annotated[Optional[List[str]], typer.Argument(help="Refs or ids to push (default: HEAD).")] = None,
    sign: SignOpt = None,
    jobs: JobsOpt = 4,
    full: Annotated[bool, typer.Option("--full", help="Walk the closure and check every object on the remote, even if its refs look up to date.")] = False,
    json_: JsonOpt = False,
):
    """Send the closure of REFs and its journal segment to a remote (only missing objects move).

    A rerun after an interruption resumes: objects already there are not sent again."""
    out = api.push(remote_name, refs or ["HEAD"], sign=sign, jobs=jobs, full=full,
                   progress=None if json_ else RichProgress(), store=common.store_dir())
    res = out.result

    def render():
        c = common.console()
        if res.up_to_date:
            c.print(f"{remote_name} is up to date ({res.objects_total} objects, {human_bytes(res.bytes_total)})")
        else:
            c.print(f"pushed {res.objects_sent} of {res.objects_total} objects ({human_bytes(res.bytes_sent)}) "
                    f"to {remote_name}" + (f", signed by {res.signed_by}" if res.signed_by else ""))
        for name, oid in sorted(res.refs.items()):
            c.print(f"  {name} → {short(oid)}")
        if res.absent:
            c.print(f"[yellow]note:[/] {len(res.absent)} id(s) the shared objects name are not held here and were "
                    f"not sent (digests or lost objects), e.g. {short(res.absent[0])}")
    finish(json_, out, render)


def pull(
    remote_name: Annotated[str, typer.Argument(metavar="REMOTE", help="A configured remote.")],
    refs: Annotated[Optional[List[str]], typer.Argument(help="Remote refs to fetch (default: all).")] = None,
    as_: AsOpt = None,
    jobs: JobsOpt = 4,
    json_: JsonOpt = False,
):
    """Fetch refs from a remote into REMOTE/… (or --as NS/…); local HEAD never changes.

    Every object is verified on arrival; signatures are checked against your trusted keys."""
    res = api.pull(remote_name, refs or None, namespace=as_, jobs=jobs, progress=None if json_ else RichProgress(),
                   store=common.store_dir())
    finish(json_, res, lambda: [_render_import(r) for r in res.imports])


def fetch(
    source: Annotated[str, typer.Argument(metavar="SOURCE", help="A configured remote, a bundle file, a remote directory or s3:// URL.")],
    ids: Annotated[List[str], typer.Argument(metavar="ID...", help="Object ids to bring here with everything they reach (e.g. a receipt).")],
    as_: AsOpt = None,
    jobs: JobsOpt = 4,
    json_: JsonOpt = False,
):
    """Bring the closure of IDs (such as a colleague's receipt) here, verified; then `ledger reproduce ID`.

    Uses the signed manifest a push of those ids left where there is one; otherwise walks the
    remote object by object (refused when this store requires signatures)."""
    out = api.fetch(source, ids, namespace=as_, jobs=jobs, progress=None if json_ else RichProgress(),
                    store=common.store_dir())
    res = out.result

    def render():
        c = common.console()
        for imp in res.imports:
            _render_import(imp)
        c.print(f"fetched {res.fetched_objects} object(s), {human_bytes(res.fetched_bytes)} from {res.source}")
        walked = sorted(set(res.repaired) - {r for i in res.imports for r in i.repaired})  # imports said theirs
        if walked:
            c.print(f"[green]repaired[/] {len(walked)} damaged object(s) here with verified copies, "
                    f"e.g. {short(walked[0])}")
        if res.missing:
            c.print(f"[yellow]{len(res.missing)} id(s) reachable from it are held neither here nor there[/] "
                    f"(digests or lost objects), e.g. {short(res.missing[0])}")
    finish(json_, out, render)


def repair(
    source: Annotated[str, typer.Option("--from", metavar="REMOTE|BUNDLE", help="A configured remote, a bundle file, a remote directory or s3:// URL holding intact copies.")],
    jobs: JobsOpt = 4,
    json_: JsonOpt = False,
):
    """Replace missing or damaged objects that `ledger verify` found with verified copies from a remote or bundle.

    Each copy must hash to its id (the journal already names it, so no signature is needed);
    the damaged file is replaced atomically. Exit 0 when the store verifies clean afterwards,
    4 while damage remains (listed)."""
    out = api.repair(source, jobs=jobs, progress=None if json_ else RichProgress(), store=common.store_dir())
    res = out.result

    def render():
        c = common.console()
        c.print(f"repaired {len(res.repaired)} object(s) from {res.source}")
        for oid in res.repaired:
            c.print(f"  [green]replaced[/] {short(oid)} with a verified copy")
        for oid in res.not_held:
            c.print(f"  [yellow]not on {res.source}[/] {short(oid)}")
        for oid, why in res.refused:
            c.print(f"  [red]refused copy[/] {short(oid)}: {why}")
        for e in res.remaining:
            c.print(f"[red]remaining[/] {e.get('message')}")
        c.print("[green]clean[/]: the store verifies" if res.ok else f"[red]{len(res.remaining)} fault(s) remain[/]")
    finish(json_, out, render)


# --- keys ----------------------------------------------------------------------------------
def key_create(name: Annotated[str, typer.Argument(help="Key name, e.g. your user name.")], json_: JsonOpt = False):
    """Create an ed25519 key pair: the private half stays in .ledger/keys/ (0600)."""
    res = api.key_create(name, store=common.store_dir())
    pub = res.key
    finish(json_, res, lambda: common.console().print(f"created key {name}  {pub.fingerprint}\n"
                                        f"  give colleagues: `ledger key export {name} -o {name}.pub`"))


def key_list(json_: JsonOpt = False):
    """Your keys and the keys you trust."""
    res = api.key_list(store=common.store_dir())
    data, own, trusted, required = res.to_json(), res.own, res.trusted, res.require_signatures

    def render():
        c = common.console()
        for k in data["own"]:
            c.print(f"own      {k['name']:<16} {k['fingerprint']}" + ("" if k["private"] else "  [red](private key missing)[/]"))
        for k in data["trusted"]:
            c.print(f"trusted  {k['name']:<16} {k['fingerprint']}")
        if not own and not trusted:
            c.print("no keys (`ledger key create NAME`)")
        c.print(f"signatures required on import: {'[bold]yes[/]' if required else 'no'}")
    finish(json_, res, render)


def key_export(
    name: Annotated[str, typer.Argument()],
    output: Annotated[Optional[Path], typer.Option("--output", "-o", help="File to write (default: stdout).")] = None,
    json_: JsonOpt = False,
):
    """Write your public key (for colleagues' `ledger key trust`)."""
    res = api.key_export(name, output, store=common.store_dir())
    if output:
        finish(json_, res, lambda: common.console().print(f"wrote {output}  {res.fingerprint}"))
    else:
        sys.stdout.buffer.write(res.data)


def key_trust(
    file: Annotated[Path, typer.Argument(help="A public key file from `ledger key export` (or PEM/OpenSSH ed25519 with --name).")],
    name: Annotated[Optional[str], typer.Option("--name", help="Name to know this key by.")] = None,
    json_: JsonOpt = False,
):
    """Trust a colleague's public key: bundles and pushes they sign are accepted as theirs."""
    res = api.key_trust(file, name=name, store=common.store_dir())
    finish(json_, res, lambda: common.console().print(f"trusting {res.body['name']}  {res.body['fingerprint']}"))


def key_untrust(fingerprint: Annotated[str, typer.Argument(help="Fingerprint (or a unique prefix of it).")],
                json_: JsonOpt = False):
    """Stop trusting a key."""
    res = api.key_untrust(fingerprint, store=common.store_dir())
    finish(json_, res, lambda: common.console().print(f"no longer trusting {fingerprint}"))


def key_require(state: Annotated[str, typer.Argument(help="on or off")], json_: JsonOpt = False):
    """Require (or stop requiring) a trusted signature on every bundle import and pull."""
    if state not in ("on", "off"):
        raise BadInput(f"expected on or off, got {state!r}", "ledger key require on (or off)")
    res = api.key_require(state == "on", store=common.store_dir())
    finish(json_, res, lambda: common.console().print(f"signatures required on import: {state}"))
