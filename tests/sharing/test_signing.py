"""Keys, signatures and the trust policy: required, missing, untrusted, wrong."""

from __future__ import annotations

import json
import stat
import struct

import pytest

from ledger.errors import BadInput, Refused, StoreCorrupt, UnknownRef
from ledger.sharing import bundle, fetch, keys, push, signing
from ledger.sharing import remote as rm
from ledger.store import Store, canonical

from .conftest import snapshot


def test_key_create_keeps_the_private_half_out_of_objects(alice):
    pub = keys.create(alice, "alice")
    p = keys.keys_dir(alice) / "alice.ed25519"
    assert stat.S_IMODE(p.stat().st_mode) == 0o600
    assert stat.S_IMODE(keys.keys_dir(alice).stat().st_mode) == 0o700
    secret = p.read_bytes()
    for oid, path in alice.objects.iter_ids():
        assert b"PRIVATE KEY" not in path.read_bytes()
    assert secret not in b"".join(path.read_bytes() for _, path in alice.objects.iter_ids())
    s = Store.open(alice.root)
    assert s.state.refs["key:alice"] == pub.id
    assert PublicKey_round_trip(s, pub)
    with pytest.raises(BadInput):
        keys.create(s, "alice")
    with pytest.raises(BadInput):
        keys.create(s, "../evil")


def PublicKey_round_trip(store, pub) -> bool:
    return keys.PublicKey.from_json(store.get_json(pub.id)) == pub


def test_signatures_bind_the_manifest_and_each_record(alice, tmp_path):
    pub = keys.create(alice, "alice")
    alice = Store.open(alice.root)
    sk = keys.private_key(alice, "alice")
    sig = signing.sign(sk, pub, "manifest", {"a": 1})
    trusted = {pub.fingerprint: pub}
    assert signing.verify(trusted, "manifest", {"a": 1}, [sig])[0].trusted
    assert not signing.verify(trusted, "manifest", {"a": 2}, [sig])[0].valid
    # domain separation: a manifest signature is not a record signature
    assert not signing.verify(trusted, "record", {"a": 1}, [sig])[0].valid
    out = tmp_path / "s.bundle"
    bundle.create(alice, ["HEAD"], out, key_name="alice")
    lst = bundle.ls(alice, out)
    assert [c.trusted_as for c in lst.signers] == ["alice"]
    assert lst.records  # and each record's signature verified while listing


@pytest.fixture
def signed(alice, tmp_path):
    keys.create(alice, "alice")
    out = tmp_path / "signed.bundle"
    bundle.create(Store.open(alice.root), ["HEAD"], out, key_name="alice", origin="alice")
    pubfile = tmp_path / "alice.pub"
    pubfile.write_bytes(canonical.dumps(keys.own_keys(Store.open(alice.root))["alice"].to_json()))
    return out, pubfile


def test_trusted_signature_is_accepted_and_shown(signed, bob):
    out, pubfile = signed
    keys.trust(bob, keys.read_public_key_file(pubfile))
    keys.set_signatures_required(Store.open(bob.root), True)
    res = bundle.import_bundle(Store.open(bob.root), out)
    assert [c.to_json() for c in res.signers] == [{"key": res.signers[0].key, "name": "alice", "valid": True, "trusted": True}]
    rec = Store.open(bob.root).journal.records()[-1]
    assert rec["payload"]["signers"][0]["trusted"] is True


def test_required_signatures_refuse_unsigned_and_untrusted(alice, signed, bob, tmp_path):
    out, _ = signed
    unsigned = tmp_path / "unsigned.bundle"
    bundle.create(Store.open(alice.root), ["HEAD"], unsigned)
    keys.set_signatures_required(bob, True)
    before = snapshot(bob.root)
    with pytest.raises(Refused) as ei:
        bundle.import_bundle(Store.open(bob.root), unsigned)
    assert ei.value.exit_code == 3 and "unsigned" in ei.value.message
    with pytest.raises(Refused) as ei:
        bundle.import_bundle(Store.open(bob.root), out)
    assert "does not trust" in ei.value.message
    assert snapshot(bob.root) == before
    # without the requirement both import (an untrusted signature is shown, not counted)
    keys.set_signatures_required(Store.open(bob.root), False)
    res = bundle.import_bundle(Store.open(bob.root), out)
    assert res.signers[0].valid and not res.signers[0].trusted


def _resign_header(path, mutate):
    raw = path.read_bytes()
    n = len(bundle.MAGIC)
    (hlen,) = struct.unpack(">Q", raw[n:n + 8])
    header = canonical.loads(raw[n + 8:n + 8 + hlen])
    mutate(header)
    h = canonical.dumps(header)
    path.write_bytes(bundle.MAGIC + struct.pack(">Q", len(h)) + h + raw[n + 8 + hlen:])


def test_wrong_signature_is_tampering_even_when_not_required(signed, bob):
    out, pubfile = signed
    keys.trust(bob, keys.read_public_key_file(pubfile))

    def rename_ref(h):  # change what is shared after signing
        m = h["manifest"]
        m["refs"]["HEAD-renamed"] = m["refs"].pop("HEAD")
    _resign_header(out, rename_ref)
    before = snapshot(bob.root)
    with pytest.raises(StoreCorrupt) as ei:
        bundle.import_bundle(Store.open(bob.root), out)
    assert ei.value.exit_code == 4 and "does not verify" in ei.value.message
    assert snapshot(bob.root) == before


def test_signature_by_another_key_claiming_a_trusted_name_is_not_trusted(signed, bob, tmp_path):
    out, pubfile = signed
    keys.trust(bob, keys.read_public_key_file(pubfile))
    mallory = Store.init(tmp_path / "mallory")
    keys.create(mallory, "alice")  # same name, different key
    mallory = Store.open(mallory.root)
    sk = keys.private_key(mallory, "alice")
    mpub = keys.own_keys(mallory)["alice"]

    def resign(h):
        h["signatures"] = [signing.sign(sk, mpub, "manifest", h["manifest"])]
    _resign_header(out, resign)
    keys.set_signatures_required(Store.open(bob.root), True)
    with pytest.raises(Refused, match="does not trust"):
        bundle.import_bundle(Store.open(bob.root), out)


def test_signed_push_and_required_pull(alice, bob, tmp_path):
    keys.create(alice, "alice")
    alice = Store.open(alice.root)
    root = tmp_path / "remote"
    push.push(alice, rm.DirBackend(root), ["HEAD"], key_name="alice")
    pub = keys.own_keys(alice)["alice"]
    keys.set_signatures_required(bob, True)
    with pytest.raises(Refused):
        fetch.pull(Store.open(bob.root), rm.DirBackend(root), namespace="alice")
    keys.trust(Store.open(bob.root), pub)
    res = fetch.pull(Store.open(bob.root), rm.DirBackend(root), namespace="alice")
    assert res[0].signers[0].trusted_as == "alice"
    # re-pushing the same target unsigned keeps the signed ref (nothing to do) ...
    assert push.push(alice, rm.DirBackend(root), ["HEAD"]).up_to_date
    fetch.pull(Store.open(bob.root), rm.DirBackend(root), namespace="alice2")
    # ... but a new, unsigned HEAD is refused by the same policy
    from ledger import generations

    with alice.transaction("genesis") as tx:
        generations.new_generation(tx, alice, note="unsigned")
    assert not push.push(alice, rm.DirBackend(root), ["HEAD"]).up_to_date
    with pytest.raises(Refused, match="unsigned"):
        fetch.pull(Store.open(bob.root), rm.DirBackend(root), namespace="alice3")


def test_untrust_and_pem_keys(alice, tmp_path):
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    pem = Ed25519PrivateKey.generate().public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
    f = tmp_path / "k.pem"
    f.write_bytes(pem)
    with pytest.raises(BadInput):
        keys.read_public_key_file(f)  # a PEM carries no name
    pub = keys.read_public_key_file(f, "carol")
    keys.trust(alice, pub)
    assert pub.fingerprint in keys.trusted_keys(Store.open(alice.root))
    keys.untrust(Store.open(alice.root), pub.key[:12])
    assert pub.fingerprint not in keys.trusted_keys(Store.open(alice.root))
    with pytest.raises(UnknownRef):
        keys.untrust(Store.open(alice.root), pub.key[:12])


def test_cli_exit_codes_for_signature_policy(alice, bob, tmp_path, cli):
    run = cli

    assert run(alice, "key", "create", "alice").returncode == 0
    pub = tmp_path / "alice.pub"
    assert run(alice, "key", "export", "alice", "-o", pub).returncode == 0
    signed, unsigned = tmp_path / "s.bundle", tmp_path / "u.bundle"
    assert run(alice, "bundle", "create", "HEAD", "-o", signed, "--sign", "alice").returncode == 0
    assert run(alice, "bundle", "create", "HEAD", "-o", unsigned).returncode == 0
    assert run(bob, "key", "require", "on").returncode == 0
    p = run(bob, "bundle", "import", unsigned)
    assert p.returncode == 3 and "unsigned" in p.stderr
    p = run(bob, "bundle", "import", signed)
    assert p.returncode == 3 and "does not trust" in p.stderr
    assert run(bob, "key", "trust", pub).returncode == 0
    p = run(bob, "key", "list", "--json")
    assert json.loads(p.stdout)["trusted"][0]["name"] == "alice"
    p = run(bob, "bundle", "ls", signed, "--json")
    assert json.loads(p.stdout)["signers"][0]["trusted"] is True
    # tamper after signing: exit 4
    raw = bytearray(signed.read_bytes())
    i = raw.index(b'"sig":"') + 10
    raw[i] = ord("0") if raw[i] != ord("0") else ord("1")
    tampered = tmp_path / "t.bundle"
    tampered.write_bytes(bytes(raw))
    p = run(bob, "bundle", "import", tampered)
    assert p.returncode == 4 and "does not verify" in p.stderr, p.stderr
    p = run(bob, "bundle", "import", signed, "--as", "alice", "--json")
    assert p.returncode == 0, p.stderr
    assert json.loads(p.stdout)["refs"] == {"alice/HEAD": alice.history["gen"]}
