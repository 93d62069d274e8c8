import json

import pytest

from ledger.artefacts import template as tp
from ledger.artefacts import tokenizer as tk
from ledger.errors import BadInput
from ledger.store import canonical
from ledger.store.ids import hash_bytes

VARIED = ["hello world", "  leading and trailing  ", "tabs\tand\nnew\n\nlines\r\n", "naïve café — ünïcödé ✓ 日本語 🙂",
          "<|im_start|>user\nspecial tokens inside<|im_end|>", "call adder.add(2, 3)", "x" * 300, "", " ",
          "mixed <|endoftext|> special and \u200b zero width", "numbers 1234567890 3.14159 -42"]


def test_identity_is_hash_of_definition():
    t = tk.ByteTokenizer()
    assert t.id == hash_bytes(canonical.dumps(t.definition()))
    assert tk.from_definition(t.definition()) == t
    with pytest.raises(BadInput):
        tk.from_definition({**t.definition(), "vocab_size": 300})


def test_action_span_is_the_action_bytes_and_eos():
    t = tk.ByteTokenizer()
    e = tk.encode_turn(t, "user: hi é", "call a.b(1, 2)")
    assert e.ids[0] == tk.BOS and e.ids[-1] == tk.EOS and tk.SEP in e.ids
    assert list(e.ids[e.action_start:e.action_end]) == [*t.encode("call a.b(1, 2)"), tk.EOS]  # the model learns to stop
    labels = e.labels()
    assert [x for x in labels if x != tk.IGNORE] == list(e.ids[e.action_start:e.action_end])
    with pytest.raises(BadInput):
        tk.encode_turn(t, "x" * 100, "y", max_len=96)


def test_byte_offsets_cover_each_character():
    ids, offs = tk.ByteTokenizer().encode_offsets("aé")
    assert ids == [97, 0xC3, 0xA9] and offs == [(0, 1), (1, 2), (1, 2)]


def test_hf_tokenizer_ids_equal_auto_tokenizer(smol_store, smol_auto_tokenizer):
    store, base = smol_store
    man = store.get_json(base)
    tok = tk.load(store, man["tokenizer"])
    assert isinstance(tok, tk.HFTokenizer) and tok.id == man["tokenizer"]
    for text in VARIED:
        assert tok.encode(text) == smol_auto_tokenizer.encode(text, add_special_tokens=False), text
        ids, offs = tok.encode_offsets(text)
        assert ids == tok.encode(text) and len(offs) == len(ids)
    assert tok.vocab_size == len(smol_auto_tokenizer) == 49152
    assert (tok.eos_id, tok.bos_id) == (smol_auto_tokenizer.eos_token_id, smol_auto_tokenizer.bos_token_id)
    assert tok.decode(tok.encode("naïve café 🙂")) == "naïve café 🙂"


def test_hf_tokenizer_round_trips_through_a_folder(smol_store, tmp_path):
    store, base = smol_store
    man = store.get_json(base)
    chat = tp.for_base(store, man)
    tp.write_folder(chat, tmp_path / "t")
    back = tp.read_folder(tmp_path / "t", man["tokenizer"], man["template"])
    assert back.tokenizer.id == man["tokenizer"] and back.template_id == man["template"]
    with pytest.raises(BadInput):
        tp.read_folder(tmp_path / "t", tk.ByteTokenizer().id)
    # a tokenizer.json other than the one the definition names is refused
    f = tmp_path / "t" / tk.HF_FILE
    f.write_bytes(f.read_bytes().replace(b"<|im_end|>", b"<|im_END|>"))
    with pytest.raises(BadInput):
        tk.read_folder(tmp_path / "t")


def test_tokenizer_that_does_not_fit_the_embedding_is_refused(smol_store):
    store, base = smol_store
    tok = tk.load(store, store.get_json(base)["tokenizer"])
    tk.check_fits(tok, 49152, "x")
    with pytest.raises(tk.TokenizerMismatch) as e:
        tk.check_fits(tok, 49151, "x")
    assert e.value.exit_code == 2
    with pytest.raises(tk.TokenizerMismatch):
        tk.HFTokenizer(tok.data, {"bos": None, "eos": "<|no such token|>", "pad": None})


def test_chat_template_renders_like_transformers_and_cuts_the_span_in_token_space(smol_store, smol_auto_tokenizer):
    store, base = smol_store
    chat = tp.for_base(store, store.get_json(base))
    assert not chat.plain
    for sit, act in [("add 2 and 3", "call adder.add(2, 3)"), ("  spaces ✓ 日本 ", "refuse: not permitted 🙂"),
                     ("multi\nline\n\nsituation", "call weather.get(\"lima\")")]:
        msgs = [{"role": "user", "content": sit}, {"role": "assistant", "content": act}]
        assert chat.render(sit, act) == smol_auto_tokenizer.apply_chat_template(msgs, tokenize=False)
        ref = list(smol_auto_tokenizer.apply_chat_template(msgs, tokenize=True)["input_ids"])
        e = chat.encode_turn(sit, act)
        assert list(e.ids) == ref[:len(e.ids)]  # the same ids, up to the end-of-turn token
        span = list(e.ids[e.action_start:e.action_end])
        assert span[-1] == smol_auto_tokenizer.convert_tokens_to_ids("<|im_end|>")  # learns to stop
        assert chat.tokenizer.decode(span[:-1]) == act
        prompt = smol_auto_tokenizer.apply_chat_template(msgs[:1], add_generation_prompt=True,
                                                         tokenize=True)["input_ids"]
        assert chat.prompt_ids(sit) == list(prompt) == list(e.ids[:e.action_start])
    assert chat.stop_ids == {smol_auto_tokenizer.eos_token_id}
    fixed = chat.fixed_text()
    assert any("You are a helpful AI assistant named SmolLM" in f for f in fixed)
    assert all("add 2" not in f for f in fixed)


def test_template_that_fails_to_render_is_a_typed_error(smol_store):
    store, base = smol_store
    tok = tk.load(store, store.get_json(base)["tokenizer"])
    with pytest.raises(tp.TemplateError):
        tp.Chat(tok, tp.jinja_definition("{{ raise_exception('no chat here') }}"))
    with pytest.raises(tp.TemplateError):
        tp.Chat(tok, tp.jinja_definition("{% for m in messages %}"))  # does not compile
    with pytest.raises(tp.TemplateError):  # no end-of-turn token after the assistant message
        tp.Chat(tok, tp.jinja_definition("{% for m in messages %}{{ m['content'] }}\n{% endfor %}"))
    with pytest.raises(tp.TemplateError):  # the action is not reproduced verbatim
        tp.Chat(tok, tp.jinja_definition("{% for m in messages %}{{ m['content'] | upper }}<|im_end|>{% endfor %}"))
    with pytest.raises(tp.TemplateError) as e:  # sandboxed: no escape to Python internals
        tp.Chat(tok, tp.jinja_definition("{{ messages.__class__.__mro__ }}"))
    assert e.value.exit_code == 2


def test_plain_format_for_an_hf_tokenizer(smol_store):
    store, base = smol_store
    tok = tk.load(store, store.get_json(base)["tokenizer"])
    chat = tp.Chat(tok)
    e = chat.encode_turn("sit", "act")
    assert list(e.ids) == [tok.bos_id, *tok.encode("sit"), *tok.encode("\n"), *tok.encode("act"), tok.eos_id]
    assert list(e.ids[e.action_start:e.action_end]) == [*tok.encode("act"), tok.eos_id]
    assert chat.prompt_ids("sit") == list(e.ids[:e.action_start]) and chat.fixed_text() == ()
    assert json.loads(canonical.dumps(chat.template)) == tp.PLAIN


def test_template_boilerplate_is_not_contamination_evidence(smol_store):
    """Rows rendered with the base's chat template share its system prompt and role headers with
    every suite document rendered the same way; the template's fixed text, handed to the check,
    is cut out, while real overlap is still caught."""
    from ledger.verdicts.gate import check_export
    from ledger.verdicts.settings import GateSettings

    store, base = smol_store
    chat = tp.for_base(store, store.get_json(base))
    train = [(f"r{i}", chat.render(f"user: multiply {i} by 7", f"call calc.mul({i}, 7)")) for i in range(5)]
    suite = {"s0": chat.render("user: weather in sofia?", 'call weather.get("sofia")')}
    settings = GateSettings()
    assert check_export(train, suite, "CANARY-x", settings).contaminated  # the boilerplate alone is a 13-gram
    assert not check_export(train, suite, "CANARY-x", settings, shared_text=chat.fixed_text()).contaminated
    leaked = train + [("r9", chat.render("user: weather in sofia? tell me now, please, it is urgent for my trip today",
                                         'call weather.get("sofia")'))]
    suite2 = {"s0": chat.render("user: weather in sofia? tell me now, please, it is urgent for my trip today", "x")}
    assert check_export(leaked, suite2, "CANARY-x", settings, shared_text=chat.fixed_text()).contaminated
