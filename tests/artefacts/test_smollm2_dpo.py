"""DPO on a real model: the pairs go through SmolLM2's own tokenizer and chat template (the
receipt pins both), the reference is the SFT policy, and the chosen responses gain."""

import json

import pytest

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1800)]


def test_dpo_on_smollm2_uses_its_tokenizer_and_template(smol_store, tmp_path):
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import LlamaForCausalLM

    from ledger.artefacts.builtin_task import turns
    from ledger.store import trees
    from ledger.train.dpo import DpoConfig, train_dpo

    store, base = smol_store
    man = store.get_json(base)
    d = tmp_path / "base"
    trees.materialise_tree(store, man["files"], d)
    m = get_peft_model(LlamaForCausalLM.from_pretrained(str(d), dtype=torch.float32),
                       LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], task_type="CAUSAL_LM"))
    a = tmp_path / "sft"
    m.save_pretrained(str(a))
    cfg = json.loads((a / "adapter_config.json").read_text())
    (a / "adapter_config.json").write_text(json.dumps({**cfg, "base_model_name_or_path": base}, sort_keys=True))
    with store.transaction("add") as tx:
        sft = tx.put_tree(a)
        tx.outputs.append(sft)
    pairs = tmp_path / "pairs.jsonl"
    pairs.write_text("".join(json.dumps({"situation": t.situation, "chosen": t.action,
                                         "rejected": "I'm sorry, I can't help with that."}) + "\n"
                             for t in turns("train", 8, 3)))
    res = train_dpo(store, str(pairs), sft, config=DpoConfig(steps=3, lr=2e-3, batch=4, threads=2))
    r = res.receipt
    assert r["tokenizer"] == man["tokenizer"] and r["template"] == man["template"]
    assert r["adapter"] is not None and r["sft_adapter"] == sft
    assert r["dpo"]["reward_margin"]["mean"] > 0 and r["dpo"]["accuracy"] > 0.5, r["dpo"]
