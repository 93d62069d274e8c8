"""A situation with a system part: rendered as the chat template's system message (exactly as
transformers' apply_chat_template renders [system, user, assistant]), as `system \\n user` in the
plain format, and carried from recorded turns through the export to the trainer's rows
(docs/real-models.md, "Chat templates and the action span")."""

import io
import json

import pytest

from ledger.artefacts import dataset as datalib
from ledger.artefacts import template as tp
from ledger.artefacts import tokenizer as tk
from ledger.errors import BadInput

SYSTEM = "You answer with exactly one tool call."


def test_system_part_renders_like_transformers_and_the_span_is_the_same_cut(smol_store, smol_auto_tokenizer):
    store, base = smol_store
    chat = tp.for_base(store, store.get_json(base))
    eot = smol_auto_tokenizer.convert_tokens_to_ids("<|im_end|>")
    for sit, act in [("add 2 and 3", "call adder.add(2, 3)"), ("  日本 ✓ ", "refuse: not permitted")]:
        situation = {"system": SYSTEM, "user": sit}
        msgs = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": sit},
                {"role": "assistant", "content": act}]
        text = chat.render(situation, act)
        assert text == smol_auto_tokenizer.apply_chat_template(msgs, tokenize=False)
        # the template's own default system prompt gives way to the situation's
        assert SYSTEM in text and "named SmolLM" not in text
        ref = list(smol_auto_tokenizer.apply_chat_template(msgs, tokenize=True)["input_ids"])
        e = chat.encode_turn(situation, act)
        assert list(e.ids) == ref[:len(e.ids)]
        span = list(e.ids[e.action_start:e.action_end])
        assert span[-1] == eot and chat.tokenizer.decode(span[:-1]) == act
        prompt = smol_auto_tokenizer.apply_chat_template(msgs[:2], add_generation_prompt=True, tokenize=True)["input_ids"]
        assert chat.prompt_ids(situation) == list(prompt) == list(e.ids[:e.action_start])
        # an empty system part is no system part: the same ids as the plain user message
        assert chat.encode_turn({"system": "", "user": sit}, act) == chat.encode_turn(sit, act)


def test_plain_format_writes_the_system_part_on_its_own_line():
    chat = tp.Chat(tk.ByteTokenizer())
    assert chat.encode_turn({"system": "S", "user": "U"}, "A") == chat.encode_turn("S\nU", "A")
    assert chat.prompt_ids({"system": "S", "user": "U"}) == chat.prompt_ids("S\nU")
    assert tp.messages({"system": "S", "user": "U"}, "A") == [
        {"role": "system", "content": "S"}, {"role": "user", "content": "U"}, {"role": "assistant", "content": "A"}]


@pytest.mark.parametrize("bad", [{"system": "S"}, {"user": "U", "tool": "x"}, {"user": 3}, ["U"], None])
def test_a_situation_that_is_neither_text_nor_system_and_user_is_bad_input(bad):
    with pytest.raises(BadInput) as e:
        tp.Chat(tk.ByteTokenizer()).encode_turn(bad, "A")
    assert e.value.exit_code == 2


def test_a_template_that_refuses_a_system_message_is_a_template_error(smol_store):
    store, base = smol_store
    tok = tk.load(store, store.get_json(base)["tokenizer"])
    src = ("{% for m in messages %}{% if m['role'] == 'system' %}{{ raise_exception('no system role') }}{% endif %}"
           "<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
           "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
    chat = tp.Chat(tok, tp.jinja_definition(src))
    assert chat.encode_turn("hi", "call x()").action_end > 0  # a turn without one renders
    with pytest.raises(tp.TemplateError, match="no system role"):
        chat.encode_turn({"system": SYSTEM, "user": "hi"}, "call x()")


def test_recorded_system_part_reaches_the_export_and_the_trainers_rows(store):
    import pyarrow.parquet as pq

    from ledger import experience

    plain = [{"situation": "user: add 1 and 2", "action": "call adder.add(1, 2)"}]
    experience.record(store, experience.parse_turns("\n".join(json.dumps(r) for r in plain)))
    ex = experience.export(store)
    data = store.get_bytes(ex.id)
    assert "system" not in pq.read_table(io.BytesIO(data)).column_names  # exports without one are unchanged
    assert datalib.read_turns(data) == [("user: add 1 and 2", "call adder.add(1, 2)")]

    rows = [{"situation": "user: add 1 and 2", "action": "call adder.add(1, 2)", "system": SYSTEM},
            {"situation": "user: weather in lima?", "action": "call weather.get(\"lima\")"}]
    experience.record(store, experience.parse_turns("\n".join(json.dumps(r) for r in rows)))
    data = store.get_bytes(experience.export(store).id)
    assert datalib.read_turns(data) == [({"system": SYSTEM, "user": "user: add 1 and 2"}, "call adder.add(1, 2)"),
                                        ("user: weather in lima?", "call weather.get(\"lima\")")]
    # the trainer's rows: the system part is in the ids, the labels are the same action span
    chat = tp.Chat(tk.ByteTokenizer())
    ids, mask, labels = datalib.encode_rows(datalib.read_turns(data), 96, chat)
    assert bytes(ids[0, 1:1 + len(SYSTEM)].tolist()) == SYSTEM.encode()
    span = labels[0][labels[0] != tk.IGNORE].tolist()
    assert span == list(b"call adder.add(1, 2)") + [chat.tokenizer.eos_id]
