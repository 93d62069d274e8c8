"""Base weights: the built-in tiny Llama, imported bases, and their shapes.

A base is a manifest object {"kind": "base", "files": <tree id>, "config": {...}, "tokenizer":
<id>, "origin": ...}. The tree holds `config.json` + `model.safetensors`, which
`LlamaForCausalLM.from_pretrained(dir)` loads as is.

The built-in model is built in process from a seeded init and written with a config.json of
our own (canonical JSON, no library version inside) and safetensors, so the same spec gives the
same bytes, and the same base id, on every run with the same torch. Building it is cached by its
recipe (shape, seed, torch and transformers versions) in .ledger/cache/, a cache only: a hit is
re-checked against the object store.

Shapes and parameter counts are computed from the config alone (no torch), so compiling a plan,
or rejecting one that cannot fit, never has to build the model.
"""

from __future__ import annotations

import json
import os
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path

from ledger.errors import BadInput, SpecError
from ledger.artefacts import recipe_cache
from ledger.artefacts import tokenizer as toklib
from ledger.plan.spec import BUILTIN_BASE
from ledger.store import canonical
from ledger.store.ids import hash_bytes, is_id

WEIGHTS_FILE = "model.safetensors"
CONFIG_FILE = "config.json"
MODULE_SHAPES = {  # in_features, out_features as functions of the arch
    "q_proj": lambda a: (a.hidden, a.heads * a.head_dim),
    "k_proj": lambda a: (a.hidden, a.kv_heads * a.head_dim),
    "v_proj": lambda a: (a.hidden, a.kv_heads * a.head_dim),
    "o_proj": lambda a: (a.heads * a.head_dim, a.hidden),
    "gate_proj": lambda a: (a.hidden, a.intermediate),
    "up_proj": lambda a: (a.hidden, a.intermediate),
    "down_proj": lambda a: (a.intermediate, a.hidden),
}


@dataclass(frozen=True)
class Arch:
    """The Llama shape facts the planner needs."""
    vocab: int
    hidden: int
    intermediate: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    max_positions: int
    tied: bool

    def to_json(self) -> dict:
        return asdict(self)

    def params(self) -> dict:
        """Parameter counts by group; sums to the model's total."""
        per_layer = sum(i * o for i, o in (f(self) for f in MODULE_SHAPES.values())) + 2 * self.hidden
        return {"embedding": self.vocab * self.hidden, "layers": self.layers * per_layer,
                "final_norm": self.hidden, "lm_head": 0 if self.tied else self.vocab * self.hidden}

    def lora_params(self, r: int, modules) -> int:
        return self.layers * sum(r * (i + o) for i, o in (MODULE_SHAPES[m](self) for m in modules))


def builtin_config(model: dict) -> dict:
    """config.json of the built-in model for the spec's [model] section."""
    return {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": toklib.VOCAB_SIZE,
            "hidden_size": model["hidden"], "intermediate_size": model["intermediate"],
            "num_hidden_layers": model["layers"], "num_attention_heads": model["heads"],
            "num_key_value_heads": model["kv_heads"], "head_dim": model["hidden"] // model["heads"],
            "hidden_act": "silu", "max_position_embeddings": model["max_positions"], "rms_norm_eps": 1e-6,
            "rope_theta": 10000.0, "tie_word_embeddings": False, "attention_bias": False, "mlp_bias": False,
            "pad_token_id": toklib.PAD, "bos_token_id": toklib.BOS, "eos_token_id": toklib.EOS,
            # 0.2, not the usual 0.02: the frozen random lm_head must be able to express peaked
            # next-byte distributions, or no adapter on this base could lower the loss much below
            # uniform (with 0.02 logits stay within about a nat of each other).
            "initializer_range": 0.2}


def arch_of(cfg: dict) -> Arch:
    if cfg.get("model_type") != "llama":
        raise BadInput(f"base model type {cfg.get('model_type')!r} is not supported",
                       "ledger trains Llama-architecture bases (model_type = llama)")
    try:
        heads = int(cfg["num_attention_heads"])
        hidden = int(cfg["hidden_size"])
        return Arch(vocab=int(cfg["vocab_size"]), hidden=hidden, intermediate=int(cfg["intermediate_size"]),
                    layers=int(cfg["num_hidden_layers"]), heads=heads,
                    kv_heads=int(cfg.get("num_key_value_heads") or heads),
                    head_dim=int(cfg.get("head_dim") or hidden // heads),
                    max_positions=int(cfg.get("max_position_embeddings") or 2048),
                    tied=bool(cfg.get("tie_word_embeddings", False)))
    except (KeyError, TypeError, ValueError) as e:
        raise BadInput(f"base config.json lacks or mangles a shape field: {e}") from None


def builtin_recipe(model: dict) -> dict:
    # Versions from package metadata: compiling must not pay for importing torch.
    from importlib.metadata import version

    return {"base": BUILTIN_BASE, "config": builtin_config(model), "init_seed": model["init_seed"],
            "torch": version("torch"), "transformers": version("transformers")}


def build_builtin_files(model: dict, out: Path) -> None:
    """Write config.json + model.safetensors of the seeded built-in model into `out`."""
    import torch
    from safetensors.torch import save_file
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = builtin_config(model)
    out.mkdir(parents=True, exist_ok=True)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(model["init_seed"])
        m = LlamaForCausalLM(LlamaConfig(**{k: v for k, v in cfg.items() if k not in ("architectures", "model_type")}))
    sd = {k: v.detach().contiguous() for k, v in sorted(m.state_dict().items())}
    save_file(sd, str(out / WEIGHTS_FILE), metadata={"format": "pt"})
    (out / CONFIG_FILE).write_bytes(canonical.dumps(cfg))


def put_tokenizer(tx) -> str:
    """A base manifest names its tokenizer: the tokenizer object must exist whenever the
    manifest does (a crash between two transactions must not leave a dangling reference)."""
    return tx.put_json(toklib.ByteTokenizer().definition())


def _manifest(tree: str, cfg: dict, origin: dict) -> dict:
    return {"kind": "base", "arch": "llama", "files": tree, "config": cfg,
            "tokenizer": toklib.ByteTokenizer().id, "origin": origin}


def ensure_builtin(tx, store, model: dict) -> str:
    """The built-in base for `model` (a spec [model] section), written into `tx` if new."""
    put_tokenizer(tx)
    recipe = builtin_recipe(model)
    oid = recipe_cache.lookup(store, "builtin-base", recipe)
    try:
        if oid and store.has(store.get_json(oid)["files"]):
            tx.objects[oid] = (store.objects.size(oid), "base")
            return oid
    except (ValueError, KeyError, TypeError, BadInput):
        pass  # a damaged entry is a cache miss: rebuild (same bytes)
    with tempfile.TemporaryDirectory(dir=store.tmp) as d:
        build_builtin_files(model, Path(d))
        tree = tx.put_tree(d)
    oid = tx.put_json(_manifest(tree, builtin_config(model), {"builtin": BUILTIN_BASE, "init_seed": model["init_seed"],
                                                              "torch": recipe["torch"],
                                                              "transformers": recipe["transformers"]}))
    recipe_cache.remember(store, "builtin-base", recipe, oid)
    return oid


def _check_byte_vocab(cfg: dict, where: str) -> None:
    if int(cfg.get("vocab_size", 0)) < toklib.VOCAB_SIZE:
        raise BadInput(f"{where}: vocab_size {cfg.get('vocab_size')} is smaller than the byte tokenizer's {toklib.VOCAB_SIZE}",
                       "imported bases are trained with ledger's byte tokenizer; import a model with vocab_size >= 260")


def import_hf_dir(tx, path: str | Path) -> str:
    """Import a Hugging Face model directory (config.json + safetensors) as a base."""
    p = Path(path)
    if not (p / CONFIG_FILE).is_file():
        raise BadInput(f"{p} has no config.json", "give a Hugging Face model directory")
    cfg = json.loads((p / CONFIG_FILE).read_text())
    arch_of(cfg)
    names = sorted(f.name for f in p.iterdir() if f.is_file())
    if not any(n.endswith(".safetensors") for n in names):
        pickled = [n for n in names if n.endswith((".bin", ".pt", ".pth", ".ckpt"))]
        raise BadInput(f"{p} has no safetensors weights" + (f" (only {pickled[0]})" if pickled else ""),
                       "ledger never unpickles weights; convert them to safetensors first")
    tok_files = [n for n in names if n.startswith("tokenizer") or n in ("vocab.json", "merges.txt", "special_tokens_map.json")]
    if tok_files:
        raise BadInput(f"{p} ships its own tokenizer ({tok_files[0]}), which this version cannot train with",
                       "ledger trains imported bases with its byte tokenizer only; import the weights without tokenizer files")
    _check_byte_vocab(cfg, str(p))
    tree = tx.put_tree(p)
    put_tokenizer(tx)
    return tx.put_json(_manifest(tree, cfg, {"import": "hf-dir", "name": p.name}))


def import_gguf(tx, store, file: str | Path) -> str:
    """Import a GGUF file through transformers' GGUF loader (dequantised to fp32 safetensors)."""
    p = Path(file)
    if not p.is_file():
        raise BadInput(f"no GGUF file at {p}")
    try:
        import gguf  # noqa: F401  (transformers' GGUF loader needs it)
    except ImportError:
        raise BadInput("GGUF import needs the `gguf` package", "pip install gguf") from None
    import torch
    import transformers
    from safetensors.torch import save_file
    from transformers import AutoConfig, AutoModelForCausalLM

    transformers.utils.logging.disable_progress_bar()
    try:
        cfg_obj = AutoConfig.from_pretrained(str(p.parent), gguf_file=p.name, local_files_only=True)
        model = AutoModelForCausalLM.from_pretrained(str(p.parent), gguf_file=p.name, local_files_only=True,
                                                     dtype=torch.float32)
    except (ValueError, OSError, KeyError, RuntimeError) as e:
        raise BadInput(f"transformers could not load {p} as GGUF: {e}") from None
    cfg = {k: v for k, v in cfg_obj.to_diff_dict().items() if k not in ("transformers_version", "_name_or_path")}
    cfg["model_type"] = "llama" if cfg_obj.model_type == "llama" else cfg_obj.model_type
    cfg["architectures"] = ["LlamaForCausalLM"]
    arch_of(cfg)
    _check_byte_vocab(cfg, str(p))
    with tempfile.TemporaryDirectory(dir=store.tmp) as d:
        sd = {k: v.detach().contiguous() for k, v in sorted(model.state_dict().items())}
        save_file(sd, os.path.join(d, WEIGHTS_FILE), metadata={"format": "pt"})
        Path(d, CONFIG_FILE).write_bytes(canonical.dumps(cfg))
        tree = tx.put_tree(d)
    src = tx.put_file(p)
    put_tokenizer(tx)
    return tx.put_json(_manifest(tree, cfg, {"import": "gguf", "name": p.name, "gguf": src}))


def load_manifest(store, base_id: str) -> dict:
    m = store.get_json(base_id)
    if not isinstance(m, dict) or m.get("kind") != "base":
        raise SpecError(f"{base_id} is not a base model manifest", "give a base id from `ledger import-base` or the built-in")
    return m


def tree_entries(store, tree_id: str) -> list[dict]:
    t = store.get_json(tree_id)
    if not isinstance(t, dict) or t.get("kind") != "tree":
        raise BadInput(f"{tree_id} is not a tree object")
    return t["entries"]


def materialise_tree(store, tree_id: str, dest: Path) -> None:
    dest.mkdir(parents=True, exist_ok=True)
    for e in tree_entries(store, tree_id):
        rel = Path(e["path"])
        if rel.is_absolute() or ".." in rel.parts:
            raise BadInput(f"tree {tree_id} names an unsafe path {e['path']!r}")
        (dest / rel).parent.mkdir(parents=True, exist_ok=True)
        store.export_file(e["id"], dest / rel)
