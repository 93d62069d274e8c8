"""Ed25519 signatures over canonical bytes, and the trust policy that judges them.

What is signed is always canonical JSON with a domain prefix, so a signature made for one
purpose cannot be replayed for another:
  message = b"ledger-signature-v1\\0" + CONTEXT + b"\\0" + canonical bytes
with CONTEXT "manifest" (a bundle's or push's table of contents: refs, roots, every object
id with its offset and size, the segment id — so it binds every byte shared) or "record"
(one journal record, with its id).

Judging: a signature that does not verify means the bytes were altered after signing —
always refused as tampering (exit 4), whatever the policy. A valid signature by a key this
store does not trust is shown but does not count. With `require_signatures` on, at least
one valid signature by a trusted key is needed (otherwise refused, exit 3).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from ledger.errors import Refused, StoreCorrupt
from ledger.sharing import keys
from ledger.store import canonical

DOMAIN = b"ledger-signature-v1\0"
SIG_RE = re.compile(r"^[0-9a-f]{128}$")


def message(context: str, obj) -> bytes:
    """The bytes signed: domain prefix, context, canonical JSON."""
    return DOMAIN + context.encode() + b"\0" + canonical.dumps(obj)


def sign(private_key, pub: keys.PublicKey, context: str, obj) -> dict:
    """A signature dict {key, name, sig} over `obj` in `context`."""
    sig = private_key.sign(message(context, obj))
    return {"key": pub.fingerprint, "name": pub.name, "sig": sig.hex()}


@dataclass(frozen=True)
class Check:
    """One signature judged: whether it verifies, and whether its key is trusted here."""

    key: str            # "ed25519:<hex>"
    claimed_name: str   # what the signature says (informational only)
    valid: bool
    trusted_as: str | None   # our name for the key if we trust it

    @property
    def trusted(self) -> bool:
        return self.valid and self.trusted_as is not None

    def to_json(self) -> dict:
        return {"key": self.key, "name": self.trusted_as or self.claimed_name, "valid": self.valid,
                "trusted": self.trusted}


def verify(trusted: dict, context: str, obj, signatures) -> list[Check]:
    """Check each signature (a list of {"key", "name", "sig"}). Never raises on a bad one:
    judging is `enforce`'s job, so `bundle ls` can show them all."""
    from cryptography.exceptions import InvalidSignature
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

    if not isinstance(signatures, list):
        raise StoreCorrupt("signatures are malformed")
    msg = message(context, obj)
    out = []
    for s in signatures:
        if not (isinstance(s, dict) and set(s) == {"key", "name", "sig"} and isinstance(s["key"], str)
                and s["key"].startswith("ed25519:") and keys.HEX_RE.match(s["key"][8:])
                and isinstance(s["name"], str) and len(s["name"]) <= 64 and isinstance(s["sig"], str)
                and SIG_RE.match(s["sig"])):
            raise StoreCorrupt("a signature entry is malformed")
        try:
            Ed25519PublicKey.from_public_bytes(bytes.fromhex(s["key"][8:])).verify(bytes.fromhex(s["sig"]), msg)
            valid = True
        except (InvalidSignature, ValueError):
            valid = False
        k = trusted.get(s["key"])
        out.append(Check(key=s["key"], claimed_name=s["name"], valid=valid, trusted_as=k.name if k else None))
    return out


def enforce(store, checks: list[Check], what: str) -> None:
    """Refuse tampering always (exit 4), and unsigned or untrusted input when signatures are required (exit 3)."""
    bad = [c for c in checks if not c.valid]
    if bad:
        raise StoreCorrupt(f"{what}: the signature by {bad[0].claimed_name} ({bad[0].key[:24]}…) does not verify",
                           "the content was altered after it was signed; do not use it")
    if keys.signatures_required(store) and not any(c.trusted for c in checks):
        if not checks:
            raise Refused(f"{what} is unsigned and this store requires signatures",
                          "ask the sender to sign it (`--sign KEY`), or `ledger key require off`")
        names = ", ".join(f"{c.claimed_name} ({c.key[:24]}…)" for c in checks)
        raise Refused(f"{what} is signed only by keys this store does not trust: {names}",
                      "if you know the signer, `ledger key trust THEIR_KEY_FILE`")
