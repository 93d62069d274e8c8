"""The read-ahead of whole-history passes (fsio.Warmer): verify --full and gc's first walk ask the
kernel for the next objects while their own reads are slow (the objects coming from the disk).
It MUST change nothing a pass says, touch nothing outside objects/, follow no link and leave no
thread behind (docs/store-format.md rule 14)."""

from __future__ import annotations

import os
import threading

import pytest

from ledger.store import Store, blockcheck, fsio, gc
from ledger.store.verify import verify
from tests.store.test_blockcheck import _block, _lines


def _damaged_store(root):
    """~1,500 turn batches naming real objects, then three of those objects damaged: one gone,
    one a FIFO (a blocking open would hang), one a link to a file outside the store."""
    store = Store.init(root)
    lines = _lines(1500, seed=11, put=store.objects.put_bytes)
    store.journal.path.write_bytes(_block(lines))
    for cache in ("refs.json", "index.duckdb", "index.duckdb.wal"):
        (store.root / cache).unlink(missing_ok=True)
    named = sorted(p for p in store.objects.dir.glob("*/*") if p.is_file())
    gone, fifo, link = named[100], named[500], named[900]
    gone.unlink()
    fifo.unlink()
    os.mkfifo(fifo)
    link.unlink()
    outside = root.parent / "outside"
    outside.write_bytes(b'{"kind":"turns"}')
    link.symlink_to(outside)
    return store.root   # the .ledger folder, as Store() takes it


def _passes(root, monkeypatch, slow: float, warmed: list) -> tuple:
    """verify --full's report and gc's plan, from nothing saved, and how many names each gave
    the warmer (`warmed`: a spy's list of them)."""
    monkeypatch.setattr(fsio.Warmer, "SLOW", slow)
    monkeypatch.setattr(blockcheck, "MIN_LINES", 256)   # gc's walk takes runs of lines (each_run) here too
    for f in ("reach.bin", "reach.seal", "verified.json"):
        (root / "cache" / f).unlink(missing_ok=True)
    warmed.clear()
    report = verify(Store(root), full=True).to_json()
    by_verify = len(warmed)
    plan = gc.plan(Store(root))
    return (report, plan), (by_verify, len(warmed) - by_verify)


def _warm_threads() -> list:
    return [t for t in threading.enumerate() if t.name.startswith("ledger-warm")]


def test_a_pass_with_the_warmer_on_says_exactly_what_it_says_without(tmp_path, monkeypatch):
    # `asked`: the names each pass gave the warmer (how many warm-ups ran depends on timing: one
    # not started when the next batch comes is dropped)
    root = _damaged_store(tmp_path / "s")
    real_ahead, real_warm, asked, ran = fsio.Warmer.ahead, fsio._warm, [], []

    def ahead(self, hexes):
        hexes = list(hexes)
        asked.extend(hexes)
        real_ahead(self, hexes)

    def warm(dir_fd, name):
        ran.append(name)
        real_warm(dir_fd, name)

    monkeypatch.setattr(fsio.Warmer, "ahead", ahead)
    monkeypatch.setattr(fsio, "_warm", warm)
    off, counts = _passes(root, monkeypatch, float("inf"), asked)   # never slow: never on
    assert counts == (0, 0) and ran == []
    on, counts = _passes(root, monkeypatch, -1.0, asked)            # always slow: on after the first reads
    assert min(counts) > 500, counts  # both passes read ahead, the damaged objects' names among them
    assert ran
    assert on == off
    report = off[0]
    assert not report["ok"] and len(report["errors"]) >= 3, report["errors"]
    assert not _warm_threads()


def test_the_warmer_opens_nothing_through_a_link_and_nothing_outside_objects(tmp_path, monkeypatch):
    # A fan-out directory replaced by a link to a directory elsewhere: the warmer's own directory
    # descriptor is opened without following it, so no name in it is warmed (the pass's own
    # reads report it); names are opened only relative to those descriptors.
    objects = tmp_path / "objects"
    (objects / "ab").mkdir(parents=True)
    (objects / "ab" / ("c" * 62)).write_bytes(b"{}")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / ("d" * 62)).write_bytes(b"{}")
    os.mkfifo(elsewhere / ("e" * 62))
    (objects / "cd").symlink_to(elsewhere)
    opened = []
    real_open = os.open

    def spy_open(path, flags, *a, dir_fd=None, **k):
        opened.append((os.fspath(path), dir_fd))
        return real_open(path, flags, *a, dir_fd=dir_fd, **k)

    monkeypatch.setattr(os, "open", spy_open)
    w = fsio.Warmer(objects)
    try:
        w.ahead(["ab" + "c" * 62, "cd" + "d" * 62, "cd" + "e" * 62, "ef" + "f" * 62])
        for f in w._pending:
            f.result(timeout=10)
    finally:
        w.close()
    names = [p for p, d in opened if d is not None]
    assert names == ["c" * 62]                       # the one object under a real fan-out directory
    dirs = sorted(p for p, d in opened if d is None)
    assert dirs == [f"{objects}/ab", f"{objects}/cd", f"{objects}/ef"]   # each refused or opened once, no-follow
    assert not _warm_threads()


def test_the_warmer_is_on_only_while_reads_are_slow():
    w = fsio.Warmer("/nonexistent")
    w.took(1000, 1000 * 4e-6)
    assert not w.on
    w.took(1000, 1000 * 80e-6)      # an object from the disk here: ~80 us
    assert w.on
    w.took(10, 10 * 1e-6)           # too few to tell: unchanged
    assert w.on
    w.took(500, 500 * 5e-6)
    assert not w.on
    w.close()


@pytest.mark.parametrize("where", ["verify", "gc"])
def test_a_ctrl_c_in_a_pass_with_the_warmer_on_leaves_no_thread(tmp_path, monkeypatch, where):
    root = _damaged_store(tmp_path / "s")
    monkeypatch.setattr(fsio.Warmer, "SLOW", -1.0)
    monkeypatch.setattr(blockcheck, "MIN_LINES", 256)
    calls = []
    real = fsio.Warmer.took

    def took(self, count, seconds):
        real(self, count, seconds)
        calls.append(count)
        if self._pool is not None:   # warm-ups under way (short runs may come first)
            raise KeyboardInterrupt

    made = []   # every warmer, held here: an executor nobody holds ends its threads by itself
    real_init = fsio.Warmer.__init__

    def init(self, *a, **k):
        real_init(self, *a, **k)
        made.append(self)

    monkeypatch.setattr(fsio.Warmer, "took", took)
    monkeypatch.setattr(fsio.Warmer, "__init__", init)
    with pytest.raises(KeyboardInterrupt):
        verify(Store(root), full=True) if where == "verify" else gc.plan(Store(root))
    assert made and calls
    assert all(w._pool is None and w._dirs == {} for w in made)   # closed: threads joined, directories closed
    assert not _warm_threads()
