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


def _oid(i: int) -> str:
    return f"b3:{i:016x}" + "0" * 48


def test_the_policy_closure_held_as_what_it_drops_is_the_closure_of_what_records_name(monkeypatch):
    """Walk keeps the retention policy's closure as the keys it leaves out of rule 9's (dropped,
    minus those a later record revived). Against a Python reference on random object graphs and
    record sequences: rule 9's closure of every id, the policy's closure of the named ids over
    the kept edges, and the same answer when the walk stops and resumes from its saved arrays."""
    monkeypatch.setattr(reach, "_FLUSH", 5)
    rng = random.Random(7)
    for trial in range(150):
        n = rng.randint(1, 60)
        nodes = {}
        for i in range(n):
            kids = {_oid(j) for j in range(i + 1, n) if rng.random() < 0.08}
            cut = rng.random() < 0.2             # a checkpoint or receipt: some edges not kept
            kept = {c for c in kids if not cut or rng.random() < 0.5}
            nodes[_oid(i)] = reach.Node(kids, kept, special=cut)
        records = []
        for _ in range(rng.randint(1, 12)):
            every = {_oid(rng.randrange(n)) for _ in range(rng.randint(0, 4))}
            named = {o for o in every if rng.random() < 0.6}
            records.append((every, named))

        def closure(roots, edge):
            seen, stack = set(), list(roots)
            while stack:
                o = stack.pop()
                if o not in seen:
                    seen.add(o)
                    stack.extend(edge(nodes[o]))
            return seen

        reached = closure(set().union(*(e for e, _ in records)), lambda nd: nd.children)
        kept = closure(set().union(*(m for _, m in records)), lambda nd: nd.kept_children)
        cut_at = rng.randint(0, len(records))
        w = reach.Walk(None)
        for every, named in records[:cut_at]:
            w._grow(every, named, dict(nodes))
        if rng.random() < 0.5:                  # resume from the saved arrays, as gc's next run does
            r, nk, inputs = w.result()
            w = reach.Walk(None, r, nk, inputs, (), w.special)
        for every, named in records[cut_at:]:
            w._grow(every, named, dict(nodes))
        r, nk, _ = w.result()
        assert sorted(r.tolist()) == sorted(reach.key(o) for o in reached), trial
        assert sorted(nk.tolist()) == sorted(reach.key(o) for o in reached - kept), trial
        assert {o for o in nodes if w.is_kept(o)} == kept, trial
        assert w.special == {o for o in kept if nodes[o].special}, trial


def test_ids_read_off_a_turn_batch_line_are_the_ids_the_payload_walk_finds():
    """gc reads a record's ids off its line when the line has its kind's usual shape
    (reach.shaped_ids); the answer MUST be record_ids', and any other line is left to it."""
    from ledger.store import canonical, journal

    rng = random.Random(3)
    ids = [_oid(rng.getrandbits(64)) for _ in range(6)]
    matched = 0
    for trial in range(400):
        batch, turns = rng.choice(ids), rng.choice(ids)
        payload = {"count": rng.randint(0, 9), "counters": {"turns": rng.randint(0, 9)},
                   "first": rng.randint(1, 99), "objects": [[batch, rng.randint(0, 999), "turns"]], "turns": turns}
        if trial % 4 == 1:
            payload["requests"] = [rng.choice(ids)]                  # not the usual shape: an id more
        if trial % 4 == 2:
            payload["objects"].append([rng.choice(ids), 1, "turns"])  # not the usual shape: two entries
        inputs = rng.sample(ids, rng.randint(0, 2))
        outputs = rng.sample(ids, rng.randint(0, 2))
        rec = journal.make_record(trial + 1, None, "record", inputs, outputs, "t@h", payload)
        line = canonical.dumps(rec)
        got = reach.shaped_ids(rec, line)
        if got is None:
            assert trial % 4 in (1, 2), trial
            continue
        matched += 1
        assert got == reach.record_ids(rec), trial
    assert matched >= 150
    other = journal.make_record(1, None, "export", [ids[0]], [ids[1]], "t@h", {"dataset": ids[1]})
    assert reach.shaped_ids(other, canonical.dumps(other)) is None
