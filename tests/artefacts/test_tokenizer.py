import pytest

from ledger.errors import BadInput
from ledger.artefacts import tokenizer as tk
from ledger.store import canonical
from ledger.store.ids import hash_bytes


def test_identity_is_hash_of_definition():
    t = tk.ByteTokenizer()
    assert t.id == hash_bytes(canonical.dumps(t.definition()))
    assert tk.from_definition(t.definition()) == t
    with pytest.raises(BadInput):
        tk.from_definition({**t.definition(), "vocab_size": 300})


def test_action_span_is_exactly_the_action_bytes():
    t = tk.ByteTokenizer()
    e = tk.encode_turn(t, "user: hi é", "call a.b(1, 2)")
    assert e.ids[0] == tk.BOS and e.ids[-1] == tk.EOS and tk.SEP in e.ids
    assert t.decode(e.ids[e.action_start:e.action_end]) == "call a.b(1, 2)"
    labels = e.labels()
    assert [x for x in labels if x != tk.IGNORE] == list(e.ids[e.action_start:e.action_end])
    with pytest.raises(BadInput):
        tk.encode_turn(t, "x" * 100, "y", max_len=96)
