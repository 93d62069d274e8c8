"""A typed, read-only view of a plan body.

The stored plan stays canonical JSON (its id is the hash of those bytes, plan/compile.py); this
module reads such a body ONCE into frozen dataclasses, so compile, the parent (train/run.py) and
the training child (train/child.py) use `plan.config.data.micro_batch` instead of string keys,
and a body of the wrong shape is refused where it is read, naming the field:

    plan field `shapes.micro_batch`: expected an integer, got "16"

Rules (docs/compile-train.md, "The plan view"):
- MUST: `Plan.from_json(body).to_json() == body` for every body compile writes, so the view
  never changes a plan's id (tested for the CPU, CUDA, DDP and fused shapes).
- MUST: an unknown field, a missing field or a value of the wrong type is a SpecError (exit 2)
  naming the dotted field; nothing is coerced (an int stays an int, so the id stays the same).
- Optional fields (`optional()`) are ones older plans of this version lack: ABSENT (falsy) when
  missing, which is not the same as a null that is there.
- Parts that only describe (requirements, fit checks, a realization's gate record) are kept as
  read (`Json`): nothing computes with them.
- No torch here: plan/ compiles on a machine without it.
"""

from __future__ import annotations

import dataclasses
import types
import typing
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Union

from ledger.artefacts.model import Arch
from ledger.errors import SpecError

PLAN_KIND = "plan"
PLAN_VERSION = 1

Json = object   # any JSON value, kept as read


class _Absent:
    """The value of an optional field the body does not have (falsy; to_json leaves it out)."""

    def __bool__(self) -> bool:
        return False

    def __repr__(self) -> str:
        return "ABSENT"


ABSENT = _Absent()


def optional():
    """A field older plans of this version lack: ABSENT when missing, left out again by to_json
    (distinct from a null that is there, so the body round-trips exactly)."""
    return field(default=ABSENT, metadata={"optional": True})


def _bad(path: str, what: str) -> SpecError:
    return SpecError(f"plan field `{path}`: {what}",
                     "the plan object is damaged or was written by another ledger version; compile the spec again",
                     field=path)


_TYPE_WORDS = {bool: "true or false", int: "an integer", float: "a number", str: "a string"}


def _convert(tp, v, path: str):
    if tp is object:
        return v
    if tp in _TYPE_WORDS:
        ok = (isinstance(v, bool) if tp is bool else
              isinstance(v, (int, float)) and not isinstance(v, bool) if tp is float else
              isinstance(v, int) and not isinstance(v, bool) if tp is int else isinstance(v, str))
        if not ok:
            raise _bad(path, f"expected {_TYPE_WORDS[tp]}, got {_show(v)}")
        return v
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin in (Union, types.UnionType):
        if v is None and type(None) in args:
            return None
        (inner,) = [a for a in args if a is not type(None)]
        return _convert(inner, v, path)
    if origin is tuple:
        if not isinstance(v, list):
            raise _bad(path, f"expected a list, got {_show(v)}")
        if len(args) == 2 and args[1] is Ellipsis:
            return tuple(_convert(args[0], x, f"{path}[{i}]") for i, x in enumerate(v))
        if len(v) != len(args):
            raise _bad(path, f"expected {len(args)} items, got {len(v)}")
        return tuple(_convert(a, x, f"{path}[{i}]") for i, (a, x) in enumerate(zip(args, v)))
    if origin in (dict, Mapping):
        if not isinstance(v, dict):
            raise _bad(path, f"expected an object, got {_show(v)}")
        return types.MappingProxyType({k: _convert(args[1], x, f"{path}.{k}") for k, x in sorted(v.items())})
    if dataclasses.is_dataclass(tp):
        return _build(tp, v, path)
    raise TypeError(f"plan view: no reader for {tp!r}")  # a bug in this module, not in the plan


def _show(v) -> str:
    text = repr(v) if not isinstance(v, str) else f'"{v}"'
    return text if len(text) <= 40 else text[:39] + "…"


def _build(cls, obj, path: str):
    if not isinstance(obj, dict):
        raise _bad(path or "(plan)", f"expected an object, got {_show(obj)}")
    hints = typing.get_type_hints(cls)
    fields = dataclasses.fields(cls)
    known = {f.name for f in fields}
    unknown = sorted(set(obj) - known)
    if unknown:
        where = f"{path}.{unknown[0]}" if path else unknown[0]
        raise _bad(where, f"unknown field; known here: {', '.join(sorted(known))}")
    kw = {}
    for f in fields:
        sub = f"{path}.{f.name}" if path else f.name
        if f.name not in obj:
            if f.metadata.get("optional"):
                continue
            raise _bad(sub, "missing")
        kw[f.name] = _convert(hints[f.name], obj[f.name], sub)
    return cls(**kw)


def _to_json(v):
    if dataclasses.is_dataclass(v):
        return {f.name: _to_json(getattr(v, f.name)) for f in dataclasses.fields(v)
                if getattr(v, f.name) is not ABSENT}
    if isinstance(v, tuple):
        return [_to_json(x) for x in v]
    if isinstance(v, Mapping):
        return {k: _to_json(x) for k, x in v.items()}
    return v


class _View:
    """from_json / to_json for every part of the plan."""

    @classmethod
    def from_json(cls, obj, path: str = ""):
        return _build(cls, obj, path)

    def to_json(self) -> dict:
        return _to_json(self)


# --- the closed config (plan/spec.py SCHEMA, one class a section) ---------------------------------
@dataclass(frozen=True)
class ModelConfig(_View):
    base: str
    hidden: int
    layers: int
    heads: int
    kv_heads: int
    intermediate: int
    max_positions: int
    init_seed: int


@dataclass(frozen=True)
class LoraConfig(_View):
    r: int
    alpha: float
    dropout: float
    target_modules: tuple[str, ...]
    init_adapter: str | None = optional()


@dataclass(frozen=True)
class OptimizerConfig(_View):
    name: str
    lr: float
    betas: tuple[float, float]
    eps: float
    weight_decay: float


@dataclass(frozen=True)
class ScheduleConfig(_View):
    kind: str
    warmup_steps: int


@dataclass(frozen=True)
class DataConfig(_View):
    dataset: str
    seq_len: int
    micro_batch: int
    grad_accum: int
    steps: int


@dataclass(frozen=True)
class SeedsConfig(_View):
    lora_init: int
    data: int
    dropout: int


@dataclass(frozen=True)
class PrecisionConfig(_View):
    dtype: str
    base_quant: str | None = optional()

    @property
    def base_format(self) -> str:
        """How the frozen base's projections are held: "none" (dense in dtype), "q4b32", "int8"."""
        return self.base_quant or "none"   # plans from before quantized bases: dense


@dataclass(frozen=True)
class CompileConfig(_View):
    target: str
    realization: str


@dataclass(frozen=True)
class TrainConfig(_View):
    threads: int
    checkpoint_every: int
    devices: int | None = optional()
    nodes: int | None = optional()

    @property
    def device_count(self) -> int:
        return self.devices or 1   # plans from before data-parallel runs: one device

    @property
    def node_count(self) -> int:
        return self.nodes or 1     # plans from before multi-node runs: one node


@dataclass(frozen=True)
class BudgetConfig(_View):
    memory_fraction: float
    max_steps: int | None


@dataclass(frozen=True)
class Config(_View):
    model: ModelConfig
    lora: LoraConfig
    optimizer: OptimizerConfig
    schedule: ScheduleConfig
    data: DataConfig
    seeds: SeedsConfig
    precision: PrecisionConfig
    compile: CompileConfig
    train: TrainConfig
    budget: BudgetConfig


# --- what compile derived ----------------------------------------------------------------------------
@dataclass(frozen=True)
class TargetRef(_View):
    name: str
    id: str
    device: str


@dataclass(frozen=True)
class Inputs(_View):
    base: str
    tokenizer: str
    dataset: str
    template: str | None = optional()       # the base's chat template object (artefacts/template.py)
    init_adapter: str | None = optional()


@dataclass(frozen=True)
class Shapes(_View):
    arch: Arch
    micro_batch: int
    seq_len: int
    grad_accum: int
    steps: int
    dataset_rows: int
    longest_turn: int | None
    lora_modules: Mapping[str, tuple[int, int]]
    padded: bool | None = optional()
    devices: int | None = optional()
    tokens_per_step: int | None = optional()
    nodes: int | None = optional()

    @property
    def lora_tensors(self) -> int:
        """LoRA weight tensors (A and B per adapted module per layer)."""
        return self.arch.layers * len(self.lora_modules) * 2


@dataclass(frozen=True)
class Parameters(_View):
    total: int
    base: int
    trainable: int
    by_group: Mapping[str, int]


@dataclass(frozen=True)
class MemoryLine(_View):
    name: str
    bytes: int
    formula: str
    per_micro_batch: bool


@dataclass(frozen=True)
class Memory(_View):
    lines: tuple[MemoryLine, ...]
    total_bytes: int

    def line(self, name: str) -> int:
        """Bytes of the line called `name` (0 when the plan has none)."""
        return next((x.bytes for x in self.lines if x.name == name), 0)


@dataclass(frozen=True)
class Realization(_View):
    name: str
    device: str
    requires: Json
    how: str | None = optional()
    not_selected: Json = optional()
    # cupy-fused only: the gated kernel build the run must load (ledger.kernels)
    kernel: str | None = optional()
    gate: Json = optional()
    build: str | None = optional()
    code_object: str | None = optional()
    arch: Json = optional()
    # fp8-base only: the tolerances its numerics gate holds it to (ledger.train.numerics)
    numerics_gate: Json = optional()


@dataclass(frozen=True)
class Fit(_View):
    fits: bool
    needed_bytes: int
    usable_bytes: int
    target_bytes: int
    memory_fraction: float
    headroom_bytes: int
    checks: Json
    memory_model: str | None = optional()
    devices: int | None = optional()
    per_device: bool | None = optional()
    nodes: int | None = optional()


@dataclass(frozen=True)
class Runtime(_View):
    threads: int
    deterministic: bool
    checkpoint_every: int
    loss: str
    loop: str | None = optional()
    devices: int | None = optional()
    autocast: str | None = optional()
    launcher: str | None = optional()
    nodes: int | None = optional()
    rendezvous: str | None = optional()

    @property
    def loop_kind(self) -> str:
        return self.loop or "eager"   # plans from before the compiled loop: eager


@dataclass(frozen=True)
class Plan(_View):
    """The whole plan body, typed. `Plan.from_json(body)` checks its shape."""
    kind: str
    version: int
    config: Config
    spec: str
    target: TargetRef
    inputs: Inputs
    shapes: Shapes
    parameters: Parameters
    memory: Memory
    realizations: Mapping[str, Realization]
    fit: Fit
    runtime: Runtime

    @classmethod
    def from_json(cls, obj, path: str = "") -> Plan:
        # what the object is comes first: a receipt read as a plan is named as such, not by its fields
        if not isinstance(obj, dict) or obj.get("kind") != PLAN_KIND:
            raise _bad("kind", f"expected \"{PLAN_KIND}\", got "
                               f"{_show(obj.get('kind') if isinstance(obj, dict) else obj)}")
        if obj.get("version") != PLAN_VERSION:
            raise _bad("version", f"this ledger reads plan version {PLAN_VERSION}, got {_show(obj.get('version'))}")
        return _build(cls, obj, path)

    @property
    def cuda(self) -> bool:
        return self.target.device == "cuda"

    @property
    def devices(self) -> int:
        """Devices (ranks) per node."""
        return self.config.train.device_count

    @property
    def nodes(self) -> int:
        return self.config.train.node_count

    @property
    def world(self) -> int:
        """Ranks of the data-parallel run: nodes x devices per node."""
        return self.nodes * self.devices

    def uses(self, realization: str) -> bool:
        """Whether any operator runs `realization` (e.g. "cupy-fused")."""
        return any(r.name == realization for r in self.realizations.values())
