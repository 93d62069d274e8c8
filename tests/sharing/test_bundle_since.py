"""Bundles made for a receiver that holds a base (`bundle create --since`, format version 2;
docs/sharing.md, docs/store-format.md C7): only what the base lacks travels — of a chunked
object, its chunk list and the chunks the base's chunked objects do not hold — and the import
checks every chunk against its name and the whole against the object's id, all-or-nothing."""

from __future__ import annotations

import json
import os
import struct

import pytest

from ledger.errors import BadInput, CorruptObject, StoreCorrupt
from ledger.sharing import bundle, chunked
from ledger.store import Store

from .conftest import assert_clean, snapshot
from .test_chunked import _add_big  # the same recorded add of a large file

SIZE = 32 << 20        # a 4 KiB edit of a 32 MiB object (the test size)


@pytest.fixture
def two_versions(alice, bob, tmp_path):
    """alice holds w1 and w2 (a 4 KiB edit of it); bob holds w1 from a full bundle."""
    data = bytearray(os.urandom(SIZE))
    v1 = _add_big(alice, bytes(data), "w1")
    bundle.create(alice, ["w1"], tmp_path / "v1.bundle", origin="alice")
    bundle.import_bundle(bob, tmp_path / "v1.bundle")
    data[SIZE // 2:SIZE // 2 + 4096] = os.urandom(4096)
    v2 = _add_big(alice, bytes(data), "w2")
    return v1, v2, bytes(data)


def test_a_bundle_since_the_base_carries_only_the_missing_chunks(alice, bob, tmp_path, two_versions):
    v1, v2, data = two_versions
    full = bundle.create(alice, ["w2"], tmp_path / "full.bundle", origin="alice")
    res = bundle.create(alice, ["w2"], tmp_path / "v2.bundle", origin="alice", since=["w1"])
    assert full.file_size > SIZE
    assert res.file_size < SIZE // 64, res.file_size            # ≪ the object: 1–2 chunks and the list
    assert res.manifest == full.manifest                         # the same table of contents, signed alike
    assert res.base == (v1,) and 1 <= res.chunks_carried <= 4
    hdr = bundle.read_header(tmp_path / "v2.bundle")
    assert hdr.version == bundle.DELTA_VERSION and hdr.to_json()["pieces"]["list"] == 1
    written = bob.objects.packs.chunks_written
    imp = bundle.import_bundle(bob, tmp_path / "v2.bundle")
    bob = Store.open(bob.root)
    assert imp.refs == {"alice/name/w2": v2}
    assert bob.objects.chunked(v2) and bob.get_bytes(v2) == data
    assert bob.objects.packs.chunks_written - written <= 6
    assert_clean(bob.root)


def test_without_the_base_a_since_bundle_is_refused_and_nothing_changes(alice, tmp_path, two_versions):
    bundle.create(alice, ["w2"], tmp_path / "v2.bundle", origin="alice", since=["w1"])
    carol = Store.init(tmp_path / "carol")
    before = snapshot(carol.root)
    with pytest.raises(BadInput, match="was made for a store holding .* lacks chunk"):
        bundle.import_bundle(carol, tmp_path / "v2.bundle")
    assert snapshot(carol.root) == before
    assert not list(carol.objects.packs.iter_packs())
    assert not [p for p in carol.tmp.iterdir() if p.is_file()]


def _rewrite(path, mutate) -> None:
    """Rewrite a bundle's header and data through `mutate(header, data) -> (header, data)`."""
    raw = path.read_bytes()
    start = len(bundle.MAGIC) + 8
    (hlen,) = struct.unpack(">Q", raw[len(bundle.MAGIC):start])
    h, data = mutate(json.loads(raw[start:start + hlen]), bytearray(raw[start + hlen:]))
    hb = json.dumps(h, sort_keys=True, separators=(",", ":")).encode()
    path.write_bytes(bundle.MAGIC + struct.pack(">Q", len(hb)) + hb + bytes(data))


def _refused(bob, path, error, match):
    before = snapshot(bob.root)
    with pytest.raises(error, match=match):
        bundle.import_bundle(bob, path)
    assert snapshot(bob.root) == before
    assert not [p for p in bob.tmp.iterdir() if p.is_file()]
    assert_clean(bob.root)


def test_a_carried_chunk_with_the_wrong_bytes_is_refused(alice, bob, tmp_path, two_versions):
    p = tmp_path / "v2.bundle"
    bundle.create(alice, ["w2"], p, origin="alice", since=["w1"])

    def flip(h, data):
        _, _, off, n = next(x for x in h["pieces"] if x[0] == "chunk")
        data[off + n // 2] ^= 1
        return h, data
    _rewrite(p, flip)
    _refused(bob, p, CorruptObject, "wrong content")


def test_a_chunk_list_whose_whole_does_not_hash_to_the_id_is_refused(alice, bob, tmp_path, two_versions):
    v1, v2, _ = two_versions
    p = tmp_path / "v2.bundle"
    bundle.create(alice, ["w2"], p, origin="alice", since=["w1"])

    def swap(h, data):
        _, _, off, n = next(x for x in h["pieces"] if x[0] == "list")
        size, entries = chunked.decode(bytes(data[off:off + n]), v2, "test")
        entries[0], entries[1] = entries[1], entries[0]          # every chunk genuine, the whole not
        data[off:off + n] = chunked.encode(size, entries)
        return h, data
    _rewrite(p, swap)
    _refused(bob, p, CorruptObject, "arrived with the wrong content")


def test_a_malformed_pieces_table_is_refused_before_any_data_is_read(alice, bob, tmp_path, two_versions):
    p = tmp_path / "v2.bundle"
    bundle.create(alice, ["w2"], p, origin="alice", since=["w1"])
    good = p.read_bytes()
    lies = [
        (lambda h, d: (h.update(pieces=[[k, i, o + 1, n] for k, i, o, n in h["pieces"]]) or h, d), "offset"),
        (lambda h, d: (h.update(pieces=[["list" if k == "chunk" else k, i, o, n] for k, i, o, n in h["pieces"]])
                       or h, d), "not one the manifest lists"),
        (lambda h, d: (h.update(pieces=[[k, i, o, (1 << 30) if k == "list" else n] for k, i, o, n in h["pieces"]])
                       or h, d), "more than its size allows"),
        (lambda h, d: (h.pop("base") and h, d), "malformed"),
    ]
    for lie, why in lies:
        p.write_bytes(good)
        _rewrite(p, lie)
        _refused(bob, p, StoreCorrupt, why)


def test_bundle_create_since_through_the_cli(alice, bob, tmp_path, two_versions, cli):
    _, v2, data = two_versions
    out = tmp_path / "cli.bundle"
    res = cli(alice, "bundle", "create", "w2", "-o", out, "--since", "w1", "--json")
    assert res.returncode == 0, res.stderr
    body = json.loads(res.stdout)
    assert body["base"] and body["file_size"] < SIZE // 64
    res = cli(bob, "bundle", "import", out, "--json")
    assert res.returncode == 0, res.stderr
    assert Store.open(bob.root).get_bytes(v2) == data
    res = cli(bob, "bundle", "ls", out)
    assert res.returncode == 0 and "for a store holding" in res.stdout and "chunk(s)" in res.stdout, res.stdout
