"""S3 remotes against a real S3-compatible HTTP server (moto, started here on loopback)."""

from __future__ import annotations

import json

import pytest

from ledger.errors import CorruptObject, RemoteError
from ledger.sharing import fetch, push
from ledger.sharing import remote as rm
from ledger.store import Store

from .conftest import assert_clean, snapshot


def _backend(s3_server, bucket, prefix="team/ledger"):
    return rm.open_backend(f"s3://{bucket}/{prefix}", {"endpoint_url": s3_server})


def test_s3_round_trip_and_up_to_date_repush(alice, bob, s3_server, s3_bucket):
    bucket, fs = s3_bucket
    be = _backend(s3_server, bucket)
    assert isinstance(be, rm.FsspecBackend) and be.protocol == "s3" and be.transactional
    h = alice.history
    first = push.push(alice, be, ["HEAD"])
    assert first.objects_sent == first.objects_total
    keys = fs.find(f"{bucket}/team/ledger")
    assert f"{bucket}/team/ledger/refs/HEAD" in keys and f"{bucket}/team/ledger/{rm.MARKER}" in keys
    assert f"{bucket}/team/ledger/{rm.object_key(h['base'])}" in keys
    again = push.push(alice, be, ["HEAD"])
    assert again.up_to_date and again.objects_sent == 0
    out = fetch.pull(bob, _backend(s3_server, bucket), namespace="alice")
    assert out[0].objects_new == first.objects_total
    b = Store.open(bob.root)
    assert b.state.refs["alice/HEAD"] == h["gen"]
    assert b.get_bytes(h["base"]) == alice.get_bytes(h["base"])
    assert_clean(bob.root)


def test_s3_multipart_upload_is_committed_only_when_the_hash_matches(tmp_path, s3_server, s3_bucket, monkeypatch):
    """Objects above SMALL_PUT go up as a multipart upload that is completed only after the
    bytes sent hashed to the id; a mismatch aborts it and nothing appears."""
    bucket, fs = s3_bucket
    monkeypatch.setattr(rm, "SMALL_PUT", 1 << 20)
    monkeypatch.setattr(rm, "CHUNK", 5 << 20)
    a = Store.init(tmp_path / "a")
    big = tmp_path / "big.bin"
    big.write_bytes(bytes(range(256)) * (11 << 12))  # 11 MiB: three parts
    with a.transaction("add") as tx:
        oid = tx.put_file(big)
        tx.outputs.append(oid)
        tx.refs["name/big"] = oid
        tx.payload.update({"path": "big.bin", "kind": "file", "size": big.stat().st_size})
    be = _backend(s3_server, bucket, "mp")
    push.push(a, be, ["big"])
    assert fs.size(f"{bucket}/mp/{rm.object_key(oid)}") == big.stat().st_size
    b = Store.init(tmp_path / "b")
    fetch.pull(b, _backend(s3_server, bucket, "mp"), namespace="a")
    assert Store.open(b.root).objects.size(oid) == big.stat().st_size
    assert_clean(b.root)
    # now a source whose bytes do not match its name: the upload is discarded
    be2 = _backend(s3_server, bucket, "mp2")
    src = tmp_path / "liar.bin"
    src.write_bytes(b"\0" * (3 << 20))
    with pytest.raises(CorruptObject):
        be2.put_object(oid, src, lambda n: None)
    assert not fs.exists(f"{bucket}/mp2/{rm.object_key(oid)}")


def test_s3_corrupt_object_is_refused_on_arrival(alice, bob, s3_server, s3_bucket):
    bucket, fs = s3_bucket
    be = _backend(s3_server, bucket)
    push.push(alice, be, ["HEAD"])
    key = f"{bucket}/team/ledger/{rm.object_key(alice.history['adapter'])}"
    data = bytearray(fs.cat_file(key))
    data[7] ^= 1
    fs.pipe_file(key, bytes(data))
    before = snapshot(bob.root)
    with pytest.raises(CorruptObject):
        fetch.pull(bob, _backend(s3_server, bucket), namespace="alice")
    after = snapshot(bob.root)
    assert after[:2] == before[:2] and alice.history["adapter"] not in after[2]


def test_s3_unreachable_endpoint_is_a_typed_error(alice, s3_server):
    be = rm.open_backend("s3://nowhere/x", {"endpoint_url": "http://127.0.0.1:9"})
    with pytest.raises(RemoteError):
        push.push(alice, be, ["HEAD"])


def test_s3_remote_through_the_cli(alice, bob, s3_server, s3_bucket, cli):
    bucket, _ = s3_bucket
    url = f"s3://{bucket}/cli"
    for s in (alice, bob):
        assert cli(s, "remote", "add", "team", url, "--endpoint-url", s3_server).returncode == 0
    p = cli(alice, "push", "team", "HEAD", alice.history["receipt"], "--json")
    assert p.returncode == 0, p.stderr
    res = json.loads(p.stdout)
    assert res["objects_sent"] == res["objects_total"]
    p = cli(bob, "pull", "team", "--json")
    assert p.returncode == 0, p.stderr
    refs = {k: v for r in json.loads(p.stdout) for k, v in r["refs"].items()}
    assert refs["team/HEAD"] == alice.history["gen"]
    assert refs["team/id/" + alice.history["receipt"][3:]] == alice.history["receipt"]
    assert_clean(bob.root)
    p = cli(bob, "remote", "list", "--json")
    assert json.loads(p.stdout)[0]["options"] == {"endpoint_url": s3_server}


def test_has_objects_lists_each_part_of_the_remote_once_per_push_not_once_per_batch(alice, s3_server, s3_bucket):
    """A chunked push asks 1000 ids a call: each call used to list all of objects/ again.
    Now a backend lists a fan-out folder (or, for a call touching many, objects/ whole) once,
    and what it uploads itself counts as present without listing again."""
    from ledger.store.ids import hash_bytes

    bucket, fs = s3_bucket
    push.push(alice, _backend(s3_server, bucket, "many"), ["HEAD"])
    held = sorted(oid for oid, _ in alice.objects.iter_ids())
    be = _backend(s3_server, bucket, "many")
    calls = []
    real = be.list
    be.list = lambda prefix: calls.append(prefix) or real(prefix)
    few = [f"b3:ab{i:062x}" for i in range(100)]                 # 100 ids in one fan-out folder
    assert not be.has_objects(few)
    assert calls == ["objects/ab/"]                              # that folder only, not the remote
    spread = [f"b3:{i:02x}" + "0" * 62 for i in range(256)]      # one id in every fan-out folder
    for _ in range(3):                                           # batch after batch
        assert be.has_objects(spread + held) == set(held)
        assert not be.has_objects(few)
    assert calls == ["objects/ab/", "objects/"], calls           # one whole listing, then none
    p = alice.root.parent / "new.bin"
    p.write_bytes(b"x" * 100)
    oid = hash_bytes(p.read_bytes())
    be.put_object(oid, p, lambda n: None)                        # an upload of ours: present, unlisted
    assert oid in be.has_objects([oid] + spread)
    assert len(calls) == 2
