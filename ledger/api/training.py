"""Training: train, reproduce, import-base.

Part of ledger.api (see its docstring): import the verbs from there, `from ledger import api`."""

from __future__ import annotations

import math
import os
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Mapping

from ledger import records
from ledger.api._base import Result, StoreLike, Wrapped, take_warnings
from ledger.api._open import open_store
from ledger.api.plans import plan_ref
from ledger.artefacts import model as modellib
from ledger.errors import BadInput, Refused
from ledger.sharing import fetch_closure
from ledger.train import reproduce as rep
from ledger.train import run as trainlib


@dataclass(frozen=True)
class Trained(Wrapped):
    """ledger.train.run's TrainResult in `result` (receipt_id, receipt, rung). failure(): Refused
    when training stopped on a non-finite loss (the receipt is committed, at a lower rung)."""

    def failure(self):
        r = self.result
        st = r.receipt["stopped"]
        if not st:
            return None
        return Refused(f"training stopped: {st['reason']} ({st['loss']}) at step {st['step']}; receipt {r.receipt_id} "
                       f"is at rung {r.rung} and has no adapter to judge", "lower optimizer.lr and compile again")



def train(plan: str, *, resume: str | None = None, unsandboxed: bool = False, progress=None,
          store: StoreLike = None, say: Callable[[str], None] | None = None, compile_cache: str | None = None) -> Trained:
    """Run a plan (a ref, or a spec .toml compiled first) in a sandboxed child; commit adapter,
    checkpoints and a receipt. `progress(dict)` gets step, steps, loss, tokens_per_s.
    `compile_cache` names a compile cache to use (refused if built for another shape, device or
    library version); without it the cache of the plan's shape is looked up by itself."""
    s = open_store(store)
    ref = plan_ref(plan, store=s, say=say)
    res = trainlib.train(s, ref, resume=resume, unsandboxed=unsandboxed, progress=progress,
                         compile_cache=compile_cache)
    return Trained(result=res, warnings=take_warnings(s))



def parse_override(text: str) -> tuple[str, Any]:
    """`section.field=VALUE` (VALUE read as TOML; a bare word is a string) -> (key, value)."""
    key, sep, raw = text.partition("=")
    if not sep or not key.strip():
        raise BadInput(f"--override {text!r}: expected section.field=VALUE", "e.g. --override optimizer.lr=0.001")
    try:
        value = tomllib.loads(f"v = {raw.strip()}")["v"]
    except tomllib.TOMLDecodeError:
        value = raw.strip()  # a bare word is a string, as a user would mean it
    return key.strip(), value



@dataclass(frozen=True)
class Reproduced(Wrapped):
    """ledger.train.reproduce's ReproduceResult in `result`. failure(): Refused unless it
    reproduced (Diverged, MissingInputs), after the comparison is committed."""

    def failure(self):
        r = self.result
        if r.outcome not in ("Diverged", "MissingInputs"):
            return None
        return Refused(f"reproduce: {r.outcome} (comparison {r.comparison_id})",
                       "see the comparison above: `ledger show " + r.comparison_id[:15] + "`")



def reproduce(receipt: str, *, overrides: Mapping[str, Any] | None = None, loss_tol: float = 1e-4,
              weight_tol: float = 1e-4, unsandboxed: bool = False, source: str | None = None, progress=None,
              store: StoreLike = None) -> Reproduced:
    """Re-execute a receipt from its pinned inputs in a fresh process and compare. `source`: first
    fetch the receipt's closure from a remote, bundle file, remote folder or s3:// URL."""
    for opt, tol in (("--loss-tol", loss_tol), ("--weight-tol", weight_tol)):
        # checked before anything runs: a NaN tolerance trained the whole reproduction, then the
        # record holding it was refused as non-canonical JSON (exit 2 after objects were written)
        if not isinstance(tol, (int, float)) or not math.isfinite(tol) or tol < 0:
            raise BadInput(f"{opt} {tol} is not a finite, non-negative number", "e.g. --loss-tol 1e-4")
    s = open_store(store)
    if source:
        receipt = fetch_closure(s, source, [receipt]).requested[0]  # verified; what it lacks → MissingInputs
    res = rep.reproduce(s, receipt, overrides=dict(overrides or {}),
                        tolerance={"loss_abs": loss_tol, "weight_abs": weight_tol}, unsandboxed=unsandboxed,
                        progress=progress)
    return Reproduced(result=res, warnings=take_warnings(s))



@dataclass(frozen=True)
class ImportedBase(Result):
    """The base manifest an import wrote, and what it was made from."""
    base: str
    name: str | None



def import_base(path: str | os.PathLike, *, name: str | None = None, store: StoreLike = None,
                progress=None) -> ImportedBase:
    """Import base weights (a Hugging Face Llama folder, or a .gguf file) with their tokenizer and
    chat template as objects (one `import-base` record); `name` names it (then model.base = NAME
    in a spec); `progress(message)` is told each stage (a GGUF import takes tens of seconds)."""
    s = open_store(store)
    with s.transaction("import-base") as tx:
        oid = modellib.import_base(tx, s, Path(path), progress)
        tx.outputs.append(oid)
        if name:
            tx.refs[f"name/{name}"] = oid
        records.write(tx, records.ImportBase(base=oid, **({"name": name} if name else {})))
    return ImportedBase(oid, name, warnings=take_warnings(s))
