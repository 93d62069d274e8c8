"""Suite hash: canonical, order-independent, sensitive to everything it covers."""

import random

import pytest

from ledger.errors import BadInput
from ledger.verdicts.suite_hash import content_hash, suite_hash, suite_hash_payload

S = {"s1": "b3:11", "s2": "b3:22"}
K = {"k1": "b3:33"}
IDS = dict(scorer_version="scorer/1", tokenizer_id="b3:tok", template_id="b3:tpl", base_weights_id="b3:base")

# Pinned by hand: BLAKE3 of exactly these canonical bytes (sorted keys, no spaces, pairs sorted).
CANONICAL = (b'{"base_weights_id":"b3:base","canaries":[["k1","b3:33"]],'
             b'"format":"ledger.suite-hash/2","scored":[["s1","b3:11"],["s2","b3:22"]],'
             b'"scorer_version":"scorer/1","template_id":"b3:tpl","tokenizer_id":"b3:tok"}')
GOLDEN = "b3:3540ea3bace1199f6ea40068c1661c681d3c83583e1e455ea72bfad8e4ee224d"


def test_golden_value_and_canonical_form():
    import blake3
    assert "b3:" + blake3.blake3(CANONICAL).hexdigest() == GOLDEN
    assert suite_hash(S, K, **IDS) == GOLDEN


def test_content_hash_is_blake3_of_utf8():
    # BLAKE3("hello"), the reference test value
    assert content_hash("hello") == "b3:ea8f163db38682925e4491c5e58d4bb3506ef8c14eb78a86e908c5624a67200f"
    assert content_hash("é") != content_hash("e")


def test_order_independent():
    pairs_s = list(S.items())
    for seed in range(5):
        random.Random(seed).shuffle(pairs_s)
        assert suite_hash(pairs_s, list(K.items()), **IDS) == GOLDEN
        assert suite_hash(dict(reversed(pairs_s)), K, **IDS) == GOLDEN


@pytest.mark.parametrize("change", [
    lambda: suite_hash({**S, "s2": "b3:23"}, K, **IDS),  # a document's content
    lambda: suite_hash({**S, "s3": "b3:44"}, K, **IDS),  # one more scored document
    lambda: suite_hash({"s1": "b3:11"}, {**K, "s2": "b3:22"}, **IDS),  # S -> K move
    lambda: suite_hash(S, {}, **IDS),  # canary removed
    lambda: suite_hash(S, K, **{**IDS, "scorer_version": "scorer/2"}),
    lambda: suite_hash(S, K, **{**IDS, "tokenizer_id": "b3:tok2"}),
    lambda: suite_hash(S, K, **{**IDS, "template_id": "b3:tpl2"}),  # the chat template, named directly
    lambda: suite_hash(S, K, **{**IDS, "base_weights_id": "b3:base2"}),
    lambda: suite_hash({"s1 ": "b3:11", "s2": "b3:22"}, K, **IDS),  # doc id spelling
])
def test_any_covered_change_changes_the_hash(change):
    h = change()
    assert h.startswith("b3:") and len(h) == 3 + 64
    assert h != GOLDEN


def test_payload_is_sorted_pairs():
    p = suite_hash_payload({"b": "h2", "a": "h1"}, [], **IDS)
    assert p["scored"] == [["a", "h1"], ["b", "h2"]] and p["canaries"] == []


@pytest.mark.parametrize("scored,canaries,ids", [
    ([("s1", "h"), ("s1", "h2")], {}, IDS),  # duplicate id
    ({"s1": "h"}, {"s1": "h"}, IDS),  # both scored and canary
    ({}, K, IDS),  # no scored documents
    ({"": "h"}, {}, IDS),
    ({"s1": ""}, {}, IDS),
    ({"s1": 5}, {}, IDS),
    ([("s1",)], {}, IDS),
    (S, K, {**IDS, "tokenizer_id": ""}),
    (S, K, {**IDS, "scorer_version": None}),
])
def test_bad_input(scored, canaries, ids):
    with pytest.raises(BadInput):
        suite_hash(scored, canaries, **ids)


def test_canonical_json_agrees_with_the_store():
    # verdicts keeps its own encoder (no dependency on the store), so pin that both agree.
    store_canonical = pytest.importorskip("ledger.store.canonical")
    from ledger.verdicts.suite_hash import canonical_json
    samples = [suite_hash_payload(S, K, **IDS), {"é": [1, 2.5, None, True], "a": {"z": -0.0}},
               {"x": 1e-17, "y": 123456789.123456789, "u": "\u2028 \U0001f600"}]
    for obj in samples:
        assert canonical_json(obj) == store_canonical.dumps(obj)
