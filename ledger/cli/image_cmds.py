"""The image: serve, act, outcome, image status|stop (docs/image.md). Parsing and rendering only:
the work is ledger.api's."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Annotated, Optional

import typer

from ledger import api
from ledger.cli import common
from ledger.cli.common import JsonOpt, WaitOpt, emit, finish, short
from ledger.errors import BadInput
from ledger.options import DURABILITY, LearnOptions, ServeOptions

image_app = typer.Typer(help="The running image: status, stop.", no_args_is_help=True)


def register(app: typer.Typer) -> None:
    app.command("serve")(serve)
    app.command("act")(act)
    app.command("outcome")(outcome)
    image_app.command("status")(status)
    image_app.command("stop")(stop)
    app.add_typer(image_app, name="image")


def serve(
    learn: Annotated[bool, typer.Option("--learn", help="Run the learn cycle when the trigger policy says so.")] = False,
    min_turns: Annotated[int, typer.Option("--min-turns", help="With --learn: new turns needed.")] = LearnOptions.min_turns,
    min_hours: Annotated[float, typer.Option("--min-hours", help="With --learn: hours since the last cycle.")] = LearnOptions.min_hours,
    spec: Annotated[Optional[Path], typer.Option("--spec", help="With --learn: training spec (default: the built-in one).")] = None,
    target: Annotated[str, typer.Option("--target", help="With --learn: target profile.")] = LearnOptions.target,
    detach: Annotated[bool, typer.Option("--detach", help="Serve in the background; return once serving.")] = False,
    durability: Annotated[str, typer.Option("--durability", help=f"{DURABILITY[0]} (default): a turn is fsynced before its reply; "
                                            "os: written to the OS only (survives a kill, not a power loss).")] = ServeOptions.durability,
    threads: Annotated[int, typer.Option("--threads", help="CPU threads for the model.")] = ServeOptions.threads,
    unsandboxed: Annotated[bool, typer.Option("--unsandboxed", help="Run the image without Landlock (recorded).")] = False,
    json_: JsonOpt = False,
):
    """Serve HEAD on .ledger/run/image.sock: act, record every turn, follow HEAD, stop for cycles."""
    # the learn cycle's training stays sandboxed: --unsandboxed is the image's own
    options = ServeOptions(learn=LearnOptions(min_turns=min_turns, min_hours=min_hours,
                                              spec=str(spec.resolve()) if spec else None, target=target) if learn else None,
                           durability=durability, threads=threads, unsandboxed=unsandboxed)
    if detach:
        res = api.serve(options, detach=True, store=common.store_dir())
        finish(json_, res, lambda: _render_status(res.status))
        return

    def ready(st):
        emit(json_, st, lambda: common.err_console().print(
            f"[green]serving[/] gen-{st['gen']} on {st['socket']}  (Ctrl-C or `ledger image stop` to stop)"))

    res = api.serve(options, ready=ready, store=common.store_dir())
    common.print_warnings(res.warnings)


def _check_seconds(timeout: float, *, positive: bool) -> None:
    """--timeout must be a finite number of seconds: NaN made socket.settimeout raise (exit 1)
    and the outcome wait loop never end; a negative one reported a timeout that never waited."""
    if not math.isfinite(timeout) or timeout < 0 or (positive and timeout == 0):
        raise BadInput(f"--timeout {timeout:g} is not a {'positive' if positive else 'non-negative'} number of seconds",
                       "give seconds to wait, e.g. --timeout 30")


def act(
    situation: Annotated[str, typer.Argument(help="What the image is asked, e.g. \"user: what is 3 plus 4?\".")],
    action: Annotated[Optional[str], typer.Option("--action", help="Execute and record this action instead of generating one.")] = None,
    request_id: Annotated[Optional[str], typer.Option("--request-id", help="Idempotency key; resending it never records twice.")] = None,
    max_new: Annotated[Optional[int], typer.Option("--max-new", help="Tokens the model may generate (1-48; it stops earlier at the end of its turn).")] = None,
    no_wait: Annotated[bool, typer.Option("--no-wait", help="Reply once the turn is durable, before the journal gives it an id.")] = False,
    timeout: Annotated[float, typer.Option("--timeout", help="Seconds to wait (the image may be paused by a cycle).")] = 120.0,
    json_: JsonOpt = False,
):
    """Ask the running image to act on a situation; prints the action, its outcome and the turn id."""
    _check_seconds(timeout, positive=True)
    res = api.act(situation, action=action, request_id=request_id, max_new=max_new, wait_recorded=not no_wait,
                  timeout=timeout, store=common.store_dir())
    reply = res.reply

    def render():
        t = reply["turn"]
        c = common.console()
        style = "yellow" if t["refusal"] else ("red" if (t.get("outcome") or "").startswith("error:") else "green")
        c.print(f"[dim]gen-{t['gen']}[/]  [{style}]{t['action']}[/]" + (f"  →  {t['outcome']}" if t.get("outcome") is not None else ""))
        c.print(f"[dim]{reply.get('turn_id') or 'buffered'} · request {reply['id']} · {t['latency_ms']:.1f} ms"
                + (" · duplicate (recorded once)" if reply.get("duplicate") else "") + "[/]")
    finish(json_, res, render)


def outcome(
    turn: Annotated[str, typer.Argument(help="Turn id (t42) or the request id of an image turn.")],
    value: Annotated[str, typer.Argument(help="The ground-truth outcome.")],
    timeout: Annotated[float, typer.Option("--timeout", help="Seconds to wait for a request's turn to be recorded.")] = 10.0,
    wait: WaitOpt = 0.0,
    json_: JsonOpt = False,
):
    """Attach the ground-truth outcome to a recorded turn (one `outcome` record; the latest wins)."""
    _check_seconds(timeout, positive=False)
    res = api.outcome(turn, value, timeout=timeout, wait=wait, store=common.store_dir())
    finish(json_, res, lambda: common.console().print(f"{res.turn}: outcome [green]{res.outcome}[/]"))


def status(json_: JsonOpt = False):
    """Whether an image serves this store, which generation, and its context."""
    res = api.image_status(store=common.store_dir())
    finish(json_, res, lambda: _render_status(res.status))


def stop(json_: JsonOpt = False):
    """Stop the image: it finishes the request in flight, its turns are committed, it exits."""
    res = api.image_stop(store=common.store_dir())
    finish(json_, res, lambda: common.console().print("stopped"))


def _render_status(st: dict) -> None:
    c = common.console()
    if not st.get("running"):
        c.print("no image is serving this store")
        return
    if st.get("state") == "busy":
        c.print(f"[yellow]busy[/]: the keeper (pid {st.get('pid') or '?'}) is starting or stopping an image; ask again shortly")
        return
    ctx = st.get("context") or {}
    n = ctx.get("counters") or {}
    box = st.get("sandbox") or {}
    c.print(f"[bold]{st['state']}[/] gen-{st.get('gen')} ({short(st.get('generation'))}) on {st['socket']}")
    c.print(f"  keeper pid {st['pid']}, image pid {st.get('image_pid') or '-'}, decoder {st.get('decoder') or '-'}, "
            + (f"Landlock ABI {box.get('landlock_abi')} ({box.get('grants')} grants)" if box.get("sandboxed")
               else "[red]unsandboxed[/]" if box else "-"))
    conf = box.get("confinement")
    if conf:   # what the image's bootstrap applied besides Landlock (docs/sandbox.md)
        left = ", ".join(conf["capabilities_left"]) or "none"
        shm = "private" if conf["shm_private"] else "[red]shared[/]"
        c.print(f"  confined: seccomp {short(conf['seccomp_filter_hash'])}, "
                f"{len(conf['capabilities_dropped'])} capabilities dropped (left: {left}), /dev/shm {shm}, "
                f"{sum(d['count'] for d in box.get('syscall_denials') or [])} syscalls refused")
    c.print(f"  turns {n.get('turns', 0)} (refusals {n.get('refusals', 0)}, calls {n.get('calls', 0)}, "
            f"call errors {n.get('call_errors', 0)}), switches {n.get('switches', 0)}, starts {n.get('starts', 0)}; "
            f"buffer cursor {short((ctx.get('cursor') or {}).get('session'))}:{(ctx.get('cursor') or {}).get('n')}")
    if st.get("learn"):
        c.print(f"  learning: a cycle after {st['learn']['min_turns']} new turns and {st['learn']['min_hours']:g} h")
