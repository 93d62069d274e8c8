"""What every command shares: option types, the --store choice, and one output path that
renders either human text (rich) or JSON (stdout) — the CLI parses and renders, nothing else;
the work is ledger.api's."""

from __future__ import annotations

import json
import os
import sys
from typing import Annotated, Callable

from ledger import api


def __getattr__(name: str):
    """JsonOpt and WaitOpt, the option types the command modules share, built on first use: an
    unchanged `ledger add FILE` (ledger/cli/main.py) runs without importing typer (~35 ms)."""
    if name not in ("JsonOpt", "WaitOpt"):
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    import typer  # only the typer app's command modules ask for these, after importing typer themselves

    wait_help = "Seconds to wait for the store lock (default: fail fast, exit 5)."
    opts = {"JsonOpt": Annotated[bool, typer.Option("--json", help="Machine-readable JSON on stdout (schemas: docs/json.md).")],
            "WaitOpt": Annotated[float, typer.Option("--wait", help=wait_help)]}
    globals().update(opts)
    return opts[name]

_store_dir: str | None = None


def set_store_dir(d: str | None) -> None:
    global _store_dir
    _store_dir = d


def store_dir() -> str | None:
    return _store_dir


_console = None
_err_console = None


def console():
    global _console
    if _console is None:
        from rich.console import Console

        _console = Console(highlight=False, **_color())
    return _console


def err_console():
    global _err_console
    if _err_console is None:
        from rich.console import Console

        _err_console = Console(stderr=True, highlight=False, **_color())
    return _err_console


def _color() -> dict:
    # NO_COLOR (no-color.org): rich alone drops only colours and still emits bold/dim escapes;
    # no colour system means no escapes at all, even on a forced terminal.
    return {"color_system": None} if os.environ.get("NO_COLOR") else {}


def _default(o):
    if hasattr(o, "to_json"):
        return o.to_json()
    if isinstance(o, (set, frozenset)):
        return sorted(o)
    return str(o)


_emitted = False


def emitted() -> bool:
    """Whether this command already wrote its JSON answer to stdout (an error after it then goes
    to stderr only, so that stdout stays one JSON document)."""
    return _emitted


def emit(json_mode: bool, data, render: Callable[[], None] | None = None) -> None:
    """Print `data` as JSON, or call `render()` for the human view."""
    global _emitted
    if json_mode:
        sys.stdout.write(json.dumps(data, default=_default, sort_keys=True, ensure_ascii=False) + "\n")
        _emitted = True
    elif render is not None:
        render()


def finish(json_mode: bool, res, render: Callable[[], None] | None = None) -> None:
    """The end of every command: the store's warnings (stderr), the result (JSON or `render()`),
    then the error the result carries (a stopped training, a refused gate, ...), if any."""
    print_warnings(res.warnings)
    emit(json_mode, res.to_json(), render)
    failure = res.failure()
    if failure is not None:
        raise failure


def plain_stdout() -> bool:
    """Whether stdout gets plain text: not a terminal, and not forced to be one (FORCE_COLOR,
    TTY_COMPATIBLE), the same test rich's Console applies before it emits any escape."""
    if os.environ.get("FORCE_COLOR") or os.environ.get("TTY_COMPATIBLE") == "1":
        return False
    try:
        return not sys.stdout.isatty()
    except (AttributeError, ValueError):  # replaced or closed stdout
        return True


def line(text: str) -> None:
    """One plain line on stdout: no markup, no wrapping, no styles — what rich would print for
    it, without importing rich (the output of `add` and other one-line answers)."""
    sys.stdout.write(text + "\n")


def print_warnings(items) -> None:
    if not items:
        return   # rich's import (~25 ms) only when there is something to print
    from rich.markup import escape

    for w in items:
        err_console().print(f"[yellow]warning:[/] {escape(w)}")


def human_bytes(n: float) -> str:
    """The API's byte format (api.human_bytes), for the CLI's tables; loaded when first drawn."""
    return api.human_bytes(n)


def short(oid: str | None, n: int = 12) -> str:
    if not oid:
        return "-"
    return oid[:3 + n] if oid.startswith("b3:") else oid


def debug() -> bool:
    return os.environ.get("LEDGER_DEBUG") == "1"


class byte_progress:
    """A transient rich progress bar on stderr for long byte-wise work; `advance(n)`."""

    def __init__(self, label: str, total: int | None):
        self.label, self.total = label, total
        self._p = None

    def __enter__(self):
        if not (self.total and self.total > (64 << 20)) or not sys.stderr.isatty():
            return lambda n: None
        task = None

        def advance(n):
            # Started on the first bytes, not on entry: work that turns out to need no bytes
            # (an unchanged re-add) neither draws a bar nor pays for importing rich's.
            nonlocal task
            if self._p is None:
                from rich.progress import BarColumn, DownloadColumn, Progress, TimeRemainingColumn, TransferSpeedColumn

                self._p = Progress("[progress.description]{task.description}", BarColumn(), DownloadColumn(),
                                   TransferSpeedColumn(), TimeRemainingColumn(), console=err_console(), transient=True)
                self._p.start()
                task = self._p.add_task(self.label, total=self.total)
            self._p.advance(task, n)

        return advance

    def __exit__(self, *exc):
        if self._p is not None:
            self._p.stop()
        return False


class TrainingBar:
    """A progress bar on stderr while a training child runs: step of steps, loss, tokens/s, elapsed
    and ETA. Pass the instance as a `progress` callback; it draws only on a terminal."""

    def __init__(self, enabled: bool):
        self.enabled = enabled and err_console().is_terminal
        self.bar = None
        self.task = None

    def __enter__(self):
        if self.enabled:
            from rich.progress import (
                BarColumn,
                MofNCompleteColumn,
                Progress,
                TextColumn,
                TimeElapsedColumn,
                TimeRemainingColumn,
            )

            self.bar = Progress(TextColumn("training"), BarColumn(), MofNCompleteColumn(),
                                TextColumn("loss {task.fields[loss]}"), TextColumn("{task.fields[tps]} tok/s"),
                                TimeElapsedColumn(), TextColumn("ETA"), TimeRemainingColumn(),
                                console=err_console(), transient=False)
            self.bar.__enter__()
        return self

    def __call__(self, p: dict) -> None:
        if not self.bar:
            return
        if self.task is None:
            self.task = self.bar.add_task("train", total=p["steps"], loss="-", tps="-")
        self.bar.update(self.task, completed=p["step"], loss=f"{p['loss']:.4f}", tps=f"{p['tokens_per_s']:,.0f}")

    def __exit__(self, *exc):
        if self.bar:
            self.bar.__exit__(*exc)
