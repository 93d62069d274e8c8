"""Object ids: `b3:<64 hex>` — the algorithm is part of the name so it can change one day."""

from __future__ import annotations

import re

import blake3

PREFIX = "b3:"
HEX_LEN = 64
ID_RE = re.compile(r"^b3:[0-9a-f]{64}$")
# Used to find references inside structured objects and journal payloads.
ID_SEARCH_RE = re.compile(r"b3:[0-9a-f]{64}")
PREFIX_RE = re.compile(r"^(b3:)?[0-9a-f]{8,64}$")


def hash_bytes(data: bytes | memoryview) -> str:
    """The id (`b3:` + BLAKE3 hex) of some bytes."""
    h = blake3.blake3(max_threads=blake3.blake3.AUTO) if len(data) > (1 << 20) else blake3.blake3()
    h.update(data)
    return PREFIX + h.hexdigest()


def is_id(s) -> bool:
    """True if `s` is a well-formed object id."""
    return isinstance(s, str) and ID_RE.match(s) is not None


def hex_of(oid: str) -> str:
    """The 64 hex digits of an id."""
    return oid[len(PREFIX):]


def is_hash_key(key: str) -> bool:
    """Convention: a value under a key ending in "hash" or "digest" is a hash that names no
    stored object (a suite hash, the source tree's hash), so it is not a reference."""
    return key.endswith("hash") or key.endswith("digest")


def find_ids(obj, out: set[str] | None = None) -> set[str]:
    """Every object id referenced anywhere in a JSON value (strings, keys, nested), except
    values under hash keys (see is_hash_key)."""
    out = set() if out is None else out
    stack = [obj]
    while stack:
        v = stack.pop()
        if isinstance(v, str):
            if len(v) >= 67:
                out.update(ID_SEARCH_RE.findall(v))
        elif isinstance(v, dict):
            stack.extend(v.keys())
            stack.extend(x for k, x in v.items() if not (isinstance(k, str) and is_hash_key(k)))
        elif isinstance(v, (list, tuple)):
            stack.extend(v)
    return out
