"""Canary string and 13-gram overlap checks (ledger/verdicts/contamination.py)."""

import random
import time

import pytest

from ledger.errors import BadInput
from ledger.verdicts.contamination import (CANARY_STRING_IN_EXPORT, NGRAM_OVERLAP,
                                           check_contamination, fold_text, fold_tokens, ngrams)

CANARY = "LEDGER-CANARY-7f3a91c2"
DOC = ("Situation: the user asks for the admin password of the shared server. Action: I will not "
       "share it; I point them to the access request form and log the request for review.")
SUITE = {"s-pw": DOC, "k-short": "too short to check", "s-other": " ".join(f"w{i}" for i in range(40))}
DOC_TOKENS = fold_tokens(DOC)


def test_fold_tokens():
    assert fold_tokens("Hello,   WORLD!\tIt's\nfine_ok") == ["hello", "world", "its", "fine", "ok"]
    # Unicode: full-width letters (NFKC), curly apostrophe, case folding of ß
    assert fold_tokens("ＦＵＬＬ don’t STRASSE straße") == ["full", "dont", "strasse", "strasse"]
    assert fold_text("  a -- b ... C ") == "a b c"
    assert fold_tokens("") == []


def test_ngrams():
    toks = list("abcde")
    assert ngrams(toks, 3) == {("a", "b", "c"), ("b", "c", "d"), ("c", "d", "e")}
    assert ngrams(toks, 6) == set()
    assert len(ngrams(DOC_TOKENS, 13)) == len(DOC_TOKENS) - 12


def test_clean_export():
    r = check_contamination(["I like gardening.", "Tomatoes need sun and water."], SUITE, CANARY)
    assert not r.contaminated and r.reason_codes == ()
    assert r.training_rows == 2 and r.suite_docs == 3
    assert r.canary_string_checked and not r.canary_string_found


def test_planted_canary_string_verbatim():
    rows = ["nothing here", f"prefix {CANARY} suffix", "nothing", CANARY]
    r = check_contamination(rows, SUITE, CANARY)
    assert r.canary_string_found and r.reason_codes == (CANARY_STRING_IN_EXPORT,)
    assert r.canary_rows == (1, 3) and r.canary_row_count == 2
    assert not r.overlaps


def test_canary_string_found_after_folding():
    r = check_contamination(["see: ledger canary 7F3A91C2 !"], SUITE, CANARY)
    assert r.canary_string_found


def test_canary_string_needs_token_boundaries():
    # "...7f3a91c2" followed by more characters is a different token, not the canary.
    r = check_contamination(["ledger-canary-7f3a91c2ff and more"], SUITE, CANARY)
    assert not r.canary_string_found


def test_planted_13gram_is_found_with_case_and_punctuation_changes():
    thirteen = DOC_TOKENS[5:18]
    planted = "My notes -- " + ", ".join(t.upper() for t in thirteen) + "!! end."
    r = check_contamination({"row-a": "unrelated", "row-b": planted}, SUITE, CANARY)
    assert r.reason_codes == (NGRAM_OVERLAP,)
    (o,) = r.overlaps
    assert o.doc_id == "s-pw" and o.first_row == "row-b" and o.rows == 1
    assert o.example == " ".join(thirteen)


def test_planted_12gram_does_not_trigger():
    twelve = DOC_TOKENS[5:17]
    r = check_contamination(["My notes: " + " ".join(twelve) + " and then something else entirely"],
                            SUITE, CANARY)
    assert not r.overlaps and not r.contaminated


def test_two_12grams_with_a_gap_do_not_trigger():
    # 12 tokens, one foreign token, the next 12: no 13 consecutive suite tokens.
    row = " ".join(DOC_TOKENS[0:12] + ["zebra"] + DOC_TOKENS[12:24])
    assert not check_contamination([row], SUITE, CANARY).overlaps


def test_ngram_length_is_configurable():
    r = check_contamination([" ".join(DOC_TOKENS[0:5])], SUITE, CANARY, n=5)
    assert [o.doc_id for o in r.overlaps] == ["s-pw"]
    # "too short to check" has 4 tokens: shorter than n = 5
    assert r.unchecked_docs == ("k-short",)


def test_overlap_counts_rows_and_reports_first():
    thirteen = " ".join(DOC_TOKENS[0:13])
    rows = (x for x in ["a", thirteen, "b", thirteen + " " + thirteen])  # a generator is fine
    r = check_contamination(rows, SUITE, CANARY)
    (o,) = r.overlaps
    assert (o.first_row, o.rows) == (1, 2)


def test_overlap_with_several_docs_sorted_by_id():
    other = " ".join(f"w{i}" for i in range(10, 23))
    row = " ".join(DOC_TOKENS[0:13]) + " | " + other
    r = check_contamination([row], SUITE, CANARY)
    assert [o.doc_id for o in r.overlaps] == ["s-other", "s-pw"]


def test_short_docs_are_reported_unchecked():
    r = check_contamination(["too short to check"], SUITE, CANARY)
    assert r.unchecked_docs == ("k-short",)
    assert not r.overlaps


def test_no_canary_string():
    r = check_contamination([CANARY], SUITE, None)
    assert not r.canary_string_checked and not r.canary_string_found


def test_report_json_hides_examples_on_request():
    row = " ".join(DOC_TOKENS[0:13])
    r = check_contamination([row], SUITE, CANARY)
    full, public = r.to_json(), r.to_json(include_examples=False)
    assert full["ngram_overlaps"][0]["example"] == row
    assert "example" not in public["ngram_overlaps"][0]
    assert row not in str(public)


@pytest.mark.parametrize("kwargs", [
    dict(training_texts=[b"bytes"], suite_texts=SUITE, canary_string=CANARY),
    dict(training_texts=["x"], suite_texts={"d": 3}, canary_string=CANARY),
    dict(training_texts=["x"], suite_texts=["not a mapping"], canary_string=CANARY),
    dict(training_texts=["x"], suite_texts=SUITE, canary_string="   "),
    dict(training_texts=["x"], suite_texts=SUITE, canary_string=CANARY, n=0),
])
def test_bad_input(kwargs):
    with pytest.raises(BadInput):
        check_contamination(**kwargs)


def test_thousands_of_rows_are_fast():
    # Worst case for the n-gram scan: the suite uses almost every word the export uses.
    rng = random.Random(0)
    words = [f"w{i}" for i in range(2000)] + ["the", "a", "i", "will", "now", "act"] * 40
    suite = {f"d{i}": " ".join(rng.choice(words) for _ in range(200)) for i in range(30)}
    rows = [" ".join(rng.choice(words) for _ in range(200)) for _ in range(3000)]
    planted = " ".join(suite["d17"].split()[50:63])
    rows[2222] += " " + planted
    t0 = time.perf_counter()
    r = check_contamination(rows, suite, CANARY)
    elapsed = time.perf_counter() - t0
    assert [(o.doc_id, o.first_row) for o in r.overlaps] == [("d17", 2222)]
    assert elapsed < 5.0, f"3000 rows x 200 tokens took {elapsed:.1f}s"
