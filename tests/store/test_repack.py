"""Repacking packs whose chunks are mostly dead after gc (ledger/store/repack.py;
docs/store-format.md C11): live chunks move to one new pack, the indexes that named the old
packs are rewritten atomically, the old packs go last — a crash at any step leaves every object
readable and whole, and what is left over is gc's."""

import json
import os
import random
import signal
import subprocess
import sys

import pytest

from ledger.errors import CorruptObject
from ledger.store import Store, chunks, gc, repack
from ledger.store.verify import verify
from tests.conftest import ledger_cmd
from tests.reliability.helpers import assert_consistent
from tests.store.test_chunks import flip_a_chunk_byte

MIB = 1 << 20
TAIL = 500      # x's last chunk: far shorter than x's page (~75 entries x 60 B)


def _setup(root, tail: int | None = TAIL, seed: int = 0):
    """x (~4 MiB) is recorded; w = x + ~8 MiB more was stored in one pack and is unrecorded, so
    gc removes w and leaves its pack two-thirds dead but named by x. x's last chunk (cut where x
    ends, so not one of w's) and x's page are in a second, small pack.

    The bytes come from `seed`, never os.urandom: with `tail`, x ends `tail` bytes after a
    chunk boundary of w near 4 MiB, so x's last chunk is that short. A short last chunk beside
    x's page (~4.5 KiB) is the layout in which a repack that rewrote the page without taking
    that small pack left it mostly dead (urandom bytes hit it about 1 run in 5); `tail=None`
    cuts x at 4 MiB exactly (a last chunk of any length)."""
    s = Store.init(root)
    s.objects.chunked_min = 1 * MIB
    wb = random.Random(seed).randbytes(12 * MIB)
    if tail is None:
        x = wb[:4 * MIB]
    else:
        ends = [off + n for off, n in chunks.cut(wb)]
        c = min(ends, key=lambda e: abs(e - 4 * MIB))
        x = wb[:c + tail]
        assert chunks.cut(x)[-1] == (c, tail)                    # the layout this asks for
    with s.locked():
        w, _ = s.objects.put_bytes(wb)
    (root / "x.bin").write_bytes(x)
    with s.transaction("add") as tx:
        xid = tx.put_file(root / "x.bin")
        tx.outputs.append(xid)
        tx.refs["name/x"] = xid
    gc.prune(Store.open(s.root))
    s = Store.open(s.root)
    assert not s.objects.has(w) and s.objects.chunked(xid)
    assert len(list(s.objects.packs.iter_packs())) == 2
    return s, xid, x


def _pack_bytes(s) -> int:
    return sum(p.stat().st_size for _, p in s.objects.packs.iter_packs())


@pytest.mark.parametrize("seed,tail", [(0, TAIL), (1, None), (2, None), (3, None)])
def test_a_mostly_dead_pack_is_repacked_and_the_object_stays_whole(tmp_path, seed, tail):
    s, xid, x = _setup(tmp_path, tail, seed)
    p = repack.plan(s)
    assert p.objects == (xid,) and not p.applied
    _, size, live = max(p.packs, key=lambda row: row[1])
    assert size - live >= 0.6 * size                             # ~8 of ~12 MiB dead
    before = _pack_bytes(s)
    done = repack.repack(Store.open(s.root))
    s = Store.open(s.root)
    assert done.applied and not any(os.path.exists(q) for q, _, _ in p.packs)
    assert s.get_bytes(xid) == x and s.objects.intact(xid)
    assert before - _pack_bytes(s) >= 7 * MIB                     # the dead chunks are gone from disk
    assert verify(s, read_data=True).ok
    assert not repack.plan(s).packs                              # nothing left to repack
    assert not [f for f in s.tmp.iterdir() if f.is_file()]


def test_a_repack_reaches_its_fixed_point_in_one_pass(tmp_path):
    """The root cause of a flaky crash test: a repack rewrites the page of every object whose
    chunks it moves, so the old copy of that page dies wherever it lies. Here it lies in a
    small pack beside x's 500-byte last chunk: fully live before, ~90% dead after. The plan
    counts that death before it happens and takes the small pack too, so one repack leaves one
    pack, every byte of it named once (no chunk or page twice, none dead), and a plan after it
    is empty — before, the small pack was left behind and the next plan wanted it."""
    s, xid, x = _setup(tmp_path)
    small = min(s.objects.packs.iter_packs(), key=lambda np: np[1].stat().st_size)
    p = repack.plan(s)
    rows = {q: (size, live) for q, size, live in p.packs}
    assert set(rows) == {str(path) for _, path in s.objects.packs.iter_packs()}
    assert rows[str(small[1])][0] == rows[str(small[1])][1]      # all live now; its page will not be
    done = repack.repack(Store.open(s.root))
    s = Store.open(s.root)
    assert s.get_bytes(xid) == x and verify(s, read_data=True).ok
    [(name, _)] = list(s.objects.packs.iter_packs())
    entries = s.objects.chunk_entries(xid)
    pages = s.objects._index(xid)[1]
    assert {loc[0] for _, loc in entries} | {loc[0] for *_, loc in pages} == {name}
    named = sum(n for _, (_, _, n) in set(entries)) + sum(loc[2] for loc in {ref[3] for ref in pages})
    assert done.bytes_after == s.objects.packs.trailer_start(name)[0] == named
    assert not repack.plan(s).packs and not gc.plan(s).packs


def test_a_page_that_names_no_moved_chunk_stays_where_it_is(tmp_path, monkeypatch):
    """y is recorded in its own pack; z = y + e shares y's chunks and, with small pages, y's
    pages too; v = y + e + more (unrecorded, so gc removes it) left e's chunks in a pack that
    is mostly dead. The repack moves e's chunks and rewrites only the pages that list them:
    z's pages over y stay in y's pack, y's index is untouched, and y's pack is not repacked."""
    monkeypatch.setattr(chunks, "PAGE_MASK", 0x3)                # ~4 entries a page: many pages
    s = Store.init(tmp_path)
    s.objects.chunked_min = 1 * MIB
    rng = random.Random(7)
    y, e = rng.randbytes(2 * MIB), rng.randbytes(1 * MIB)
    with s.transaction("add") as tx:
        (tmp_path / "y.bin").write_bytes(y)
        yid = tx.put_file(tmp_path / "y.bin")
        tx.outputs.append(yid)
        tx.refs["name/y"] = yid
    with s.locked():
        vid, _ = s.objects.put_bytes(y + e + rng.randbytes(4 * MIB))
    with s.transaction("add") as tx:
        (tmp_path / "z.bin").write_bytes(y + e)
        zid = tx.put_file(tmp_path / "z.bin")
        tx.outputs.append(zid)
        tx.refs["name/z"] = zid
    gc.prune(Store.open(s.root))
    s = Store.open(s.root)
    assert not s.objects.has(vid)
    y_pack = {loc[0] for _, loc in s.objects.chunk_entries(yid)}
    assert len(y_pack) == 1
    y_index = s.objects.index_path(yid).read_bytes()
    z_before = s.objects._index(zid)[1]
    kept = [ref for ref in z_before if ref[3][0] in y_pack]      # z's pages shared with y
    assert len(kept) >= 2
    p = repack.plan(s)
    assert p.objects == (zid,) and str(s.objects.packs.path(next(iter(y_pack)))) not in {q for q, _, _ in p.packs}
    repack.repack(Store.open(s.root))
    s = Store.open(s.root)
    assert s.objects.index_path(yid).read_bytes() == y_index
    z_after = s.objects._index(zid)[1]
    assert [ref for ref in z_after if ref[3][0] in y_pack] == kept
    assert s.get_bytes(zid) == y + e and s.get_bytes(yid) == y and verify(s, read_data=True).ok
    assert not repack.plan(s).packs and not gc.plan(s).packs


def test_a_damaged_live_chunk_stops_the_repack_before_any_index_changes(tmp_path):
    s, xid, x = _setup(tmp_path)
    old_index = s.objects.index_path(xid).read_bytes()
    packs = sorted(str(p) for _, p in s.objects.packs.iter_packs())
    p = repack.plan(s)
    i = next(i for i, (_, loc) in enumerate(s.objects.chunk_entries(xid))
             if str(s.objects.packs.path(loc[0])) == p.packs[0][0])
    flip_a_chunk_byte(s, xid, i)
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
    assert not body["applied"] and len(body["packs"]) == 2 and body["reclaimed"] >= 7 * MIB   # w's pack and x's small one
    assert repack.plan(Store.open(s.root)).packs                 # nothing changed
    done = ledger_cmd("repack", "--apply", "--json", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["applied"]
    assert Store.open(s.root).get_bytes(xid) == x
    bad = ledger_cmd("repack", "--min-dead", "2", cwd=tmp_path)
    assert bad.returncode == 2 and "fraction" in bad.stderr
