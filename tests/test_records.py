"""ledger/records.py: every journal record kind's payload round-trips and is checked for type and
meaning; the registry covers every kind the code writes; real writers' records pass their schema."""

from __future__ import annotations

import ast
import copy
import pickle
from pathlib import Path

import pytest

from ledger import records
from ledger.errors import BadInput
from ledger.store import schema

ROOT = Path(__file__).resolve().parents[1]


def i(n: int) -> str:
    return "b3:" + f"{n:02x}" * 32


REFS = {"refs": {"HEAD": i(1), "gen-1": i(1)}}
# One payload per kind, as its writer writes it (field names and types from the writers).
EXAMPLES: dict[str, dict] = {
    "init": {"format": 1},
    "add": {"path": "/data/x.bin", "kind": "blob", "size": 12, "name": "x", "refs": {"name/x": i(2)},
            "objects": [[i(2), 12, "blob"]]},
    "gc": {"objects_removed": 2, "bytes_removed": 100, "tmp_files_removed": 1, "work_folders_removed": ["train-1"]},
    "prune": {"policy": {"name": "superseded-training-state", "version": 1, "keep_resumed": True},
              "objects_removed": 1, "bytes_removed": 64, "removed": [["a" * 64, 64, "checkpoint optimizer", "b" * 64]]},
    "import-base": {"base": i(3), "name": "smol", "refs": {"name/smol": i(3)}},
    "genesis": {"generation": 0, "refs": {"HEAD": i(1), "gen-0": i(1)}},
    "commit": {"generation": 1, "cycle": 1, "verdict_name": "Accept", "counters": {"cycles": 1}, **REFS},
    "refusal": {"cycle": 2, "verdict_name": "Regressed", "reasons": ["Regressed"], "receipt": i(4), "verdict": i(5),
                "counters": {"cycles": 1}},
    "rollback": {"head": 0, "from": 1, "to": 0, "reason": "bad", "refs": {"HEAD": i(1)}},
    "adopt": {"generation": 4, "source_ref": "alice/gen-3", "source": i(37), "forced": False, "reason": "",
              "verdict": i(22), **REFS},
    "capability": {"capability": "calc", "action": "add", "module": i(6), "manifest": i(7),
                   "grants": [{"kind": "clock"}], "generation": 2, **REFS},
    "capability-grant": {"capability": "calc", "action": "grant", "grants": [], "previous": [{"kind": "clock"}],
                         "generation": 3, **REFS},
    "compile": {"plan": i(8), "spec": i(9), "target": "cpu", "spec_source": i(10)},
    "train": {"receipt": i(11), "plan": i(8), "adapter": i(12), "rung": "Learned", "unsandboxed": False,
              "wall_s": 3.25},
    "checkpoint": {"checkpoint": i(13), "plan": i(8), "step": 4, "run": "run-1"},
    "reproduce": {"comparison": i(14), "of": i(11), "receipt": i(15), "outcome": "Reproduced"},
    "sandbox-violation": {"run": "run-1", "trainer": "sft", "violations": [{"what": "a symlink", "path": "x"}],
                          "checkpoints": [i(13)], "sandboxed": True, "policy": {"network": False}, "plan": i(8)},
    "track-start": {"run": "mine", "version": 1, "params": {"lr": 0.1}, "seeds": {"torch": 1}, "data": {"train": i(16)},
                    "loss": "loss", "source": {"script": {"path": "t.py", "id": i(17)}}, "started": 1700000000.5,
                    "pid": 42, "host": "h", "argv": ["t.py"]},
    "track-metrics": {"run": "run:" + "ab" * 32, "metrics": i(19), "rows": 2, "first_step": 1, "last_step": 2},
    "track": {"run": "run:" + "ab" * 32, "receipt": i(20), "status": "finished", "rung": "Ran", "name": "mine"},
    "seal": {"suite": i(21), "suite_hash": "b3:abc", "scored": 40, "canaries": 2, "repin": False, "reason": None,
             "previous": None, "changes": {}, "refs": {"suite": i(21)}},
    "judge": {"verdict": i(22), "verdict_name": "Accept", "reason_codes": [], "learner_view": i(23),
              "suite_hash": "b3:abc", "suite_ref": i(21), "recomputed_suite_hash": "b3:abc", "candidate": i(24),
              "incumbent": None, "scored": True, "budget_counted": True, "budget": {"used": 1, "of": 20},
              "wall_s": 1.5, "score_s": 1.0},
    "record": {"turns": i(25), "first": 1, "count": 2, "counters": {"turns": 2}, "requests": ["r1", None],
               "image": {"session": "s", "from": 1, "upto": 2}, "context": i(26), "refs": {"image/context": i(26)}},
    "outcome": {"turn": "t2", "outcome": "it worked", "time": "2026-01-01T00:00:00.000000Z", "source": "user"},
    "export": {"dataset": i(27), "first": 1, "last": 2, "counters": {"exported": 2}, "cycle": 1},
    "image": {"event": "start", "generation": i(1), "gen": 1, "restored": None, "context": i(26), "session": "s",
              "image_pid": 7},
    "kernel-build": {"record": i(28), "kernel": "decode_linear", "target": "h200", "arch": "sm_90", "cubin": i(29),
                     "target_profile": {"name": "h200"}, "gate_dropped": i(30)},
    "kernel-test": {"record": i(31), "kernel": "decode_linear", "target": "h200", "build": i(28),
                    "worst_rel_l2": 1e-6, "tolerance": 1e-3, "unwritten": 0},
    "kernel-bench": {"record": i(32), "kernel": "decode_linear", "target": "h200", "build": i(28), "shape": "1x4096",
                     "candidate_median_s": 1e-5, "baseline_median_s": None},
    "kernel-gate": {"record": i(33), "kernel": "decode_linear", "target": "h200", "build": i(28),
                    "code_object": i(29), "verdict": "Accept", "code": None},
    "import": {"source": "bundle.tar", "namespace": "alice", "manifest": i(34), "segment": None, "signers": [],
               "objects_new": 3, "bytes_new": 100, "absent": [i(35)], "refs": {"alice/HEAD": i(1)}},
    "repair": {"source": "origin", "repaired": [i(2)], "objects": [[i(2), 12, "repair"]]},
    "remote": {"remote": {"name": "origin", "action": "add"}, "refs": {"remote:origin": i(36)}},
    "key": {"key": {"name": "me", "fingerprint": "ab12"}},
    "trust": {"untrust": {"fingerprint": "ab12"}, "refs": {"trust:ab12": None}},
    "setting": {"setting": {"require_signatures": True}},
}


def test_every_kind_has_an_example_and_every_example_a_kind():
    assert set(EXAMPLES) == set(records.KINDS)


@pytest.mark.parametrize("kind", sorted(records.KINDS))
def test_payload_round_trips(kind):
    p = EXAMPLES[kind]
    obj = records.KINDS[kind].from_payload(copy.deepcopy(p))
    assert type(obj) is records.KINDS[kind] and obj.KIND == kind
    assert obj.to_payload() == p
    assert records.parse({"kind": kind, "payload": p}) == obj
    with pytest.raises(AttributeError):  # frozen
        obj.extra = {}


@pytest.mark.parametrize("kind", sorted(records.KINDS))
def test_each_required_field_is_checked(kind):
    """Dropping a required field, or giving it a list where the writer writes something else,
    is BadInput naming the field."""
    cls = records.KINDS[kind]
    for f in cls._fields():
        key = f.metadata["key"] or f.name
        if key not in EXAMPLES[kind]:
            continue
        p = copy.deepcopy(EXAMPLES[kind])
        if f.default is records.MISSING:
            del p[key]
            with pytest.raises(BadInput, match=f"payload.{key} is missing"):
                cls.from_payload(p)
        if f.metadata["check"]([["not", "this"]]) is not None:
            p = {**copy.deepcopy(EXAMPLES[kind]), key: [["not", "this"]]}
            with pytest.raises(BadInput, match=f"payload.{key} must be"):
                cls.from_payload(p)


@pytest.mark.parametrize("bad", [{"refs": ["HEAD"]}, {"refs": {"HEAD": "not-an-id"}}, {"refs": {"": None}},
                                 {"counters": {"turns": "2"}}, {"counters": {"turns": True}}, {"counters": []},
                                 {"objects": {"a": 1}}, {"objects": [[i(1), -1, "blob"]]},
                                 {"objects": [["x", 1, "b"]]}])
def test_the_envelope_is_checked_for_every_kind(bad):
    for kind, cls in records.KINDS.items():
        with pytest.raises(BadInput, match="payload.(refs|counters|objects)"):
            cls.from_payload({**EXAMPLES[kind], **bad})


def test_meaning_not_only_types():
    with pytest.raises(BadInput, match="last .* is before"):
        records.Export.from_payload({**EXAMPLES["export"], "first": 5, "last": 2})
    with pytest.raises(BadInput, match="head .* and payload.to"):
        records.Rollback.from_payload({**EXAMPLES["rollback"], "head": 3})
    with pytest.raises(BadInput, match="turn name"):
        records.Outcome.from_payload({**EXAMPLES["outcome"], "turn": "t0"})
    with pytest.raises(BadInput, match="b3: id"):
        records.Judge.from_payload({**EXAMPLES["judge"], "verdict": "b3:" + "g" * 64})
    with pytest.raises(BadInput, match="exactly one"):
        records.Trust.from_payload({"trust": {"name": "a", "fingerprint": "b"}, "untrust": {"fingerprint": "b"}})
    with pytest.raises(BadInput, match="finite"):
        records.Train.from_payload({**EXAMPLES["train"], "wall_s": float("nan")})
    with pytest.raises(BadInput, match="non-negative"):
        records.Add.from_payload({**EXAMPLES["add"], "size": -1})
    with pytest.raises(BadInput, match="not one this version defines"):
        records.parse({"kind": "no-such-kind", "payload": {}})


def test_extra_keys_survive_and_typed_refs_are_named():
    p = {**EXAMPLES["judge"], "from_a_newer_writer": [1, 2]}
    obj = records.Judge.from_payload(p)
    assert obj.extra == {"from_a_newer_writer": [1, 2]} and obj.to_payload() == p
    assert obj.object_kinds() == {"verdict": (i(22), "verdict"), "learner_view": (i(23), "learner-view"),
                                  "suite_ref": (i(21), "suite")}
    assert records.ref_object_kind("HEAD") == "generation" and records.ref_object_kind("gen-12") == "generation"
    assert records.ref_object_kind("name/x") is None


def test_the_store_registry_is_the_records_registry():
    assert schema.kinds() == frozenset(records.KINDS)
    assert schema.ref_object_kind("gen-3") == "generation"


def _written_kinds() -> set[str]:
    """Every kind passed to `store.transaction(...)` in ledger/: string literals, module-level
    string constants (JUDGE_KIND = "judge"), and a payload class's KIND (records.Judge.KIND, or a
    constant bound to it)."""
    by_class = {c.__name__: c.KIND for c in records.KINDS.values()}

    def kind_of(node, consts):
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            return node.value
        if isinstance(node, ast.Name) and node.id in consts:
            return consts[node.id]
        if isinstance(node, ast.Attribute) and node.attr == "KIND" and isinstance(node.value, ast.Attribute) \
                and isinstance(node.value.value, ast.Name) and node.value.value.id == "records":
            return by_class.get(node.value.attr, f"<unknown records.{node.value.attr}>")
        return None

    out = set()
    for path in (ROOT / "ledger").rglob("*.py"):
        tree = ast.parse(path.read_text(), str(path))
        consts: dict[str, str] = {}
        for n in tree.body:
            if isinstance(n, ast.Assign):
                v = kind_of(n.value, consts)
                if v is not None:
                    consts.update({t.id: v for t in n.targets if isinstance(t, ast.Name)})
        for node in ast.walk(tree):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) \
                    and node.func.attr in ("transaction", "transaction_held") and node.args:
                a = node.args[0]
                if isinstance(a, ast.Name) and a.id == "kind":
                    continue  # Store.transaction's own definition passes its argument on
                k = kind_of(a, consts)
                assert k is not None, (f"{path}:{node.lineno}: a transaction kind this test cannot read; "
                                       "use a literal, a module constant or records.<Kind>.KIND")
                out.add(k)
    return out


def test_the_registry_covers_every_kind_the_code_writes():
    written = _written_kinds()
    assert len(written) >= 28  # the scan found the writers (not an empty set that passes trivially)
    assert written - set(records.KINDS) == set(), "record kinds without a schema in ledger/records.py"


def test_real_writers_pass_their_schemas(tmp_path):
    """Records written by the real code (not examples) pass their kind's schema, and the objects
    they name have the kinds the schema says."""
    from ledger import experience
    from ledger.sharing import keys, remote
    from ledger.store import Store
    from ledger.store.add import add_path

    store = Store.init(tmp_path)
    (tmp_path / "f.txt").write_text("hello")
    add_path(store, tmp_path / "f.txt", name="f")
    experience.record(store, experience.parse_turns('{"situation": "s1", "action": "a1"}\n'
                                                    '{"situation": "s2", "action": "a2", "outcome": "o2"}', "turns"))
    experience.attach_outcome(store, "t1", "better")
    experience.export(store)
    (tmp_path / "remote").mkdir()
    remote.add(store, "origin", str(tmp_path / "remote"))
    keys.trust(store, keys.create(store, "me"))
    seen = set()
    for rec in store.journal.scan().records:
        obj = records.parse(rec)
        assert obj.to_payload() == rec["payload"]
        for key, (oid, want) in obj.object_kinds().items():
            assert store.get_json(oid)["kind"] == want, (rec["kind"], key)
        seen.add(rec["kind"])
    assert {"init", "add", "record", "outcome", "export", "remote", "key", "trust"} <= seen


def test_every_kind_is_documented():
    """docs/store-format.md ("Record schemas") lists every kind the registry defines."""
    doc = (ROOT / "docs" / "store-format.md").read_text(encoding="utf-8")
    section = doc[doc.index("## Record schemas"):]
    missing = [k for k in records.KINDS if f"`{k}`" not in section and f"`{k}` /" not in section]
    assert missing == [], f"record kinds not described in docs/store-format.md: {missing}"


def test_payload_objects_are_valid_by_construction():
    """A writer that builds its payload through records gets the checks verify applies."""
    with pytest.raises(BadInput, match="payload.dataset must be a b3: id"):
        records.Export(dataset="not-an-id", first=1, last=2)
    with pytest.raises(BadInput, match="last .* is before"):
        records.Export(dataset=i(1), first=3, last=2)
    with pytest.raises(BadInput, match="payload.counters"):
        records.Record(turns=i(1), first=1, count=1, counters={"turns": "1"})
    ok = records.Export(dataset=i(1), first=1, last=2, counters={"exported": 2}, extra={"note": "x"})
    assert ok.to_payload() == {"dataset": i(1), "first": 1, "last": 2, "counters": {"exported": 2}, "note": "x"}


def test_absent_survives_copy_and_pickle():
    e = records.Export(dataset=i(1), first=1, last=1)
    assert copy.deepcopy(e).cycle is records.ABSENT and pickle.loads(pickle.dumps(e)).cycle is records.ABSENT
    assert copy.deepcopy(e).to_payload() == e.to_payload() == {"dataset": i(1), "first": 1, "last": 1}


def test_writers_fill_a_payload_only_through_its_kind(tmp_path):
    """records.write: the payload's kind must be the transaction's, and must agree with a field a
    shared helper wrote (generations.new_generation's number); write_field: a field the kind
    models, of its type. Each refusal is a bug in the writer (InternalError), before any commit."""
    from ledger.errors import InternalError
    from ledger.store import Store

    s = Store.init(tmp_path)
    seq = s.state.seq
    with pytest.raises(InternalError, match="a commit transaction was given a rollback payload"):
        with s.transaction("commit") as tx:
            records.write(tx, records.Rollback(head=0))
    with pytest.raises(InternalError, match="would change generation"):
        with s.transaction("commit") as tx:
            records.write_field(tx, "generation", 1)
            records.write(tx, records.Commit(generation=2))
    with pytest.raises(InternalError, match="has no payload field 'nope'"):
        with s.transaction("image") as tx:
            records.write_field(tx, "nope", 1)
    with pytest.raises(InternalError, match="payload.context must be a b3: id"):
        with s.transaction("image") as tx:
            records.write_field(tx, "context", "not-an-id")
    assert Store.open(tmp_path).state.seq == seq  # nothing was committed
    with s.transaction("rollback") as tx:  # agreeing values: move_head's head, then the whole payload
        records.write_field(tx, "head", 0)
        records.write(tx, records.Rollback(head=0, reason="same"))
        tx.refs["name/x"] = tx.put_bytes(b"x")
    assert records.read(tx.record) == records.Rollback(head=0, reason="same", refs=tx.record["payload"]["refs"],
                                                       objects=tx.record["payload"]["objects"])


def test_given_reads_an_optional_field():
    e = records.Export(dataset=i(1), first=1, last=1)
    assert records.given(e.cycle) is None and records.given(e.cycle, 7) == 7
    assert records.given(records.Export(dataset=i(1), first=1, last=1, cycle=3).cycle) == 3
