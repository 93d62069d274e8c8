"""Remotes through fsspec: the memory filesystem (the rename write path), HTTP read-only on
loopback (a directory remote served by http.server), and the refusals around them.
S3 (the transactional path) is tested against moto's server in test_remote_s3.py."""

from __future__ import annotations

import functools
import http.server
import threading
import uuid

import pytest

from ledger.errors import BadInput, CorruptObject, RemoteError
from ledger.sharing import fetch, push
from ledger.sharing import remote as rm
from ledger.store import Store

from .conftest import assert_clean


@pytest.fixture
def memory_url():
    url = f"memory://ledger-test-{uuid.uuid4().hex}"
    yield url
    import fsspec

    fs = fsspec.filesystem("memory")
    path = url.split("://", 1)[1]
    if fs.exists(path):
        fs.rm(path, recursive=True)


def test_a_memory_remote_round_trips(alice, bob, memory_url):
    h = alice.history
    be = rm.open_backend(memory_url)
    assert isinstance(be, rm.FsspecBackend) and not be.transactional and not be.read_only
    res = push.push(alice, be, ["HEAD"])
    assert res.objects_sent == res.objects_total
    assert not be.list("tmp/")  # every write was moved into place
    out = fetch.pull(bob, rm.open_backend(memory_url), namespace="alice")
    assert out[0].objects_new == res.objects_total
    bob = Store.open(bob.root)
    assert bob.state.refs["alice/HEAD"] == h["gen"]
    assert bob.get_bytes(h["receipt"]) == alice.get_bytes(h["receipt"])
    assert_clean(bob.root)


def test_a_damaged_object_on_an_fsspec_remote_is_refused(alice, bob, memory_url):
    h = alice.history
    be = rm.open_backend(memory_url)
    push.push(alice, be, ["HEAD"])
    key = be._p(rm.object_key(h["adapter"]))
    data = bytearray(be.fs.cat_file(key))
    data[0] ^= 1
    be.fs.pipe_file(key, bytes(data))
    before = sorted(p.name for p in (bob.root / "objects").rglob("*"))
    with pytest.raises(CorruptObject):
        fetch.pull(bob, be, namespace="alice")
    assert sorted(p.name for p in (bob.root / "objects").rglob("*")) == before  # nothing written


@pytest.fixture
def http_remote(alice, tmp_path):
    """alice's history pushed to a directory remote, served read-only over HTTP on loopback."""
    root = tmp_path / "served"
    push.push(alice, rm.DirBackend(root), ["HEAD"])
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(root))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    handler.log_message = lambda *a: None
    t = threading.Thread(target=server.serve_forever, daemon=True)
    t.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def test_pull_over_http_read_only(alice, bob, http_remote):
    h = alice.history
    be = rm.open_backend(http_remote)
    assert be.read_only
    fetch.pull(bob, be, ["HEAD"], namespace="alice")
    bob = Store.open(bob.root)
    assert bob.state.refs["alice/HEAD"] == h["gen"]
    assert_clean(bob.root)
    with pytest.raises(RemoteError, match="read-only"):
        push.push(bob, be, ["alice/HEAD"])


def test_unknown_schemes_and_missing_packages_are_typed_errors():
    with pytest.raises(BadInput, match="unsupported remote URL"):
        rm.normalise_url("ftp://example/x")
    with pytest.raises(BadInput, match="names no bucket"):
        rm.check_url("gs://")
    assert rm.normalise_url("S3://bucket/prefix/") == "s3://bucket/prefix"
