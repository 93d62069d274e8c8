"""The gate's scorer: mean negative log-likelihood over the ACTION span of each document.

A document is (situation, action). It is encoded exactly as training encodes a turn -- by the
base's own tokenizer and chat template (`template.Chat.encode_turn`; the plain format
`<bos> situation <sep> action <eos>` for the built-in model and bases without a template) -- and
its score is the mean NLL, in nats per token, of the action span only: the action's tokens and the
end-of-turn token that closes them (so a model that cannot stop scores worse), not the situation,
not the template's fixed text, and not any register a model may have learned to put in front of an
action (docs/gate.md). Lower is better.

Both models of a gate run are scored in one call on one loaded base: the base is built once and
each adapter is attached to it by name (peft), the bare base is scored with adapters disabled.
Documents are batched: right-padded to the longest document of a batch, with an attention mask,
and the per-document sums are masked reductions over whole tensors (no per-token Python loop).

`SCORER_VERSION` is part of the suite hash: any change to how a score is computed (template,
span, reduction, precision) must change it, so a pinned suite cannot silently be scored
differently from how it was pinned.

What is scored is named by a `ModelRef`: a base plus an adapter (or none). `resolve_model` turns
what a user types -- an adapter tree id, a receipt, `gen-N`/`HEAD`, a base -- into one.
"""

from __future__ import annotations

import contextlib
import tempfile
import warnings
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ledger.artefacts import model as modellib
from ledger.artefacts import template as templatelib
from ledger.artefacts import tokenizer as toklib
from ledger.errors import BadInput, UnknownRef
from ledger.store import trees

# Template, span, reduction and precision; bump on any change to any of them.
SCORER_VERSION = ("ledger.score/2: the base's tokenizer and chat template (plain: [bos]situation sep action eos); "
                  "span = action tokens + end-of-turn token; mean NLL nats/token; fp32 forward, float64 sums")
ADAPTER_FILES = ("adapter_config.json", "adapter_model.safetensors")
DEFAULT_BATCH = 16


@dataclass(frozen=True)
class ModelRef:
    """A model the gate can score: base weights plus an optional LoRA adapter."""
    base: str  # base manifest id
    adapter: str | None  # adapter tree id (adapter_model.safetensors + adapter_config.json)
    ref: str = ""  # what the user named it by ("HEAD", "gen-3", an id)
    generation: str | None = None  # generation manifest id, when named through one
    tokenizer: str = ""  # tokenizer id of the base

    @property
    def id(self) -> str:
        """The identity a verdict names: the adapter; for a model without one, the generation it
        was named through, else the base."""
        return self.adapter or self.generation or self.base

    @property
    def bare(self) -> bool:
        return self.adapter is None

    def to_json(self) -> dict:
        return {"id": self.id, "base": self.base, "adapter": self.adapter, "ref": self.ref,
                "generation": self.generation, "tokenizer": self.tokenizer}


# --- naming what is scored ---------------------------------------------------------------------
def _tree_files(store, tree_id: str) -> dict[str, str]:
    return {e["path"]: e["id"] for e in trees.tree_entries(store, tree_id)}


def _adapter_base(store, tree_id: str) -> str:
    files = _tree_files(store, tree_id)
    missing = [f for f in ADAPTER_FILES if f not in files]
    if missing:
        raise BadInput(f"{tree_id} is a tree but not an adapter (it lacks {', '.join(missing)})",
                       "judge an adapter tree, a receipt, a generation (gen-N, HEAD) or a base")
    try:
        cfg = store.get_json(files["adapter_config.json"])
    except BadInput:
        raise BadInput(f"adapter {tree_id}: adapter_config.json is not JSON") from None
    base = cfg.get("base_model_name_or_path") if isinstance(cfg, dict) else None
    if not isinstance(base, str) or not base.startswith("b3:"):
        raise BadInput(f"adapter {tree_id} does not name its base by id (base_model_name_or_path = {base!r})",
                       "adapters trained by ledger name their base; others cannot be judged")
    return base


def _model(store, base: str, adapter: str | None, ref: str, generation: str | None) -> ModelRef:
    man = modellib.load_manifest(store, base)
    return ModelRef(base=base, adapter=adapter, ref=ref, generation=generation,
                    tokenizer=man["tokenizer"])


def resolve_model(store, ref: str) -> ModelRef:
    """An adapter tree, a receipt (its adapter), a generation (its adapter, or its bare base when
    it has none) or a base manifest, named by id, prefix or ref."""
    oid = store.resolve(ref)
    if not store.has(oid):  # a full id resolves without a lookup; unknown is bad input, not corruption
        raise UnknownRef(f"no object {oid} in this store", "judge an adapter, receipt, generation or base of this store")
    try:
        obj = store.get_json(oid)
    except BadInput:
        raise BadInput(f"{ref} names a blob, not something that can be judged",
                       "judge an adapter tree, a receipt, a generation (gen-N, HEAD) or a base") from None
    kind = obj.get("kind") if isinstance(obj, dict) else None
    if kind == "generation":
        if not obj.get("base"):
            raise BadInput(f"generation {ref} names no base weights, so there is nothing to score")
        adapter = obj.get("adapter")
        if adapter is not None and _adapter_base(store, adapter) != obj["base"]:
            raise BadInput(f"generation {ref}: its adapter was trained on another base than the one it names")
        return _model(store, obj["base"], adapter, ref, oid)
    if kind == "tree":
        return _model(store, _adapter_base(store, oid), oid, ref, None)
    if kind in ("receipt", "dpo-receipt"):
        adapter = obj.get("adapter")
        if not adapter:
            raise BadInput(f"receipt {ref} has no adapter (the run stopped early)", "judge a run that finished")
        return _model(store, _adapter_base(store, adapter), adapter, ref, None)
    if kind == "base":
        return _model(store, oid, None, ref, None)
    raise BadInput(f"{ref} is a {kind or 'JSON'} object, not something that can be judged",
                   "judge an adapter tree, a receipt, a generation (gen-N, HEAD) or a base")


# --- encoding --------------------------------------------------------------------------------------
@dataclass(frozen=True)
class EncodedDocs:
    """Right-padded token ids, attention mask, and the mask of the action span's *targets*
    (position t predicts token t+1, so span[t] says whether token t+1 is an action byte)."""
    ids: object  # LongTensor [N, T]
    attention: object  # LongTensor [N, T]
    span: object  # BoolTensor [N, T-1]
    lengths: tuple[int, ...]


def encode_docs(docs: Sequence[tuple[str, str]], max_len: int | None = None, chat=None) -> EncodedDocs:
    """Documents encoded by `chat` (the base's template.Chat; the built-in byte tokenizer in the
    plain format when None)."""
    import torch

    if not docs:
        raise BadInput("nothing to score: no documents")
    chat = chat or templatelib.Chat(toklib.ByteTokenizer())
    enc = [chat.encode_turn(s, a, max_len) for s, a in docs]
    for (s, a), e in zip(docs, enc):
        if e.action_end <= e.action_start:
            raise BadInput(f"a document has an empty action span (situation {s[:40]!r})")
    T = max(len(e.ids) for e in enc)
    n = len(enc)
    ids = torch.full((n, T), chat.tokenizer.pad_id, dtype=torch.long)
    att = torch.zeros((n, T), dtype=torch.long)
    span = torch.zeros((n, T), dtype=torch.bool)
    for i, e in enumerate(enc):  # one slice assignment per document, not per token
        ids[i, :len(e.ids)] = torch.tensor(e.ids, dtype=torch.long)
        att[i, :len(e.ids)] = 1
        span[i, e.action_start:e.action_end] = True
    return EncodedDocs(ids=ids, attention=att, span=span[:, 1:].contiguous(),
                       lengths=tuple(len(e.ids) for e in enc))


def _batch_losses(model, ids, att, span) -> np.ndarray:
    """Mean action-span NLL of each row of one padded batch, as float64."""
    import torch

    logits = model(input_ids=ids, attention_mask=att).logits[:, :-1, :].float()
    targets = ids[:, 1:]
    nll = torch.nn.functional.cross_entropy(logits.transpose(1, 2), targets, reduction="none")
    nll = nll.double() * span
    return (nll.sum(dim=1) / span.sum(dim=1)).numpy()


def doc_losses(model, docs: EncodedDocs, batch_size: int = DEFAULT_BATCH) -> np.ndarray:
    """Per-document mean action-span NLL (nats/token) of `model` (eval mode, no grad)."""
    import torch

    if batch_size < 1:
        raise BadInput(f"batch size must be >= 1, got {batch_size}")
    out = []
    n = docs.ids.shape[0]
    with torch.inference_mode():
        for lo in range(0, n, batch_size):
            hi = min(n, lo + batch_size)
            # Trim the batch to its own longest document: padding costs compute, not correctness.
            T = max(docs.lengths[lo:hi])
            out.append(_batch_losses(model, docs.ids[lo:hi, :T], docs.attention[lo:hi, :T],
                                     docs.span[lo:hi, :T - 1]))
    losses = np.concatenate(out)
    if not np.all(np.isfinite(losses)):
        raise BadInput("the scorer produced a non-finite loss", "the model's weights hold NaN or inf")
    return losses


# --- loading ------------------------------------------------------------------------------------
def _load_base(store, base_id: str, work: Path):
    import torch
    from transformers import LlamaForCausalLM

    man = modellib.load_manifest(store, base_id)
    d = work / "base"
    trees.materialise_tree(store, man["files"], d)
    model = LlamaForCausalLM.from_pretrained(str(d), dtype=torch.float32, local_files_only=True)
    return model.eval(), int(man["config"].get("max_position_embeddings") or 0) or None, templatelib.for_base(store, man)


def _adapter_dir(store, adapter_id: str, dest: Path) -> Path:
    files = _tree_files(store, adapter_id)
    dest.mkdir(parents=True)
    for name in ADAPTER_FILES:
        store.export_file(files[name], dest / name)
    return dest


class _Loaded:
    """One base in memory with every distinct adapter attached under its own name."""

    def __init__(self, store, models: Sequence[ModelRef], work: Path):
        bases = {m.base for m in models}
        if len(bases) != 1:
            raise BadInput("the models to score have different bases: " + ", ".join(sorted(bases)),
                           "the gate compares adapters of one base; judge against a generation of the same base")
        self.model, self.max_len, self.chat = _load_base(store, models[0].base, work)
        self.names: dict[str, str] = {}
        for m in models:
            if m.adapter is None or m.adapter in self.names:
                continue
            name = f"a{len(self.names)}"
            d = _adapter_dir(store, m.adapter, work / name)
            if not self.names:
                from peft import PeftModel

                self.model = PeftModel.from_pretrained(self.model, str(d), adapter_name=name, is_trainable=False)
            else:
                self.model.load_adapter(str(d), adapter_name=name, is_trainable=False)
            self.names[m.adapter] = name
        self.model.eval()

    @contextlib.contextmanager
    def use(self, m: ModelRef):
        if m.adapter is None:
            if self.names:
                with self.model.disable_adapter():
                    yield self.model
            else:
                yield self.model
        else:
            self.model.set_adapter(self.names[m.adapter])
            yield self.model


@contextlib.contextmanager
def _quiet():
    """Loading a model prints progress bars and library deprecation warnings; a gate run's
    output is its verdict, so they are silenced here (and restored after)."""

    from transformers.utils import logging as hf_logging

    level, bars = hf_logging.get_verbosity(), hf_logging.is_progress_bar_enabled()
    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", FutureWarning)
            yield
    finally:
        hf_logging.set_verbosity(level)
        if bars:
            hf_logging.enable_progress_bar()


def score_models(store, models: Mapping[str, ModelRef], docs: Sequence[tuple[str, str]], *,
                 batch_size: int = DEFAULT_BATCH,
                 progress: Callable[[str], None] | None = None) -> dict[str, np.ndarray]:
    """Score every model on `docs` (situation, action) in one run: {name: losses in doc order}."""
    import torch

    if not models:
        raise BadInput("no models to score")
    refs = list(models.values())
    with tempfile.TemporaryDirectory(prefix="ledger-score-") as d, torch.random.fork_rng(devices=[]):
        with _quiet():
            loaded = _Loaded(store, refs, Path(d))
        enc = encode_docs(docs, loaded.max_len, loaded.chat)
        out: dict[str, np.ndarray] = {}
        by_id: dict[str, np.ndarray] = {}
        for name, m in models.items():
            if progress is not None:
                progress(name)
            if m.id not in by_id:
                with loaded.use(m) as net:
                    by_id[m.id] = doc_losses(net, enc, batch_size)
            out[name] = by_id[m.id]
        return out
