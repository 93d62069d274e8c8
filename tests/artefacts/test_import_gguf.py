"""GGUF import through transformers' GGUF loader, on a tiny GGUF file written here."""

import json

import pytest

gguf = pytest.importorskip("gguf")


def _write_gguf(hf_dir, path):
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
    w.add_tokenizer_model("llama")
    w.add_token_list([f"<{i}>" for i in range(cfg["vocab_size"])])
    w.add_token_scores([0.0] * cfg["vocab_size"])
    w.add_token_types([1] * cfg["vocab_size"])
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
        w.add_tensor(name, np.ascontiguousarray(a))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return sd


def test_gguf_import_round_trips_the_weights(store, tmp_path):
    from safetensors.torch import load_file

    from ledger.plan import compile as comp
    from ledger.artefacts import model
    from ledger.plan import spec, targets

    hf = tmp_path / "hf"
    model.build_builtin_files(spec.parse("[model]\nhidden = 32\nintermediate = 64\nkv_heads = 2\n").config["model"], hf)
    sd = _write_gguf(hf, tmp_path / "tiny.gguf")
    with store.transaction("import-base") as tx:
        base = model.import_gguf(tx, store, tmp_path / "tiny.gguf")
        tx.outputs.append(base)
        tx.refs["name/g"] = base
    man = model.load_manifest(store, base)
    assert man["origin"]["import"] == "gguf" and store.has(man["origin"]["gguf"])
    model.materialise_tree(store, man["files"], tmp_path / "out")
    back = load_file(str(tmp_path / "out" / "model.safetensors"))
    assert set(back) == set(sd) and all(bool((back[k] == sd[k]).all()) for k in sd)
    arch = model.arch_of(man["config"])
    assert (arch.hidden, arch.kv_heads, arch.vocab) == (32, 2, 260)
    plan = comp.compile_spec(store, spec.parse('[model]\nbase = "g"\n[data]\nsteps = 2\n'), targets.get("cpu")).plan
    assert plan.body["inputs"]["base"] == base
