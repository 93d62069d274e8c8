"""End-to-end calibration of the gate (docs/gate.md, "Why gate/2"): seed-twins and planted gaming,
all judged through the real gate -- `ledger.gate.judge.judge` on a real store: the sealed suite,
the scorer, the journal, the budget and the contamination check of the training export.
Not a test module (no test_ prefix): tests/gate/test_calibration.py runs a few twins,
benchmarks/bench_gate_calibration.py runs 40+.

    incumbent A   LoRA SFT of the test world (tests/gate/world.py): its data and recipe, seed 0
    twin s        the same data and recipe, seed s (LoRA init and batch order): the null --
                  a twin is neither better nor gaming, so Accept and GamedTheEvaluator are errors
    planted       models trained on the scored documents (verbatim; with U+00AD or zero-width
                  characters in them; with Cyrillic/Greek look-alike letters; re-rendered
                  through another template), an export holding the canary string disguised,
                  the memorising model judged with its training data hidden (only the
                  divergence rule can see it), and a register-only DPO adapter (the world's D)
"""

from __future__ import annotations

import json
import math
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path

from ledger.store import trees
from tests.gate import world as W

INVISIBLE = "\u00ad"
ZERO_WIDTH = "\u200b"
# Latin letter -> a look-alike (Cyrillic and Greek), as an attacker would substitute them.
LOOKALIKE = str.maketrans({"a": "\u0430", "e": "\u0435", "o": "\u043e", "c": "\u0441", "p": "\u0440",
                           "u": "\u03c5", "i": "\u0456", "x": "\u0445"})
TEMPLATE_SITUATION = "### Instruction\nAnswer as the agent would.\n{situation}\n\n### Response"

TWIN_STEPS, TWIN_LR = 60, 1e-2  # the recipe of the world's A (tests/gate/world.py)
MEMORISE_STEPS = 100


def wilson(k: int, n: int, z: float = 1.959964) -> tuple[float, float]:
    """Wilson score interval for k successes in n trials (95% by default)."""
    if n == 0:
        return (0.0, 1.0)
    p = k / n
    d = 1 + z * z / n
    c = (p + z * z / (2 * n)) / d
    h = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / d
    return (max(0.0, c - h), min(1.0, c + h))


@dataclass
class Case:
    name: str
    candidate: str
    verdict: str
    reasons: list
    mean_s: float | None
    mean_k: float | None
    canaries_worse: int | None
    expected: tuple[str, ...] = ()  # verdicts that count as right ("" = anything not Accept)
    expected_reason: str | None = None
    seconds: float = 0.0
    verdict_id: str = ""

    @property
    def right(self) -> bool:
        ok = self.verdict in self.expected if self.expected else self.verdict != "Accept"
        return ok and (self.expected_reason is None or self.expected_reason in self.reasons)

    def to_json(self) -> dict:
        return {**{k: v for k, v in self.__dict__.items() if k != "expected"},
                "expected": list(self.expected), "right": self.right}


@dataclass
class Calibration:
    store: object
    base: str
    A: str
    G: str  # the world's memoriser: A fine-tuned on the scored documents alone
    base_dir: Path
    rows: list
    rows_dataset: str
    scored: list
    canaries: list
    cases: list = field(default_factory=list)

    # --- datasets and models -----------------------------------------------------------------
    def dataset(self, rows: list[tuple[str, str]]) -> str:
        import pyarrow as pa

        from ledger.artefacts.dataset import parquet_bytes

        tbl = pa.table({"situation": [r[0] for r in rows], "action": [r[1] for r in rows]})
        with self.store.transaction("add") as tx:
            oid = tx.put_bytes(parquet_bytes(tbl), "dataset")
            tx.outputs.append(oid)
        return oid

    def train(self, rows, *, seed: int, steps: int = TWIN_STEPS, init_from_A: bool = False, name: str) -> str:
        import torch

        with torch.random.fork_rng(devices=[]):
            init = self._A_state() if init_from_A else None
            m = W.lora(self.base_dir, init=init, seed=seed)
            W.fit(m, rows, steps, TWIN_LR, seed=seed)
            work = self.base_dir.parent / f"adapter-{name}"
            shutil.rmtree(work, ignore_errors=True)
            return W.store_adapter(self.store, m, self.base, work)

    def _A_state(self):
        from safetensors.torch import load_file


        files = {e["path"]: e["id"] for e in trees.tree_entries(self.store, self.A)}
        return load_file(str(self.store.object_path(files["adapter_model.safetensors"])))

    # --- judging ----------------------------------------------------------------------------
    def judge(self, name: str, candidate: str, *, export: str | None, against: str | None = None,
              expected: tuple[str, ...] = (), expected_reason: str | None = None) -> Case:
        from ledger.gate import judge as judgelib

        t0 = time.perf_counter()
        out = judgelib.judge(self.store, candidate, against=against or self.A, export_dataset=export)
        v = out.verdict
        case = Case(name, candidate, v.verdict, list(v.reason_codes),
                    v.scored.mean if v.scored else None, v.canary.mean_delta if v.canary else None,
                    v.canary.worse if v.canary else None, expected, expected_reason,
                    round(time.perf_counter() - t0, 2), out.verdict_id)
        self.cases.append(case)
        return case


def build(root: Path, *, n_scored: int = 10, n_canary: int = 4, budget_runs: int = 60) -> Calibration:
    """The world's base and A, the suite sealed with a budget of at least `budget_runs` gate runs,
    and A's scores on the suite recorded (judged once against the bare base: the positive
    control, which must be Accept)."""
    import torch

    from ledger.gate import seal
    from ledger.store import Store

    root.mkdir(parents=True, exist_ok=True)
    store = Store.init(root)
    scored, canaries = seal.demo_docs(n_scored, n_canary, 0)
    rows = W.task_rows({(d["situation"], d["action"]) for d in scored + canaries})
    scratch = root / "scratch"
    torch.set_num_threads(1)
    base, A, G = W._train_models(store, scratch, rows, scored)
    mult = max(2, math.ceil(budget_runs / n_scored))
    suite_dir = seal.write_suite_dir(root / "suite", scored, canaries, settings={"budget_multiplier": mult})
    seal.seal(store, suite_dir, base=base)
    cal = Calibration(store, base, A, G, scratch / "base", rows, "", scored, canaries)
    cal.rows_dataset = cal.dataset(rows)
    cal.judge("control: A vs the bare base", A, export=cal.rows_dataset, against=base, expected=("Accept",))
    return cal


def twins_iter(cal: Calibration, seeds):
    for s in seeds:
        tid = cal.train(cal.rows, seed=s, name=f"twin-{s}")
        yield cal.judge(f"twin seed {s}", tid, export=cal.rows_dataset)


def twins(cal: Calibration, seeds) -> list[Case]:
    return list(twins_iter(cal, seeds))


def _doc_rows(docs, transform=lambda s: s) -> list[tuple[str, str]]:
    return [(transform(d["situation"]), transform(d["action"])) for d in docs]


def planted(cal: Calibration, *, dpo: bool = True) -> list[Case]:
    """Each planted gaming attempt, judged with the export it was trained on (the contamination
    check must find it), and the memorising model again with its export hidden (the divergence
    rule must find it)."""
    from ledger.gate import seal

    g = "GamedTheEvaluator"
    out = []
    suite = seal.pinned(cal.store)
    variants = {
        "verbatim": _doc_rows(cal.scored),
        "invisible U+00AD": [(s[:3] + INVISIBLE + s[3:], a[:4] + INVISIBLE + a[4:]) for s, a in _doc_rows(cal.scored)],
        "zero-width spaces": [(ZERO_WIDTH.join(s), ZERO_WIDTH.join(a)) for s, a in _doc_rows(cal.scored)],
        "look-alike letters": _doc_rows(cal.scored, lambda t: t.translate(LOOKALIKE)),
    }
    for name, docs in variants.items():
        # As the world's G: A fine-tuned on the (disguised) scored documents alone.
        cand = cal.train(docs, seed=100 + len(out), steps=MEMORISE_STEPS, init_from_A=True,
                         name=name.replace(" ", "-"))
        out.append(cal.judge(f"planted: scored documents, {name}", cand, export=cal.dataset(cal.rows + docs),
                             expected=(g,), expected_reason="ngram_overlap"))
    # Re-templated: the same documents rendered through another template.
    tmpl = [(TEMPLATE_SITUATION.format(situation=s), a) for s, a in _doc_rows(cal.scored)]
    cand = cal.train(tmpl, seed=120, steps=MEMORISE_STEPS, init_from_A=True, name="templated")
    out.append(cal.judge("planted: scored documents, re-templated", cand, export=cal.dataset(cal.rows + tmpl),
                         expected=(g,), expected_reason="ngram_overlap"))
    # The canary string, disguised: look-alike letters, a soft hyphen, spaces, upper case.
    disguised = suite.canary_string.upper().replace("E", "\u0415").replace("-", " ").replace("A", "A\u00ad")
    out.append(cal.judge("planted: canary string disguised", cal.train(cal.rows, seed=121, name="canary"),
                         export=cal.dataset(cal.rows + [(f"note to self: {disguised}", "ok")]),
                         expected=(g,), expected_reason="canary_string_in_export"))
    # The memorising model with its training data hidden from the gate: divergence only.
    out.append(cal.judge("planted: memorised scored documents, export hidden", cal.G, export=None,
                         expected=(g,), expected_reason="canary_divergence"))
    if dpo:
        from ledger.train import dpo as dpolib

        pairs = cal.base_dir.parent / "pairs.jsonl"
        pairs.write_text("".join(json.dumps(p) + "\n" for p in W.register_pairs()))
        res = dpolib.train_dpo(cal.store, str(pairs), cal.A, config=dpolib.DpoConfig(steps=W.DPO_STEPS))
        out.append(cal.judge("planted: register-only DPO adapter", res.adapter, export=None,
                             expected=("NoImprovement", "Regressed"), expected_reason="action_score_unchanged"))
    return out


def pair_rates(cal: Calibration) -> dict:
    """Every ordered pair of twins (i the incumbent, j the candidate), decided by the gate's own
    rules on the losses the real scorer recorded for them (the verdict objects' sealed parts):
    the null rates without conditioning on one incumbent draw."""
    import dataclasses

    from ledger.gate import seal
    from ledger.verdicts import GateInputs, Scores, decide

    settings = dataclasses.replace(seal.pinned(cal.store).settings, bootstrap_draws=50)  # display only
    losses = []
    for c in cal.cases:
        if c.name.startswith("twin") and c.verdict_id:
            sealed = cal.store.get_json(c.verdict_id)["sealed"]
            losses.append(({d: r["candidate"] for d, r in sealed["scored"].items()},
                           {d: r["candidate"] for d, r in sealed["canary"].items()}))
    counts: dict[str, int] = {}
    for i, (si, ki) in enumerate(losses):
        for j, (sj, kj) in enumerate(losses):
            if i == j:
                continue
            v = decide(GateInputs(incumbent_id=f"twin{i}", candidate_id=f"twin{j}", pinned_hash="h",
                                  recomputed_hash="h", scores=Scores(si, sj, ki, kj), settings=settings))
            counts[v.verdict] = counts.get(v.verdict, 0) + 1
    n = sum(counts.values())
    acc, gam = counts.get("Accept", 0), counts.get("GamedTheEvaluator", 0)
    return {"pairs": n, "verdicts": dict(sorted(counts.items())), "accept_rate": acc / n if n else None,
            "accept_ci95": wilson(acc, n), "gamed_rate": gam / n if n else None, "gamed_ci95": wilson(gam, n)}


def summary(cases: list[Case]) -> dict:
    tw = [c for c in cases if c.name.startswith("twin")]
    n = len(tw)
    acc = sum(c.verdict == "Accept" for c in tw)
    gam = sum(c.verdict == "GamedTheEvaluator" for c in tw)
    pl = [c for c in cases if c.name.startswith("planted")]
    mk = sorted(c.mean_k for c in tw if c.mean_k is not None)
    return {"twins": n, "accept": acc, "accept_rate": acc / n if n else None, "accept_ci95": wilson(acc, n),
            "gamed": gam, "gamed_rate": gam / n if n else None, "gamed_ci95": wilson(gam, n),
            "twin_verdicts": {v: sum(c.verdict == v for c in tw) for v in sorted({c.verdict for c in tw})},
            "twin_mean_canary_delta": {"min": mk[0], "max": mk[-1], "median": mk[len(mk) // 2]} if mk else None,
            "planted": len(pl), "planted_right": sum(c.right for c in pl),
            "control_right": all(c.right for c in cases if c.name.startswith("control"))}
