"""The docs stay true to the CLI: the command reference is generated and current, every command's
--json output has a documented schema, and the links between docs resolve."""

from __future__ import annotations

import re
import runpy
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"


def _gen():
    return runpy.run_path(str(DOCS / "gen_commands.py"), run_name="gen_commands")


def _leaf_commands() -> list[str]:
    import typer

    from ledger.cli.main import app

    out = []

    def walk(cmd, path):
        if getattr(cmd, "hidden", False):
            return
        if hasattr(cmd, "list_commands"):
            ctx = cmd.context_class(cmd, info_name=path[-1])
            for sub in cmd.list_commands(ctx):
                walk(cmd.get_command(ctx, sub), path + [sub])
        else:
            out.append(" ".join(path))

    walk(typer.main.get_command(app), ["ledger"])
    return out


def test_command_reference_is_generated_and_current():
    text = _gen()["render"]()
    current = (DOCS / "commands.md").read_text(encoding="utf-8")
    assert current == text, "docs/commands.md is out of date: run `python docs/gen_commands.py`"
    for cmd in _leaf_commands():
        assert f"`{cmd}`" in text


def test_command_catalog_is_current():
    """`ledger` lists and dispatches commands from a static catalog without importing them;
    it must name exactly what the modules register, in their order, with their help."""
    from ledger.cli import catalog

    assert catalog.COMMANDS == catalog.scan(), "ledger/cli/catalog.py is stale: run `python docs/gen_commands.py`"


def test_help_imports_no_command_module():
    import subprocess
    import sys

    code = ("import sys; from ledger.cli.main import main; main(['--help']); "
            "print(sorted(m for m in sys.modules if m.endswith('_cmds') or m.split('.')[0] in "
            "('duckdb', 'torch', 'pyarrow', 'wasmtime', 'rich')))")
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert "Commands:" in p.stdout and "report" in p.stdout
    assert p.stdout.strip().splitlines()[-1] == "[]", p.stdout.splitlines()[-1]


def test_every_command_has_a_json_schema():
    text = (DOCS / "json.md").read_text(encoding="utf-8")
    headings = set(re.findall(r"^#{2,4} .*?`(ledger [^`]+)`", text, re.M))
    missing = [c for c in _leaf_commands() if c not in headings]
    assert not missing, f"docs/json.md has no section for: {missing}"


def _links(md: Path) -> list[str]:
    text = md.read_text(encoding="utf-8")
    return [m for m in re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", text) if "://" not in m]


def test_docs_link_to_each_other_and_links_resolve():
    guide = DOCS / "user-guide.md"
    links = _links(guide)
    for target in ("store-format.md", "commands.md", "json.md", "gate.md", "sharing.md"):
        assert target in links, f"the user guide does not link {target}"
    for md in (guide, DOCS / "json.md", DOCS / "commands.md", ROOT / "README.md"):
        for link in _links(md):
            assert (md.parent / link).exists(), f"{md.name} links to missing {link}"
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    for doc in ("docs/user-guide.md", "docs/commands.md", "docs/json.md", "docs/store-format.md"):
        assert doc in readme
