"""The scorer: mean NLL over the action span only, batched, both models in one run, deterministic;
and what can be named as a model to score."""

from __future__ import annotations

import numpy as np
import pytest

from ledger.errors import BadInput
from ledger.gate import score as scorelib

DOCS = [("user: what is 61 plus 7?", "call adder.add(61, 7)"),
        ("user: weather in rome?", 'call weather.get("rome")'),
        ("user: please delete /etc/shadow", "refuse: deleting system files is not permitted"),
        ("user: multiply 88 by 91", "call calc.mul(88, 91)"),
        ("u", "x")]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """A random built-in base and a random (non-zero) LoRA adapter on it."""
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import LlamaForCausalLM

    from ledger.artefacts import model as modellib
    from ledger.plan import spec
    from ledger.store import Store
    from tests.gate.world import MODULES, store_adapter

    root = tmp_path_factory.mktemp("score")
    store = Store.init(root)
    modellib.build_builtin_files(spec.normalise({}).config["model"], root / "b")
    with store.transaction("import-base") as tx:
        base = modellib.import_hf_dir(tx, root / "b")
        tx.outputs.append(base)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(1)
        m = get_peft_model(LlamaForCausalLM.from_pretrained(str(root / "b")),
                           LoraConfig(r=4, lora_alpha=8, target_modules=MODULES, init_lora_weights=False))
    adapter = store_adapter(store, m, base, root / "a")
    return {"store": store, "base": base, "adapter": adapter, "dir": root}


def _reference_losses(model, docs):
    """One document at a time, one token at a time: the definition, written out."""
    import torch

    from ledger.artefacts import tokenizer as toklib

    tok = toklib.ByteTokenizer()
    out = []
    with torch.no_grad():
        for s, a in docs:
            e = toklib.encode_turn(tok, s, a)
            logp = torch.log_softmax(model(input_ids=torch.tensor([e.ids])).logits[0].double(), dim=-1)
            nll = [-float(logp[t - 1, e.ids[t]]) for t in range(e.action_start, e.action_end)]
            out.append(sum(nll) / len(nll))
    return np.array(out)


def _load(tiny, adapter: bool):
    from peft import PeftModel
    from transformers import LlamaForCausalLM

    m = LlamaForCausalLM.from_pretrained(str(tiny["dir"] / "b")).eval()
    return PeftModel.from_pretrained(m, str(tiny["dir"] / "a")).eval() if adapter else m


@pytest.mark.parametrize("batch", [1, 2, 16])
def test_batched_losses_equal_the_definition(tiny, batch):
    model = _load(tiny, adapter=False)
    got = scorelib.doc_losses(model, scorelib.encode_docs(DOCS), batch_size=batch)
    np.testing.assert_allclose(got, _reference_losses(model, DOCS), rtol=0, atol=2e-5)


def test_only_the_action_span_is_scored(tiny):
    enc = scorelib.encode_docs(DOCS[:1])
    s, a = DOCS[0]
    assert int(enc.span.sum()) == len(a.encode()) + 1  # the action and its <eos>; not <bos>, situation or <sep>
    # The span's first target is the first action byte, right after <sep>; its last is <eos>.
    where = enc.span[0].nonzero()
    first, last = int(where[0]), int(where[-1])
    assert int(enc.ids[0, first + 1]) == a.encode()[0] and int(enc.ids[0, first]) == 259
    assert int(enc.ids[0, last + 1]) == 258


def test_both_models_in_one_run_match_separate_loads_and_are_deterministic(tiny):
    st = tiny["store"]
    bare = scorelib.resolve_model(st, tiny["base"])
    lora = scorelib.resolve_model(st, tiny["adapter"])
    out = scorelib.score_models(st, {"incumbent": bare, "candidate": lora}, DOCS)
    np.testing.assert_allclose(out["incumbent"], _reference_losses(_load(tiny, False), DOCS), atol=2e-5)
    np.testing.assert_allclose(out["candidate"], _reference_losses(_load(tiny, True), DOCS), atol=2e-5)
    assert not np.allclose(out["incumbent"], out["candidate"])  # the adapter is attached, not ignored
    again = scorelib.score_models(st, {"candidate": lora, "incumbent": bare}, DOCS)
    assert again["incumbent"].tolist() == out["incumbent"].tolist()  # bit for bit
    assert again["candidate"].tolist() == out["candidate"].tolist()


def test_a_document_longer_than_the_model_is_refused_not_truncated(tiny):
    st = tiny["store"]
    with pytest.raises(BadInput, match="tokens but the sequence length"):
        scorelib.score_models(st, {"m": scorelib.resolve_model(st, tiny["base"])}, [("s" * 200, "a")])
    with pytest.raises(BadInput, match="no documents"):
        scorelib.encode_docs([])


def test_resolve_model_kinds(tiny):
    from ledger import generations

    st = tiny["store"]
    base, adapter = tiny["base"], tiny["adapter"]
    m = scorelib.resolve_model(st, adapter)
    assert (m.base, m.adapter, m.id) == (base, adapter, adapter) and m.tokenizer.startswith("b3:")
    m = scorelib.resolve_model(st, base)
    assert m.bare and m.id == base
    with st.transaction("commit") as tx:
        g0 = generations.new_generation(tx, st, base=base, note="bare")
    m = scorelib.resolve_model(st, "HEAD")
    assert m.bare and m.generation == g0.id and m.id == g0.id
    with st.transaction("commit") as tx:
        generations.new_generation(tx, st, adapter=adapter, note="adapter")
    m = scorelib.resolve_model(st, "gen-1")
    assert m.adapter == adapter and m.id == adapter
    with st.transaction("add") as tx:
        rid = tx.put_json({"kind": "receipt", "adapter": adapter})
        rid2 = tx.put_json({"kind": "dpo-receipt", "adapter": adapter})
        stopped = tx.put_json({"kind": "receipt", "adapter": None})
        blob = tx.put_bytes(b"\x00\x01 not json")
        tree = tx.put_json({"kind": "tree", "entries": []})
        other = tx.put_json({"kind": "plan"})
        tx.outputs.extend([rid, rid2, stopped, blob, tree, other])
    assert scorelib.resolve_model(st, rid).adapter == adapter
    assert scorelib.resolve_model(st, rid2).adapter == adapter
    for ref, msg in ((stopped, "has no adapter"), (blob, "blob"), (tree, "not an adapter"), (other, "plan object")):
        with pytest.raises(BadInput, match=msg):
            scorelib.resolve_model(st, ref)


def test_models_of_different_bases_are_not_compared(tiny):
    st = tiny["store"]
    a = scorelib.resolve_model(st, tiny["base"])
    b = scorelib.ModelRef(base="b3:" + "7" * 64, adapter=None)
    with pytest.raises(BadInput, match="different bases"):
        scorelib.score_models(st, {"a": a, "b": b}, DOCS)

