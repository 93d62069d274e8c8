"""Compressed structured objects travel as their own bytes (docs/store-format.md Z3): a bundle,
a push and a pull carry the uncompressed content under its id, the receiver stores it in its own
encoding (arrivals: whole), and the ids a compressed object names are followed for the closure."""

from __future__ import annotations

import json

from ledger.sharing import bundle, fetch, push
from ledger.sharing import remote as rm
from ledger.store import Store
from ledger.store.objects import hash_file

from .conftest import assert_clean


def _turn_batch(alice) -> tuple[str, str]:
    """A compressed turn batch naming a blob only from inside its `.z` file, under a ref."""
    with alice.transaction("add") as tx:
        blob = tx.put_bytes(b"an attachment " * 50, "blob")
        batch = tx.put_json({"kind": "turns", "first": 1, "attachment": blob, "turns": [
            {"id": f"t{i}", "situation": f"user: what is {i} plus 2?", "action": f"call adder.add({i}, 2)",
             "outcome": str(i + 2), "refusal": False} for i in range(300)]})
        tx.outputs.append(batch)
        tx.refs["name/turns"] = batch
        tx.payload.update({"path": "turns.json", "kind": "file", "size": 1})
    assert alice.objects.compressed(batch) and not alice.objects.compressed(blob)
    return batch, blob


def test_a_bundle_carries_the_uncompressed_bytes_and_the_closure_inside(alice, bob, tmp_path):
    batch, blob = _turn_batch(alice)
    out = tmp_path / "t.bundle"
    bundle.create(alice, ["name/turns"], out, origin="alice")
    data = alice.get_bytes(batch)
    assert data in out.read_bytes()                                   # the object's own bytes, not the .z
    bundle.import_bundle(bob, out, namespace="alice")
    bob = Store.open(bob.root)
    assert bob.get_bytes(batch) == data and bob.get_bytes(blob) == alice.get_bytes(blob)
    assert_clean(bob.root)


def test_push_sends_the_content_and_pull_stores_it_whole(alice, bob, tmp_path):
    batch, blob = _turn_batch(alice)
    be = rm.DirBackend(tmp_path / "remote")
    res = push.push(alice, be, ["name/turns"])
    assert res.objects_sent >= 2
    remote_file = tmp_path / "remote" / "objects" / batch[3:5] / batch[5:]
    assert hash_file(remote_file) == batch                            # a remote holds plain objects
    assert json.loads(remote_file.read_bytes())["kind"] == "turns"
    fetch.pull(bob, be, ["name/turns"], namespace="alice")
    bob = Store.open(bob.root)
    assert bob.get_bytes(batch) == alice.get_bytes(batch) and bob.objects.has(blob)
    assert bob.object_path(batch).is_file()                           # arrivals are installed whole (Z3)
    assert_clean(bob.root)
    # a store that holds the batch compressed and pulls it again moves nothing, crashes on nothing
    again = fetch.pull(bob, be, ["name/turns"], namespace="alice")
    assert again[0].objects_new == 0
