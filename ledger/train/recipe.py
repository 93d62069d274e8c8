"""The recipe interface every training child implements (torchtune style: a recipe is read top to
bottom -- setup, train, save -- over small parts; no inheritance between recipes).

    recipe = SftRecipe(work)     # ledger/train/sft.py: supervised LoRA on the plan
    recipe = DpoRecipe(work)     # ledger/train/dpo.py: preference tuning on an SFT adapter
    result = run(recipe)         # setup(); train(); save() -> what out/result.json holds

`child_main` is the shared entry point of `python -m ledger.train.child WORK` and
`python -m ledger.train.dpo WORK`: it arms the death signal (a killed parent must not leave a
child training unobserved), runs the recipe, and reports a typed error the one way an error
crosses a process boundary (out/error.json, `LedgerError.to_json`; exit 3). The parent side is
ledger/train/job.py.
"""

from __future__ import annotations

import ctypes
import json
import os
import signal
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Protocol

from ledger.errors import LedgerError

CHILD_ERROR_EXIT = 3


class Recipe(Protocol):
    """What a training child does, in three steps over the work folder it was given."""

    def setup(self) -> None:
        """Read inputs/ and build everything the loop needs (model, data, optimizer, resume state)."""

    def train(self) -> None:
        """Run the optimizer steps, writing out/progress.jsonl (and checkpoints) as it goes."""

    def save(self) -> dict:
        """Write the adapter, final state and out/result.json; return the result."""


def run(recipe: Recipe) -> dict:
    recipe.setup()
    recipe.train()
    return recipe.save()


def die_with_parent() -> None:
    """A parent that is killed must not leave a training child running unobserved."""
    try:
        ctypes.CDLL(None).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
        if os.getppid() == 1:
            os._exit(1)
    except (OSError, AttributeError):
        pass


def child_main(argv: list[str], module: str, make: Callable[[Path], Recipe]) -> int:
    """`python -m MODULE WORKDIR`: run the recipe `make(work)`; a LedgerError goes to out/error.json."""
    if len(argv) != 1:
        print(f"usage: python -m {module} WORKDIR", file=sys.stderr)
        return 2
    die_with_parent()
    work = Path(argv[0])
    try:
        run(make(work))
    except LedgerError as e:
        try:  # the first rank to fail names the error
            with open(work / "out" / "error.json", "x") as f:
                f.write(json.dumps(e.to_json(), sort_keys=True, default=str))
        except FileExistsError:
            pass
        print(f"error: {e.message}", file=sys.stderr)
        return CHILD_ERROR_EXIT
    return 0
