from ledger.artefacts import tokenizer as tk
from ledger.artefacts.builtin_task import SPLITS, turns
from ledger.verdicts.contamination import fold_tokens


def test_deterministic_and_seeded():
    assert turns("train", 50, 1) == turns("train", 50, 1)
    assert turns("train", 50, 1) != turns("train", 50, 2)
    assert turns("eval", 5, 0)[:5] == turns("eval", 10, 0)[:5]


def test_turn_fields_and_lengths():
    tok = tk.ByteTokenizer()
    for split in SPLITS:
        ts = turns(split, 500, 0)
        assert any(t.refusal for t in ts) and any(not t.refusal for t in ts)
        for t in ts:
            assert t.refusal == t.action.startswith("refuse:")
            assert t.action.startswith(("call ", "refuse: "))
            assert len(tk.encode_turn(tok, t.situation, t.action).ids) <= 96


def _grams(text, n=13):
    toks = fold_tokens(text)
    return {tuple(toks[i:i + n]) for i in range(len(toks) - n + 1)}


def test_splits_are_disjoint_by_construction():
    rows = {s: turns(s, 2000, 0) for s in SPLITS}
    text = {s: {(t.situation, t.action) for t in rows[s]} for s in SPLITS}
    assert not text["train"] & text["eval"] and not text["train"] & text["canary"] and not text["eval"] & text["canary"]
    # The gate's contamination check (13-grams of folded text) must never fire on honest
    # training data: no training turn shares one with an eval or canary turn.
    train_grams = set().union(*(_grams(f"{t.situation} {t.action} {t.outcome}") for t in rows["train"]))
    for s in ("eval", "canary"):
        for t in rows[s]:
            assert not _grams(f"{t.situation} {t.action} {t.outcome}") & train_grams
