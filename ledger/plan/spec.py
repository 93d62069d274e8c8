"""Experiment specs: TOML in, a normalised closed configuration out.

Every field the trainer reads is declared in SCHEMA with its type, default and bounds, so a
spec is either fully understood or refused: an unknown field, a wrong type or a value out of
range raises SpecError naming the dotted field and the line it is on. Normalising fills every
default, so the stored configuration is closed -- two specs that mean the same run have the
same canonical JSON and the same id, and adding a default later cannot change an old plan.
"""

from __future__ import annotations

import math
import re
import tomllib
from dataclasses import dataclass, field
from pathlib import Path

from ledger.artefacts.builtin_task import BUILTIN_BASE, BUILTIN_DATASET  # noqa: F401  (re-exported: specs name them)
from ledger.errors import SpecError
from ledger.store import canonical, fsio
from ledger.store.ids import hash_bytes

LLAMA_MODULES = ("down_proj", "gate_proj", "k_proj", "o_proj", "q_proj", "up_proj", "v_proj")
DTYPES = ("fp32", "bf16", "fp16")
BASE_QUANTS = ("none", "q4b32", "int8")   # ledger.plan.memory.BASE_QUANTS
MAX_SPEC_FILE = 16 << 20   # a spec is a few KiB of TOML; more is not a spec (and is refused unread)
MAX_WORLD = 1024   # ranks of one data-parallel run (nodes x devices): gloo's and torchrun's tested scale
REALIZATIONS = ("auto", "torch-eager", "torch-compiled", "cupy-fused", "fused-lora", "fp8-base")


@dataclass(frozen=True)
class F:
    """One field: type, default (None = optional, absent from the run), and a bound check."""
    type: str                      # int | float | str | bool | str-list | float-pair
    default: object
    check: object = None           # callable(value) -> error text or None
    choices: tuple = ()


def _pos(v):
    return None if v > 0 else "must be > 0"


def _nonneg(v):
    return None if v >= 0 else "must be >= 0"


def _unit(v):
    return None if 0 <= v < 1 else "must be in [0, 1)"


def _frac(v):
    return None if 0 < v <= 1 else "must be in (0, 1]"


def _betas(v):
    return None if all(0 <= b < 1 for b in v) else "both betas must be in [0, 1)"


def _modules(v):
    bad = sorted(set(v) - set(LLAMA_MODULES))
    if bad:
        return f"unknown modules {bad}; known: {', '.join(LLAMA_MODULES)}"
    if not v:
        return "must name at least one module"
    return None


SCHEMA: dict[str, dict[str, F]] = {
    "model": {
        "base": F("str", BUILTIN_BASE),
        # Shape of the built-in model only (an imported base brings its own config).
        "hidden": F("int", 64, _pos), "layers": F("int", 2, _pos), "heads": F("int", 4, _pos),
        "kv_heads": F("int", 4, _pos), "intermediate": F("int", 176, _pos),
        "max_positions": F("int", 128, _pos), "init_seed": F("int", 0, _nonneg),
    },
    "lora": {
        "r": F("int", 8, _pos), "alpha": F("float", 16.0, _pos), "dropout": F("float", 0.0, _unit),
        "target_modules": F("str-list", list(LLAMA_MODULES), _modules),
        # An adapter (tree id or name) to start from instead of a fresh LoRA init: the learn
        # cycle continues from HEAD's adapter. "" = fresh. Its shapes must match this section.
        "init_adapter": F("str", ""),
    },
    "optimizer": {
        "name": F("str", "adamw", choices=("adamw",)), "lr": F("float", 3e-3, _pos),
        "betas": F("float-pair", [0.9, 0.999], _betas), "eps": F("float", 1e-8, _pos),
        "weight_decay": F("float", 0.0, _nonneg),
    },
    "schedule": {
        "kind": F("str", "constant", choices=("constant", "linear", "cosine")),
        "warmup_steps": F("int", 0, _nonneg),
    },
    "data": {
        "dataset": F("str", BUILTIN_DATASET), "seq_len": F("int", 96, _pos),
        "micro_batch": F("int", 16, _pos), "grad_accum": F("int", 1, _pos), "steps": F("int", 100, _pos),
    },
    "seeds": {"lora_init": F("int", 0, _nonneg), "data": F("int", 0, _nonneg), "dropout": F("int", 0, _nonneg)},
    # base_quant: the frozen base's seven projections held in ledger's q4b32 or int8 format
    # (ledger.kernels.qlinear), dequantized per matmul; LoRA trains on top (QLoRA's recipe).
    "precision": {"dtype": F("str", "fp32", choices=DTYPES), "base_quant": F("str", "none", choices=BASE_QUANTS)},
    "compile": {
        "target": F("str", "cpu"), "realization": F("str", "auto", choices=REALIZATIONS),
    },
    # devices: data-parallel processes per node, one per GPU (DDP over NCCL; gloo on a CPU
    # target); the memory plan is per device and data.micro_batch is per device. nodes: node
    # agents meeting at one torchrun c10d rendezvous (ledger.train.nodes); the world is
    # nodes x devices ranks.
    "train": {"threads": F("int", 1, _pos), "checkpoint_every": F("int", 25, _pos), "devices": F("int", 1, _pos),
              "nodes": F("int", 1, _pos)},
    "budget": {"memory_fraction": F("float", 0.9, _frac), "max_steps": F("int", None, _pos)},
}


@dataclass(frozen=True)
class Spec:
    """A normalised closed configuration. `.id` names it; `.source` keeps the TOML it came from."""
    config: dict
    source: str = field(default="", compare=False)

    def body(self) -> dict:
        return {"kind": "spec", "config": self.config}

    @property
    def id(self) -> str:
        return hash_bytes(canonical.dumps(self.body()))

    def get(self, dotted: str):
        sec, key = dotted.split(".", 1)
        return self.config[sec][key]

    def with_overrides(self, overrides: dict) -> "Spec":
        """A new spec with `{"section.field": value}` replaced (validated like TOML input)."""
        raw = {s: dict(v) for s, v in self.config.items()}
        for dotted, value in overrides.items():
            if "." not in dotted:
                raise SpecError(f"override {dotted!r}: name a field as section.field")
            sec, key = dotted.split(".", 1)
            raw.setdefault(sec, {})[key] = value
        return normalise(raw, "")


# --- line numbers --------------------------------------------------------------------------------
_HEADER = re.compile(r"^\s*\[\s*([^\[\]]+?)\s*\]\s*(#.*)?$")
_KEY = re.compile(r"^\s*([A-Za-z0-9_\-\.\"' ]+?)\s*=")


def _clean_key(k: str) -> str:
    return ".".join(p.strip().strip("\"'") for p in k.split("."))


def line_of(text: str, dotted: str) -> int | None:
    """The 1-based line where `dotted` (section.field, or a section) is written, if any."""
    table = ""
    for n, line in enumerate(text.splitlines(), 1):
        if m := _HEADER.match(line):
            table = _clean_key(m.group(1))
            if table == dotted:
                return n
            continue
        if m := _KEY.match(line):
            key = _clean_key(m.group(1))
            full = f"{table}.{key}" if table else key
            if full == dotted or full.startswith(dotted + ".") or dotted.startswith(full + "."):
                return n
    return None


def _err(text: str, dotted: str, msg: str) -> SpecError:
    ln = line_of(text, dotted)
    where = f" (line {ln})" if ln else ""
    return SpecError(f"spec field `{dotted}`{where}: {msg}", field=dotted, line=ln)


# --- typing --------------------------------------------------------------------------------------
def _coerce(f: F, v, name: str):
    """The value in its canonical type, or a string saying why not."""
    t = f.type
    if t == "int":
        if isinstance(v, bool) or not isinstance(v, int):
            return None, f"must be an integer, got {type(v).__name__} {v!r}"
        return v, None
    if t == "float":
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            return None, f"must be a number, got {type(v).__name__} {v!r}"
        v = float(v)
        if not math.isfinite(v):
            return None, f"must be finite, got {v!r}"
        return v, None
    if t == "str":
        if not isinstance(v, str):
            return None, f"must be a string, got {type(v).__name__} {v!r}"
        if f.choices and v not in f.choices:
            return None, f"must be one of {', '.join(f.choices)}; got {v!r}"
        return v, None
    if t == "bool":
        if not isinstance(v, bool):
            return None, f"must be true or false, got {v!r}"
        return v, None
    if t == "str-list":
        if not isinstance(v, list) or not all(isinstance(x, str) for x in v):
            return None, f"must be a list of strings, got {v!r}"
        if len(set(v)) != len(v):
            return None, "lists a module twice"
        return sorted(v), None  # order carries no meaning; sorting makes equal specs equal
    if t == "float-pair":
        if (not isinstance(v, list) or len(v) != 2
                or not all(isinstance(x, (int, float)) and not isinstance(x, bool) for x in v)):
            return None, f"must be a list of two numbers, got {v!r}"
        return [float(x) for x in v], None
    raise AssertionError(t)


def normalise(raw: dict, text: str = "") -> Spec:
    if not isinstance(raw, dict):
        raise SpecError("a spec must be a TOML table")
    for sec in raw:
        if sec not in SCHEMA:
            raise _err(text, sec, f"unknown section; known: {', '.join(SCHEMA)}")
        if not isinstance(raw[sec], dict):
            raise _err(text, sec, "must be a table ([section])")
    config: dict = {}
    for sec, fields in SCHEMA.items():
        given = raw.get(sec, {})
        for key in given:
            if key not in fields:
                raise _err(text, f"{sec}.{key}", f"unknown field; known in [{sec}]: {', '.join(fields)}")
        out = {}
        for key, f in fields.items():
            name = f"{sec}.{key}"
            if key not in given or (given[key] is None and f.default is None):  # optional, absent
                out[key] = f.default
                continue
            v, problem = _coerce(f, given[key], name)
            if problem is None and f.check is not None:
                problem = f.check(v)
            if problem:
                raise _err(text, name, problem)
            out[key] = v
        config[sec] = out
    _cross_checks(config, text)
    return Spec(config=config, source=text)


def _cross_checks(c: dict, text: str) -> None:
    m = c["model"]
    if m["hidden"] % m["heads"]:
        raise _err(text, "model.heads", f"hidden size {m['hidden']} is not divisible by {m['heads']} heads")
    if m["heads"] % m["kv_heads"]:
        raise _err(text, "model.kv_heads", f"{m['heads']} heads are not divisible into {m['kv_heads']} key/value heads")
    if (m["hidden"] // m["heads"]) % 2:
        raise _err(text, "model.heads", "head dimension must be even (rotary embeddings)")
    if c["data"]["seq_len"] > m["max_positions"] and m["base"] == BUILTIN_BASE:
        raise _err(text, "data.seq_len", f"{c['data']['seq_len']} exceeds model.max_positions {m['max_positions']}")
    if c["schedule"]["warmup_steps"] > c["data"]["steps"]:
        raise _err(text, "schedule.warmup_steps", "is longer than data.steps")
    world = c["train"]["devices"] * c["train"]["nodes"]
    if world > MAX_WORLD:
        raise _err(text, "train.nodes", f"{c['train']['nodes']} nodes x {c['train']['devices']} devices = {world} "
                                        f"ranks; at most {MAX_WORLD} are supported")
    mx = c["budget"]["max_steps"]
    if mx is not None and c["data"]["steps"] > mx:
        raise _err(text, "data.steps", f"{c['data']['steps']} steps exceed budget.max_steps {mx}")


def parse(text: str) -> Spec:
    try:
        raw = tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise SpecError(f"spec is not valid TOML: {e}") from None
    except RecursionError:   # arrays nested thousands deep: tomllib recurses per level
        raise SpecError("spec is not valid TOML: nested too deeply to parse") from None
    return normalise(raw, text)


def load(path: str | Path) -> Spec:
    p = Path(path)
    try:
        text = fsio.read_user_file(p, MAX_SPEC_FILE).decode("utf-8")
    except FileNotFoundError:
        raise SpecError(f"no spec file at {p}", "give the path of a TOML spec, e.g. examples/tiny.toml") from None
    except (OSError, UnicodeDecodeError, ValueError, fsio.NotRegular) as e:   # a FIFO is refused, not waited on
        raise SpecError(f"cannot read spec {p}: {e}", "give the path of a TOML spec file, e.g. examples/tiny.toml") from None
    return parse(text)


def from_body(body: dict) -> Spec:
    """A spec from its stored JSON body (re-validated: stored objects are inputs too)."""
    if not isinstance(body, dict) or body.get("kind") != "spec" or not isinstance(body.get("config"), dict):
        raise SpecError("object is not a spec")
    s = normalise(body["config"])
    if s.config != body["config"]:
        raise SpecError("stored spec is not in normalised form")
    return s
