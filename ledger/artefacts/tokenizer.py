"""Tokenizers as artefacts: one interface, two implementations.

* `ByteTokenizer` -- the built-in model's: 256 byte tokens plus <pad>=256, <bos>=257, <eos>=258,
  <sep>=259. Stateless; its definition is its identity.
* `HFTokenizer` -- a base's own tokenizer: a Hugging Face `tokenizer.json` (from a model
  directory, or converted from the vocabulary and merges embedded in a GGUF file by
  transformers' GGUF loader at import) plus the special tokens its config names.

Both answer the same questions -- `id`, `vocab_size`, `encode`, `encode_offsets`, `decode`,
`bos_id`/`eos_id`/`pad_id`, `special_ids`, `plain_sep` -- so the trainer, the scorer, DPO and the
image each have one code path for every base.

Identity and storage. A tokenizer's **definition** is canonical JSON; its id is the hash of that
JSON, which is exactly the object `put` stores. An HF definition names its `tokenizer.json` by
object id, so the id covers every byte of the vocabulary and merges. A base manifest pins its
tokenizer by this id, and so do plans, receipts, suites and the image. Encoding never adds
special tokens on its own (`add_special_tokens=False`): the chat template (template.py) or the
plain format places them, so what a turn's ids are is decided in one place.

The plain format (a base without a chat template; the built-in model always) lives here because
it is the tokenizer's own layout: `[<bos>] situation <sep> action <eos>`, where <sep> is the
byte tokenizer's <sep> token and an HF tokenizer's encoding of "\\n". The ACTION SPAN is the
action tokens plus the final <eos>: training puts its loss there and the gate scores there
(docs/gate.md), so a model learns to stop, and cannot lower its score by learning the situation.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

from ledger.errors import BadInput
from ledger.store import canonical
from ledger.store.ids import hash_bytes, is_id

PAD, BOS, EOS, SEP = 256, 257, 258, 259
VOCAB_SIZE = 260
IGNORE = -100  # label value torch's cross-entropy skips
MAX_TOKENIZER_JSON = 64 << 20  # a real tokenizer.json is a few MB; refuse to parse more
DEFINITION_FILE = "tokenizer-definition.json"  # how a tokenizer travels into a child's inputs
HF_FILE = "tokenizer.json"


class TokenizerMismatch(BadInput):
    """A tokenizer whose ids do not fit the model it is paired with (its vocabulary is larger
    than the embedding, or a special token it needs is missing)."""
    default_hint = "import the model with the tokenizer it was trained with"


# --- the byte tokenizer -------------------------------------------------------------------------
@dataclass(frozen=True)
class ByteTokenizer:
    """Bytes 0..255 are themselves; specials follow. Stateless: its definition is its identity."""

    vocab_size = VOCAB_SIZE
    pad_id = PAD
    bos_id = BOS
    eos_id = EOS
    special_ids = frozenset({PAD, BOS, EOS, SEP})

    def definition(self) -> dict:
        return {"kind": "tokenizer", "type": "byte", "version": 1, "vocab_size": VOCAB_SIZE,
                "specials": {"pad": PAD, "bos": BOS, "eos": EOS, "sep": SEP},
                "template": "<bos>{situation}<sep>{action}<eos>", "action_span": "action bytes and <eos>"}

    @property
    def id(self) -> str:
        return hash_bytes(canonical.dumps(self.definition()))

    @property
    def plain_sep(self) -> tuple[int, ...]:
        return (SEP,)

    def encode(self, text: str) -> list[int]:
        return list(text.encode("utf-8"))

    def encode_offsets(self, text: str) -> tuple[list[int], list[tuple[int, int]]]:
        """Ids and, per id, the (start, end) character span of the character its byte belongs to."""
        ids, offs = [], []
        for i, ch in enumerate(text):
            b = ch.encode("utf-8")
            ids.extend(b)
            offs.extend([(i, i + 1)] * len(b))
        return ids, offs

    def decode(self, ids) -> str:
        return bytes(i for i in ids if 0 <= i < 256).decode("utf-8", "replace")

    def token_text(self, i: int) -> str:
        return {PAD: "<pad>", BOS: "<bos>", EOS: "<eos>", SEP: "<sep>"}.get(i) or self.decode([i])


# --- Hugging Face tokenizers ----------------------------------------------------------------------
def _hf_backend(data: bytes):
    """A `tokenizers.Tokenizer` from tokenizer.json bytes, without its post-processor.

    The post-processor only adds special tokens (never wanted: see the module doc) and trims
    byte-level offsets (which would move a token's span off the whitespace it covers); with it
    removed, ids are unchanged and offsets are the exact character spans the cut needs."""
    from tokenizers import Tokenizer  # lazy: heavy-ish, and not needed by the byte path

    if len(data) > MAX_TOKENIZER_JSON:
        raise BadInput(f"tokenizer.json is {len(data)} bytes, larger than the {MAX_TOKENIZER_JSON} ledger reads")
    try:
        tk = Tokenizer.from_str(data.decode("utf-8"))
    except Exception as e:  # tokenizers raises a bare Exception on bad JSON (and UnicodeDecodeError)
        raise BadInput(f"tokenizer.json is not a tokenizer the `tokenizers` library can read: {str(e)[:200]}") from None
    tk.post_processor = None
    return tk


@dataclass(frozen=True)
class HFTokenizer:
    """A `tokenizers`-backed tokenizer: tokenizer.json bytes + the names of its special tokens."""
    data: bytes = field(repr=False)
    specials: dict  # {"bos": str|None, "eos": str, "pad": str|None}: token texts from the config
    _tk: object = field(default=None, repr=False, compare=False)

    def __post_init__(self):
        tk = _hf_backend(self.data)
        object.__setattr__(self, "_tk", tk)
        vocab = tk.get_vocab(with_added_tokens=True)
        if not self.specials.get("eos"):
            raise TokenizerMismatch("the tokenizer's config names no end-of-sequence token",
                                    "a base needs an eos token so a trained model can stop")
        for role, text in sorted(self.specials.items()):
            if text is not None and text not in vocab:
                raise TokenizerMismatch(f"the tokenizer's {role} token {text!r} is not in its vocabulary")
        object.__setattr__(self, "_vocab_size", max(vocab.values()) + 1)
        object.__setattr__(self, "_special_ids",
                           frozenset(t.id for t in _added_tokens(self.data) if t.special))

    def definition(self) -> dict:
        ids = {role: (None if t is None else self._tk.token_to_id(t)) for role, t in sorted(self.specials.items())}
        return {"kind": "tokenizer", "type": "hf", "version": 1, "tokenizer_json": hash_bytes(self.data),
                "vocab_size": self.vocab_size, "special_tokens": dict(sorted(self.specials.items())),
                "specials": ids, "add_special_tokens": False}

    @property
    def id(self) -> str:
        return hash_bytes(canonical.dumps(self.definition()))

    @property
    def vocab_size(self) -> int:
        return self._vocab_size

    @property
    def special_ids(self) -> frozenset:
        return self._special_ids

    @property
    def bos_id(self) -> int | None:
        b = self.specials.get("bos")
        return None if b is None else self._tk.token_to_id(b)

    @property
    def eos_id(self) -> int:
        return self._tk.token_to_id(self.specials["eos"])

    @property
    def pad_id(self) -> int:
        p = self.specials.get("pad")
        return self.eos_id if p is None else self._tk.token_to_id(p)

    @property
    def plain_sep(self) -> tuple[int, ...]:
        return tuple(self.encode("\n"))

    def encode(self, text: str) -> list[int]:
        return self._tk.encode(text, add_special_tokens=False).ids

    def encode_offsets(self, text: str) -> tuple[list[int], list[tuple[int, int]]]:
        e = self._tk.encode(text, add_special_tokens=False)
        return e.ids, [tuple(o) for o in e.offsets]

    def decode(self, ids) -> str:
        return self._tk.decode(list(ids), skip_special_tokens=True)

    def token_id(self, text: str) -> int | None:
        return self._tk.token_to_id(text)

    def token_text(self, i: int) -> str:
        return self._tk.id_to_token(i) or ""


@dataclass(frozen=True)
class _Added:
    id: int
    content: str
    special: bool


def _added_tokens(data: bytes) -> list[_Added]:
    try:
        added = json.loads(data).get("added_tokens") or []
        return [_Added(int(t["id"]), str(t["content"]), bool(t.get("special"))) for t in added]
    except (ValueError, TypeError, KeyError, AttributeError):
        raise BadInput("tokenizer.json has a malformed added_tokens list") from None


def hf_specials(config: dict) -> dict:
    """The special-token texts of a tokenizer_config.json (an entry may be a string or an
    AddedToken-shaped {"content": ...} object)."""
    def text(k):
        v = config.get(k)
        if isinstance(v, dict):
            v = v.get("content")
        return v if isinstance(v, str) and v else None

    return {"bos": text("bos_token"), "eos": text("eos_token"), "pad": text("pad_token")}


def check_fits(tok, embedding_rows: int, where: str) -> None:
    """Every id the tokenizer can produce must index a row of the embedding (and of lm_head)."""
    if tok.vocab_size > embedding_rows:
        raise TokenizerMismatch(f"{where}: the tokenizer has {tok.vocab_size} ids but the model's embedding has "
                                f"{embedding_rows} rows", "import the model with the tokenizer it was trained with")


# --- storage --------------------------------------------------------------------------------------
def put(tx, tok) -> str:
    """Store a tokenizer (its tokenizer.json blob first, then the definition naming it)."""
    if isinstance(tok, HFTokenizer):
        blob = tx.put_bytes(tok.data, "tokenizer-json")
        assert blob == tok.definition()["tokenizer_json"]
    oid = tx.put_json(tok.definition())
    assert oid == tok.id
    return oid


def from_definition(d: dict, data: bytes | None = None):
    """The tokenizer a definition describes (`data` = its tokenizer.json bytes for type hf).
    The rebuilt tokenizer must have exactly this definition, or it is not the one pinned."""
    if not isinstance(d, dict) or d.get("kind") != "tokenizer":
        raise BadInput("not a tokenizer definition")
    if d.get("type") == "byte":
        tok = ByteTokenizer()
        if d != tok.definition():
            raise BadInput("unknown byte tokenizer definition", "this ledger knows byte tokenizer version 1")
        return tok
    if d.get("type") == "hf" and d.get("version") == 1:
        if data is None or hash_bytes(data) != d.get("tokenizer_json"):
            raise BadInput("the tokenizer.json given is not the one the definition names")
        specials = d.get("special_tokens")
        if not isinstance(specials, dict):
            raise BadInput("tokenizer definition lacks special_tokens")
        tok = HFTokenizer(data, {k: specials.get(k) for k in ("bos", "eos", "pad")})
        if tok.definition() != d:
            raise BadInput("the tokenizer rebuilt from its definition does not match it",
                           "the definition was written by another version of ledger or tampered with")
        return tok
    raise BadInput(f"unknown tokenizer type {d.get('type')!r}", "this ledger knows byte (v1) and hf (v1) tokenizers")


def load(store, tok_id: str):
    """The tokenizer stored under `tok_id`."""
    d = store.get_json(tok_id)
    data = None
    if isinstance(d, dict) and d.get("type") == "hf":
        blob = d.get("tokenizer_json")
        if not (isinstance(blob, str) and is_id(blob)):
            raise BadInput(f"tokenizer {tok_id} names no tokenizer.json object")
        data = store.get_bytes(blob)
    return from_definition(d, data)


def write_folder(tok, dest: Path) -> None:
    """The tokenizer as files a child or the image reads back with `read_folder`."""
    dest.mkdir(parents=True, exist_ok=True)
    (dest / DEFINITION_FILE).write_bytes(canonical.dumps(tok.definition()))
    if isinstance(tok, HFTokenizer):
        (dest / HF_FILE).write_bytes(tok.data)


def read_folder(src: Path, want_id: str | None = None):
    """The tokenizer `write_folder` wrote; `want_id` (the plan's pin) must match."""
    try:
        d = canonical.loads((src / DEFINITION_FILE).read_bytes())
        data = (src / HF_FILE).read_bytes() if d.get("type") == "hf" else None
    except (OSError, AttributeError) as e:
        raise BadInput(f"cannot read the tokenizer in {src}: {e}") from None
    tok = from_definition(d, data)
    if want_id is not None and tok.id != want_id:
        raise BadInput(f"the tokenizer handed over is {tok.id}, the plan pins {want_id}")
    return tok


# --- the plain format ---------------------------------------------------------------------------------
@dataclass(frozen=True)
class EncodedTurn:
    ids: tuple[int, ...]
    action_start: int  # index of the first action token in ids
    action_end: int    # one past the end-of-turn token that closes the action

    def labels(self) -> list[int]:
        """Next-token targets aligned with ids (HF shifts internally): only the action span counts."""
        return [t if self.action_start <= i < self.action_end else IGNORE for i, t in enumerate(self.ids)]


def check_len(n: int, max_len: int | None) -> None:
    if max_len is not None and n > max_len:
        # Truncating would silently cut the action span the gate scores: refuse instead.
        raise BadInput(f"a turn needs {n} tokens but the sequence length is {max_len}",
                       "raise data.seq_len in the spec, or shorten the turns")


def plain_prompt(tok, situation: str) -> list[int]:
    """What precedes the action in the plain format: `[<bos>] situation <sep>`."""
    bos = [] if tok.bos_id is None else [tok.bos_id]
    return [*bos, *tok.encode(situation), *tok.plain_sep]


def encode_turn(tok, situation: str, action: str, max_len: int | None = None) -> EncodedTurn:
    """A turn in the plain format; the span is the action tokens and the closing <eos>."""
    p, a = plain_prompt(tok, situation), tok.encode(action)
    ids = [*p, *a, tok.eos_id]
    check_len(len(ids), max_len)
    return EncodedTurn(ids=tuple(ids), action_start=len(p), action_end=len(ids))
