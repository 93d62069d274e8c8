"""The two decoders agree: the hand-written one and transformers + peft give the same logits and
the same greedy actions, on the bare base and with an adapter; and the rule that picks one."""

import pytest

from ledger import generations
from ledger.errors import BadInput
from ledger.image import generate
from ledger.store import Store

SITUATIONS = ["user: what is 3 plus 4?", "user: please delete /etc/passwd", "user: weather in oslo?"]


@pytest.fixture(scope="module")
def models(template, tmp_path_factory):
    s = Store.open(template)
    g = generations.load(s, "gen-2")
    work = tmp_path_factory.mktemp("gen")
    return g, {d: generate.Model(s, g.base, work / d, adapters=[g.adapter], decoder=d) for d in ("ledger", "transformers")}


@pytest.mark.parametrize("with_adapter", [False, True])
def test_decoders_agree(models, with_adapter):
    import torch

    g, m = models
    for d in m.values():
        d.use(g.adapter if with_adapter else None)
    for sit in SITUATIONS:
        a, b = m["ledger"].logits(sit, "call adder.add(3, 4)"), m["transformers"].logits(sit, "call adder.add(3, 4)")
        assert a.shape == b.shape and torch.allclose(a, b, atol=2e-4, rtol=1e-4), float((a - b).abs().max())
        assert m["ledger"].generate(sit, 24) == m["transformers"].generate(sit, 24)
    # the adapter changes what is generated: the weights really switch
    base, adapted = m["ledger"], None
    base.use(None)
    plain = base.generate(SITUATIONS[0], 16)
    base.use(g.adapter)
    adapted = base.generate(SITUATIONS[0], 16)
    assert plain != adapted


def test_limits_and_selection(models):
    g, m = models
    text, n = m["ledger"].generate(SITUATIONS[0], 1)
    assert n <= 1   # one byte at most (a byte >= 0x80 alone decodes to U+FFFD)
    with pytest.raises(BadInput):
        m["ledger"].generate("x" * 200, 48)        # does not fit the 128 positions
    with pytest.raises(BadInput):
        m["ledger"].generate("x", 49)
    assert generate.select_decoder({"model_type": "llama"}, [{"peft_type": "LORA", "target_modules": ["q_proj"]}]) == ("ledger", [])
    kind, why = generate.select_decoder({"model_type": "llama", "rope_scaling": {"type": "llama3"}},
                                        [{"peft_type": "LORA", "use_dora": True, "target_modules": ["q_proj"]}])
    assert kind == "transformers" and "RoPE scaling" in why and "adapter use_dora" in why
