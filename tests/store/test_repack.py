"""Repacking packs whose chunks are mostly dead after gc (ledger/store/repack.py;
docs/store-format.md C11): live chunks move to one new pack, the indexes that named the old
packs are rewritten atomically, the old packs go last — a crash at any step leaves every object
readable and whole, and what is left over is gc's."""

import json
import os
import signal
import subprocess
import sys

import pytest

from ledger.errors import CorruptObject
from ledger.store import Store, gc, repack
from ledger.store.verify import verify
from tests.conftest import ledger_cmd
from tests.reliability.helpers import assert_consistent

MIB = 1 << 20


def _setup(root):
    """x (4 MiB) is recorded; w = x + 8 MiB more was stored in one pack and is unrecorded, so
    gc removes w and leaves its pack two-thirds dead but named by x."""
    s = Store.init(root)
    s.objects.chunked_min = 1 * MIB
    x = os.urandom(4 * MIB)
    with s.locked():
        w, _ = s.objects.put_bytes(x + os.urandom(8 * MIB))
    (root / "x.bin").write_bytes(x)
    with s.transaction("add") as tx:
        xid = tx.put_file(root / "x.bin")
        tx.outputs.append(xid)
        tx.refs["name/x"] = xid
    gc.prune(Store.open(s.root))
    s = Store.open(s.root)
    assert not s.objects.has(w) and s.objects.chunked(xid)
    return s, xid, x


def _pack_bytes(s) -> int:
    return sum(p.stat().st_size for _, p in s.objects.packs.iter_packs())


def test_a_mostly_dead_pack_is_repacked_and_the_object_stays_whole(tmp_path):
    s, xid, x = _setup(tmp_path)
    p = repack.plan(s)
    assert len(p.packs) == 1 and p.objects == (xid,) and not p.applied
    _, size, live = p.packs[0]
    assert size - live >= 0.6 * size                             # ~8 of ~12 MiB dead
    before = _pack_bytes(s)
    done = repack.repack(Store.open(s.root))
    s = Store.open(s.root)
    assert done.applied and not os.path.exists(p.packs[0][0])
    assert s.get_bytes(xid) == x and s.objects.intact(xid)
    assert before - _pack_bytes(s) >= 7 * MIB                     # the dead chunks are gone from disk
    assert verify(s, read_data=True).ok
    assert not repack.plan(s).packs                              # nothing left to repack
    assert not [f for f in s.tmp.iterdir() if f.is_file()]


def test_a_damaged_live_chunk_stops_the_repack_before_any_index_changes(tmp_path):
    s, xid, x = _setup(tmp_path)
    old_index = s.objects.index_path(xid).read_bytes()
    packs = sorted(str(p) for _, p in s.objects.packs.iter_packs())
    p = repack.plan(s)
    d, (pack, off, n) = next((d, loc) for d, loc in s.objects.chunk_entries(xid)
                             if str(s.objects.packs.path(loc[0])) == p.packs[0][0])
    path = s.objects.packs.path(pack)
    os.chmod(path, 0o644)
    with open(path, "r+b") as f:
        f.seek(off + n // 2)
        b = f.read(1)
        f.seek(off + n // 2)
        f.write(bytes([b[0] ^ 1]))
    with pytest.raises(CorruptObject, match="does not hash to its name"):
        repack.repack(Store.open(s.root))
    s = Store.open(s.root)
    assert s.objects.index_path(xid).read_bytes() == old_index   # untouched
    assert sorted(str(p) for _, p in s.objects.packs.iter_packs()) == packs
    assert not [f for f in s.tmp.iterdir() if f.is_file()]


def test_a_crash_at_every_step_of_a_repack_leaves_every_object_whole(tmp_path):
    """SIGKILL at each fault point of a repack (the new pack durable; each index renamed;
    the indexes durable; before the old packs go): the object reads back exactly, verify
    --read-data is clean, and gc then a second repack finish the job."""
    script = "import sys; from ledger.store import Store, repack; repack.repack(Store.open(sys.argv[1]))"
    probe, xid, x = _setup(tmp_path / "probe")
    trace = tmp_path / "trace"
    env = {k: v for k, v in os.environ.items() if not k.startswith("LEDGER_")}
    r = subprocess.run([sys.executable, "-c", script, str(probe.root)], env={**env, "LEDGER_FAULT_TRACE": str(trace)},
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    points = [line.split()[1] for line in trace.read_text().splitlines()]
    assert {"pack.before-fsync", "pack.after-rename", "repack.pack-written", "repack.index-installed",
            "repack.indexes-durable"} <= set(points)
    for i, name in enumerate(points):
        work = tmp_path / f"w{i}"
        s, xid, x = _setup(work)
        r = subprocess.run([sys.executable, "-c", script, str(s.root)], env={**env, "LEDGER_FAULT_AT": str(i + 1)},
                           capture_output=True, text=True)
        assert r.returncode == -signal.SIGKILL, (name, r.stderr)
        s = assert_consistent(s.root)
        assert s.get_bytes(xid) == x, name
        gc.prune(s)                                              # leftovers (a new or an old pack) are gc's
        repack.repack(Store.open(s.root))
        s = Store.open(s.root)
        assert s.get_bytes(xid) == x and verify(s, read_data=True).ok, name
        assert not repack.plan(s).packs, name


def test_repack_through_the_cli_is_a_dry_run_unless_applied(tmp_path):
    s, xid, x = _setup(tmp_path)
    dry = ledger_cmd("repack", "--json", cwd=tmp_path)
    assert dry.returncode == 0, dry.stderr
    body = json.loads(dry.stdout)
    assert not body["applied"] and len(body["packs"]) == 1 and body["reclaimed"] >= 7 * MIB
    assert repack.plan(Store.open(s.root)).packs                 # nothing changed
    done = ledger_cmd("repack", "--apply", "--json", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["applied"]
    assert Store.open(s.root).get_bytes(xid) == x
    bad = ledger_cmd("repack", "--min-dead", "2", cwd=tmp_path)
    assert bad.returncode == 2 and "fraction" in bad.stderr
