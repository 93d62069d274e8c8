"""Signing keys (ed25519) and the trust list.

A private key lives only in `.ledger/keys/NAME.ed25519` (PKCS#8 PEM, created 0600 with
O_EXCL in a 0700 directory); it is never an object, never in a bundle, never pushed.
The public key is a structured object — {"kind": "public-key", "algorithm": "ed25519",
"name", "key": <64 hex>} — whose canonical bytes are also the file `ledger key export`
writes and `ledger key trust FILE` reads.

Which keys are ours, which we trust, and whether signatures are required are refs, so they
change only through journal records like everything else that is live:
  key:NAME                     -> our public key object
  trust:ed25519:<hex>          -> a colleague's public key object
  setting:require_signatures   -> {"kind": "setting", ...} (absent = not required)
A key's identity is "ed25519:<hex of the 32 raw public bytes>"; it is deliberately not
formatted as `b3:…`, which the store would take for an object reference.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path

from ledger import records
from ledger.errors import BadInput, UnknownRef
from ledger.store import canonical, fsio
from ledger.store.ids import hash_bytes

NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")
HEX_RE = re.compile(r"^[0-9a-f]{64}$")
REQUIRE_REF = "setting:require_signatures"


@dataclass(frozen=True)
class PublicKey:
    """An ed25519 public key as this store knows it (an object under `key:NAME` or `trust:…`)."""

    name: str
    key: str            # 64 hex chars: the raw ed25519 public key

    @property
    def fingerprint(self) -> str:
        return f"ed25519:{self.key}"

    def to_json(self) -> dict:
        return {"kind": "public-key", "algorithm": "ed25519", "name": self.name, "key": self.key}

    @property
    def id(self) -> str:
        return hash_bytes(canonical.dumps(self.to_json()))

    @classmethod
    def from_json(cls, obj) -> "PublicKey":
        if not (isinstance(obj, dict) and obj.get("kind") == "public-key" and obj.get("algorithm") == "ed25519"
                and isinstance(obj.get("key"), str) and HEX_RE.match(obj["key"]) and isinstance(obj.get("name"), str)
                and NAME_RE.match(obj["name"])):
            raise BadInput("not a ledger ed25519 public key", "use a file written by `ledger key export NAME`")
        return cls(name=obj["name"], key=obj["key"])


def check_name(name: str) -> str:
    """A key name: letters, digits, . _ - (it names a file under .ledger/keys)."""
    if not isinstance(name, str) or not NAME_RE.match(name):
        raise BadInput(f"bad key name {name!r}", "key names use letters, digits, . _ - (up to 64)")
    return name


def keys_dir(store) -> Path:
    """Where this store's private keys live (0700; never an object, never shared)."""
    return store.root / "keys"


def _private_path(store, name: str) -> Path:
    return keys_dir(store) / f"{check_name(name)}.ed25519"


def create(store, name: str) -> PublicKey:
    """Make a new key pair: private half to keys/ (0600), public half as an object + ref."""
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    check_name(name)
    if f"key:{name}" in store.state.refs:
        raise BadInput(f"a key named {name!r} already exists", "choose another name; keys are never overwritten")
    d = keys_dir(store)
    d.mkdir(mode=0o700, exist_ok=True)
    os.chmod(d, 0o700)
    path = _private_path(store, name)
    sk = Ed25519PrivateKey.generate()
    pem = sk.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    raw = sk.public_key().public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    pub = PublicKey(name=name, key=raw.hex())
    with store.transaction("key") as tx:
        # The private file is written under the lock, before the record, and O_EXCL: a
        # leftover file from a crashed create is refused rather than silently replaced.
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        except FileExistsError:
            raise BadInput(f"{path} already exists but no key record names it",
                           "move the file aside (it may be a key from an interrupted `key create`)") from None
        try:
            os.write(fd, pem)
            os.fsync(fd)
        finally:
            os.close(fd)
        oid = tx.put_json(pub.to_json())
        tx.outputs.append(oid)
        tx.refs[f"key:{name}"] = oid
        records.write(tx, records.Key(key={"name": name, "fingerprint": pub.fingerprint}))
    return pub


def private_key(store, name: str):
    """Load our private key NAME (for signing)."""
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    if f"key:{check_name(name)}" not in store.state.refs:
        raise UnknownRef(f"no key named {name!r}", "see `ledger key list`, or `ledger key create NAME`")
    path = _private_path(store, name)
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        raise UnknownRef(f"the private half of key {name!r} is not in {keys_dir(store)}",
                         "this store holds only its public half; sign from the store that created it") from None
    try:
        sk = serialization.load_pem_private_key(data, password=None)
    except ValueError as e:
        raise BadInput(f"{path} is not a readable private key: {e}") from None
    if not isinstance(sk, Ed25519PrivateKey):
        raise BadInput(f"{path} is not an ed25519 key")
    own = own_keys(store)[name]
    raw = sk.public_key().public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw).hex()
    if raw != own.key:
        raise BadInput(f"{path} does not match the public key recorded for {name!r}",
                       "the key file was replaced; restore the original")
    return sk


def _load(store, oid: str) -> PublicKey:
    return PublicKey.from_json(store.get_json(oid))


def own_keys(store) -> dict[str, PublicKey]:
    """The keys created in this store, by name."""
    return {n[4:]: _load(store, oid) for n, oid in sorted(store.state.refs.items()) if n.startswith("key:")}


def trusted_keys(store) -> dict[str, PublicKey]:
    """fingerprint -> key, for every key this store trusts (its own and those trusted)."""
    out = {}
    for n, oid in sorted(store.state.refs.items()):
        if n.startswith("key:") or n.startswith("trust:"):
            k = _load(store, oid)
            out[k.fingerprint] = k
    return out


def read_public_key_file(path: Path, name: str | None = None) -> PublicKey:
    """A file from `ledger key export` (JSON), or a PEM/OpenSSH ed25519 public key."""
    try:
        data = fsio.read_user_file(Path(path), 64 << 10)   # a FIFO is refused, not waited on
    except OSError as e:
        raise BadInput(f"cannot read {path}: {e.strerror}") from None
    except fsio.NotRegular as e:
        raise BadInput(f"cannot read {path}: {e}") from None
    except ValueError:
        raise BadInput(f"{path} is too large to be a public key") from None
    if data.lstrip().startswith(b"{"):
        pub = PublicKey.from_json(canonical.loads(data))
        return PublicKey(name=check_name(name), key=pub.key) if name else pub
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

    try:
        pk = (serialization.load_ssh_public_key(data) if data.startswith(b"ssh-")
              else serialization.load_pem_public_key(data))
    except (ValueError, TypeError) as e:
        raise BadInput(f"{path} is not a public key: {e}") from None
    if not isinstance(pk, Ed25519PublicKey):
        raise BadInput(f"{path} is not an ed25519 public key", "ledger signs with ed25519 only")
    if not name:
        raise BadInput("a PEM or OpenSSH key carries no name", "pass --name NAME")
    raw = pk.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    return PublicKey(name=check_name(name), key=raw.hex())


def trust(store, pub: PublicKey) -> str:
    """Trust `pub` (a `trust:ed25519:<hex>` ref in one record); returns its fingerprint."""
    ref = f"trust:{pub.fingerprint}"
    with store.transaction("trust") as tx:
        oid = tx.put_json(pub.to_json())
        tx.outputs.append(oid)
        tx.refs[ref] = oid
        records.write(tx, records.Trust(trust={"name": pub.name, "fingerprint": pub.fingerprint}))
    return oid


def untrust(store, fingerprint: str) -> None:
    """Stop trusting a key (its trust ref removed in one record)."""
    fp = fingerprint if fingerprint.startswith("ed25519:") else f"ed25519:{fingerprint}"
    matches = [n for n in store.state.refs if n.startswith("trust:") and n[len("trust:"):].startswith(fp)]
    if len(matches) != 1:
        raise UnknownRef(f"{'no' if not matches else 'more than one'} trusted key matches {fingerprint!r}",
                         "see `ledger key list` for fingerprints")
    with store.transaction("trust") as tx:
        tx.refs[matches[0]] = None
        records.write(tx, records.Trust(untrust={"fingerprint": matches[0][len("trust:"):]}))


def signatures_required(store) -> bool:
    """Whether imports and pulls need a valid signature by a trusted key."""
    oid = store.state.refs.get(REQUIRE_REF)
    return bool(oid) and store.get_json(oid).get("value") is True


def set_signatures_required(store, on: bool) -> None:
    """Turn the signature requirement on or off (the ref `setting:require_signatures`)."""
    with store.transaction("setting") as tx:
        if on:
            oid = tx.put_json({"kind": "setting", "name": "require_signatures", "value": True})
            tx.outputs.append(oid)
            tx.refs[REQUIRE_REF] = oid
        else:
            tx.refs[REQUIRE_REF] = None
        records.write(tx, records.Setting(setting={"require_signatures": on}))
