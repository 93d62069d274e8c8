"""`ledger seal` says when a suite makes a blunt gate (docs/gate-ops.md, "Small suites"): too few documents,
or documents too short for the contamination check to find a partial copy."""

from ledger.gate import seal


def _warnings(tmp_path, scored, canaries):
    return seal.sharpness_warnings(seal.read_suite_dir(seal.write_suite_dir(tmp_path, scored, canaries)))


def test_the_demo_suite_is_small_and_its_documents_short(tmp_path):
    s, k = seal.demo_docs(10, 4, 0)
    w = _warnings(tmp_path, s, k)
    assert any(x.startswith("small suite: 10 scored and 4 canary") for x in w)
    short = [x for x in w if "shorter than a contamination window" in x]
    assert short and short[0].startswith("11 of 14 documents")  # 3 are long enough for windows


def test_tiny_documents_cannot_be_checked(tmp_path):
    s = [{"id": f"s{i}", "situation": "hi", "action": f"ok {i}"} for i in range(5)]
    w = _warnings(tmp_path, s, [])
    assert any("cannot be checked for contamination at all: s0, s1, s2, s3, s4" in x for x in w)


def test_a_large_suite_of_long_documents_has_no_warnings(tmp_path):
    def doc(i, p):
        return {"id": f"{p}{i}", "situation": f"the operator of site {i} asks for the nightly report of shard {i}",
                "action": f"call reports.nightly(site={i}, shard={i}, format='pdf')"}
    assert _warnings(tmp_path, [doc(i, "s") for i in range(30)], [doc(i, "k") for i in range(30, 38)]) == []
    assert _warnings(tmp_path / "b", [doc(i, "s") for i in range(3)], [])[1].startswith("3 scored documents")
