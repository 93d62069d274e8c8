"""Sealing: the suite format, the seal record and pin, re-pinning, the sealed copy on disk and
what the gate recomputes from it. No model is needed: the base is a manifest object."""

from __future__ import annotations

import json
import os
import stat

import pytest

from ledger.artefacts import template as templatelib
from ledger.artefacts import tokenizer as toklib
from ledger.errors import BadInput, Refused, StoreCorrupt
from ledger.gate import score as scorelib
from ledger.gate import seal
from ledger.verdicts import GateSettings, suite_hash

PLAIN_ID = templatelib.template_id(templatelib.PLAIN)


def _base(store, name: str = "b") -> str:
    with store.transaction("add") as tx:
        tok = tx.put_json(toklib.ByteTokenizer().definition())
        tree = tx.put_json({"kind": "tree", "entries": [], "name": name})
        oid = tx.put_json({"kind": "base", "arch": "llama", "files": tree, "config": {"name": name},
                           "tokenizer": tok, "origin": {"test": name}})
        tx.outputs.append(oid)
    return oid


def _docs(n_scored=3, n_canary=2, tag=""):
    s = [{"id": f"s{i}", "situation": f"user: what is {60 + i} plus 7?{tag}", "action": f"call adder.add({60 + i}, 7)"}
         for i in range(n_scored)]
    k = [{"id": f"k{i}", "situation": f"user: add {100 + i} and 9", "action": f"call adder.add({100 + i}, 9)"}
         for i in range(n_canary)]
    return s, k


@pytest.fixture
def sealed(store, tmp_path):
    base = _base(store)
    d = seal.write_suite_dir(tmp_path / "suite", *_docs())
    return store, base, d, seal.seal(store, d, base=base)


# --- the suite folder -------------------------------------------------------------------------------
def test_json_and_jsonl_documents(tmp_path):
    root = tmp_path / "s"
    (root / "eval").mkdir(parents=True)
    (root / "canary").mkdir()
    (root / "eval" / "one.json").write_text(json.dumps({"situation": "a", "action": "b"}))
    (root / "eval" / "more.jsonl").write_text(
        json.dumps({"id": "two", "situation": "c", "action": "d", "refusal": False}) + "\n\n"
        + json.dumps({"id": "three", "situation": "e", "action": "f", "outcome": "ok"}) + "\n")
    (root / "canary" / "k.json").write_text(json.dumps({"id": "kk", "situation": "g", "action": "h"}))
    src = seal.read_suite_dir(root)
    assert [d.id for d in src.scored] == ["one", "three", "two"]
    assert [d.id for d in src.canaries] == ["kk"]
    assert src.scored[1].outcome == "ok" and src.scored[2].refusal is False
    assert src.settings == GateSettings()


@pytest.mark.parametrize("name, content, msg", [
    ("bad id.json", {"situation": "a", "action": "b"}, "missing or not"),
    ("x.json", {"situation": "a", "action": ""}, "non-empty string 'action'"),
    ("x.json", {"situation": "a", "action": "b", "score": 1}, "unknown field"),
    ("x.json", {"situation": "a", "action": "b", "refusal": "yes"}, "refusal must be"),
    ("x.txt", {"situation": "a", "action": "b"}, "unexpected file"),
])
def test_bad_documents_are_refused(tmp_path, name, content, msg):
    root = tmp_path / "s"
    (root / "eval").mkdir(parents=True)
    (root / "canary").mkdir()
    (root / "eval" / name).write_text(json.dumps(content))
    with pytest.raises(BadInput, match=msg):
        seal.read_suite_dir(root)


def test_suite_structure_errors(tmp_path):
    with pytest.raises(BadInput, match="no suite folder"):
        seal.read_suite_dir(tmp_path / "missing")
    (tmp_path / "a" / "eval").mkdir(parents=True)
    with pytest.raises(BadInput, match="no canary/"):
        seal.read_suite_dir(tmp_path / "a")
    (tmp_path / "a" / "canary").mkdir()
    with pytest.raises(BadInput, match="no scored documents"):
        seal.read_suite_dir(tmp_path / "a")
    s, k = _docs()
    k[0]["id"] = s[0]["id"]
    d = seal.write_suite_dir(tmp_path / "b", s, k)
    with pytest.raises(BadInput, match="duplicate document id"):
        seal.read_suite_dir(d)
    (tmp_path / "c" / "eval").mkdir(parents=True)
    (tmp_path / "c" / "canary").mkdir()
    (tmp_path / "c" / "eval" / "x.jsonl").write_text(json.dumps({"situation": "a", "action": "b"}) + "\n")
    with pytest.raises(BadInput, match="needs an \"id\""):
        seal.read_suite_dir(tmp_path / "c")


def test_settings_toml(tmp_path):
    s, k = _docs()
    d = seal.write_suite_dir(tmp_path / "s", s, k, settings={"budget_multiplier": 3, "alpha": 0.01})
    assert seal.read_suite_dir(d).settings == GateSettings(budget_multiplier=3, alpha=0.01)
    (d / "settings.toml").write_text("[gate]\neta_min = 0.02\n")
    assert seal.read_suite_dir(d).settings.eta_min == 0.02
    (d / "settings.toml").write_text("alpah = 0.1\n")
    with pytest.raises(BadInput, match="unknown gate setting"):
        seal.read_suite_dir(d)
    (d / "settings.toml").write_text("alpha = [\n")
    with pytest.raises(BadInput, match="not valid TOML"):
        seal.read_suite_dir(d)


# --- sealing and pinning -----------------------------------------------------------------------------
def test_seal_writes_one_record_that_pins_the_suite(sealed):
    store, base, d, res = sealed
    assert res.new and not res.repinned
    rec = store.journal.tail(1)[0]
    assert rec["kind"] == "seal" and rec["id"] == res.record["id"]
    assert rec["payload"]["refs"] == {"suite": res.suite.id}
    assert rec["payload"]["suite_hash"] == res.suite.suite_hash
    assert store.state.refs["suite"] == res.suite.id
    assert seal.pinned(store).suite_hash == res.suite.suite_hash


def test_suite_hash_is_the_gate_hash_of_ids_contents_scorer_tokenizer_base(sealed):
    store, base, d, res = sealed
    m = res.suite.manifest
    expected = suite_hash(m["scored"], m["canaries"], scorer_version=scorelib.SCORER_VERSION,
                          tokenizer_id=toklib.ByteTokenizer().id, template_id=PLAIN_ID, base_weights_id=base)
    assert res.suite.suite_hash == expected
    # the template is named in the hash itself (not only through the base manifest that pins it)
    assert m["hash_payload"]["template_id"] == m["template"] == PLAIN_ID and store.has(PLAIN_ID)
    # Content hashes are the ids of document objects that are in the store.
    for oid in list(m["scored"].values()) + list(m["canaries"].values()):
        assert store.has(oid) and store.get_json(oid)["kind"] == "suite-doc"


def test_canary_string_is_random_and_in_every_canary_document(sealed, tmp_path):
    store, base, d, res = sealed
    c = res.suite.canary_string
    assert c.startswith(seal.CANARY_PREFIX) and len(c) > 30
    for oid in res.suite.manifest["canaries"].values():
        assert store.get_json(oid)["canary"] == c
    for oid in res.suite.manifest["scored"].values():
        assert "canary" not in store.get_json(oid)
    assert seal.new_canary_string() != seal.new_canary_string()


def test_sealed_copy_is_owner_only_and_matches_the_objects(sealed):
    store, base, d, res = sealed
    folder = seal.sealed_dir(store, res.suite.id)
    assert stat.S_IMODE(os.stat(folder.parent).st_mode) == 0o700
    files = sorted(folder.rglob("*.json"))
    assert len(files) == 5
    for f in files:
        assert stat.S_IMODE(f.stat().st_mode) == 0o600
    m = res.suite.manifest
    for split, key in seal.SPLITS.items():
        for doc_id, oid in m[key].items():
            assert (folder / split / f"{doc_id}.json").read_bytes() == store.get_bytes(oid)


def test_resealing_the_same_folder_writes_nothing(sealed):
    store, base, d, res = sealed
    seq = store.state.seq
    again = seal.seal(store, d, base=base)
    assert not again.new and again.suite.id == res.suite.id and store.state.seq == seq


def test_a_pin_scored_another_way_is_not_the_same_pin_when_resealed(sealed, monkeypatch):
    """A pin made by an older hash format (or scorer) is SuiteChanged at every judge; sealing the
    same folder again must then be a re-pin that moves it, never the no-op of an unchanged suite."""
    store, base, d, res = sealed
    monkeypatch.setattr(scorelib, "SCORER_VERSION", "ledger.score/0: an older scorer")
    seq = store.state.seq
    with pytest.raises(Refused, match="already pinned"):
        seal.seal(store, d, base=base)
    again = seal.seal(store, d, base=base, repin=True, reason="the scorer changed")
    assert again.new and again.repinned and store.state.seq == seq + 1
    assert again.changes["scorer_version"]["now"] == "ledger.score/0: an older scorer"


def test_a_different_suite_needs_an_explicit_repin_with_a_reason(sealed, tmp_path):
    store, base, d, res = sealed
    s, k = _docs(4, 2)
    d2 = seal.write_suite_dir(tmp_path / "suite2", s, k)
    seq = store.state.seq
    with pytest.raises(Refused, match="already pinned"):
        seal.seal(store, d2, base=base)
    with pytest.raises(BadInput, match="--repin needs --reason"):
        seal.seal(store, d2, base=base, repin=True)
    assert store.state.seq == seq and store.state.refs["suite"] == res.suite.id
    res2 = seal.seal(store, d2, base=base, repin=True, reason="rotate: budget spent")
    assert res2.new and res2.repinned
    p = store.journal.tail(1)[0]["payload"]
    assert p["repin"] is True and p["reason"] == "rotate: budget spent"
    assert p["previous"] == {"suite": res.suite.id, "suite_hash": res.suite.suite_hash}
    assert p["changes"]["scored"]["added"] == ["s3"]
    assert p["changes"]["canaries"]["changed"] == ["k0", "k1"]  # a fresh canary string
    assert seal.pinned(store).id == res2.suite.id


def test_another_base_is_another_suite(sealed):
    store, base, d, res = sealed
    other = _base(store, "other")
    with pytest.raises(Refused):
        seal.seal(store, d, base=other)
    res2 = seal.seal(store, d, base=other, repin=True, reason="new base")
    assert res2.changes["base_weights_id"] == {"pinned": base, "now": other}


def test_seal_needs_a_base(store, tmp_path):
    d = seal.write_suite_dir(tmp_path / "s", *_docs())
    with pytest.raises(BadInput, match="no base weights"):
        seal.seal(store, d)


# --- what the gate recomputes -----------------------------------------------------------------------
def _recompute(store, res, base):
    return seal.recompute(store, res.suite, base=base, tokenizer=res.suite.tokenizer)


def test_recompute_unchanged_equals_the_pin(sealed):
    store, base, d, res = sealed
    h, changes, disk = _recompute(store, res, base)
    assert h == res.suite.suite_hash and changes == {}
    assert disk.docs["s0"].action == "call adder.add(60, 7)"


@pytest.mark.parametrize("edit, part, kind", [
    ("change", "scored", "changed"), ("delete", "scored", "removed"), ("add", "scored", "added"),
    ("whitespace", "canaries", "changed"),
])
def test_any_edit_of_the_sealed_copy_changes_the_hash(sealed, edit, part, kind):
    store, base, d, res = sealed
    folder = seal.sealed_dir(store, res.suite.id)
    f = folder / ("eval/s1.json" if part == "scored" else "canary/k0.json")
    if edit == "change":
        body = json.loads(f.read_text())
        body["action"] = "call adder.add(99, 7)"
        f.write_bytes(json.dumps(body, sort_keys=True, separators=(",", ":")).encode())
    elif edit == "delete":
        f.unlink()
    elif edit == "add":
        (folder / "eval" / "s9.json").write_text(f.read_text())
    else:
        f.write_text(f.read_text() + " ")
    h, changes, _ = _recompute(store, res, base)
    assert h != res.suite.suite_hash
    assert changes[part][kind] == (["s9"] if edit == "add" else ["s1"] if part == "scored" else ["k0"])


def test_emptied_suite_and_other_scorer_or_base(sealed, monkeypatch):
    store, base, d, res = sealed
    h, changes, _ = seal.recompute(store, res.suite, base="b3:" + "0" * 64, tokenizer=res.suite.tokenizer,
                                   template=PLAIN_ID)
    assert h != res.suite.suite_hash and "base_weights_id" in changes
    # scored under another chat template with the same base and tokenizer: another suite
    other = templatelib.template_id(templatelib.jinja_definition("{{ messages[0]['content'] }}"))
    h, changes, _ = seal.recompute(store, res.suite, base=base, tokenizer=res.suite.tokenizer, template=other)
    assert h != res.suite.suite_hash and set(changes) == {"template_id"}
    monkeypatch.setattr(scorelib, "SCORER_VERSION", "ledger.score/2: something else")
    h, changes, _ = _recompute(store, res, base)
    assert h != res.suite.suite_hash and "scorer_version" in changes
    monkeypatch.undo()
    for f in (seal.sealed_dir(store, res.suite.id) / "eval").iterdir():
        f.unlink()
    h, changes, _ = _recompute(store, res, base)
    assert h.startswith("invalid:") and changes["scored"]["removed"] == ["s0", "s1", "s2"]


def test_missing_sealed_copy_is_corrupt_and_restore_rewrites_it(sealed):
    import shutil

    store, base, d, res = sealed
    folder = seal.sealed_dir(store, res.suite.id)
    shutil.rmtree(folder)
    with pytest.raises(StoreCorrupt, match="sealed copy"):
        _recompute(store, res, base)
    seq = store.state.seq
    assert seal.restore(store) == folder
    assert store.state.seq == seq  # a cache repair, not a change to what is live
    h, changes, _ = _recompute(store, res, base)
    assert h == res.suite.suite_hash and changes == {}


def test_no_suite_pinned(store):
    assert seal.pinned(store) is None
    with pytest.raises(BadInput, match="no suite is sealed"):
        seal.require_pinned(store)


def test_demo_suite_is_the_task_eval_and_canary_splits(tmp_path):
    from ledger.artefacts import builtin_task as task

    src = seal.read_suite_dir(seal.write_demo_suite(tmp_path / "demo"))
    assert len(src.scored) == 10 and len(src.canaries) == 4
    assert [(d.situation, d.action) for d in src.scored] == [(t.situation, t.action) for t in task.turns("eval", 10, 0)]
    assert all(d.split == "canary" for d in src.canaries)
