"""The import rules of docs/architecture.md, checked over the AST of every module."""

import sys

from tests.house.layers import FLOOR, HEAVY, PACKAGE, cycles, heavy_modules, imports, module_path, room, third_party


def _show(found):
    return "\n".join(f"  {i.source}:{i.line} imports {i.target}" for i in found)


def test_every_room_has_a_floor():
    rooms = {room(i.source) for i in imports()} | {room(i.target) for i in imports()}
    rooms |= {p.stem if p.is_file() else p.name for p in PACKAGE.iterdir()
              if (p.suffix == ".py" or (p / "__init__.py").exists())}
    assert rooms <= set(FLOOR), f"rooms with no floor in tests/house/layers.py: {sorted(rooms - set(FLOOR))}"


def test_store_and_verdicts_import_only_errors_and_themselves():
    bad = [i for i in imports() if room(i.source) in ("store", "verdicts")
           and room(i.target) not in (room(i.source), "errors", "__init__")]
    assert not bad, "store/ and verdicts/ are the bottom: they import only ledger.errors and themselves\n" + _show(bad)


def test_nothing_below_the_cli_imports_it():
    bad = [i for i in imports() if room(i.target) == "cli" and room(i.source) != "cli"]
    assert not bad, "only the CLI imports ledger.cli (the demo and api call ledger.api)\n" + _show(bad)


def test_artefacts_import_no_train_gate_or_plan():
    bad = [i for i in imports() if room(i.source) == "artefacts" and room(i.target) in ("train", "gate", "plan")]
    assert not bad, "artefacts/ are below plan/, gate/ and train/\n" + _show(bad)


def test_plan_imports_no_torch():
    bad = [(p, name, line) for p in (PACKAGE / "plan").rglob("*.py") for name, line, _ in third_party(p)
           if name in ("torch", "transformers", "peft")]
    assert not bad, f"plan/ compiles without torch: {bad}"


def test_no_import_points_up_a_floor():
    # `ledger` itself is the facade: `ledger.track` is loaded from its __getattr__ on first use, so
    # `import ledger` (every module's, every command's) stays at the bottom floor
    bad = [i for i in imports() if FLOOR.get(room(i.target), 0) > FLOOR.get(room(i.source), 99)
           and not (i.source == "ledger" and not i.top)]
    assert not bad, "an import never points up a floor (docs/architecture.md)\n" + _show(bad)


def test_no_import_circles():
    found = cycles()
    assert not found, "import circles:\n" + "\n".join("  " + " <-> ".join(c) for c in found)


def _commented(path, line: int) -> bool:
    """Whether an import says why it is where it is: a comment on its line or the line above."""
    lines = path.read_text().splitlines()
    return any("#" in lines[k] for k in (line - 1, line - 2) if 0 <= k < len(lines))


def test_imports_inside_functions_are_only_for_heavy_modules():
    heavy = heavy_modules()
    bad = []
    for i in imports():
        if not i.top and i.target not in heavy:
            path = module_path(i.source)
            if not _commented(path, i.line):
                bad.append(f"  {i.source}:{i.line} imports {i.target} inside a function")
    for path in sorted(PACKAGE.rglob("*.py")):
        for name, line, top in third_party(path):
            if not top and name not in HEAVY and not _commented(path, line):
                bad.append(f"  {path.relative_to(PACKAGE.parent)}:{line} imports {name} inside a function")
    assert not bad, ("imports go at module top unless a measured start-up cost says otherwise: a module in "
                     "tests/house/layers.py HEAVY, or a comment on the import saying why\n" + "\n".join(bad))


def test_the_layer_check_can_fail(tmp_path, monkeypatch):
    """The checks above read real files: a planted upward import is found."""
    from tests.house import layers

    pkg = tmp_path / "ledger"
    (pkg / "store").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "store" / "__init__.py").write_text("")
    (pkg / "store" / "bad.py").write_text("from ledger import cli\n")
    (pkg / "cli").mkdir()
    (pkg / "cli" / "__init__.py").write_text("from ledger.store import bad\n")
    monkeypatch.setattr(layers, "PACKAGE", pkg)
    found = layers.imports()
    assert any(i.source == "ledger.store.bad" and i.target == "ledger.cli" for i in found)
    assert layers.cycles() == [["ledger.cli", "ledger.store.bad"]]
    assert sys.modules.get("ledger.store.bad") is None  # read, never imported
