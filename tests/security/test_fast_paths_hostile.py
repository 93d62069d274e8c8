"""Attacks on issue 18's fast paths (docs/store-format.md rule 11's quick re-add, the canonical
line check, the line shape, chunk lists, gc's and report's states): each test is one hole found
and closed."""

import os
import time

from ledger.store import fsio, statcache
from tests.conftest import ledger_cmd


def _store_with_entry(tmp_path):
    ledger_cmd("init", cwd=tmp_path, check=True)
    f = tmp_path / "f.bin"
    f.write_bytes(b"x" * 100)
    ledger_cmd("add", f, cwd=tmp_path, check=True)
    time.sleep(0.05)   # past the tick: the next add writes a non-racy entry (rule 11)
    ledger_cmd("add", "--wait", "0", f, cwd=tmp_path, check=True)
    return tmp_path / ".ledger", f


def test_a_config_nested_too_deep_is_unsupported_never_an_internal_error(tmp_path):
    # json.loads raised RecursionError (not a ValueError) for a config nested 30,000 deep, under
    # the 64 KiB bound: `ledger add FILE` answered "internal error", exit 1, quick path or not
    root, f = _store_with_entry(tmp_path)
    (root / "config").write_text('{"format":2,"x":' + "[" * 30000 + "]" * 30000 + "}")
    for args in (("add", f), ("add", "--wait", "0", f)):
        p = ledger_cmd(*args, cwd=tmp_path)
        assert p.returncode == 2 and "config is unreadable" in p.stderr, (p.returncode, p.stderr)


def test_a_stat_cache_entry_removed_while_it_is_read_is_a_miss_never_a_crash(tmp_path, monkeypatch):
    # lookup opened the entry safely, then stat'ed the path again for the racy check: an entry
    # removed (or swapped for a link) in between was a FileNotFoundError, exit 1, or a stat of
    # what the link names
    root, f = _store_with_entry(tmp_path)
    text, st = statcache.stat_line(f)
    entry = statcache.entry_path(root, text)
    assert statcache.lookup(root, entry, max(st.st_mtime_ns, st.st_ctime_ns))   # a hit, untouched
    real_open = fsio.open_regular

    def open_then_unlink(path):
        out = real_open(path)
        os.unlink(path)
        return out
    monkeypatch.setattr(fsio, "open_regular", open_then_unlink)
    hit = statcache.lookup(root, entry, max(st.st_mtime_ns, st.st_ctime_ns))
    assert hit is not None and hit.startswith("b3:")   # the bytes read before it went, judged by their fstat
    assert not entry.exists()
