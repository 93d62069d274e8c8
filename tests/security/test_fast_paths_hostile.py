"""Attacks on issue 18's fast paths (docs/store-format.md rule 11's quick re-add, the canonical
line check, the line shape, chunk lists, gc's and report's states): each test is one hole found
and closed."""

import os
import time

import pytest

from ledger.store import statcache
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
    from ledger.store import Store

    text, st = statcache.stat_line(f)
    entry = statcache.entry_path(root, text, Store.open(root).store_id)
    newest = max(st.st_mtime_ns, st.st_ctime_ns)
    assert statcache.lookup(root, entry, newest, st.st_size)   # a hit, untouched
    real_open = os.open

    def open_then_unlink(path, flags, *a, dir_fd=None, **kw):
        out = real_open(path, flags, *a, dir_fd=dir_fd, **kw)
        if path == entry.name:
            os.unlink(entry)
        return out
    monkeypatch.setattr(os, "open", open_then_unlink)
    hit = statcache.lookup(root, entry, newest, st.st_size)
    assert hit is not None and hit.startswith("b3:")   # the bytes read before it went, judged by their fstat
    assert not entry.exists()


# --- the stat cache (rule 11): what an entry may make `add` believe -----------------------------
# An entry lets `add` skip both the hash and the record, so it is the one cache that is not
# checked against the journal: each test below is an entry that must not be believed.

def _entries(root):
    return sorted((root / "cache" / "stat").iterdir())


def _seq(root):
    from ledger.store import Store

    return Store.open(root.parent).state.seq


def _both_adds(cwd, *args, env=None):
    """The quick `ledger add FILE` and the typer command's (an option): the same answer."""
    return [ledger_cmd("add", *args, cwd=cwd, env=env), ledger_cmd("add", "--wait", "0", *args, cwd=cwd, env=env)]


def test_stat_cache_entries_of_another_store_are_not_trusted(tmp_path):
    # store B holds the same bytes under another name, then gets A's cache/stat (a restored
    # backup of another store's cache, a copied .ledger/cache): A's entry for f was trusted in
    # B, so `ledger add f` answered "unchanged" and B never recorded f
    a, b = tmp_path / "a", tmp_path / "b"
    a.mkdir()
    b.mkdir()
    root_a, f = _store_with_entry(a)
    ledger_cmd("init", cwd=b, check=True)
    (b / "same").write_bytes(f.read_bytes())
    ledger_cmd("add", b / "same", cwd=b, check=True)
    root_b = b / ".ledger"
    for e in _entries(root_a):
        (root_b / "cache" / "stat" / e.name).write_bytes(e.read_bytes())
    time.sleep(0.05)   # the copies are older than nothing they cover: not racy
    n = _seq(root_b)
    quick, typed = _both_adds(b, f)
    assert quick.returncode == 0 and quick.stdout.startswith("added b3:"), (quick.stdout, quick.stderr)
    assert _seq(root_b) == n + 1    # recorded in B ...
    assert typed.returncode == 0 and typed.stdout.startswith("unchanged"), typed.stdout   # ... and B's own entry then


def _forge(root, f, oid):
    """Point f's stat-cache entry at `oid`, all else as written (as a writer of cache/stat/ can)."""
    from ledger.store.ids import hash_bytes

    mine = hash_bytes(f.read_bytes())
    entries = [e for e in _entries(root) if e.read_text().startswith(mine)]
    assert len(entries) == 1, entries
    entries[0].write_text(entries[0].read_text().replace(mine, oid))
    time.sleep(0.05)   # written after f's last change: not racy


def test_an_entry_naming_another_present_object_is_not_believed(tmp_path):
    # the entry said f's bytes were g's object (present in the store): `add f` answered
    # "unchanged <g's id>" with f's size, and a folder add recorded g's object for f
    from ledger.store.ids import hash_bytes

    root, f = _store_with_entry(tmp_path)
    g = tmp_path / "g.bin"
    g.write_bytes(b"y" * 37)
    gid = ledger_cmd("add", g, cwd=tmp_path, check=True).stdout.split()[1]
    _forge(root, f, gid)
    for p in _both_adds(tmp_path, f):
        assert p.returncode == 0 and p.stdout.split()[1] == hash_bytes(f.read_bytes()), p.stdout
    # in a folder: the tree records each file's own id, whatever its entry says
    d = tmp_path / "d"
    d.mkdir()
    h = d / "h"
    h.write_bytes(b"z" * 100)
    ledger_cmd("add", h, cwd=tmp_path, check=True)
    time.sleep(0.05)
    ledger_cmd("add", "--wait", "0", h, cwd=tmp_path, check=True)   # a non-racy entry for h
    _forge(root, h, gid)
    tree = ledger_cmd("add", d, cwd=tmp_path, check=True).stdout.split()[1]
    from ledger.store import Store

    entries = Store.open(tmp_path).get_json(tree)["entries"]
    assert [e["id"] for e in entries] == [hash_bytes(b"z" * 100)]


def test_a_folder_entry_naming_what_is_not_its_tree_is_not_believed(tmp_path):
    # a folder's entry naming a present JSON object that is not a tree (its size as the folder's
    # total, as the entry is checked): add.py read the "tree" for its size, a KeyError, exit 1;
    # one naming another tree answered that tree for the folder
    from ledger.store import Store
    from ledger.store.add import add_path

    s = Store.init(tmp_path)
    d = tmp_path / "d"
    d.mkdir()
    (d / "x").write_bytes(b"hello")
    tree = _committed(s, d)
    other = tmp_path / "e"
    other.mkdir()
    (other / "y").write_bytes(b"other, of another size")
    other_tree = add_path(Store.open(s.root), other)["id"]
    j = tmp_path / "j.json"
    j.write_bytes(b'{"a":1}')
    jid = add_path(Store.open(s.root), j)["id"]
    entry = [e for e in _entries(s.root) if e.read_text().startswith(tree)]
    assert len(entry) == 1
    for forged in (jid, other_tree):
        entry[0].write_text(entry[0].read_text().replace(tree, forged, 1))
        time.sleep(0.05)
        for p in _both_adds(tmp_path, d):
            assert p.returncode == 0 and p.stdout.split()[1] == tree, (p.returncode, p.stdout, p.stderr)
        entry = [e for e in _entries(s.root) if e.read_text().startswith(tree)]   # the add wrote it again


def _committed(store, path):
    """Add `path` until its stat-cache entry is written (an entry within the tick is racy)."""
    from ledger.store.add import add_path

    add_path(store, path)
    time.sleep(0.05)
    return add_path(store, path)["id"]


def _swap_for_link_after_lstat(monkeypatch, victim, target, in_walk=False):
    """The first lstat of `victim` sees the regular file; just after it, victim becomes a link to
    `target` (a writer of the file being added racing the add). in_walk: the look trees.put_tree
    takes at each file of a folder before it is read (an lstat of its bytes path, or a stat
    relative to the folder's fd)."""
    real_lstat, real_stat, done = os.lstat, os.stat, []

    def swap():
        if not done:
            done.append(1)
            os.unlink(victim)
            os.symlink(target, victim)

    def lstat(p, *a, **kw):
        st = real_lstat(p, *a, **kw)
        if isinstance(p, bytes) == in_walk and os.fsdecode(p) == str(victim):
            swap()
        return st

    def stat_(p, *a, dir_fd=None, follow_symlinks=True):
        st = real_stat(p, *a, dir_fd=dir_fd, follow_symlinks=follow_symlinks)
        if in_walk and dir_fd is not None and not follow_symlinks and os.fsdecode(p) == victim.name:
            swap()
        return st
    monkeypatch.setattr(os, "lstat", lstat)
    monkeypatch.setattr(os, "stat", stat_)
    return done


def test_a_file_swapped_for_a_link_after_its_lstat_is_not_answered_for_the_links_target(tmp_path, monkeypatch):
    # unchanged_file lstat'ed the file, then stat'ed (following links) and resolved it: a file
    # swapped for a link to a committed file meanwhile was answered "unchanged <its id>", and in a
    # folder add the tree recorded the target's id for the file, unread (the target may be one the
    # writer of the folder cannot read: its bytes then travel with the tree)
    from ledger.errors import BadInput
    from ledger.store import Store
    from ledger.store.add import add_path

    s = Store.init(tmp_path)
    secret = tmp_path / "secret"
    secret.write_bytes(b"s" * 64)
    _committed(s, secret)
    mine = tmp_path / "mine"
    mine.write_bytes(b"m" * 64)
    done = _swap_for_link_after_lstat(monkeypatch, mine, secret)
    assert statcache.unchanged_file(mine, str(s.root)) is None and done
    d = tmp_path / "d"
    d.mkdir()
    (d / "f").write_bytes(b"m" * 64)
    n = Store.open(s.root).state.seq
    done = _swap_for_link_after_lstat(monkeypatch, d / "f", secret, in_walk=True)
    with pytest.raises(BadInput, match="link"):
        add_path(Store.open(s.root), d)
    assert done and Store.open(s.root).state.seq == n


@pytest.mark.parametrize("linked", ["cache/stat", "cache"])
def test_the_stat_cache_is_never_read_or_written_through_a_linked_folder(tmp_path, linked):
    # lookup opened cache/stat/<name> with O_NOFOLLOW, which guards the last name only: a link
    # in place of cache/ or cache/stat/ was followed, so entries were read from (and written to)
    # a folder outside the store: another store's, or one anyone can write
    root, f = _store_with_entry(tmp_path)
    outside = tmp_path / "outside"
    outside.mkdir()
    moved = outside / os.path.basename(linked)
    os.rename(root / linked, moved)
    os.symlink(moved, root / linked)
    before = sorted((p.relative_to(outside), p.read_bytes()) for p in outside.rglob("*") if p.is_file())
    n = _seq(root)
    for p in _both_adds(tmp_path, f):
        assert p.returncode == 0 and p.stdout.startswith("added b3:"), (p.stdout, p.stderr)
    assert _seq(root) == n + 2
    assert sorted((p.relative_to(outside), p.read_bytes()) for p in outside.rglob("*") if p.is_file()) == before


# --- saved states and small store files: JSON nested too deep -----------------------------------
# json.loads raises RecursionError (not a ValueError) for an array nested a few thousand deep,
# far under each file's read bound: every reader of a small file anyone can write caught only
# ValueError, so each command below answered "internal error", exit 1, for a file of a few KiB.

NESTED = {"refs.json": ("verify", "gc", "report", "show HEAD"), "cache/verified.json": ("verify",),
          "cache/reach.seal": ("gc",), "cache/report.json": ("report",), "lock": ("add b", "unlock")}


@pytest.mark.parametrize("name", sorted(NESTED))
def test_a_store_file_nested_too_deep_is_never_an_internal_error(tmp_path, name):
    ledger_cmd("init", cwd=tmp_path, check=True)
    (tmp_path / "a").write_bytes(b"hi")
    ledger_cmd("add", tmp_path / "a", cwd=tmp_path, check=True)
    for c in ("gc", "report", "verify"):
        ledger_cmd(c, cwd=tmp_path, check=True)   # each saves its state
    (tmp_path / "b").write_bytes(b"new")   # a new file: its add takes the lock
    (tmp_path / ".ledger" / name).write_text("[" * 3000 + "]" * 3000)
    for c in NESTED[name]:
        p = ledger_cmd(*c.split(), cwd=tmp_path)
        assert p.returncode != 1 and "internal error" not in p.stderr, (c, p.returncode, p.stderr)


# --- chunk indexes (docs/store-format.md C2, rule 14's bounds) ----------------------------------

def _chunked_object(tmp_path):
    """A store holding one chunked object: (store, its id, its chunk index, made writable)."""
    from ledger.store import Store, chunks
    from ledger.store.add import add_path

    s = Store.init(tmp_path)
    f = tmp_path / "big"
    f.write_bytes(os.urandom(chunks.THRESHOLD + 1))
    oid = add_path(s, f)["id"]
    idx = s.objects.index_path(oid)
    assert idx.exists()
    os.chmod(idx, 0o644)
    return s, oid, idx

def test_a_chunk_index_padded_past_its_pages_is_corrupt_before_it_is_read(tmp_path, monkeypatch):
    # the index was read whole up to index_limit() — one page per chunk of the largest object,
    # ~32 GiB — and only then found not to add up: a real index padded to 6 GiB (sparse, so a
    # second to make) was a MemoryError, exit 1, in verify and cat (2.2-3.0 GB resident under a
    # 3 GB limit), and gc read it too
    from ledger.errors import CorruptObject
    from ledger.store import Store

    s, oid, idx = _chunked_object(tmp_path)
    with open(idx, "r+b") as fo:
        fo.truncate(100 << 20)   # sparse: the header and pages as written, then zeros
    got, real_pread = [0], os.pread

    def pread(fd, n, off):
        out = real_pread(fd, n, off)
        got[0] += len(out)
        return out
    monkeypatch.setattr(os, "pread", pread)
    with pytest.raises(CorruptObject, match="chunk index"):
        Store.open(s.root).objects.size(oid)
    assert got[0] < 1 << 20, got[0]


# --- the line shape (Record.LINE_SHAPE: report, gc and verify read a batch off its line) --------

def test_the_line_shape_is_matched_only_at_the_payload_and_only_on_what_the_typed_read_accepts():
    """Held (no change): the shape is matched at the first `,"payload":` of a checked line.
    Before the payload only strings and lists of ids sort (actor, id, inputs, kind, outputs:
    scan.check_line types them), and a canonical string holds no bare quote, so a shaped payload
    written into the actor — or anything but the payload — never matches, and a payload the typed
    read refuses is never read off its line (report, gc and verify then take the typed path)."""
    from ledger import records
    from ledger.errors import JournalCorrupt
    from ledger.store import canonical, journal, reach, scan

    tid = "b3:" + "a" * 64
    shaped = {"count": 1, "counters": {"turns": 1}, "first": 1, "objects": [[tid, 10, "turns"]], "turns": tid}
    fake = ',"payload":' + canonical.dumps(shaped).decode() + ',"prev":'
    for payload in ({"count": "1", "first": 0, "turns": "x"}, {**shaped, "first": 0}, {**shaped, "count": -1},
                    {**shaped, "requests": [fake]}):
        rec = journal.make_record(1, None, "record", [], [], fake, payload)
        line = canonical.dumps(rec)
        assert scan.check_line(line) == rec
        assert records.read_batch_line(rec, line) is None
        assert reach.shaped_ids(rec, line) is None
        assert records.Record.LINE_SHAPE[0].match(line, line.find(b',"payload":')) is None
        if "requests" not in payload:
            with pytest.raises(JournalCorrupt):
                records.read(rec)
    # the premise: nothing but a string sorts before the payload (a shaped object in the actor,
    # or among the inputs, would be the first `,"payload":` of the line)
    from ledger.errors import BadInput

    for actor, inputs in (({"a": 1, "payload": shaped, "prev": 1}, []), ("t@h", [{"a": 1, "payload": shaped, "prev": 1}])):
        bad = journal.make_record(1, None, "record", inputs, [], "t@h", {"count": "1"})
        bad["actor"] = actor
        bad["id"] = journal.record_id({k: v for k, v in bad.items() if k != "id"})
        line = canonical.dumps(bad)
        assert records.Record.LINE_SHAPE[0].match(line, line.find(b',"payload":'))   # it would match ...
        with pytest.raises(BadInput):
            scan.check_line(line)                                                     # ... were it read
    # and the shape itself, under that actor, is read as the typed read reads it
    rec = journal.make_record(1, None, "record", [], [], fake, shaped)
    line = canonical.dumps(rec)
    p = records.read(rec)
    assert records.read_batch_line(rec, line) == (p.first, p.turns, p.count)
    assert reach.shaped_ids(rec, line) == reach.record_ids(rec)


# --- gc's saved state (rule 22): a forged seal is rule 22's stated limit, a crash is not ---------

def test_a_reach_state_of_a_terabyte_of_keys_is_unreadable_never_an_internal_error(tmp_path):
    # reach.bin padded (sparse) to a TiB of "keys", its seal rewritten to name it (what rule 22
    # says it cannot catch): gc allocated the keys' array first, a MemoryError, exit 1
    import json

    from ledger.store import canonical
    from ledger.store.journal import stat_identity

    ledger_cmd("init", cwd=tmp_path, check=True)
    (tmp_path / "a").write_bytes(b"hi")
    ledger_cmd("add", tmp_path / "a", cwd=tmp_path, check=True)
    ledger_cmd("gc", cwd=tmp_path, check=True)
    state, seal = tmp_path / ".ledger" / "cache" / "reach.bin", tmp_path / ".ledger" / "cache" / "reach.seal"
    os.chmod(state, 0o644)
    with open(state, "r+b") as fo:
        fo.truncate(len(fo.readline()) + (1 << 40))
    s = json.loads(seal.read_bytes())
    s["file"] = stat_identity(os.lstat(state))
    seal.write_bytes(canonical.dumps(s))
    p = ledger_cmd("gc", cwd=tmp_path)
    assert p.returncode == 0 and "reach state was not used (it is unreadable)" in p.stderr, (p.returncode, p.stderr)


def test_a_folder_swapped_for_a_link_while_its_folder_is_added_is_never_read_through(tmp_path, monkeypatch):
    # put_tree walked with os.walk, which looks (islink) at a subfolder and then lists it by
    # path: a subfolder swapped for a link in between was listed through the link, and its
    # files (named like the ones the writer planted) were read into the tree — bytes from outside
    # the folder, perhaps ones its writer cannot read. O_NOFOLLOW on each file guards its last
    # name only ("links in folders above the entry's last name are followed").
    from ledger.errors import BadInput
    from ledger.store import Store
    from ledger.store.add import add_path
    from ledger.store.ids import hash_bytes

    s = Store.init(tmp_path)
    secret = tmp_path / "secret"
    secret.mkdir()
    (secret / "f").write_bytes(b"SECRET" * 10)
    d = tmp_path / "d"
    (d / "sub").mkdir(parents=True)
    (d / "sub" / "f").write_bytes(b"mine" * 10)
    armed, done = [], []

    def swap():
        if armed and not done:
            done.append(1)
            os.rename(d / "sub", tmp_path / "sub-moved")
            os.symlink(secret, d / "sub")

    # the first look at d/sub while the tree is read (after the stat-cache key's walk) sees the
    # folder; just after it, sub is a link (os.walk looks with islink, a walk by folder fds with
    # a stat relative to its parent)
    real_islink, real_stat = os.path.islink, os.stat

    def islink(p):
        out = real_islink(p)
        if os.fsdecode(p) == str(d / "sub"):
            swap()
        return out

    def stat_(p, *a, dir_fd=None, follow_symlinks=True):
        out = real_stat(p, *a, dir_fd=dir_fd, follow_symlinks=follow_symlinks)
        if dir_fd is not None and os.fsdecode(p) == "sub":
            swap()
        return out
    monkeypatch.setattr(os.path, "islink", islink)
    monkeypatch.setattr(os, "stat", stat_)
    from ledger.store import trees

    real_put_tree = trees.put_tree

    def put_tree(*a, **kw):
        armed.append(1)
        return real_put_tree(*a, **kw)
    monkeypatch.setattr(trees, "put_tree", put_tree)
    n = Store.open(s.root).state.seq
    try:
        res = add_path(Store.open(s.root), d)
    except BadInput as e:
        assert "changed" in e.message, e.message
        assert Store.open(s.root).state.seq == n
    else:
        entries = Store.open(s.root).get_json(res["id"])["entries"]
        assert hash_bytes(b"SECRET" * 10) not in [e["id"] for e in entries], entries
    assert done


def test_read_data_does_not_hash_what_a_planted_chunk_index_declares(tmp_path, monkeypatch):
    # A consistent planted index: the object's one page repeated 50 times, its header declaring
    # 50x the size. verify finds the size is not what was written (exit 4); `--read-data` then
    # went on to hash all 50x of what the index declared (20 GB for a 20 MiB object: 13 s of CPU)
    # before reporting the same object. An object already found damaged is not rehashed.
    from ledger.store import Store, chunks, objects
    from ledger.store.verify import verify

    s, oid, idx = _chunked_object(tmp_path)
    data = idx.read_bytes()
    magic, size, npages, _ = chunks.HEAD.unpack_from(data)
    idx.write_bytes(chunks.HEAD.pack(magic, size * 50, npages * 50, 0) + data[chunks.HEAD.size:] * 50)
    fed, real_feed = [0], objects._feed

    def feed(h, view, start, part):
        fed[0] += sum(n for _, _, n in part)
        return real_feed(h, view, start, part)
    monkeypatch.setattr(objects, "_feed", feed)
    rep = verify(Store.open(s.root), read_data=True, full=True)
    assert [e["id"] for e in rep.errors if e["what"] == "corrupt"] == [oid], rep.errors
    assert fed[0] == 0, f"hashed {fed[0]} bytes of an object already found damaged"


def _journal_of_turn_batches(root, n: int, edit=None):
    """A store whose journal is an init and `n` turn batches naming one real turns object, each
    line made with journal.make_record and chained; `edit(rec)` may change a record's fields
    before its id is set (a hostile writer re-hashes what it changes). The caches are removed."""
    from ledger.store import Store, canonical, journal

    store = Store.init(root)
    data = canonical.dumps({"kind": "turns", "first": 1, "turns": [{"id": "t1"}]})
    oid, _ = store.objects.put_bytes(data)
    recs = [journal.make_record(1, None, "init", [], [], "a@b", {"format": 2})]
    for seq in range(2, n + 2):
        r = journal.make_record(seq, recs[-1]["id"], "record", [], [oid], "a@b",
                                {"count": 1, "counters": {"turns": 1}, "first": seq - 1,
                                 "objects": [[oid, len(data), "turns"]], "turns": oid})
        if edit is not None and edit(r):
            r.pop("id")
            r["id"] = journal.record_id(r)
        recs.append(r)
    store.journal.path.write_bytes(b"".join(canonical.dumps(r) + b"\n" for r in recs))
    for cache in ("refs.json", "index.duckdb", "index.duckdb.wal"):
        (store.root / cache).unlink(missing_ok=True)
    return store


@pytest.mark.parametrize("bad", ["2026-02-30T00:00:00.000000Z", "2026-99-99T99:99:99.999999Z", "not a time",
                                 "2026-12-01T00:00:00Z", "0000-01-01T00:00:00.000000Z"])
def test_a_record_time_that_is_no_instant_is_refused_by_every_reader(tmp_path, bad):
    # check_line took any string as the time: verify said clean, and `ledger index rebuild` was
    # DuckDB's ConversionException (exit 1) casting it to the journal table's TIMESTAMP. The time
    # is now part of the line check (scan.time_ok, and blockcheck's templates with it).
    def edit(r):
        if r["seq"] == 2:
            r["time"] = bad
            return True
    _journal_of_turn_batches(tmp_path, 2, edit)
    journal = (tmp_path / ".ledger" / "journal").read_bytes()
    p = ledger_cmd("verify", "--full", cwd=tmp_path)
    assert p.returncode == 4 and "broken at record 2: journal record has a bad time" in p.stderr, p.stderr
    for args in (("index", "rebuild"), ("query", "SELECT count(*) FROM journal")):
        p = ledger_cmd(*args, cwd=tmp_path)
        assert p.returncode == 0 and "damaged at record 2" in p.stderr, (args, p.returncode, p.stderr)
    p = ledger_cmd("add", "/etc/hostname", cwd=tmp_path)
    assert p.returncode == 4 and "appends are refused" in p.stderr, p.stderr
    assert (tmp_path / ".ledger" / "journal").read_bytes() == journal


def test_time_ok_is_the_calendars_answer():
    import datetime

    from ledger.store.scan import time_ok

    for year in (1, 4, 100, 400, 1900, 2000, 2023, 2024, 2100, 9999):
        for month in range(0, 14):
            for day in range(0, 33):
                for hms in ((0, 0, 0), (23, 59, 59), (24, 0, 0), (0, 60, 0), (0, 0, 60)):
                    t = f"{year:04d}-{month:02d}-{day:02d}T{hms[0]:02d}:{hms[1]:02d}:{hms[2]:02d}.123456Z"
                    try:
                        datetime.datetime(year, month, day, *hms)
                        real = True
                    except ValueError:
                        real = False
                    assert time_ok(t) is real, t
    for t in ("2026-12-01T00:00:00.00000Z", "2026-12-01T00:00:00.000000", "2026-12-01 00:00:00.000000Z",
              "2026-12-01T00:00:00.000000Z ", "+026-12-01T00:00:00.000000Z", "2026-12-01T00:00:00.000000z",
              "\u0662026-12-01T00:00:00.000000Z"):
        assert not time_ok(t), t


def test_records_too_large_for_the_index_memory_are_a_typed_error_not_an_internal_one(tmp_path):
    # 3,600 turn batches with 5,000-character actors (a journal some other program wrote) among
    # 14,000 records: filling the deferred turns table read 5,000 rows at once under the index's
    # 32 MB and was DuckDB's OutOfMemoryException, exit 1 (helper-44). It now reads fewer rows at a
    # time, the same rows; a row that alone does not fit is exit 6, with the index as it was.
    import orjson

    from ledger.store import Store, canonical, journal
    from tests.store.test_blockcheck import _block, _lines

    store = Store.init(tmp_path / "a")
    lines = _lines(14_000, seed=5, put=store.objects.put_bytes)
    prev = None
    for i in range(10_200, len(lines)):
        rec = orjson.loads(lines[i])
        if i < 13_800 and rec["kind"] == "record":
            rec["actor"] = "A" * 5000
        rec["prev"] = prev if prev is not None else rec["prev"]
        rec.pop("id")
        rec["id"] = prev = journal.record_id(rec)
        lines[i] = canonical.dumps(rec)
    store.journal.path.write_bytes(_block(lines))
    for cache in ("refs.json", "index.duckdb", "index.duckdb.wal"):
        (store.root / cache).unlink(missing_ok=True)
    ledger_cmd("index", "rebuild", cwd=tmp_path / "a", check=True)
    p = ledger_cmd("query", "SELECT count(*) FROM turns", cwd=tmp_path / "a")
    turns = sum(orjson.loads(x)["payload"]["count"] for x in lines if b'"kind":"record"' in x)
    assert p.returncode == 0 and str(turns) in p.stdout, (p.returncode, p.stdout, p.stderr)

    huge = "A" * (40 << 20)    # one record larger than the whole buffer pool
    _journal_of_turn_batches(tmp_path / "b", 2, lambda r: r["seq"] == 3 and (r.update(actor=huge) or True))
    p = ledger_cmd("index", "rebuild", cwd=tmp_path / "b")
    if p.returncode == 0:   # the journal row fitted: the deferred fill then reads it alone
        p = ledger_cmd("query", "SELECT count(*) FROM turns", cwd=tmp_path / "b")
    assert p.returncode == 6 and "the index ran out of its 32MB of memory" in p.stderr, (p.returncode, p.stderr)
    assert "Traceback" not in p.stderr
