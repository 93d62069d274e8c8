"""An image is granted a packed object's own file, never a pack (docs/store-format.md P5)."""

from __future__ import annotations

import fcntl
import os

from ledger import api
from ledger.cycle import ensure_genesis, load_spec
from ledger.image import confine, protocol
from ledger.store import Store, canonical, gc, packed


def _served_store(tmp_path):
    """A store whose genesis generation is served, with enough small objects besides that a
    gc --prune packs the generation's small objects too (its manifest, tokenizer, template)."""
    s = Store.init(tmp_path)
    ensure_genesis(s, load_spec(None))
    with s.transaction("t") as tx:
        tx.payload["notes"] = [s.objects.put_bytes(canonical.dumps({"kind": "note", "i": i}))[0]
                               for i in range(packed.MIN_LOOSE)]
    return Store.open(tmp_path)


def test_the_policy_gives_packed_objects_files_of_their_own_and_grants_no_pack(tmp_path):
    s = _served_store(tmp_path)
    gc.prune(Store.open(tmp_path))
    s = Store.open(tmp_path)
    gens = confine.all_generations(s)
    served = set().union(*(confine.serving_objects(s, g) for g in gens))
    was_packed = {o for o in served if s.objects.packed_only(o)}
    assert was_packed, "the test needs served objects that gc packed"
    buffer = protocol.run_dir(s.root) / protocol.BUFFER_DIR
    buffer.mkdir(parents=True)
    policy, objects = confine.policy(s, gens, buffer)
    assert objects == served
    packs_dir = str(s.root / packed.DIR)
    assert not [p for p in policy.read_only if p.startswith(packs_dir)]
    for o in was_packed:
        own = [p for p in (s.objects.path(o), s.objects.zpath(o)) if p.is_file()]
        assert own and str(own[0]) in policy.read_only
        assert s.objects.get_bytes(o)   # the file of its own hashes to the id
    assert not s.root.joinpath("lock").exists()   # the store lock it took is released


def test_gc_moves_no_loose_file_while_a_keeper_holds_its_lock(tmp_path):
    s = _served_store(tmp_path)
    run = protocol.run_dir(s.root)
    run.mkdir()
    fd = os.open(run / "keeper.lock", os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)   # as a serving keeper holds it
        loose = sorted(p for p in s.objects.dir.rglob("*") if p.is_file())
        res = api.gc(prune=True, store=s.root)
        assert res.result.packing.objects == 0
        assert "an image is serving" in res.result.packing.skipped
        assert sorted(p for p in s.objects.dir.rglob("*") if p.is_file()) == loose
    finally:
        os.close(fd)
    res = api.gc(prune=True, store=s.root)   # no keeper now: packed
    assert res.result.packing.objects >= packed.MIN_LOOSE and res.result.packing.skipped is None
