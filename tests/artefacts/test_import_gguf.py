"""Import: GGUF files (a tiny one written here, and the SmolLM2 fixture) and Hugging Face
folders; the refusals (remote code, pickles, a tokenizer that does not fit, an unsupported GGUF
type, a template that cannot render) leave the store unchanged."""

import json
import os
import shutil

import pytest

from ledger.store import trees

gguf = pytest.importorskip("gguf")


def _write_gguf(hf_dir, path, n_tokens=None, raw_type=None):
    """Write the HF model in hf_dir as a llama GGUF the way llama.cpp's converter does
    (q/k rows permuted for its rotary layout; transformers undoes that on load)."""
    import numpy as np
    from safetensors.torch import load_file

    cfg = json.loads((hf_dir / "config.json").read_text())
    sd = load_file(str(hf_dir / "model.safetensors"))

    def permute(w, n_head):
        return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)

    w = gguf.GGUFWriter(str(path), "llama")
    w.add_context_length(cfg["max_position_embeddings"])
    w.add_embedding_length(cfg["hidden_size"])
    w.add_block_count(cfg["num_hidden_layers"])
    w.add_feed_forward_length(cfg["intermediate_size"])
    w.add_head_count(cfg["num_attention_heads"])
    w.add_head_count_kv(cfg["num_key_value_heads"])
    w.add_rope_freq_base(cfg["rope_theta"])
    w.add_layer_norm_rms_eps(cfg["rms_norm_eps"])
    w.add_vocab_size(cfg["vocab_size"])
    n = n_tokens or cfg["vocab_size"]
    w.add_tokenizer_model("llama")
    # <unk> <s> </s> first, where llama's converter expects them (else it adds its own ids)
    w.add_token_list(["<unk>", "<s>", "</s>"] + [f"<{i}>" for i in range(3, n)])
    w.add_token_scores([0.0] * n)
    w.add_token_types([1] * n)
    w.add_unk_token_id(0)
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    top = {"model.embed_tokens.weight": "token_embd.weight", "model.norm.weight": "output_norm.weight",
           "lm_head.weight": "output.weight"}
    per = {"self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k", "self_attn.v_proj": "attn_v",
           "self_attn.o_proj": "attn_output", "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up",
           "mlp.down_proj": "ffn_down", "input_layernorm": "attn_norm", "post_attention_layernorm": "ffn_norm"}
    for k, v in sd.items():
        a = v.numpy()
        if k in top:
            name = top[k]
        else:
            parts = k.split(".")
            mod = ".".join(parts[3:-1])
            name = f"blk.{parts[2]}.{per[mod]}.weight"
            if mod == "self_attn.q_proj":
                a = permute(a, cfg["num_attention_heads"])
            elif mod == "self_attn.k_proj":
                a = permute(a, cfg["num_key_value_heads"])
        if raw_type is not None and name == "blk.0.ffn_up.weight":  # one tensor of a type gguf cannot read
            w.add_tensor(name, np.zeros(a.size, dtype=np.int8).reshape(a.shape), raw_dtype=raw_type)
            continue
        w.add_tensor(name, np.ascontiguousarray(a))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return sd


def test_gguf_import_round_trips_the_weights(store, tmp_path):
    from safetensors.torch import load_file

    from ledger.artefacts import model
    from ledger.plan import compile as comp
    from ledger.plan import spec, targets

    hf = tmp_path / "hf"
    model.build_builtin_files(spec.parse("[model]\nhidden = 32\nintermediate = 64\nkv_heads = 2\n").config["model"], hf)
    sd = _write_gguf(hf, tmp_path / "tiny.gguf")
    with store.transaction("import-base") as tx:
        base = model.import_gguf(tx, store, tmp_path / "tiny.gguf")
        tx.outputs.append(base)
        tx.refs["name/g"] = base
        tx.payload["base"] = base
    man = model.load_manifest(store, base)
    o = man["origin"]
    assert o["import"] == "gguf" and o["stored_dtype"] == "float32" and o["quant_types"] == {"F32": 21}
    assert o["source_bytes"] == (tmp_path / "tiny.gguf").stat().st_size and o["source_hash"].startswith("b3:")
    trees.materialise_tree(store, man["files"], tmp_path / "out")
    back = load_file(str(tmp_path / "out" / "model.safetensors"))
    assert set(back) == set(sd) and all(bool((back[k] == sd[k]).all()) for k in sd)
    arch = model.arch_of(man["config"])
    assert (arch.hidden, arch.kv_heads, arch.vocab) == (32, 2, 260)
    plan = comp.compile_spec(store, spec.parse('[model]\nbase = "g"\n[data]\nsteps = 2\n'), targets.get("cpu")).plan
    assert plan.body["inputs"]["base"] == base


def _snapshot(store):
    """What a refused import must not change: every object file and the journal's bytes."""
    objs = sorted(str(p.relative_to(store.root)) for p in (store.root / "objects").rglob("*") if p.is_file())
    journal = sorted((str(p.relative_to(store.root)), p.stat().st_size)
                     for p in store.root.rglob("*") if p.is_file() and "journal" in str(p.relative_to(store.root)))
    return objs, journal, store.state.refs if hasattr(store, "state") else None


def _refused(store, path, exc):
    from ledger.artefacts import model

    before = _snapshot(store)
    with pytest.raises(exc) as e:
        with store.transaction("import-base") as tx:
            model.import_base(tx, store, path)
    assert _snapshot(store) == before
    return e.value


def _tiny_hf(tmp_path):
    from ledger.artefacts import model
    from ledger.plan import spec

    hf = tmp_path / "hf"
    model.build_builtin_files(spec.parse("[model]\nhidden = 32\nintermediate = 64\nkv_heads = 2\n").config["model"], hf)
    return hf


def test_unsupported_gguf_type_is_refused(store, tmp_path):
    from ledger.artefacts import model

    _write_gguf(_tiny_hf(tmp_path), tmp_path / "odd.gguf", raw_type=gguf.GGMLQuantizationType.I8)
    e = _refused(store, tmp_path / "odd.gguf", model.UnsupportedModel)
    assert "I8" in e.message and e.exit_code == 2


def test_gguf_vocabulary_larger_than_the_embedding_is_refused(store, tmp_path):
    from ledger.artefacts import tokenizer as tk

    _write_gguf(_tiny_hf(tmp_path), tmp_path / "big.gguf", n_tokens=300)
    e = _refused(store, tmp_path / "big.gguf", tk.TokenizerMismatch)
    assert "300" in e.message and "260" in e.message


def _hf_with_tokenizer(tmp_path, smol_store):
    """A tiny Llama folder (vocab 49152) that ships SmolLM2's tokenizer and chat template."""
    from ledger.artefacts import model
    from ledger.plan import spec

    store, base = smol_store
    hf = tmp_path / "hfdir"
    cfg = spec.parse("[model]\nhidden = 16\nintermediate = 32\nheads = 2\nkv_heads = 1\nlayers = 1\n").config["model"]
    model.build_builtin_files(cfg, hf)
    c = json.loads((hf / "config.json").read_text())
    c.update(vocab_size=49152, bos_token_id=1, eos_token_id=2, pad_token_id=2)
    (hf / "config.json").write_text(json.dumps(c))
    from transformers import LlamaConfig, LlamaForCausalLM

    m = LlamaForCausalLM(LlamaConfig(**{k: v for k, v in c.items() if k not in ("architectures", "model_type")}))
    m.save_pretrained(str(hf), safe_serialization=True)
    (hf / "config.json").write_text(json.dumps(c))
    files = {e["path"]: e["id"] for e in trees.tree_entries(store, store.get_json(base)["files"])}
    for name in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja"):
        store.export_file(files[name], hf / name)
    return hf


def test_hf_folder_with_tokenizer_and_template_imports_them(store, tmp_path, smol_store):
    from ledger.artefacts import model
    from ledger.artefacts import template as tp

    hf = _hf_with_tokenizer(tmp_path, smol_store)
    (hf / "README.md").write_text("not kept")
    with store.transaction("import-base") as tx:
        base = model.import_base(tx, store, hf)
        tx.payload["base"] = base
    man = model.load_manifest(store, base)
    smol = smol_store[0].get_json(smol_store[1])
    assert man["tokenizer"] == smol["tokenizer"] and man["template"] == smol["template"]  # same artefacts, same ids
    kept = {e["path"] for e in trees.tree_entries(store, man["files"])}
    assert kept == {"config.json", "generation_config.json", "model.safetensors", "tokenizer.json",
                    "tokenizer_config.json", "chat_template.jinja"}  # not README.md
    assert list(man["origin"]["dtypes"]) == ["F32"]  # stored as the source has it
    assert not tp.for_base(store, man).plain


def test_remote_code_and_pickles_are_refused_never_run(store, tmp_path, smol_store):
    from ledger.artefacts import model
    from ledger.artefacts import tokenizer as tk

    hf = _hf_with_tokenizer(tmp_path, smol_store)
    marker = tmp_path / "ran"
    (hf / "modeling_evil.py").write_text(f"open({str(marker)!r}, 'w').write('x')\n")
    cfg = json.loads((hf / "config.json").read_text())
    (hf / "config.json").write_text(json.dumps({**cfg, "auto_map": {"AutoModelForCausalLM": "modeling_evil.Evil"}}))
    e = _refused(store, hf, model.UnsafeModel)
    assert "auto_map" in e.message and e.exit_code == 3
    (hf / "config.json").write_text(json.dumps({**cfg, "trust_remote_code": True}))
    _refused(store, hf, model.UnsafeModel)
    (hf / "config.json").write_text(json.dumps(cfg))
    tc = json.loads((hf / "tokenizer_config.json").read_text())
    (hf / "tokenizer_config.json").write_text(json.dumps({**tc, "auto_map": {"AutoTokenizer": ["x.T", None]}}))
    _refused(store, hf, model.UnsafeModel)
    (hf / "tokenizer_config.json").write_text(json.dumps(tc))
    pickled = tmp_path / "pickled"
    shutil.copytree(hf, pickled)
    (pickled / "model.safetensors").rename(pickled / "pytorch_model.bin")
    e = _refused(store, pickled, model.UnsafeModel)
    assert "pytorch_model.bin" in e.message and "unpickle" in e.message
    assert not marker.exists()
    # a tokenizer whose vocabulary does not fit this folder's embedding
    (hf / "config.json").write_text(json.dumps({**cfg, "vocab_size": 49000}))
    _refused(store, hf, tk.TokenizerMismatch)
    # a chat template that cannot render a turn
    from ledger.artefacts import template as tp

    (hf / "config.json").write_text(json.dumps(cfg))
    (hf / "chat_template.jinja").write_text("{{ raise_exception('no') }}")
    _refused(store, hf, tp.TemplateError)
    assert os.listdir(store.root / "tmp") == [] or all(not n.startswith("tmp") for n in os.listdir(store.root / "tmp"))


@pytest.mark.slow
def test_smollm2_import_stores_bf16_one_tied_tensor_and_matches_transformers_logits(smol_store, smol_gguf, tmp_path):
    import torch
    from safetensors import safe_open
    from transformers import AutoModelForCausalLM, LlamaForCausalLM

    from ledger.artefacts import model
    from ledger.artefacts import template as tp

    store, base = smol_store
    man = model.load_manifest(store, base)
    o = man["origin"]
    assert o["quant_types"] == {"F32": 61, "Q4_1": 210, "Q8_0": 1} and o["stored_dtype"] == "bfloat16" and o["tied"]
    assert o["source_bytes"] == smol_gguf.stat().st_size
    d = tmp_path / "base"
    trees.materialise_tree(store, man["files"], d)
    with safe_open(str(d / "model.safetensors"), framework="pt") as f:
        keys = set(f.keys())
        assert "lm_head.weight" not in keys and "model.embed_tokens.weight" in keys
        assert {str(f.get_slice(k).get_dtype()) for k in keys} == {"BF16"}
    stored = sum(e["size"] for e in trees.tree_entries(store, man["files"]))
    assert stored < 3 * smol_gguf.stat().st_size  # bf16 (~270 MB), not fp32 (~540 MB)
    ours = LlamaForCausalLM.from_pretrained(str(d), dtype=torch.float32).eval()
    ref = AutoModelForCausalLM.from_pretrained(str(smol_gguf.parent), gguf_file=smol_gguf.name,
                                               dtype=torch.float32).eval()
    chat = tp.for_base(store, man)
    ids = torch.tensor([chat.encode_turn("What is the capital of France?", "Paris, ✓ of course.").ids])
    with torch.inference_mode():
        a, b = ours(input_ids=ids).logits, ref(input_ids=ids).logits
    # bf16 weights vs the same weights dequantized to fp32: close, and the same next-token choices
    assert torch.allclose(a, b, atol=0.5, rtol=0.05), float((a - b).abs().max())
    assert float((a.argmax(-1) == b.argmax(-1)).float().mean()) >= 0.9
