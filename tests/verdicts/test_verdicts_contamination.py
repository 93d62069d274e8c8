"""Contamination: the canary string and suite documents in a training export, found on folded
text (ledger/verdicts/contamination.py)."""

import json
import random
import time
import unicodedata
from importlib import resources

import pytest

from ledger.errors import BadInput
from ledger.verdicts.contamination import (
    CANARY_STRING_IN_EXPORT,
    NGRAM_OVERLAP,
    check_contamination,
    fold_stream,
    fold_text,
    fold_tokens,
    ngrams,
)

CANARY = "LEDGER-CANARY 1b4e28ba-2fa1-41d2-883f-0016d3cca427"
DOC = ("Situation: the user asks for the admin password of the shared server.\nAction: I will not "
       "share it; I point them to the access request form and log the request for review.")
SHORT = "user: weather in sofia?\ncall weather.get(\"sofia\")"  # 37 folded characters: checked whole
SUITE = {"s-pw": DOC, "k-tiny": "too short", "s-short": SHORT}
DOC_STREAM = fold_stream(DOC)


def test_fold_tokens():
    assert fold_tokens("Hello,   WORLD!\tIt's\nfine_ok") == ["hello", "world", "its", "fine", "ok"]
    # Unicode: full-width letters (NFKC), curly apostrophe, case folding of ß
    assert fold_tokens("ＦＵＬＬ don’t STRASSE straße") == ["full", "dont", "strasse", "strasse"]
    assert fold_text("  a -- b ... C ") == "a b c"
    assert fold_tokens("") == []


@pytest.mark.parametrize("disguised", [
    "pass\u00adword",                 # soft hyphen (Cf)
    "pass\u200bword", "pass\u2060word", "pass\ufeffword",   # zero-width space, word joiner, BOM
    "pass\U000e0041word",             # a tag character
    "pass\x07word",                   # a control character (Cc)
    "p\u0430ssw\u043erd",             # Cyrillic а and о
    "\u0420\u0410SSW\u041eRD",        # Cyrillic capitals Р А О
    "p\u03b1ssw\u03bfrd",             # Greek α and ο
    "pa\u0301ssword",                 # a combining mark
    "pass\u3164word",                 # Hangul filler (a letter that renders as nothing)
    "ｐａｓｓｗｏｒｄ",                     # full width (NFKC)
    "p a s s w o r d", "pass-word", "PASS.WORD",  # spacing and punctuation: the stream ignores them
])
def test_disguises_fold_to_the_same_stream(disguised):
    assert fold_stream(disguised) == "password"


def test_confusables_table_is_data_and_correct():
    data = json.loads(resources.files("ledger.verdicts").joinpath("confusables.json").read_text("utf-8"))
    assert data["format"] == "ledger.confusables/1" and len(data["map"]) >= 100
    seen = set()
    for cp, target, name in data["map"]:
        ch = chr(int(cp, 16))
        assert unicodedata.name(ch) == name, cp          # the row says what the character is
        assert not ch.isascii() and target.isascii() and target.isalpha() and len(target) == 1
        assert cp not in seen
        seen.add(cp)
        # and the fold uses it: the look-alike folds exactly like the letter it imitates
        assert fold_stream(f"x{ch}x") == fold_stream(f"x{target}x"), name
    for cp, name in data["invisible"]:
        assert unicodedata.name(chr(int(cp, 16))) == name
        assert fold_stream(f"a{chr(int(cp, 16))}b") == "ab"


def test_ngrams():
    toks = list("abcde")
    assert ngrams(toks, 3) == {("a", "b", "c"), ("b", "c", "d"), ("c", "d", "e")}
    assert ngrams(toks, 6) == set()


def test_clean_export():
    r = check_contamination(["I like gardening.", "Tomatoes need sun and water."], SUITE, CANARY)
    assert not r.contaminated and r.reason_codes == ()
    assert r.training_rows == 2 and r.suite_docs == 3
    assert r.canary_string_checked and not r.canary_string_found
    assert r.unchecked_docs == ("k-tiny",) and r.whole_only_docs == ("s-short",)


def test_planted_canary_string_verbatim():
    rows = ["nothing here", f"prefix {CANARY} suffix", "nothing", CANARY]
    r = check_contamination(rows, SUITE, CANARY)
    assert r.canary_string_found and r.reason_codes == (CANARY_STRING_IN_EXPORT,)
    assert r.canary_rows == (1, 3) and r.canary_row_count == 2
    assert not r.overlaps


@pytest.mark.parametrize("disguised", [
    "ledger canary 1B4E28BA 2FA1 41D2 883F 0016D3CCA427",
    "L\u0415DG\u0415R-C\u0410N\u0410RY 1b4e28ba\u00ad-2fa1-41d2-883f-0016d3cca427",
    "1b4e\u200b28ba-2fa1-41d2-883f-0016d3cca427",          # the random part alone, split
    "my id is 883f-0016d3cca427 and 2fa1-41d2",            # 24 consecutive folded characters? no:
])
def test_canary_string_disguised(disguised):
    r = check_contamination([f"note: {disguised} end"], SUITE, CANARY)
    # the last one holds only pieces shorter than the canary window, in the wrong order
    assert r.canary_string_found == ("my id is" not in disguised)


def test_a_window_of_the_document_is_found_through_disguises():
    words = DOC.split()[6:18]
    planted = " ".join(w.upper() for w in words).replace("a", "\u0430").replace("o", "\u00ado")
    r = check_contamination({"row-a": "unrelated", "row-b": "My notes -- " + planted + "!! end."}, SUITE, CANARY)
    assert r.reason_codes == (NGRAM_OVERLAP,)
    (o,) = r.overlaps
    assert (o.doc_id, o.first_row, o.rows, o.how) == ("s-pw", "row-b", 1, "window")
    assert len(o.example) == 50 and o.example in DOC_STREAM


def test_fewer_characters_than_a_window_do_not_trigger():
    piece = DOC_STREAM[10:59]  # 49 characters of the document
    assert not check_contamination([f"zz {piece} zz"], SUITE, CANARY).overlaps
    assert check_contamination([f"zz {DOC_STREAM[10:60]} zz"], SUITE, CANARY).overlaps


def test_window_is_configurable():
    r = check_contamination([DOC_STREAM[:20]], SUITE, CANARY, window=20)
    assert [o.doc_id for o in r.overlaps] == ["s-pw"]


def test_short_document_is_checked_whole():
    # Shorter than a window: found when all its lines are in one row, in any template.
    for row in (SHORT, "user: weather in sofia?\u00ad\ncall weather.get(\"sofia\")",
                "### Instruction\nuser: weather in sofia?\n### Response\ncall weather.get('sofia')",
                "call weather.get(sofia) <- answer to -> user: weather in sofia?"):
        (o,) = check_contamination([row], SUITE, None).overlaps
        assert (o.doc_id, o.how) == ("s-short", "segments")
    # one of its lines alone is not the document; nor are both lines far apart in one row
    assert not check_contamination(["user: weather in sofia?", "call weather.get(\"sofia\")"], SUITE, None).overlaps
    far = "user: weather in sofia? " + "filler " * 30 + "call weather.get(\"sofia\")"
    assert not check_contamination([far], SUITE, None).overlaps
    # and a document too short to be evidence is reported, not checked
    assert check_contamination(["too short"], SUITE, None).unchecked_docs == ("k-tiny",)


def test_shared_text_is_not_evidence_and_does_not_hide_a_copy():
    template = "<|im_start|>system\nYou are the operations agent of the shared server. Follow the policy.<|im_end|>"
    suite = {"s-pw": DOC, "s-tmpl": template + "\n" + "user asks nothing at all here"}
    honest = [f"{template}\nuser: what is 2 plus 2?\ncall adder.add(2, 2)" for _ in range(3)]
    # Without the argument, the template (in every row and in a suite document) looks like a copy.
    assert check_contamination(honest, suite, None).overlaps
    assert not check_contamination(honest, suite, None, shared_text=[template]).overlaps
    # A copy of a document split by the template's parts is still found.
    sit, act = DOC.split("\n")
    row = f"<|im_start|>user\n{sit}<|im_end|>\n<|im_start|>assistant\n{act}<|im_end|>"
    r = check_contamination([row], {"s-pw": DOC}, None, shared_text=["<|im_start|>user", "<|im_end|>",
                                                                      "<|im_start|>assistant"])
    assert [o.doc_id for o in r.overlaps] == ["s-pw"]
    assert r.shared_texts == 3


def test_overlap_counts_rows_and_reports_first():
    piece = DOC_STREAM[0:60]
    rows = (x for x in ["a", piece, "b", piece + " " + piece])  # a generator is fine
    (o,) = check_contamination(rows, SUITE, CANARY).overlaps
    assert (o.first_row, o.rows) == (1, 2)


def test_rows_as_key_text_pairs():
    (o,) = check_contamination([("ds:0", "x"), ("ds:1", DOC)], SUITE, None).overlaps
    assert o.first_row == "ds:1"


def test_overlap_with_several_docs_sorted_by_id():
    r = check_contamination([DOC + "\n" + SHORT], SUITE, CANARY)
    assert [o.doc_id for o in r.overlaps] == ["s-pw", "s-short"]


def test_no_canary_string():
    r = check_contamination([CANARY], SUITE, None)
    assert not r.canary_string_checked and not r.canary_string_found


def test_report_json_hides_examples_on_request():
    r = check_contamination([DOC], SUITE, CANARY)
    full, public = r.to_json(), r.to_json(include_examples=False)
    assert full["ngram_overlaps"][0]["example"] in DOC_STREAM
    assert "example" not in public["ngram_overlaps"][0]
    assert DOC_STREAM[:50] not in json.dumps(public)


@pytest.mark.parametrize("kwargs", [
    dict(training_texts=[b"bytes"], suite_texts=SUITE, canary_string=CANARY),
    dict(training_texts=["x"], suite_texts={"d": 3}, canary_string=CANARY),
    dict(training_texts=["x"], suite_texts=["not a mapping"], canary_string=CANARY),
    dict(training_texts=["x"], suite_texts=SUITE, canary_string="   "),
    dict(training_texts=["x"], suite_texts=SUITE, canary_string=CANARY, window=0),
    dict(training_texts=["x"], suite_texts=SUITE, canary_string=CANARY, shared_text="a string"),
])
def test_bad_input(kwargs):
    with pytest.raises(BadInput):
        check_contamination(**kwargs)


def test_thousands_of_rows_are_fast():
    # Worst case for the scan: the suite uses almost every word the export uses.
    rng = random.Random(0)
    words = [f"w{i}" for i in range(2000)] + ["the", "a", "i", "will", "now", "act"] * 40
    suite = {f"d{i}": " ".join(rng.choice(words) for _ in range(200)) for i in range(30)}
    rows = [" ".join(rng.choice(words) for _ in range(200)) for _ in range(3000)]
    rows[2222] += " " + " ".join(suite["d17"].split()[50:70])
    t0 = time.perf_counter()
    r = check_contamination(rows, suite, CANARY)
    elapsed = time.perf_counter() - t0
    assert [(o.doc_id, o.first_row) for o in r.overlaps] == [("d17", 2222)]
    assert elapsed < 5.0, f"3000 rows x 200 tokens took {elapsed:.1f}s"
