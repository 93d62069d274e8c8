"""The `ledger` command: the typer app of ledger/cli/app.py, whose commands come from one module
per command group, loaded only when used (ledger/cli/catalog.py); here every LedgerError is
mapped to its one-line message, hint and exit code (tracebacks: LEDGER_DEBUG=1). A plain
`ledger add FILE` runs the same command body without importing typer (_quick below).

Conduct every command shares (tests/cli/test_conduct.py):
- an error is one line and a hint on stderr; under --json it is also one JSON object on stdout,
  {"exit_code", "error", "message", "hint"}, unless the command already wrote its answer there;
- Ctrl-C exits 130 with one line saying what the store kept (its last committed record);
- the store is --store DIR (or DIR/.ledger), else LEDGER_DIR, else found from the current
  folder or any parent, like git;
- `ledger --version` prints the version."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

try:   # the module top, inside a try: a Ctrl-C while these load is said as an interrupt (below)
    from ledger import api, errors  # in the try above: a Ctrl-C here exits 130, not as a traceback
    from ledger.cli import adding, common  # in the try above, likewise
    from ledger.errors import BadInput, LedgerError  # in the try above, likewise
except KeyboardInterrupt:
    # Ctrl-C while the CLI loads (its first ~50 ms): no command ran, so nothing was written. Said
    # as every interrupt is (exit 130, one line and a hint), not as a traceback.
    if "--json" in sys.argv[1:]:
        sys.stdout.write(json.dumps({"exit_code": 130, "error": "Interrupted", "message": "interrupted: nothing was written",
                                     "hint": "run the same command again"}) + "\n")
    sys.stderr.write("error: interrupted: nothing was written\nhint: run the same command again\n")
    raise SystemExit(130) from None


def _specific_hint(e: LedgerError, args: list[str]) -> str:
    """An error whose raiser gave no hint of its own gets the help of the command that failed,
    not a class-wide stock phrase."""
    if e.hint == type(e).default_hint and isinstance(e, BadInput) and type(e).default_hint == BadInput.default_hint:
        from ledger.cli.app import _command_path  # the error path only: it builds typer's command

        return f"see `{_command_path(args)} --help` for what it accepts"
    return e.hint


def _quick(args: list[str]) -> int | None:
    """`ledger add FILE` with no option, run without typer: the same body as the typer command
    (ledger/cli/adding.py), the store from LEDGER_DIR as the root option's envvar gives it. An
    unchanged re-add is all start-up, and importing typer and building the command was ~35 ms
    of its ~95 ms (benchmarks/RESULTS.md); an unchanged file is answered from the stat cache
    before the store's modules load (adding.quick). Anything else: None, for the typer app."""
    if len(args) != 2 or args[0] != "add" or not args[1] or args[1].startswith("-"):
        return None
    common.set_store_dir(os.environ.get("LEDGER_DIR") or None)   # click reads an empty envvar as unset
    adding.quick(Path(args[1]))
    return 0


def _json_mode(args: list[str]) -> bool:
    return "--json" in args[:args.index("--")] if "--" in args else "--json" in args


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else list(argv)
    json_mode = _json_mode(args)
    try:
        rv = _quick(args)
        if rv is None:
            from ledger.cli.app import app  # typer and its app: every command but a plain `add FILE`

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
        import typer  # to tell typer's exceptions apart (imported already unless _quick ran)

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
    # The process's own entry (the console script, `python -m ledger.cli.main`), not main(),
    # which tests call in-process: a Ctrl-C is noted so that one a library swallows still
    # stops the next commit (ledger/errors.py, store-format.md rule 24).
    errors.install_interrupt_handler()
    code = main()
    if code != 130 and errors.interrupt_requested():
        # the command ended although the user pressed Ctrl-C on the way (something swallowed
        # it): exit as interrupted, saying what was kept, after any error it reported itself
        code = _interrupted(_json_mode(sys.argv[1:]))
    sys.exit(code)


def __getattr__(name: str):
    """The typer app and its helpers, where docs/gen_commands.py and the tests import them from."""
    if name in ("app", "LazyGroup", "_LazyCommands", "_command_path"):
        from ledger.cli import app as typer_app  # imported on request: main's own start-up skips typer

        return getattr(typer_app, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


if __name__ == "__main__":
    entry()
