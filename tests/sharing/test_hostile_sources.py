"""Hostile sources: a bundle cannot inject references, and reads from a remote are bounded,
never follow links and never hang. Each case runs the real CLI where users see it, and checks
the exit code and that the receiving store is exactly as it was."""

from __future__ import annotations

import io
import json
import os
import struct

import pytest

from ledger.errors import CorruptObject, StoreCorrupt
from ledger.sharing import bundle, fetch, push, sources
from ledger.sharing import remote as rm
from ledger.store import Store, canonical, fsio
from ledger.store.ids import hash_bytes
from tests.conftest import ledger_cmd

from .conftest import assert_clean, snapshot

INVENTED = hash_bytes(b"an object nobody ever had")


def _rewrite_header(path, edit) -> None:
    raw = path.read_bytes()
    n = len(bundle.MAGIC)
    (hlen,) = struct.unpack(">Q", raw[n:n + 8])
    header, data = canonical.loads(raw[n + 8:n + 8 + hlen]), raw[n + 8 + hlen:]
    edit(header)
    h = canonical.dumps(header)
    path.write_bytes(bundle.MAGIC + struct.pack(">Q", len(h)) + h + data)


# --- references cannot be injected ------------------------------------------------------------
def test_an_unsigned_bundle_cannot_inject_absent_ids(alice, bob, tmp_path):
    """Without the check the invented id became a reference of the import record, and `verify`
    failed for good ("referenced but missing") although nothing was ever lost."""
    out = tmp_path / "g.bundle"
    bundle.create(alice, ["HEAD"], out)
    _rewrite_header(out, lambda h: h["manifest"].update(absent=sorted(h["manifest"]["absent"] + [INVENTED])))
    before = snapshot(bob.root)
    r = ledger_cmd("--store", bob.root, "bundle", "import", out)
    assert r.returncode == 4, (r.stdout, r.stderr)
    assert "absent" in r.stderr and "none of its objects names" in r.stderr
    assert snapshot(bob.root) == before
    assert ledger_cmd("--store", bob.root, "verify", "--read-data").returncode == 0


def test_a_pulled_manifest_cannot_inject_absent_ids_either(alice, bob, tmp_path):
    """The same rule on a remote: a ref rewritten to an (unsigned) manifest with an invented
    absent id is refused by the one inbound check, and nothing is recorded."""
    root = tmp_path / "remote"
    be = rm.DirBackend(root)
    push.push(alice, be, ["HEAD"])
    ref = canonical.loads((root / "refs" / "HEAD").read_bytes())
    man = sources.read_manifest(be, ref["manifest"]).to_json()
    man["absent"] = sorted(man["absent"] + [INVENTED])
    forged = canonical.dumps(man)
    be.write_small(rm.object_key(hash_bytes(forged)), forged)
    be.write_small("refs/HEAD", canonical.dumps(dict(ref, manifest=hash_bytes(forged), signatures=[])))
    before = snapshot(bob.root)
    with pytest.raises(StoreCorrupt, match="none of its objects names"):
        fetch.pull(bob, be, namespace="alice")
    assert Store.open(bob.root).state.seq == before[1]   # no import record
    assert_clean(bob.root)


# --- bounded reads ----------------------------------------------------------------------------
def _pushed(alice, bob, tmp_path):
    root = tmp_path / "remote"
    push.push(alice, rm.DirBackend(root), ["HEAD"])
    ledger_cmd("--store", bob.root, "remote", "add", "team", root, check=True)
    return root


def test_an_oversized_remote_object_is_refused_before_it_is_read(alice, bob, tmp_path):
    """A 1 TiB (sparse) file under an object's name: refused from its size alone (exit 4),
    so it neither fills the disk nor takes time; nothing is installed or recorded."""
    root = _pushed(alice, bob, tmp_path)
    big = root / rm.object_key(alice.history["base"])
    os.chmod(big, 0o644)
    os.truncate(big, 1 << 40)
    before = snapshot(bob.root)
    r = ledger_cmd("--store", bob.root, "pull", "team", timeout=60)
    assert r.returncode == 4, (r.stdout, r.stderr)
    assert "1099511627776 bytes" in r.stderr and "announced" in r.stderr
    assert snapshot(bob.root) == before
    assert not any((bob.root / "tmp").iterdir())


def test_a_remote_read_stops_at_the_announced_size(tmp_path):
    """The bound holds inside the read too: not one byte moves for an object of the wrong size,
    and an object of unknown size may not exceed the limit given."""
    oid = hash_bytes(b"x" * 10)
    p = tmp_path / rm.object_key(oid)
    p.parent.mkdir(parents=True)
    p.write_bytes(b"x" * 5000)
    src = sources.RemoteSource(rm.DirBackend(tmp_path))
    sink = io.BytesIO()
    with pytest.raises(CorruptObject, match="5000 bytes; 10 were announced"):
        src.read(oid, 10, sink, lambda n: None)
    assert sink.getvalue() == b""
    with pytest.raises(fsio.StorageIOError, match="room for 100"):
        src.read(oid, None, sink, lambda n: None, limit=100)
    assert sink.getvalue() == b""


def test_an_oversized_s3_object_is_refused(alice, bob, s3_server, s3_bucket):
    bucket, fs = s3_bucket
    url = f"s3://{bucket}/team"
    push.push(alice, rm.open_backend(url, {"endpoint_url": s3_server}), ["HEAD"])
    key = f"{bucket}/team/{rm.object_key(alice.history['adapter'])}"
    fs.pipe_file(key, fs.cat_file(key) + b"\0" * (1 << 20))
    before = snapshot(bob.root)
    with pytest.raises(CorruptObject, match="were announced"):
        fetch.pull(bob, rm.open_backend(url, {"endpoint_url": s3_server}), namespace="alice")
    assert snapshot(bob.root) == before


# --- no links, no special files, no hangs -------------------------------------------------------
def test_a_fifo_in_a_remote_is_a_typed_error_not_a_hang(alice, bob, tmp_path):
    root = _pushed(alice, bob, tmp_path)
    p = root / rm.object_key(alice.history["data"])
    p.unlink()
    os.mkfifo(p)
    before = snapshot(bob.root)
    r = ledger_cmd("--store", bob.root, "pull", "team", timeout=60)
    assert r.returncode == 4, (r.stdout, r.stderr)
    assert "is a FIFO, not a regular file" in r.stderr
    assert snapshot(bob.root) == before


def test_a_fifo_as_a_remote_ref_is_a_typed_error_not_a_hang(alice, bob, tmp_path):
    root = _pushed(alice, bob, tmp_path)
    (root / "refs" / "HEAD").unlink()
    os.mkfifo(root / "refs" / "HEAD")
    before = snapshot(bob.root)
    r = ledger_cmd("--store", bob.root, "pull", "team", "HEAD", timeout=60)
    assert r.returncode == 4, (r.stdout, r.stderr)
    assert "refs/HEAD is a FIFO" in r.stderr
    assert snapshot(bob.root) == before


def test_a_link_in_a_remote_is_not_followed(alice, bob, tmp_path):
    """Even a link to a correct copy is refused: what a remote holds is its own files."""
    root = _pushed(alice, bob, tmp_path)
    p = root / rm.object_key(alice.history["base"])
    elsewhere = tmp_path / "elsewhere"
    elsewhere.write_bytes(p.read_bytes())
    p.unlink()
    p.symlink_to(elsewhere)
    before = snapshot(bob.root)
    r = ledger_cmd("--store", bob.root, "pull", "team", timeout=60)
    assert r.returncode == 4, (r.stdout, r.stderr)
    assert "symbolic link" in r.stderr
    assert snapshot(bob.root) == before


def test_a_fifo_named_as_a_bundle_is_refused_not_read(bob, tmp_path):
    f = tmp_path / "fifo.bundle"
    os.mkfifo(f)
    before = snapshot(bob.root)
    for args in (("bundle", "import", f), ("bundle", "ls", f)):
        r = ledger_cmd("--store", bob.root, *args, timeout=60)
        assert r.returncode == 2, (args, r.stdout, r.stderr)
        assert "FIFO, not a bundle file" in r.stderr
    assert snapshot(bob.root) == before


def test_json_error_of_a_refused_pull_names_the_object(alice, bob, tmp_path):
    root = _pushed(alice, bob, tmp_path)
    p = root / rm.object_key(alice.history["data"])
    p.unlink()
    os.mkfifo(p)
    r = ledger_cmd("--store", bob.root, "pull", "team", "--json", timeout=60)
    assert r.returncode == 4
    err = json.loads(r.stdout)
    assert err["error"] == "CorruptObject" and alice.history["data"] in json.dumps(err), err
