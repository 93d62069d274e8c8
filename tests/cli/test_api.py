"""The porcelain's shape (ledger/api/): the lazy VERBS map is the submodules' names, results are
frozen dataclasses, the CLI and the demo call nothing deeper, and the options hold each default
once and cross to the detached keeper as JSON."""

import ast
import dataclasses
import importlib
import json
import subprocess
import sys
from pathlib import Path

import pytest

from ledger import api
from ledger.errors import BadInput
from ledger.options import LearnOptions, ServeOptions

LEDGER = Path(__file__).resolve().parents[2] / "ledger"


def _public_names(path: Path) -> list[str]:
    names = []
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, (ast.FunctionDef, ast.ClassDef)) and not node.name.startswith("_"):
            names.append(node.name)
        elif isinstance(node, ast.Assign):
            names += [t.id for t in node.targets if isinstance(t, ast.Name) and t.id.isupper()]
    return names


def test_verbs_map_is_the_submodules():
    found = {p.stem: tuple(_public_names(p)) for p in sorted((LEDGER / "api").glob("*.py"))
             if not p.stem.startswith("_")}
    assert found == api.VERBS, "ledger/api/__init__.py VERBS is stale"
    for module, names in api.VERBS.items():
        assert module not in api.__all__, f"submodule {module!r} would shadow the name it shares"
        for name in names:
            assert getattr(api, name) is getattr(importlib.import_module(f"ledger.api.{module}"), name)
    with pytest.raises(AttributeError):
        api.no_such_verb


def test_results_are_frozen_dataclasses():
    results = [getattr(api, n) for n in api.__all__ if isinstance(getattr(api, n), type)
               and issubclass(getattr(api, n), api.Result)]
    assert len(results) > 40
    for cls in results:
        assert dataclasses.is_dataclass(cls) and cls.__dataclass_params__.frozen, cls
    res = api.Added("b3:x", 3, "blob", None, True)
    with pytest.raises(dataclasses.FrozenInstanceError):
        res.size = 4
    assert res.to_json() == {"id": "b3:x", "size": 3, "kind": "blob", "name": None, "unchanged": True}
    assert res.failure() is None


def test_importing_api_loads_no_room():
    code = "import sys, ledger.api; print(sorted(m for m in sys.modules if m.startswith('ledger.api.')))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert json.loads(out.replace("'", '"')) == []


def _ledger_imports(path: Path) -> set[str]:
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("ledger"):
            out.add(node.module)
        elif isinstance(node, ast.Import):
            out |= {a.name for a in node.names if a.name.startswith("ledger")}
    return out


def test_the_cli_and_the_demo_call_only_the_api():
    allowed = ("ledger.api", "ledger.cli", "ledger.errors", "ledger.options")
    for path in sorted((LEDGER / "cli").glob("*.py")):
        deeper = {m for m in _ledger_imports(path) if not m.startswith(allowed) and m != "ledger"}
        deeper -= {"ledger.demo.story"}    # `ledger demo` runs the story, which sits beside the CLI
        assert not deeper, f"{path.name} reaches past the api: {sorted(deeper)}"
    demo = _ledger_imports(LEDGER / "demo" / "story.py")
    assert not {m for m in demo if m.startswith("ledger.cli")}, "the demo must not import the CLI"
    assert not {m for m in demo if not m.startswith(("ledger.api", "ledger.errors", "ledger.options"))
                and m != "ledger" and m != "ledger.artefacts.builtin_task"}


def test_learn_defaults_are_written_once():
    """150 turns and 4 h appear as numbers only in ledger/options.py; the CLI and the policy read them."""
    from ledger.cycle import Policy

    assert (Policy().min_turns, Policy().min_hours) == (LearnOptions.min_turns, LearnOptions.min_hours) == (150, 4.0)
    for path in [*(LEDGER / "cli").glob("*.py"), LEDGER / "cycle.py", *(LEDGER / "image").glob("*.py"),
                 *(LEDGER / "api").glob("*.py"), LEDGER / "demo" / "story.py"]:
        text = path.read_text()
        assert "= 150" not in text and "min_turns=150" not in text and "= 4.0," not in text, path


def test_options_cross_as_json_and_check_themselves():
    o = ServeOptions(learn=LearnOptions(min_turns=10, min_hours=0.5, spec="s.toml", target="h200"), threads=2,
                     durability="os")
    assert ServeOptions.from_json(json.loads(json.dumps(o.to_json()))) == o
    assert ServeOptions.from_json({}) == ServeOptions()
    for bad in ({"durability": "maybe"}, {"threads": 0}, {"threads": True}, {"learn": {"min_turns": -1}},
                {"learn": 3}, {"colour": "red"}):
        with pytest.raises(BadInput):
            ServeOptions.from_json(bad)
    with pytest.raises(BadInput):
        LearnOptions(min_hours=float("nan"))


def test_the_keeper_reads_its_options_from_stdin(tmp_path):
    """`python -m ledger.image` takes one JSON object on stdin; anything else is bad input (exit 2),
    logged as the error-json line start_detached reads."""
    from ledger.image.client import ERROR_JSON_TAG

    def keeper(stdin: str):
        return subprocess.run([sys.executable, "-m", "ledger.image"], input=stdin, capture_output=True, text=True,
                              timeout=60)

    api.init(tmp_path / "s")
    for stdin, needle in (("not json", "not JSON"), ('{"options": {}}', "name no store"),
                          (json.dumps({"store": str(tmp_path), "options": {}}), "no ledger store"),
                          (json.dumps({"store": str(tmp_path / "s"), "options": {"threads": 0}}), "threads")):
        p = keeper(stdin)
        assert p.returncode == 2, (stdin, p.stderr)
        line = next(x for x in p.stderr.splitlines() if ERROR_JSON_TAG in x)
        assert needle in json.loads(line.partition(ERROR_JSON_TAG)[2])["message"], (stdin, line)
