"""The gate and the report: seal, judge, dpo, report.

Part of ledger.api (see its docstring): import the verbs from there, `from ledger import api`."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Mapping

from ledger import cycle, generations, records
from ledger import report as reportlib
from ledger.api._base import Result, StoreLike, Wrapped, take_warnings
from ledger.api._open import open_store
from ledger.errors import Refused
from ledger.gate import judge as judgelib
from ledger.gate import seal as seallib
from ledger.train import dpo as dpolib


@dataclass(frozen=True)
class Sealed(Wrapped):
    """ledger.gate.seal's SealResult in `result` (suite, new, repinned, changes)."""


@dataclass(frozen=True)
class Restored(Result):
    """The pinned suite whose sealed copy was rewritten, and where."""
    suite: Any      # the pinned SealedSuite
    path: str

    def to_json(self):
        return {**self.suite.summary(), "restored": self.path}


def seal(suite_dir: str | os.PathLike, *, base: str | None = None, repin: bool = False, reason: str | None = None,
         store: StoreLike = None) -> Sealed:
    """Seal a suite folder (eval/ and canary/ documents, optional settings.toml) where training
    cannot read it, and pin its hash against `base` (default HEAD's base): one `seal` record.
    A different suite needs `repin` and a `reason` (else Refused, exit 3). On a store with no
    generation and no `base`, gen-0 is made first on the built-in base (what the first `ledger run`
    would make), so that `init`, `seal`, `record`, `run` is a sequence that works."""
    s = open_store(store)
    if base is None and generations.head(s) is None:
        g = cycle.ensure_genesis(s, cycle.load_spec(None))
        s.warnings.append(f"no generation yet: made {g.name} on the built-in tiny base to pin the suite against "
                          "(to use your own model, `ledger import-base` and `ledger seal --base BASE` instead)")
    res = seallib.seal(s, Path(suite_dir), base=base, repin=repin, reason=reason)
    return Sealed(result=res, warnings=take_warnings(s))


def seal_restore(*, store: StoreLike = None) -> Restored:
    """Rewrite the pinned suite's sealed copy from its objects."""
    s = open_store(store)
    path = seallib.restore(s)
    warn = take_warnings(s)
    return Restored(seallib.require_pinned(s), str(path), warnings=warn)


def write_demo_suite(directory: str | os.PathLike) -> Path:
    """Write the built-in task's small suite (10 scored + 4 canary documents) to seal."""
    return seallib.write_demo_suite(Path(directory))


@dataclass(frozen=True)
class Judged(Result):
    """The verdict (ledger.verdicts' Verdict in `verdict`), its stored body and ids."""

    verdict: Any
    verdict_id: str
    record: Mapping
    body: Mapping       # the verdict object as stored (what `ledger show VERDICT` renders)

    def to_json(self):
        out = self.verdict.to_json()
        out.pop("sealed")  # per-document losses stay in the verdict object: `ledger cat VERDICT`
        return {**out, "verdict_id": self.verdict_id, "record": self.record["id"],
                "learner_view_id": records.read(self.record).learner_view}


def judge(candidate: str, *, against: str | None = None, export: str | None = None,
          progress: Callable[[str], None] | None = None, store: StoreLike = None) -> Judged:
    """Score candidate and incumbent (default HEAD) on the sealed suite and record the verdict
    (one `judge` record). Every verdict reached is returned, refusals included (the verdict is
    data); a spent suite budget is Refused (exit 3)."""
    s = open_store(store)
    v, vid, rec = judgelib.judge(s, candidate, against, export_dataset=export, progress=progress)
    return Judged(v, vid, rec, s.get_json(vid), warnings=take_warnings(s))


@dataclass(frozen=True)
class DpoTrained(Wrapped):
    """ledger.train.dpo's DpoResult in `result`. failure(): Refused when it stopped early."""

    def failure(self):
        r = self.result
        st = r.receipt["stopped"]
        if not st:
            return None
        return Refused(f"DPO stopped: {st['reason']} at step {st['step']}; receipt {r.receipt_id} has no adapter",
                       "lower --lr or --beta and retry")


def dpo(pairs: str, *, sft: str, beta: float = 0.1, lr: float = 1e-4, steps: int = 50, batch: int = 8, seed: int = 0,
        threads: int = 1, unsandboxed: bool = False, progress=None, store: StoreLike = None) -> DpoTrained:
    """Train a DPO adapter on preference pairs (a .jsonl or .parquet file, or a stored Parquet
    object) on top of the SFT adapter `sft` in a sandboxed child (one `train` record)."""
    cfg = dpolib.DpoConfig(beta=beta, lr=lr, steps=steps, batch=batch, seed=seed, threads=threads)
    s = open_store(store)
    res = dpolib.train_dpo(s, pairs, sft, config=cfg, unsandboxed=unsandboxed, progress=progress)
    return DpoTrained(result=res, warnings=take_warnings(s))


@dataclass(frozen=True)
class Reported(Result):
    """What `ledger report` wrote: the file, its size and what it covers."""
    info: Mapping      # path, bytes, generations, cycles, gate_runs, receipts, rollbacks

    def to_json(self):
        return self.info


def report(output: str | os.PathLike = "report.html", *, store: StoreLike = None) -> Reported:
    """Write the store's history as one self-contained HTML file (offline: no script, no network)."""
    s = open_store(store)
    info = reportlib.write(s, Path(output))
    return Reported(info, warnings=take_warnings(s))


def report_html(*, store: StoreLike = None) -> tuple[str, tuple[str, ...]]:
    """The report page as text (for `-o -`), and the store's warnings."""
    s = open_store(store)
    html = reportlib.render(reportlib.gather(s))
    return html, take_warnings(s)
