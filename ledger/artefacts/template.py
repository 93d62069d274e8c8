"""Chat templates: how a turn becomes token ids, and where its action span is.

A template is an artefact: `{"kind": "chat-template", "version": 1, "format": "jinja", "source":
<the base's Jinja chat template>}` or the plain format `{"kind": "chat-template", "version": 1,
"format": "plain"}` (a base without a template, and the built-in model). Its id is the hash of that
object; a base manifest pins it next to its tokenizer, and plans, receipts and suite hashes name
it, so a suite scored under one template is never silently scored under another.

`Chat(tokenizer, template)` is the one encoder every stage uses (trainer, scorer, DPO, image):

* **jinja**: the turn is rendered as messages -- the situation as the user message, preceded by
  a system message when the situation has a system part (else the template adds its own system
  message, if it has one), the action as the assistant message --
  in a sandboxed Jinja environment set up like transformers' `apply_chat_template` (trim_blocks,
  lstrip_blocks, loop controls, `raise_exception`, the special tokens as variables; no clock, so
  a render is deterministic). The text is tokenized once; the action span is cut in TOKEN space
  from the tokens' character offsets: the tokens of the action text plus the end-of-turn token
  the template puts right after it (`<|im_end|>` for SmolLM2), so a trained model learns to stop.
  The prompt (`render(messages, add_generation_prompt=True)`) must be a prefix of the full text
  and its ids the ids before the span, so what the image feeds a model equals what it trained on.
* **plain**: `[<bos>] situation <sep> action <eos>` (tokenizer.encode_turn); span = action + <eos>.
  A system part is written before the user part, one line break between them.

A situation is a str (the user message) or a mapping {"system": str, "user": str} (`situation`
checks it): datasets carry the system part in an optional `system` column (ledger.artefacts.dataset).

Anything that breaks these rules -- a template that fails to render, that does not reproduce the
action verbatim, that merges prompt and action into one token, or that puts no special token
after the assistant message -- is a `TemplateError` (exit 2), never a silent other cut.

`fixed_text()` is the text every rendered turn shares by construction (the template's
boilerplate: system prompt, role headers); the contamination check must not count it as overlap.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field

from ledger.artefacts import tokenizer as toklib
from ledger.errors import BadInput
from ledger.store import canonical
from ledger.store.ids import hash_bytes

PLAIN = {"kind": "chat-template", "version": 1, "format": "plain"}
MAX_TEMPLATE = 256 << 10  # real chat templates are a few KB
# Two strings that never occur in a template's own text, used to find its fixed parts.
_PROBE_S, _PROBE_A = "\x00ledger-situation\x00", "\x00ledger-action\x00"


class TemplateError(BadInput):
    """A chat template that cannot render a turn the way training and scoring need."""
    default_hint = "check the base's chat template, or import the base without one (the plain format)"


def jinja_definition(source: str) -> dict:
    if not isinstance(source, str) or not source.strip():
        raise TemplateError("the chat template is empty")
    if len(source.encode("utf-8")) > MAX_TEMPLATE:
        raise TemplateError(f"the chat template is larger than {MAX_TEMPLATE} bytes")
    return {"kind": "chat-template", "version": 1, "format": "jinja", "source": source}


def template_id(definition: dict) -> str:
    return hash_bytes(canonical.dumps(definition))


def check_definition(d) -> dict:
    if d == PLAIN:
        return d
    if isinstance(d, dict) and set(d) == {"kind", "version", "format", "source"} \
            and (d["kind"], d["format"], d["version"]) == ("chat-template", "jinja", 1):
        return jinja_definition(d["source"])
    raise BadInput("not a chat-template definition this ledger knows", "known: plain (v1) and jinja (v1)")


def situation(value) -> dict:
    """A situation as {"user": str} or {"system": str, "user": str}: a str is the user message;
    an empty or missing system part is no system part. BadInput for anything else."""
    if isinstance(value, str):
        return {"user": value}
    if not isinstance(value, dict) or not {"user"} <= set(value) <= {"system", "user"} \
            or not all(isinstance(v, str) for v in value.values()):
        raise BadInput(f"a situation is text or {{\"system\": text, \"user\": text}}, got {str(value)[:60]!r}")
    return {"user": value["user"], **({"system": value["system"]} if value.get("system") else {})}


def situation_text(value) -> str:
    """The situation as one text (the plain format's, and what messages quote): system part, a line
    break, user part."""
    s = situation(value)
    return f"{s['system']}\n{s['user']}" if "system" in s else s["user"]


def messages(value, action: str | None = None) -> list[dict]:
    """The chat messages of a turn: [system,] user[, assistant]."""
    s = situation(value)
    msgs = ([{"role": "system", "content": s["system"]}] if "system" in s else []) + [{"role": "user", "content": s["user"]}]
    return msgs + ([{"role": "assistant", "content": action}] if action is not None else [])


def _environment():
    import jinja2
    from jinja2.ext import loopcontrols
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    def raise_exception(message):
        raise jinja2.exceptions.TemplateError(message)

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        # as transformers: json.dumps, not Jinja's HTML-escaping filter
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[loopcontrols])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    return env


@dataclass(frozen=True)
class Chat:
    """A tokenizer and a template: the encoder of turns for one base."""
    tokenizer: object
    template: dict = field(default_factory=lambda: dict(PLAIN))
    _compiled: object = field(default=None, repr=False, compare=False)

    def __post_init__(self):
        check_definition(self.template)
        if self.template["format"] == "jinja":
            import jinja2

            try:
                compiled = _environment().from_string(self.template["source"])
            except jinja2.TemplateError as e:
                raise TemplateError(f"the chat template does not compile: {e}") from None
            object.__setattr__(self, "_compiled", compiled)
            object.__setattr__(self, "_stop", self._probe_stop())

    @property
    def template_id(self) -> str:
        return template_id(self.template)

    @property
    def plain(self) -> bool:
        return self.template["format"] == "plain"

    # --- rendering --------------------------------------------------------------------------------
    def render(self, situation, action: str | None = None) -> str:
        """The template's text for a turn (`situation`: text, or {"system", "user"}); without an
        action, the prompt a model continues."""
        import jinja2

        msgs = messages(situation, action)
        sp = getattr(self.tokenizer, "specials", {})
        try:
            return self._compiled.render(messages=msgs, add_generation_prompt=action is None,
                                         bos_token=sp.get("bos") or "", eos_token=sp.get("eos") or "",
                                         pad_token=sp.get("pad") or "")
        except (jinja2.TemplateError, TypeError, ValueError, KeyError, AttributeError, IndexError) as e:
            raise TemplateError(f"the chat template failed to render a turn: {e}") from None

    def _cut(self, situation, action: str) -> tuple[list[int], int, int, int]:
        """(ids, span start, span end, end-of-turn id) of a rendered turn, cut by offsets."""
        prompt, full = self.render(situation), self.render(situation, action)
        if not full.startswith(prompt):
            raise TemplateError("the chat template's prompt (add_generation_prompt) is not a prefix of the turn",
                                "ledger needs templates whose generation prompt starts the assistant message")
        a0, a1 = len(prompt), len(prompt) + len(action)
        if full[a0:a1] != action:
            raise TemplateError("the chat template does not reproduce the action verbatim after the prompt "
                                f"(it renders {full[a0:a1][:40]!r})", "strip leading/trailing whitespace from actions")
        ids, offs = self.tokenizer.encode_offsets(full)
        k0 = next((i for i, (s, _) in enumerate(offs) if s >= a0), len(ids))
        if any(e > a0 for _, e in offs[:k0]):
            raise TemplateError("the prompt's last token and the action's first token merge into one token",
                                "begin actions with a character the tokenizer splits from the prompt")
        k1 = next((i for i in range(k0, len(ids)) if offs[i][0] >= a1), len(ids))
        if any(e > a1 for _, e in offs[k0:k1]) or k1 == len(ids) or offs[k1][0] != a1 \
                or ids[k1] not in self.tokenizer.special_ids:
            raise TemplateError("the chat template puts no special end-of-turn token right after the assistant message",
                                "ledger needs one so a model can learn to stop")
        if k1 == k0:
            raise TemplateError("a turn has an empty action", "every turn needs a non-empty action")
        if ids[:k0] != self.tokenizer.encode(prompt):
            raise TemplateError("the prompt tokenizes differently alone than as part of the turn",
                                "the image would feed the model other ids than it trained on")
        return ids, k0, k1 + 1, ids[k1]

    def _probe_stop(self) -> int:
        return self._cut("a", "b")[3]

    # --- what the stages use -------------------------------------------------------------------------
    def encode_turn(self, situation, action: str, max_len: int | None = None) -> toklib.EncodedTurn:
        if self.plain:
            return toklib.encode_turn(self.tokenizer, situation_text(situation), action, max_len)
        ids, k0, k1, eot = self._cut(situation, action)
        if eot != self._stop:
            raise TemplateError(f"a turn ends with token {eot}, not the template's end-of-turn token {self._stop}")
        # The span ends at the end-of-turn token; anything the template adds after it (a newline)
        # is not part of what the model must produce, so it is dropped from the sequence.
        ids = ids[:k1]
        toklib.check_len(len(ids), max_len)
        return toklib.EncodedTurn(ids=tuple(ids), action_start=k0, action_end=k1)

    def prompt_ids(self, situation) -> list[int]:
        if self.plain:
            return toklib.plain_prompt(self.tokenizer, situation_text(situation))
        return self.tokenizer.encode(self.render(situation))

    @property
    def stop_ids(self) -> frozenset:
        """Ids that end an answer: the end-of-turn token (and the tokenizer's eos)."""
        eos = self.tokenizer.eos_id
        return frozenset({eos} if self.plain else {eos, self._stop})

    def fixed_text(self) -> tuple[str, ...]:
        """The text every turn shares by construction: the template's parts around the
        situation and the action (empty for the plain format, which adds only special ids)."""
        if self.plain:
            return ()
        full = self.render(_PROBE_S, _PROBE_A)
        parts = full.replace(_PROBE_A, _PROBE_S).split(_PROBE_S)
        return tuple(p for p in parts if p.strip())


# --- storage --------------------------------------------------------------------------------------
def put(tx, definition: dict) -> str:
    check_definition(definition)
    return tx.put_json(definition)


def load(store, tid: str | None) -> dict:
    """A stored template definition; None (a manifest from before templates) is the plain format."""
    return dict(PLAIN) if tid is None else check_definition(store.get_json(tid))


def for_base(store, manifest: dict) -> Chat:
    """The encoder of a base: its pinned tokenizer and template."""
    return Chat(toklib.load(store, manifest["tokenizer"]), load(store, manifest.get("template")))


TEMPLATE_FILE = "chat-template.json"


def write_folder(chat: Chat, dest) -> None:
    """Tokenizer + template as files for a child or the image (read back with read_folder)."""
    toklib.write_folder(chat.tokenizer, dest)
    (dest / TEMPLATE_FILE).write_bytes(canonical.dumps(chat.template))


def read_folder(src, tokenizer_id: str | None = None, template: str | None = None) -> Chat:
    tok = toklib.read_folder(src, tokenizer_id)
    try:
        d = canonical.loads((src / TEMPLATE_FILE).read_bytes())
    except OSError as e:
        raise BadInput(f"cannot read the chat template in {src}: {e}") from None
    chat = Chat(tok, check_definition(d))
    if template is not None and chat.template_id != template:
        raise BadInput(f"the chat template handed over is {chat.template_id}, the plan pins {template}")
    return chat
