"""git's "racy" stat-cache problem (issue 14): a same-size rewrite within one timestamp tick
of `ledger add` has the same stat as the file that was added. The guard: an entry is trusted
only if the files it covers were modified strictly before the entry was written.

To make the tick long enough to rewrite a file inside it deterministically, the test runs on
an emulated filesystem with whole-second timestamps (as ext3, HFS+ and FAT have): every
os.stat / os.lstat / os.fstat result has its mtime and ctime truncated to the second.
"""

import os
import time

import pytest

from ledger.store import Store
from ledger.store.add import add_path
from ledger.store.ids import hash_bytes

SECOND = 1_000_000_000


def _coarse(st):
    cls, (seq, extra) = st.__reduce__()[:2]
    seq, extra = list(seq), dict(extra)
    for f in ("st_mtime_ns", "st_ctime_ns"):
        extra[f] = extra[f] // SECOND * SECOND
    for i, f in ((8, "st_mtime"), (9, "st_ctime")):
        seq[i] = int(seq[i])
        extra[f] = float(seq[i])
    return cls(seq, extra)


@pytest.fixture
def whole_second_timestamps(monkeypatch):
    real_stat, real_lstat, real_fstat = os.stat, os.lstat, os.fstat
    monkeypatch.setattr(os, "stat", lambda *a, **kw: _coarse(real_stat(*a, **kw)))
    monkeypatch.setattr(os, "lstat", lambda *a, **kw: _coarse(real_lstat(*a, **kw)))
    monkeypatch.setattr(os, "fstat", lambda fd: _coarse(real_fstat(fd)))


def _same_second_rewrite(tmp_path, store, name, first, second):
    """Write, add, rewrite (same size) all inside one second; retry across a boundary."""
    f = tmp_path / name
    for _ in range(5):
        while time.time() % 1 > 0.5:  # start early in a second: add takes well under 0.5 s
            time.sleep(0.05)
        t0 = int(time.time())
        f.write_bytes(first)
        res = add_path(store, f)
        f.write_bytes(second)
        if int(time.time()) == t0:
            return f, res
    pytest.skip("could not fit write, add and rewrite into one second")


def test_same_size_rewrite_within_the_tick_is_seen(tmp_path, whole_second_timestamps):
    s = Store.init(tmp_path)
    f, res = _same_second_rewrite(tmp_path, s, "f", b"first----", b"second---")
    assert res["id"] == hash_bytes(b"first----")
    again = add_path(Store.open(s.root), f)
    assert not again["unchanged"] and again["id"] == hash_bytes(b"second---")
    # once the file is older than the cache, the stat cache is trusted again
    time.sleep(1.1)
    add_path(Store.open(s.root), f)
    n = Store.open(s.root).state.seq
    assert add_path(Store.open(s.root), f)["unchanged"] and Store.open(s.root).state.seq == n


def test_same_size_rewrite_in_a_folder_within_the_tick_is_seen(tmp_path, whole_second_timestamps):
    s = Store.init(tmp_path)
    d = tmp_path / "d"
    d.mkdir()
    (d / "other").write_bytes(b"unchanging")
    for _ in range(5):
        while time.time() % 1 > 0.5:
            time.sleep(0.05)
        t0 = int(time.time())
        (d / "f").write_bytes(b"first----")
        first = add_path(s, d)
        (d / "f").write_bytes(b"second---")
        if int(time.time()) == t0:
            break
    else:
        pytest.skip("could not fit write, add and rewrite into one second")
    again = add_path(Store.open(s.root), d)
    assert not again["unchanged"] and again["id"] != first["id"]
    entries = {e["path"]: e["id"] for e in Store.open(s.root).get_json(again["id"])["entries"]}
    assert entries["f"] == hash_bytes(b"second---")
