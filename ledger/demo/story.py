"""`ledger demo`: the whole learn-cycle story on the built-in tiny model, in a few minutes on a
laptop CPU, with no downloads. It is written as a script a newcomer can read next to its output:
every step calls ledger.api, the same verbs the CLI commands call. How it is drawn is the
caller's (`show`, a Show): `ledger demo` passes the CLI's renderers, `--json` passes none. The
demo sits beside the CLI, above the API (it imports no CLI module).

  1. init a store                     5. a cycle on bad experience → refused (HEAD stays)
  2. seal a suite (10 scored + 4)     6. gens, and diff gen-0 gen-1
  3. record experience (200 turns)    7. rollback, and roll the rollback back
  4. a learn cycle → Accept → gen-1   8. verify --read-data: clean
"""

from __future__ import annotations

import random
import shutil
import time
from pathlib import Path
from typing import Protocol

from ledger import api
from ledger.artefacts.builtin_task import turns
from ledger.errors import BadInput
from ledger.options import LearnOptions

MARKER = ".ledger-demo"
GOOD_TURNS = 200
BAD_TURNS = 160


def _prepare(directory: Path) -> Path:
    directory = Path(directory)
    if directory.exists():
        if (directory / MARKER).exists():
            shutil.rmtree(directory)  # a previous demo's folder: start afresh
        elif any(directory.iterdir()):
            raise BadInput(f"{directory} exists and is not a demo folder", "pass --dir NEW_FOLDER")
    directory.mkdir(parents=True, exist_ok=True)
    (directory / MARKER).write_text("made by `ledger demo`; safe to delete\n")
    return directory


def good_turns(n: int, seed: int) -> list[dict]:
    return [{"situation": t.situation, "action": t.action, "outcome": t.outcome, "refusal": t.refusal}
            for t in turns("train", n, seed)]


def bad_turns(n: int, seed: int) -> list[dict]:
    """Experience gone wrong: each situation recorded with another turn's action (a logging bug
    that misaligned rows). Training on it should make the model worse, and the gate must say so."""
    rows = good_turns(n, seed)
    actions = [r["action"] for r in rows]
    rng = random.Random(seed)
    rng.shuffle(actions)
    return [dict(r, action=a, outcome="", refusal=a.startswith("refuse:")) for r, a in zip(rows, actions)]


class Show(Protocol):
    """What draws the story: chapter headings, lines of text, and the results of three verbs."""

    def chapter(self, n: int, title: str, why: str) -> None: ...
    def say(self, msg: str) -> None: ...
    def cycle(self, res: api.Cycle) -> None: ...
    def gens(self, res: api.Gens) -> None: ...
    def diff(self, res: api.Diff) -> None: ...


class _Quiet:
    def chapter(self, n, title, why): pass
    def say(self, msg): pass
    def cycle(self, res): pass
    def gens(self, res): pass
    def diff(self, res): pass


def run_demo(directory: Path, show: Show | None = None) -> dict:
    t_start = time.perf_counter()
    out = show or _Quiet()
    root = _prepare(directory)
    story: dict = {"dir": str(root)}

    out.chapter(1, "A store", "Every artefact is an immutable BLAKE3-named object; every change is a journal record.")
    store = api.init(root).store
    out.say(f"created {store}")

    out.chapter(2, "Seal the judge", "10 scored and 4 canary documents, disjoint from anything training sees, pinned by hash. "
                "Training runs in a Landlock sandbox that cannot open them.")
    g0 = api.genesis(store=store)
    suite_dir = api.write_demo_suite(root / "suite-source")
    sealed = api.seal(suite_dir, store=store).result
    shutil.rmtree(suite_dir)  # only the sealed copy remains, inside the store
    story["suite_hash"] = sealed.suite.suite_hash
    out.say(f"gen-0 is the bare base model ({g0.base[:15]}…); suite pinned: {sealed.suite.suite_hash[:23]}…")

    out.chapter(
        3, "Record experience", "Turns are (situation, the action verbatim, the outcome as ground truth); refusals are kept."
    )
    rows = good_turns(GOOD_TURNS, seed=1)
    rec = api.record(rows, store=store)
    refusals = sum(r["refusal"] for r in rows)
    out.say(f"recorded {rec.count} turns ({refusals} refusals), e.g.")
    for r in (rows[0], next(r for r in rows if r["refusal"])):
        out.say(f"  [cyan]{r['situation']}[/]  →  [green]{r['action']}[/]")

    def say(stage: str, msg: str) -> None:
        out.say(f"  [bold cyan]{stage:>8}[/] {msg}")

    def cycle():
        res = api.run_cycle(LearnOptions(min_hours=0.0), progress=say, store=store)
        out.cycle(res)
        return res.result

    out.chapter(4, "A learn cycle", "export → compile → train (sandboxed) → judge (sealed) → commit only on Accept.")
    c1 = cycle()
    story["cycle1"] = {"verdict": c1.verdict, "generation": c1.generation, "stages": c1.stages}

    out.chapter(5, "A cycle on bad experience", "160 turns whose actions were misaligned by a logging bug. "
                "The candidate trains on them; the gate must refuse it, and the refusal is kept.")
    api.record(bad_turns(BAD_TURNS, seed=2), store=store)
    c2 = cycle()
    story["cycle2"] = {"verdict": c2.verdict, "reasons": c2.reasons, "generation": c2.generation}

    out.chapter(6, "What changed", "`ledger gens` and `ledger diff gen-0 gen-1`: config, identities, scores, weight change.")
    gens = api.gens(losses=show is not None, store=store)
    story["generations"] = [{"name": r["name"], "verdict": r["verdict"], "head": r["head"]} for r in gens.rows]
    d = api.diff("gen-0", "gen-1", store=store) if len(gens.rows) > 1 else None
    out.gens(gens)
    if d:
        out.diff(d)
    story["diff_fields"] = len(d.body["fields"]) if d else 0

    out.chapter(7, "Roll back, and roll the rollback back", "One journal record moves HEAD; nothing is deleted.")
    r1 = api.rollback(reason="demo: back to the base", store=store)
    out.say(f"HEAD {r1.from_} → {r1.to}")
    r2 = api.rollback(undo=True, reason="demo: undo", store=store)
    out.say(f"HEAD {r2.from_} → {r2.to}")
    story["rollback"] = [r1.to, r2.to]

    out.chapter(8, "Verify", "Every journal link and every object's bytes rehashed.")
    rep = api.verify(read_data=True, store=store).result
    story["verify"] = rep.to_json()["ok"]
    out.say(("[green]clean[/]" if rep.ok else "[red]FAULTS[/]") +
            f": {rep.stats['records']} records, {rep.stats['objects']} objects")
    story["seconds"] = round(time.perf_counter() - t_start, 1)
    out.say(f"\n[bold]done in {story['seconds']} s.[/] Look around: [cyan]ledger --store {root} log[/], "
            f"[cyan]ledger --store {root} gens[/], [cyan]ledger --store {root} show HEAD[/]")
    return story
