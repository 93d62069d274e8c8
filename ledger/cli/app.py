"""The typer app behind `ledger` (ledger/cli/main.py runs it): the root command group, whose
commands come from one module per command group (ledger/cli/catalog.py) and are imported only
when used, and the root's options (--store, --version)."""

from __future__ import annotations

import importlib
from typing import Annotated, Optional

import typer

from ledger import api
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
