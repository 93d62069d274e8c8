"""Bundles: round trip, and every kind of bad bundle refused with a typed error and no change."""

from __future__ import annotations

import struct

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ledger.errors import CorruptObject, LedgerError, MissingObject, StoreCorrupt, UnsupportedFormat
from ledger.sharing import bundle
from ledger.sharing import manifest as mf
from ledger.store import Store, canonical
from ledger.store.ids import hash_bytes

from .conftest import assert_clean, make_history, snapshot


def _split(path):
    raw = path.read_bytes()
    n = len(bundle.MAGIC)
    (hlen,) = struct.unpack(">Q", raw[n:n + 8])
    return canonical.loads(raw[n + 8:n + 8 + hlen]), raw[n + 8 + hlen:]


def _join(path, header, data):
    h = canonical.dumps(header)
    path.write_bytes(bundle.MAGIC + struct.pack(">Q", len(h)) + h + data)


def test_round_trip_imports_into_a_namespace_and_never_moves_head(alice, bob, tmp_path):
    h = alice.history
    out = tmp_path / "g.bundle"
    res = bundle.create(alice, ["HEAD", h["gen_name"]], out, origin="alice")
    assert res.segment_records >= 4  # add, add, train, commit all touch the closure
    with bob.transaction("add") as tx:  # bob has a life of his own
        mine = tx.put_bytes(b"bob's own")
        tx.outputs.append(mine)
        tx.refs["name/mine"] = mine
        tx.payload.update({"path": "mine.txt", "kind": "file", "size": 9})
    refs_before = {k: v for k, v in bob.state.refs.items()}
    imp = bundle.import_bundle(bob, out)
    bob = Store.open(bob.root)
    assert {k: v for k, v in bob.state.refs.items() if not k.startswith("alice/")} == refs_before  # HEAD too
    assert bob.state.refs["alice/HEAD"] == h["gen"]
    assert bob.state.refs[f"alice/{h['gen_name']}"] == h["gen"]
    for k in ("base", "data", "adapter", "receipt", "gen"):
        assert bob.get_bytes(h[k]) == alice.get_bytes(h[k])
    assert imp.objects_new == imp.objects_total
    rec = bob.journal.records()[-1]
    assert rec["kind"] == "import" and rec["id"] == imp.record
    # the segment travelled with original ids: the records alice's journal holds
    seg = mf.decode_segment(bob.get_bytes(imp.refs and rec["payload"]["segment"]))
    alice_ids = {r["id"] for r in alice.journal.records()}
    assert {r["id"] for r in seg.records} <= alice_ids
    assert_clean(bob.root)
    # a second import moves nothing new and is still one record
    again = bundle.import_bundle(bob, out, namespace="alice2")
    assert again.objects_new == 0 and Store.open(bob.root).state.refs["alice2/HEAD"] == h["gen"]


def test_bundle_of_a_receipt_id_carries_its_closure(alice, bob, tmp_path):
    h = alice.history
    out = tmp_path / "r.bundle"
    res = bundle.create(alice, [h["receipt"]], out)
    assert res.refs == {"id/" + h["receipt"][3:]: h["receipt"]}
    bundle.import_bundle(bob, out, namespace="al")
    missing: set = set()
    bob.closure([h["receipt"]], missing)
    assert not missing
    assert_clean(bob.root)


def test_a_named_root_must_be_held(alice, tmp_path):
    alice.objects.remove(alice.history["gen"])
    with pytest.raises(MissingObject):  # the journal reaches it: the store lost it (exit 4)
        bundle.create(alice, [alice.history["gen"]], tmp_path / "x.bundle")
    assert not (tmp_path / "x.bundle").exists()


def test_ids_the_sender_does_not_hold_are_carried_as_absent(alice, bob, tmp_path):
    """The store cannot tell a `b3:` digest from a lost object; what the sender lacks is listed
    in the manifest, shown to both sides, and the receiver ends exactly as complete."""
    lost = alice.history["adapter"]
    alice.objects.remove(lost)
    out = tmp_path / "x.bundle"
    bundle.create(alice, ["HEAD"], out)
    assert bundle.read_header(out).manifest.absent == (lost,)
    res = bundle.import_bundle(bob, out, namespace="alice")
    assert res.absent == (lost,)
    b = Store.open(bob.root)
    assert not b.has(lost) and b.journal.records()[-1]["payload"]["absent"] == [lost]


def test_bundle_create_refuses_a_corrupt_object(alice, tmp_path):
    p = alice.object_path(alice.history["base"])
    p.chmod(0o644)
    data = bytearray(p.read_bytes())
    data[10] ^= 1
    p.write_bytes(bytes(data))
    with pytest.raises(CorruptObject):
        bundle.create(alice, ["HEAD"], tmp_path / "x.bundle")
    assert not (tmp_path / "x.bundle").exists()


@pytest.fixture
def made(alice, tmp_path):
    out = tmp_path / "g.bundle"
    bundle.create(alice, ["HEAD"], out, origin="alice")
    return out


def _refused(bob, path, exc, **kw):
    before = snapshot(bob.root)
    with pytest.raises(exc) as ei:
        bundle.import_bundle(Store.open(bob.root), path, **kw)
    assert snapshot(bob.root) == before, "a refused bundle changed the store"
    assert not list((bob.root / "tmp").iterdir()), "a refused bundle left temporary files"
    return ei.value


def test_tampered_object_byte_is_rejected_with_no_change(made, bob):
    raw = bytearray(made.read_bytes())
    raw[-5] ^= 0x40  # inside the last object's data
    made.write_bytes(bytes(raw))
    e = _refused(bob, made, CorruptObject)
    assert e.exit_code == 4


@pytest.mark.parametrize("cut", [3, 20, 200, -1, -1000])
def test_truncated_bundle_is_rejected_with_no_change(made, bob, cut):
    raw = made.read_bytes()
    made.write_bytes(raw[:cut] if cut > 0 else raw[:len(raw) + cut])
    e = _refused(bob, made, LedgerError)
    assert isinstance(e, StoreCorrupt) and "truncated" in e.message


def test_trailing_bytes_are_rejected(made, bob):
    made.write_bytes(made.read_bytes() + b"x")
    _refused(bob, made, StoreCorrupt)


def test_foreign_algorithm_is_rejected(made, bob):
    header, data = _split(made)
    header["algorithm"] = "sha256"
    _join(made, header, data)
    e = _refused(bob, made, UnsupportedFormat)
    assert "sha256" in e.message


def test_foreign_manifest_algorithm_or_version_is_rejected(made, bob, tmp_path):
    header, data = _split(made)
    header["manifest"]["algorithm"] = "sha256"
    _join(made, header, data)
    _refused(bob, made, UnsupportedFormat)
    header["manifest"]["algorithm"] = "blake3"
    header["version"] = 99
    _join(made, header, data)
    _refused(bob, made, UnsupportedFormat)


def test_oversized_claims_are_rejected_before_reading(made, bob):
    raw = made.read_bytes()
    n = len(bundle.MAGIC)
    made.write_bytes(raw[:n] + struct.pack(">Q", 1 << 60) + raw[n + 8:])
    e = _refused(bob, made, StoreCorrupt)
    assert "claims" in e.message
    # an object claiming a petabyte
    made.write_bytes(raw)
    header, data = _split(made)
    last = header["manifest"]["objects"][-1]
    last[2] = 1 << 49
    _join(made, header, data)
    e = _refused(bob, made, StoreCorrupt)
    assert "truncated" in e.message


def test_offsets_that_overlap_are_rejected(made, bob):
    header, data = _split(made)
    header["manifest"]["objects"][1][1] = 0
    _join(made, header, data)
    _refused(bob, made, StoreCorrupt)


def test_swapped_object_ids_are_caught_by_hash(made, bob):
    header, data = _split(made)
    objs = header["manifest"]["objects"]
    a, b = objs[0], objs[1]
    a[0], b[0] = b[0], a[0]
    objs.sort(key=lambda o: o[1])
    _join(made, header, data)
    _refused(bob, made, CorruptObject)


def test_non_canonical_or_garbage_header_is_rejected(made, bob):
    header, data = _split(made)
    h = canonical.dumps(header).replace(b'"format"', b' "format"', 1)
    made.write_bytes(bundle.MAGIC + struct.pack(">Q", len(h)) + h + data)
    _refused(bob, made, StoreCorrupt)
    made.write_bytes(b"PK\x03\x04 not a bundle at all")
    _refused(bob, made, LedgerError)


def _rebuild_with_segment(path, mutate):
    """Rewrite the bundle with a changed segment but *consistent* object hashes and TOC, so
    only the segment's own chain checks can notice."""
    header, data = _split(path)
    m = header["manifest"]
    objs = {o[0]: data[o[1]:o[1] + o[2]] for o in m["objects"]}
    seg = objs.pop(m["segment"])
    body = canonical.loads(seg[len(mf.SEGMENT_MAGIC):-1])
    mutate(body["records"])
    new_seg = mf.SEGMENT_MAGIC + canonical.dumps(body) + b"\n"
    sid = hash_bytes(new_seg)
    objs[sid] = new_seg
    table, off, blob = [], 0, b""
    for oid in sorted(objs):
        table.append([oid, off, len(objs[oid])])
        off += len(objs[oid])
        blob += objs[oid]
    m["objects"], m["segment"] = table, sid
    _join(path, header, blob)


def test_segment_with_an_edited_record_is_rejected(made, bob):
    def edit(recs):
        recs[0]["payload"]["note"] = "rewritten history"
    _rebuild_with_segment(made, edit)
    e = _refused(bob, made, StoreCorrupt)
    assert "segment" in e.message


def test_segment_with_a_broken_prev_link_is_rejected(made, bob):
    from ledger.store.journal import record_id

    def relink(recs):
        # a record whose own id is recomputed correctly but whose prev lies
        r = recs[1]
        r["prev"] = "b3:" + "0" * 64
        r["id"] = record_id(r)
    _rebuild_with_segment(made, relink)
    e = _refused(bob, made, StoreCorrupt)
    assert "chain" in e.message


def test_incomplete_closure_is_rejected(made, bob):
    """A bundle whose structured objects name an id it does not carry (and bob lacks)."""
    header, data = _split(made)
    m = header["manifest"]
    objs = {o[0]: data[o[1]:o[1] + o[2]] for o in m["objects"]}
    blobs = [oid for oid, b in objs.items() if not b.startswith(b"{") and oid != m["segment"]]
    victim = blobs[0]
    del objs[victim]
    table, off, blob = [], 0, b""
    for oid in sorted(objs):
        table.append([oid, off, len(objs[oid])])
        off += len(objs[oid])
        blob += objs[oid]
    m["objects"] = table
    m["roots"] = [r for r in m["roots"] if r != victim]
    _join(made, header, blob)
    e = _refused(bob, made, StoreCorrupt)
    assert victim in e.message


def test_reserved_namespace_is_refused(made, bob):
    from ledger.errors import BadInput

    for ns in ("HEAD", "name", "gen-3", "a/b", ""):
        _refused(bob, made, BadInput, namespace=ns)


def test_ls_shows_the_table_of_contents_without_importing(made, bob):
    before = snapshot(bob.root)
    lst = bundle.ls(bob, made)
    j = lst.to_json()
    assert j["origin"] == "alice" and j["objects"] == len(lst.header.manifest.objects)
    assert [r["kind"] for r in j["segment_records"]] == ["add", "add", "train", "genesis"]
    assert snapshot(bob.root) == before


@pytest.fixture(scope="module")
def fuzz_src(tmp_path_factory):
    d = tmp_path_factory.mktemp("fuzzsrc")
    a = Store.init(d / "a")
    make_history(a, seed=7, blob_size=2000)
    src = d / "src.bundle"
    bundle.create(a, ["HEAD"], src)
    return src.read_bytes(), bundle.read_header(src).manifest


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.data())
def test_fuzzed_bundles_only_raise_typed_errors_and_change_nothing(tmp_path_factory, fuzz_src, data):
    """Random flips, cuts and splices: only LedgerError escapes, and a refused bundle changes
    nothing. One that imports must carry exactly the original table of contents (only the
    informational header fields — origin, created, actor — are not integrity-checked)."""
    raw, man = fuzz_src
    d = tmp_path_factory.mktemp("fz")
    b = Store.init(d / "b")
    buf = bytearray(raw)
    for _ in range(data.draw(st.integers(1, 4))):
        if not buf:
            break
        op = data.draw(st.sampled_from(["flip", "cut", "splice"]))
        i = data.draw(st.integers(0, len(buf) - 1))
        if op == "flip":
            buf[i] ^= 1 << data.draw(st.integers(0, 7))
        elif op == "cut":
            del buf[i:i + data.draw(st.integers(1, 64))]
        else:
            buf[i:i] = data.draw(st.binary(min_size=1, max_size=16))
    path = d / "fuzzed.bundle"
    path.write_bytes(bytes(buf))
    before = snapshot(b.root)
    try:
        res = bundle.import_bundle(b, path, namespace="fz")
    except LedgerError:
        assert snapshot(b.root) == before
        assert not list((b.root / "tmp").iterdir())
    else:
        assert res.manifest == man.id
        assert_clean(b.root)
