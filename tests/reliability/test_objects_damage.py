"""Bit flips, wrong names, missing and dangling objects."""

import os
import random

import pytest

from ledger.errors import CorruptObject
from ledger.store import Store
from ledger.store.verify import verify
from tests.conftest import ledger_cmd


def _store(tmp_path):
    s = Store.init(tmp_path)
    ids = []
    for i in range(5):
        with s.transaction("t") as tx:
            oid = tx.put_bytes(os.urandom(1000 + i))
            tx.outputs.append(oid)
            ids.append(oid)
    return s, ids


def test_bit_flip(tmp_path):
    s, ids = _store(tmp_path)
    rng = random.Random(7)
    victim = rng.choice(ids)
    p = s.object_path(victim)
    os.chmod(p, 0o644)
    data = bytearray(p.read_bytes())
    bit = rng.randrange(len(data) * 8)
    data[bit // 8] ^= 1 << (bit % 8)
    p.write_bytes(bytes(data))
    rep = verify(Store.open(s.root), read_data=True)
    assert [e["id"] for e in rep.errors] == [victim]
    with pytest.raises(CorruptObject):
        s.get_bytes(victim)
    cli = ledger_cmd("verify", "--read-data", cwd=tmp_path)
    assert cli.returncode == 4 and victim in cli.stdout and "Traceback" not in cli.stderr


def test_wrong_name_missing_dangling(tmp_path):
    s, ids = _store(tmp_path)
    # wrong name: another object's bytes under this id (same size cannot be assumed)
    wrong = s.object_path(ids[0])
    os.chmod(wrong, 0o644)
    wrong.write_bytes(s.object_path(ids[1]).read_bytes())  # 1001 bytes under a 1000-byte id
    # missing: delete a referenced one
    s.object_path(ids[2]).unlink()
    # dangling: an unreferenced object
    with pytest.raises(RuntimeError):
        with s.transaction("t") as tx:
            dangling = tx.put_bytes(b"nobody refers to me")
            raise RuntimeError
    rep = verify(Store.open(s.root), read_data=True)
    faults = {(e["what"], e.get("id")) for e in rep.errors}
    assert ("corrupt", ids[0]) in faults
    assert ("missing", ids[2]) in faults
    assert any(i["what"] == "dangling" and dangling in i["ids"] for i in rep.info)
    assert not any(e.get("id") == dangling for e in rep.errors)
    # even without --read-data, a size mismatch and a missing object are found
    rep2 = verify(Store.open(s.root))
    assert {("corrupt", ids[0]), ("missing", ids[2])} <= {(e["what"], e.get("id")) for e in rep2.errors}


def test_gc_removes_only_unreachable(tmp_path):
    s, ids = _store(tmp_path)
    with pytest.raises(RuntimeError):
        with s.transaction("t") as tx:
            dangling = tx.put_bytes(b"garbage")
            raise RuntimeError
    from ledger.store import gc

    plan = gc.plan(s)
    assert [o for o, _ in plan.unreachable] == [dangling]
    assert s.has(dangling)  # dry run deletes nothing
    gc.prune(s)
    assert not s.has(dangling)
    assert all(s.has(i) for i in ids)
    assert verify(Store.open(s.root), read_data=True).ok


def test_gc_keeps_objects_reached_through_json(tmp_path):
    s = Store.init(tmp_path)
    with s.transaction("t") as tx:
        leaf = tx.put_bytes(b"leaf")
        mid = tx.put_json({"kind": "x", "child": leaf})
        top = tx.put_json({"kind": "y", "nested": [{"m": mid}]})
        tx.outputs.append(top)
    from ledger.store import gc

    assert gc.plan(s).unreachable == ()
    assert {leaf, mid, top} <= s.closure([top])
