"""The `ledger` command: a typer app whose commands come from one module per command group,
loaded only when used (ledger/cli/catalog.py), and which maps every LedgerError to its
one-line message, hint and exit code (tracebacks: LEDGER_DEBUG=1).

Conduct every command shares (tests/cli/test_conduct.py):
- an error is one line and a hint on stderr; under --json it is also one JSON object on stdout,
  {"exit_code", "error", "message", "hint"}, unless the command already wrote its answer there;
- Ctrl-C exits 130 with one line saying what the store kept (its last committed record);
- the store is --store DIR (or DIR/.ledger), else LEDGER_DIR, else found from the current
  folder or any parent, like git;
- `ledger --version` prints the version."""

from __future__ import annotations

import importlib
import json
import sys
from typing import Annotated, Optional

import typer

from ledger import api
from ledger.cli import catalog, common
from ledger.errors import BadInput, LedgerError


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


def _version(value: bool) -> None:
    if value:
        common.line(f"ledger {api.version()}")
        raise typer.Exit(0)


@app.callback()
def _root(
    store: Annotated[Optional[str], typer.Option(
        "--store", envvar="LEDGER_DIR",
        help="The store: a folder holding .ledger/, or the .ledger folder itself (default: found from the "
             "current folder or any parent).")] = None,
    version: Annotated[bool, typer.Option("--version", is_eager=True, callback=_version,
                                          help="Print the version and exit.")] = False,
):
    common.set_store_dir(store)


def _command_path(args: list[str]) -> str:
    """`ledger bundle create` from the arguments: the command (and its subcommand, for a group)."""
    words, skip = [], False
    for a in args:
        if skip:
            skip = False
        elif a == "--store":  # the root's one option that takes a value
            skip = True
        elif not a.startswith("-"):
            words.append(a)
    if not words or words[0] not in catalog.COMMANDS:
        return "ledger"
    path = ["ledger", words[0]]
    # on the error path only: building the group's click command is cheap next to what failed
    cmd = _LazyCommands().get(words[0])
    if len(words) > 1 and isinstance(cmd, typer.core.TyperGroup) and words[1] in cmd.commands:
        path.append(words[1])
    return " ".join(path)


def _specific_hint(e: LedgerError, args: list[str]) -> str:
    """An error whose raiser gave no hint of its own gets the help of the command that failed,
    not a class-wide stock phrase."""
    if e.hint == type(e).default_hint and isinstance(e, BadInput) and type(e).default_hint == BadInput.default_hint:
        return f"see `{_command_path(args)} --help` for what it accepts"
    return e.hint


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else list(argv)
    json_mode = "--json" in args[:args.index("--")] if "--" in args else "--json" in args
    try:
        rv = app(args=args, prog_name="ledger", standalone_mode=False)
    except LedgerError as e:
        if common.debug():
            _print_details(e)
            raise
        _report(e.message, _specific_hint(e, args), e.exit_code, type(e).__name__, json_mode)
        return e.exit_code
    except SystemExit as e:
        return e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
    except KeyboardInterrupt:   # outside a command (typer turns one inside into 130, below)
        return _interrupted(json_mode)
    except Exception as e:  # usage errors and anything unexpected
        if isinstance(e, typer.Abort):
            return 1
        if hasattr(e, "format_message") and isinstance(e, typer.TyperException):  # click usage errors
            msg = e.format_message()
            # the help of the command that was being parsed (`ledger bundle create --help`), not a
            # placeholder; for an unknown command, the list of them
            path = getattr(getattr(e, "ctx", None), "command_path", None) or "ledger"
            _report(msg.splitlines()[0] if msg else type(e).__name__, f"see `{path} --help`", 2, "UsageError",
                    json_mode)
            return 2
        if common.debug():
            raise
        _report(f"internal error: {type(e).__name__}: {e}", "rerun with LEDGER_DEBUG=1 for a traceback and report it", 1,
                "InternalError", json_mode)
        return 1
    if rv == 130:   # typer's answer to a KeyboardInterrupt inside a command
        return _interrupted(json_mode)
    return rv if isinstance(rv, int) else 0


def _interrupted(json_mode: bool) -> int:
    """Ctrl-C: exit 130, saying what the store kept. Every change is a transaction, so what was
    committed before the interrupt is whole and nothing after it was written."""
    try:
        last = api.last_record(store=common.store_dir())
    except LedgerError:   # no store here (or an unreadable one): nothing of it to report
        last = None
    kept = (f"the store keeps everything up to journal record {last['seq']} ({last['kind']}); nothing after it was written"
            if last else "nothing was written")
    _report(f"interrupted: {kept}", "run the same command again to carry on (`ledger run` resumes a cycle "
            "from its last committed stage)", 130, "Interrupted", json_mode)
    return 130


def _print_details(e) -> None:
    """LEDGER_DEBUG=1: what an error carries besides its message (a child's output, the accesses
    its sandbox denied), printed before the traceback."""
    for key, value in e.details.items():
        text = value if isinstance(value, str) else json.dumps(value, indent=1, default=str)
        sys.stderr.write(f"--- {key} ---\n{text.rstrip()}\n")


def _report(message: str, hint: str, code: int, name: str, json_mode: bool) -> None:
    from rich.markup import escape

    if json_mode and not common.emitted():   # one JSON document on stdout: the answer, or this
        common.emit(True, {"exit_code": code, "error": name, "message": message, "hint": hint})
    # soft_wrap: the message stays one line whatever the terminal width (scripts grep it)
    common.err_console().print(f"[bold red]error:[/] {escape(message)}\n[dim]hint: {escape(hint)}[/]", soft_wrap=True)


def entry() -> None:
    sys.exit(main())


if __name__ == "__main__":
    entry()
