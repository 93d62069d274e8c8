"""The `ledger` command: a typer app whose commands come from one module per command group,
loaded only when used (ledger/cli/catalog.py), and which maps every LedgerError to its
one-line message, hint and exit code (tracebacks: LEDGER_DEBUG=1)."""

from __future__ import annotations

import importlib
import sys
from typing import Annotated, Optional

import typer

from ledger.cli import catalog, common


class LazyGroup(typer.core.TyperGroup):
    """The root command group, with its commands imported on first use.

    Building click commands for all ~50 commands, and importing every module that defines
    them, cost most of `ledger`'s start-up. Here `--help`, completion and typo suggestions read
    the static catalog, and running a command imports only the module that registers it."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.commands = _LazyCommands()

    def list_commands(self, ctx):
        return list(catalog.COMMANDS)

    def format_commands(self, ctx, formatter):
        from typer._click.utils import make_default_short_help

        names = list(catalog.COMMANDS)
        limit = formatter.width - 6 - max(map(len, names))
        with formatter.section("Commands"):
            formatter.write_dl([(n, make_default_short_help(catalog.COMMANDS[n][1], limit)) for n in names])


class _LazyCommands(dict):
    """name -> click command, filled from the catalog on first lookup of each name."""

    def __missing__(self, name):
        if name not in catalog.COMMANDS:
            raise KeyError(name)
        module = catalog.COMMANDS[name][0]
        # Build click commands for this module's registrations only, and of those only the one
        # asked for (typer's conversion is the expensive part).
        sub = typer.Typer(rich_markup_mode=None)
        importlib.import_module(module).register(sub)
        sub.registered_commands = [c for c in sub.registered_commands
                                   if (c.name or typer.main.get_command_name(c.callback.__name__)) == name]
        sub.registered_groups = [g for g in sub.registered_groups if (g.name or g.typer_instance.info.name) == name]
        group = typer.main.get_group(sub)
        if name not in group.commands:  # the catalog is stale (tests/report/test_docs.py checks it)
            raise KeyError(name)
        self[name] = group.commands[name]
        return self[name]

    def get(self, name, default=None):
        try:
            return self[name]
        except KeyError:
            return default

    def keys(self):  # typo suggestions ("did you mean …") read the names, not the commands
        return catalog.COMMANDS.keys()


app = typer.Typer(
    name="ledger",
    cls=LazyGroup,
    help="A content-addressed experiment ledger for learning systems that change themselves.",
    no_args_is_help=True,
    add_completion=True,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,  # plain click help: rich help rendering costs ~0.3 s of start-up
    context_settings={"help_option_names": ["-h", "--help"]},
)


@app.callback()
def _root(
    store: Annotated[Optional[str], typer.Option("--store", envvar="LEDGER_DIR", help="Store directory (default ./.ledger).")] = None,
):
    common.set_store_dir(store)


def main(argv: list[str] | None = None) -> int:
    from ledger.errors import LedgerError

    try:
        app(args=argv, standalone_mode=False)
    except LedgerError as e:
        if common.debug():
            _print_details(e)
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


def _print_details(e) -> None:
    """LEDGER_DEBUG=1: what an error carries besides its message (a child's output, the accesses
    its sandbox denied), printed before the traceback."""
    import json

    for key, value in e.details.items():
        text = value if isinstance(value, str) else json.dumps(value, indent=1, default=str)
        sys.stderr.write(f"--- {key} ---\n{text.rstrip()}\n")


def _report(message: str, hint: str, code: int, data) -> None:
    from rich.markup import escape

    # soft_wrap: the message stays one line whatever the terminal width (scripts grep it)
    common.err_console().print(f"[bold red]error:[/] {escape(message)}\n[dim]hint: {escape(hint)}[/]", soft_wrap=True)


def entry() -> None:
    sys.exit(main())


if __name__ == "__main__":
    entry()
