"""The `ledger` command: builds the typer app from one module per command group and maps
every LedgerError to its one-line message, hint and exit code (tracebacks: LEDGER_DEBUG=1)."""

from __future__ import annotations

import importlib
import sys
from typing import Annotated, Optional

import typer

from ledger.cli import common

app = typer.Typer(
    name="ledger",
    help="A content-addressed experiment ledger for learning systems that change themselves.",
    no_args_is_help=True,
    add_completion=True,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,  # plain click help: rich help rendering costs ~0.3 s of start-up
    context_settings={"help_option_names": ["-h", "--help"]},
)

# One module per command group; each exposes `register(app)`. Modules import only light
# libraries at top level: torch/peft/transformers load inside the commands that need them.
COMMAND_MODULES = [
    "ledger.cli.store_cmds",
    "ledger.cli.capability_cmds",
    "ledger.cli.share_cmds",
    "ledger.cli.train_cmds",
    "ledger.cli.cycle_cmds",
    "ledger.cli.gate_cmds",
    "ledger.cli.report_cmds",
    "ledger.cli.kernel_cmds",
    "ledger.cli.image_cmds",
]


@app.callback()
def _root(
    store: Annotated[Optional[str], typer.Option("--store", envvar="LEDGER_DIR", help="Store directory (default ./.ledger).")] = None,
):
    common.set_store_dir(store)


def _register() -> None:
    for name in COMMAND_MODULES:
        importlib.import_module(name).register(app)


_register()


def main(argv: list[str] | None = None) -> int:
    from ledger.errors import LedgerError

    try:
        app(args=argv, standalone_mode=False)
    except LedgerError as e:
        if common.debug():
            raise
        _report(e.message, e.hint, e.exit_code, e.to_json())
        return e.exit_code
    except SystemExit as e:
        return e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
    except KeyboardInterrupt:
        _report("interrupted", "nothing after the last committed record was kept", 1, None)
        return 130
    except Exception as e:  # usage errors and anything unexpected
        if isinstance(e, typer.Abort):
            return 1
        if hasattr(e, "format_message") and isinstance(e, typer.TyperException):  # click usage errors
            msg = e.format_message()
            _report(msg.splitlines()[0] if msg else type(e).__name__, "see `ledger COMMAND --help`", 2, None)
            return 2
        if common.debug():
            raise
        _report(f"internal error: {type(e).__name__}: {e}", "rerun with LEDGER_DEBUG=1 for a traceback and report it", 1, None)
        return 1
    return 0


def _report(message: str, hint: str, code: int, data) -> None:
    from rich.markup import escape

    # soft_wrap: the message stays one line whatever the terminal width (scripts grep it)
    common.err_console().print(f"[bold red]error:[/] {escape(message)}\n[dim]hint: {escape(hint)}[/]", soft_wrap=True)


def entry() -> None:
    sys.exit(main())


if __name__ == "__main__":
    entry()
