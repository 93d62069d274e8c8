"""Greedy decoding of an action with a generation's base + adapter, one request at a time.

A prompt is what training and the gate encode before the action, by the base's own tokenizer
and chat template (ledger.artefacts.template.Chat.prompt_ids: the rendered generation prompt, or
`<bos> situation <sep>` in the plain format); the action is the tokens generated after it, up to
the end-of-turn token (Chat.stop_ids) or `max_new` tokens (at most MAX_NEW = 48), and it is
returned as text (the tokenizer's decode), never as ids. Both realizations keep a KV cache: the
prompt is fed once, then one token per step.

Two realizations of the same function, chosen by an explicit rule (`select_decoder`) and named
in the image's start record and status -- selection, never a silent fallback:

  "ledger"        a small Llama decoder written here on plain torch ops: the adapter is merged
                  into the base weights once per generation (W + scaling * B @ A), the KV cache
                  is preallocated, logits are computed for the last position only. It loads
                  with torch and safetensors alone. It covers the plain Llama configuration
                  the built-in model and most imported bases use.
  "transformers"  LlamaForCausalLM + peft adapters attached by name, for anything else (RoPE
                  scaling, biases, DoRA, ...). Slower: the library's per-call machinery costs
                  about 5 ms of CPU per token on the tiny model, where "ledger" costs well under 1 ms.

tests/image/test_generate.py checks that both give the same logits and the same greedy actions.

A third, on a GPU and asked for by name only (ServeOptions.decoder): "ledger-cuda" (base in
q4b32), "ledger-cuda-int8", "ledger-cuda-bf16" -- the adapter merged, the base quantized, the
matvecs on ledger's decode kernels, one CUDA graph a step (ledger.image.cuda_decode).
"""

from __future__ import annotations

import contextlib
import json
from dataclasses import dataclass
from pathlib import Path

from ledger.artefacts import model as modellib
from ledger.artefacts import template as templatelib
from ledger.errors import BadInput
from ledger.store import trees

MAX_NEW = 48
# The GPU decoders (ledger.image.cuda_decode), by name -> the format the merged base is held in.
CUDA_DECODERS = {"ledger-cuda": "q4b32", "ledger-cuda-int8": "int8", "ledger-cuda-bf16": "bf16"}
# The KV cache is preallocated for this many positions at most (a real base may declare 8192,
# which would cost ~400 MB of cache for SmolLM2); a request that needs more is refused.
MAX_CONTEXT = 2048
ADAPTER_FILES = ("adapter_config.json", "adapter_model.safetensors")
LORA_MODULES = {"q_proj": "self_attn", "k_proj": "self_attn", "v_proj": "self_attn", "o_proj": "self_attn",
                "gate_proj": "mlp", "up_proj": "mlp", "down_proj": "mlp"}


def check_fits(prompt: list[int], max_new: int, max_positions: int | None) -> None:
    if not 1 <= max_new <= MAX_NEW:
        raise BadInput(f"max_new must be between 1 and {MAX_NEW}, got {max_new}")
    need = len(prompt) + max_new
    if max_positions is not None and need > max_positions:
        raise BadInput(f"the situation needs {need} positions with {max_new} new tokens, but the model has {max_positions}",
                       "shorten the situation or ask for fewer new tokens (max_new)")


# --- choosing a realization ----------------------------------------------------------------------
def _fast_unsupported(cfg: dict, adapter_cfgs: list[dict]) -> list[str]:
    why = []
    if cfg.get("model_type") != "llama":
        why.append(f"model_type {cfg.get('model_type')!r}")
    if cfg.get("hidden_act", "silu") != "silu":
        why.append(f"hidden_act {cfg.get('hidden_act')!r}")
    for k in ("attention_bias", "mlp_bias"):
        if cfg.get(k):
            why.append(k)
    rope = cfg.get("rope_scaling") or {}
    params = cfg.get("rope_parameters") or {}
    if rope or params.get("rope_type", "default") != "default":
        why.append("RoPE scaling")
    for a in adapter_cfgs:
        if a.get("peft_type") != "LORA":
            why.append(f"adapter type {a.get('peft_type')!r}")
        for k in ("use_dora", "use_rslora", "fan_in_fan_out", "lora_bias", "modules_to_save", "layers_to_transform",
                  "rank_pattern", "alpha_pattern", "target_parameters", "trainable_token_indices", "layer_replication"):
            if a.get(k):
                why.append(f"adapter {k}")
        if a.get("bias", "none") != "none":
            why.append("adapter bias")
        if not set(a.get("target_modules") or ()) <= set(LORA_MODULES):
            why.append(f"adapter targets {sorted(set(a.get('target_modules') or ()) - set(LORA_MODULES))}")
    return why


def select_decoder(cfg: dict, adapter_cfgs: list[dict]) -> tuple[str, list[str]]:
    """("ledger", []) when the hand-written decoder covers the base and every adapter, else
    ("transformers", [what it does not cover])."""
    why = _fast_unsupported(cfg, adapter_cfgs)
    return ("transformers" if why else "ledger"), why


# --- reading a generation's weights --------------------------------------------------------------
def _files(store, tree_id: str) -> dict[str, str]:
    return {e["path"]: e["id"] for e in trees.tree_entries(store, tree_id)}


def adapter_config(store, adapter_id: str) -> dict:
    files = _files(store, adapter_id)
    missing = [f for f in ADAPTER_FILES if f not in files]
    if missing:
        raise BadInput(f"{adapter_id} is not an adapter (it lacks {', '.join(missing)})")
    cfg = store.get_json(files["adapter_config.json"])
    if not isinstance(cfg, dict):
        raise BadInput(f"adapter {adapter_id}: adapter_config.json is not an object")
    return cfg


def _export(store, oid: str, dest: Path) -> Path:
    if not dest.exists():
        dest.parent.mkdir(parents=True, exist_ok=True)
        store.export_file(oid, dest)   # verified while copying
    return dest


@dataclass(frozen=True)
class Shape:
    vocab: int
    hidden: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    eps: float
    theta: float
    tied: bool
    max_positions: int

    @classmethod
    def of(cls, cfg: dict) -> "Shape":
        a = modellib.arch_of(cfg)
        return cls(a.vocab, a.hidden, a.layers, a.heads, a.kv_heads, a.head_dim, float(cfg.get("rms_norm_eps", 1e-6)),
                   float((cfg.get("rope_parameters") or {}).get("rope_theta") or cfg.get("rope_theta") or 10000.0),
                   a.tied, min(a.max_positions, MAX_CONTEXT))


class FastLlama:
    """The "ledger" realization: plain torch, merged LoRA weights, preallocated KV cache."""

    name = "ledger"

    def __init__(self, base_sd: dict, shape: Shape):
        import torch

        self.torch = torch
        self.shape = s = shape
        g = lambda k: base_sd[k].to(torch.float32).contiguous()  # noqa: E731
        try:
            self.base = {"embed": g("model.embed_tokens.weight"), "norm": g("model.norm.weight"),
                         "head": g("model.embed_tokens.weight") if s.tied else g("lm_head.weight"), "layers": []}
            for i in range(s.layers):
                p = f"model.layers.{i}."
                layer = {"ln1": g(p + "input_layernorm.weight"), "ln2": g(p + "post_attention_layernorm.weight")}
                for m, block in LORA_MODULES.items():
                    layer[m] = g(f"{p}{block}.{m}.weight")
                self.base["layers"].append(self._fuse(layer))
        except KeyError as e:
            raise BadInput(f"base weights lack {e.args[0]}", "the base is not a Llama checkpoint ledger can serve") from None
        # RoPE tables for every position, computed as transformers does (float32, default rope).
        inv = 1.0 / (s.theta ** (torch.arange(0, s.head_dim, 2, dtype=torch.int64).float() / s.head_dim))
        freqs = torch.outer(torch.arange(s.max_positions, dtype=torch.float32), inv)
        emb = torch.cat((freqs, freqs), dim=-1)
        self.cos, self.sin = emb.cos(), emb.sin()
        self.k_cache = torch.zeros(s.layers, s.kv_heads, s.max_positions, s.head_dim)
        self.v_cache = torch.zeros_like(self.k_cache)

    def _fuse(self, layer: dict) -> dict:
        """One matmul for q, k, v and one for gate, up: fewer, larger ops per decoded byte."""
        torch = self.torch
        layer["qkv"] = torch.cat([layer["q_proj"], layer["k_proj"], layer["v_proj"]]).T.contiguous()
        layer["gu"] = torch.cat([layer["gate_proj"], layer["up_proj"]]).T.contiguous()
        layer["o"], layer["down"] = layer["o_proj"].T.contiguous(), layer["down_proj"].T.contiguous()
        return layer

    def merged(self, lora_sd: dict | None, cfg: dict | None) -> dict:
        """Base weights with the adapter folded in: W + (alpha / r) * B @ A per targeted module."""
        if lora_sd is None:
            return self.base
        torch = self.torch
        scaling = float(cfg["lora_alpha"]) / int(cfg["r"])
        out = {k: v for k, v in self.base.items() if k != "layers"}
        out["layers"] = []
        used = 0
        for i, layer in enumerate(self.base["layers"]):
            new = dict(layer)
            for m, block in LORA_MODULES.items():
                key = f"base_model.model.model.layers.{i}.{block}.{m}"
                a, b = lora_sd.get(key + ".lora_A.weight"), lora_sd.get(key + ".lora_B.weight")
                if a is None and b is None:
                    continue
                if a is None or b is None:
                    raise BadInput(f"adapter has only one of lora_A / lora_B for {key}")
                new[m] = (layer[m] + scaling * (b.to(torch.float32) @ a.to(torch.float32))).contiguous()
                used += 2
            out["layers"].append(self._fuse(new))
        if used != sum(1 for k in lora_sd if ".lora_A." in k or ".lora_B." in k):
            raise BadInput("adapter holds LoRA weights for modules this decoder does not know")
        return out

    def _rms(self, x, w):
        torch = self.torch
        return w * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.shape.eps))

    def _rot(self, x, cos, sin):
        torch = self.torch
        h = x.shape[-1] // 2
        return x * cos + torch.cat((-x[..., h:], x[..., :h]), dim=-1) * sin

    def _step(self, W, ids, pos0: int):
        """Logits of the last position after feeding `ids` at positions pos0.. (cache updated)."""
        torch, s = self.torch, self.shape
        F = torch.nn.functional
        T = ids.shape[0]
        x = W["embed"][ids]
        cos, sin = self.cos[pos0:pos0 + T], self.sin[pos0:pos0 + T]
        end = pos0 + T
        rep = s.heads // s.kv_heads
        nq, nkv = s.heads * s.head_dim, s.kv_heads * s.head_dim
        for i, L in enumerate(W["layers"]):
            h = self._rms(x, L["ln1"])
            qkv = h @ L["qkv"]
            q = qkv[:, :nq].view(T, s.heads, s.head_dim).transpose(0, 1)
            k = qkv[:, nq:nq + nkv].view(T, s.kv_heads, s.head_dim).transpose(0, 1)
            v = qkv[:, nq + nkv:].view(T, s.kv_heads, s.head_dim).transpose(0, 1)
            q, k = self._rot(q, cos, sin), self._rot(k, cos, sin)
            self.k_cache[i, :, pos0:end] = k
            self.v_cache[i, :, pos0:end] = v
            K, V = self.k_cache[i, :, :end], self.v_cache[i, :, :end]
            if rep > 1:
                K, V = K.repeat_interleave(rep, dim=0), V.repeat_interleave(rep, dim=0)
            a = F.scaled_dot_product_attention(q, K, V, is_causal=T > 1)
            x = x + a.transpose(0, 1).reshape(T, nq) @ L["o"]
            h = self._rms(x, L["ln2"])
            gu = h @ L["gu"]
            half = gu.shape[-1] // 2
            x = x + (F.silu(gu[:, :half]) * gu[:, half:]) @ L["down"]
        return self._rms(x[-1], W["norm"]) @ W["head"].T

    def logits(self, W, ids: list[int]):
        """Logits at every position of `ids` (for the equivalence test), from an empty cache."""
        torch = self.torch
        with torch.inference_mode():
            return torch.stack([self._step(W, torch.tensor(ids[: t + 1]), 0) for t in range(len(ids))])

    def greedy(self, W, ids: list[int], max_new: int, stop: frozenset) -> list[int]:
        torch = self.torch
        out: list[int] = []
        with torch.inference_mode():
            logits = self._step(W, torch.tensor(ids), 0)
            pos = len(ids)
            for _ in range(max_new):
                nxt = int(logits.argmax())
                if nxt in stop:
                    break
                out.append(nxt)
                if len(out) == max_new:
                    break
                logits = self._step(W, torch.tensor([nxt]), pos)
                pos += 1
        return out


class HFLlama:
    """The "transformers" realization: LlamaForCausalLM, each adapter attached by name (peft)."""

    name = "transformers"

    def __init__(self, base_dir: Path, max_positions: int):
        import torch
        from transformers import LlamaForCausalLM

        self.torch = torch
        self.model = LlamaForCausalLM.from_pretrained(str(base_dir), dtype=torch.float32, local_files_only=True).eval()
        self.names: dict[str, str] = {}
        self.shape_max = max_positions

    def merged(self, adapter_dir: Path | None, adapter_id: str | None):
        if adapter_id is None or adapter_id in self.names:
            return adapter_id
        name = f"a{len(self.names)}"
        if not self.names:
            from peft import PeftModel

            self.model = PeftModel.from_pretrained(self.model, str(adapter_dir), adapter_name=name, is_trainable=False).eval()
        else:
            self.model.load_adapter(str(adapter_dir), adapter_name=name, is_trainable=False)
        self.names[adapter_id] = name
        return adapter_id

    def _net(self, adapter_id):

        if adapter_id is None:
            return self.model.disable_adapter() if self.names else contextlib.nullcontext(self.model)
        self.model.set_adapter(self.names[adapter_id])
        return contextlib.nullcontext(self.model)

    def logits(self, adapter_id, ids: list[int]):
        torch = self.torch
        with torch.inference_mode(), self._net(adapter_id) as net:
            ctx = net if net is not None else self.model
            return ctx(input_ids=torch.tensor([ids])).logits[0].float()

    def greedy(self, adapter_id, ids: list[int], max_new: int, stop: frozenset) -> list[int]:
        from transformers import DynamicCache

        torch = self.torch
        out: list[int] = []
        with torch.inference_mode(), self._net(adapter_id) as net:
            m = net if net is not None else self.model
            cache = DynamicCache()
            x = torch.tensor([ids])
            for _ in range(max_new):
                nxt = int(m(input_ids=x, cache=cache, use_cache=True, logits_to_keep=1).logits[0, -1].argmax())
                if nxt in stop:
                    break
                out.append(nxt)
                x = torch.tensor([[nxt]])
        return out


class Model:
    """One base in memory and the adapters of the generations served so far, by adapter id.

    `use(adapter_id)` switches generations (merging an adapter the first time it is used);
    `generate(situation, max_new)` returns the action text and the number of tokens generated."""

    def __init__(self, store, base_id: str, work: Path, adapters=(), decoder: str | None = None):
        manifest = modellib.load_manifest(store, base_id)
        # the base's pinned tokenizer and chat template: prompts, stop tokens and decoding
        self.chat = templatelib.for_base(store, manifest)
        self.store, self.base_id, self.work = store, base_id, Path(work)
        self.cfg = manifest["config"]
        self.shape = Shape.of(self.cfg)
        adapter_cfgs = [adapter_config(store, a) for a in adapters if a]
        chosen, self.why = select_decoder(self.cfg, adapter_cfgs)
        self.decoder = decoder or chosen
        if self.decoder in ("ledger", *CUDA_DECODERS) and self.why:
            raise BadInput(f"the {self.decoder} decoder does not cover: " + ", ".join(self.why),
                           "use decoder 'transformers'")
        files = _files(store, manifest["files"])
        base_dir = self.work / "base"
        for name, oid in files.items():
            _export(store, oid, base_dir / name)
        if self.decoder == "ledger":
            from safetensors.torch import load_file

            self.impl = FastLlama(load_file(str(base_dir / modellib.WEIGHTS_FILE)), self.shape)
        elif self.decoder in CUDA_DECODERS:
            # asked for by name only (ServeOptions.decoder): the adapter merged, the base in the
            # named format, ledger's decode kernels on the GPU (ledger.image.cuda_decode)
            from safetensors.torch import load_file

            from ledger.image import cuda_decode  # torch + cupy on a GPU: only for this decoder

            self.impl = cuda_decode.CudaLlama(load_file(str(base_dir / modellib.WEIGHTS_FILE)), self.shape,
                                              CUDA_DECODERS[self.decoder], context=self.shape.max_positions)
        elif self.decoder == "transformers":
            self.impl = HFLlama(base_dir, self.shape.max_positions)
        else:
            raise BadInput(f"unknown decoder {self.decoder!r}",
                           f"use 'ledger', 'transformers' or one of {', '.join(CUDA_DECODERS)}")
        self._weights: dict[str | None, object] = {}
        self.adapter: str | None = None
        self.use(None)

    def _load_adapter(self, adapter_id: str):
        files = _files(self.store, adapter_id)
        d = self.work / "adapters" / adapter_id[3:19]
        for name in ADAPTER_FILES:
            _export(self.store, files[name], d / name)
        cfg = json.loads((d / "adapter_config.json").read_text())
        if cfg.get("base_model_name_or_path") not in (None, self.base_id):
            raise BadInput(f"adapter {adapter_id} was trained on another base ({cfg.get('base_model_name_or_path')})")
        if self.decoder == "ledger" or self.decoder in CUDA_DECODERS:
            why = _fast_unsupported(self.cfg, [cfg])
            if why:
                raise BadInput(f"adapter {adapter_id} needs what the ledger decoder does not cover: {', '.join(why)}",
                               "restart the image; it selects the transformers decoder for this adapter")
            from safetensors.torch import load_file

            return self.impl.merged(load_file(str(d / "adapter_model.safetensors")), cfg)
        return self.impl.merged(d, adapter_id)

    def use(self, adapter_id: str | None) -> None:
        if adapter_id not in self._weights:
            self._weights[adapter_id] = self.impl.merged(None, None) if adapter_id is None else self._load_adapter(adapter_id)
        self.adapter = adapter_id

    def generate(self, situation: str, max_new: int = MAX_NEW) -> tuple[str, int]:
        ids = self.generate_ids(situation, max_new)
        return self.chat.tokenizer.decode(ids), len(ids)

    def generate_ids(self, situation: str, max_new: int = MAX_NEW) -> list[int]:
        """The greedy answer's token ids, without the end-of-turn token that stopped it."""
        prompt = self.chat.prompt_ids(situation)
        check_fits(prompt, max_new, self.shape.max_positions)
        return self.impl.greedy(self._weights[self.adapter], prompt, max_new, self.chat.stop_ids)

    def logits(self, situation: str, action: str = ""):
        ids = self.chat.prompt_ids(situation) + self.chat.tokenizer.encode(action)
        return self.impl.logits(self._weights[self.adapter], ids)
