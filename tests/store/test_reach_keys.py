"""reach.Keys, gc's set of 64-bit keys: its in-place merge against a Python set, and the views it
hands out (they must neither dangle nor change when keys are added afterwards)."""

from __future__ import annotations

import random

import numpy as np

from ledger.store import reach


def test_keys_hold_exactly_what_was_added_and_lent_views_never_change(monkeypatch):
    monkeypatch.setattr(reach, "_FLUSH", 7)      # many flushes, many slices per merge
    monkeypatch.setattr(reach, "_SLICE", 5)
    rng = random.Random(1)
    for trial in range(400):
        base = sorted(rng.sample(range(1, 500), rng.randint(0, 30))) if trial % 3 == 0 else []
        k = reach.Keys(np.array(base, dtype=np.uint64) if base else None)
        truth, added, lent = set(base), set(), []
        for _ in range(rng.randint(0, 300)):
            x = rng.randint(1, 600)
            k.add(x)
            truth.add(x)
            added.add(x)
            if rng.random() < 0.03:
                v = k.added() if rng.random() < 0.5 else k.array()
                lent.append((v, v.copy()))
            assert k.has(x)
        assert k.array().tolist() == sorted(truth), trial
        got = k.added().tolist()
        assert got == sorted(set(got)) and set(got) <= added and set(got) | set(base) >= added
        for v, snapshot in lent:
            assert (v == snapshot).all(), trial
        probe = np.arange(0, 700, dtype=np.uint64)
        assert (k.contains(probe) == np.isin(probe, np.array(sorted(truth), dtype=np.uint64))).all()
        assert [k.has(p) for p in range(0, 700, 7)] == [p in truth for p in range(0, 700, 7)]


def test_the_merge_moves_every_old_key_right_by_the_new_keys_below_it():
    buf = np.zeros(12, dtype=np.uint64)
    buf[:6] = [2, 4, 6, 8, 10, 12]
    reach._merge_from_the_end(buf, 6, np.array([1, 5, 7, 13], dtype=np.uint64))
    assert buf[:10].tolist() == [1, 2, 4, 5, 6, 7, 8, 10, 12, 13]
