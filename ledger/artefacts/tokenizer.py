"""The byte-level tokenizer of the built-in model, and how a turn becomes tokens.

256 byte tokens plus four specials. Its identity is the hash of its canonical definition (the
same JSON object that is stored), so anything scored or trained with it can name it.

A turn is encoded as  <bos> situation-bytes <sep> action-bytes <eos>.  The ACTION SPAN is the
action bytes only (not <sep>, not <eos>): training puts its loss there and the gate scores
there (GATE.md), so a model cannot lower its score by learning the situation or the framing.
`encode_turn` is the one place that cuts the span; trainer and scorer both call it.
"""

from __future__ import annotations

from dataclasses import dataclass

from ledger.errors import BadInput
from ledger.store import canonical
from ledger.store.ids import hash_bytes

PAD, BOS, EOS, SEP = 256, 257, 258, 259
VOCAB_SIZE = 260
IGNORE = -100  # label value torch's cross-entropy skips


@dataclass(frozen=True)
class ByteTokenizer:
    """Bytes 0..255 are themselves; specials follow. Stateless: its definition is its identity."""

    def definition(self) -> dict:
        return {"kind": "tokenizer", "type": "byte", "version": 1, "vocab_size": VOCAB_SIZE,
                "specials": {"pad": PAD, "bos": BOS, "eos": EOS, "sep": SEP},
                "template": "<bos>{situation}<sep>{action}<eos>", "action_span": "action bytes only"}

    @property
    def id(self) -> str:
        return hash_bytes(canonical.dumps(self.definition()))

    vocab_size = VOCAB_SIZE
    pad_id = PAD

    def encode(self, text: str) -> list[int]:
        return list(text.encode("utf-8"))

    def decode(self, ids) -> str:
        return bytes(i for i in ids if 0 <= i < 256).decode("utf-8", "replace")


@dataclass(frozen=True)
class EncodedTurn:
    ids: tuple[int, ...]
    action_start: int  # index of the first action token in ids
    action_end: int    # one past the last action token

    def labels(self) -> list[int]:
        """Next-token targets aligned with ids (HF shifts internally): only the action span counts."""
        return [t if self.action_start <= i < self.action_end else IGNORE for i, t in enumerate(self.ids)]


def encode_turn(tok: ByteTokenizer, situation: str, action: str, max_len: int | None = None) -> EncodedTurn:
    s, a = tok.encode(situation), tok.encode(action)
    ids = [BOS, *s, SEP, *a, EOS]
    if max_len is not None and len(ids) > max_len:
        # Truncating would silently cut the action span the gate scores: refuse instead.
        raise BadInput(f"a turn needs {len(ids)} tokens but the sequence length is {max_len}",
                       "raise data.seq_len in the spec, or shorten the turns")
    return EncodedTurn(ids=tuple(ids), action_start=len(s) + 2, action_end=len(s) + 2 + len(a))


def from_definition(d: dict) -> ByteTokenizer:
    tok = ByteTokenizer()
    if d != tok.definition():
        raise BadInput("unknown tokenizer definition", "this ledger knows only the byte tokenizer (version 1)")
    return tok
