"""docs/store-api.md lists every verb of ledger.api with its parameters as the code has them
(issue 14: the docs describe the api package); `NAME=` marks a parameter with a default, `store=`
(every verb's) is left out, and the return type is checked where the code annotates it."""

import importlib
import inspect
import re
from pathlib import Path

from ledger import api

DOC = Path(__file__).resolve().parents[2] / "docs" / "store-api.md"


def _documented() -> dict[str, str]:
    return dict(re.findall(r"^api\.(\w+)\((.*)$", DOC.read_text(encoding="utf-8"), re.M))


def _signature(f) -> tuple[str, str | None]:
    sig = inspect.signature(f)
    params = ", ".join(p.name + ("=" if p.default is not inspect.Parameter.empty else "")
                       for p in sig.parameters.values() if p.name != "store")
    ret = sig.return_annotation
    if ret is inspect.Signature.empty:
        return params, None
    return params, ret if isinstance(ret, str) else getattr(ret, "__name__", str(ret))


def _verbs():
    for room, names in api.VERBS.items():
        module = importlib.import_module(f"ledger.api.{room}")
        for name in names:
            if inspect.isfunction(getattr(module, name)):
                yield name, getattr(module, name)


def test_every_verb_is_listed_as_the_code_has_it():
    doc = _documented()
    wrong = []
    for name, f in _verbs():
        params, ret = _signature(f)
        if name not in doc:
            wrong.append(f"  api.{name}({params}) is not listed")
            continue
        m = re.match(r"(.*)\) -> (.*)$", doc[name])
        if m is None or m.group(1) != params or (ret is not None and m.group(2) != ret):
            wrong.append(f"  api.{name}({doc[name]} in the docs; the code has ({params}) -> {ret or '?'}")
    assert not wrong, "docs/store-api.md is out of step with ledger.api:\n" + "\n".join(wrong)


def test_nothing_listed_that_is_not_a_verb():
    verbs = {name for name, _ in _verbs()}
    assert set(_documented()) - verbs == set()
