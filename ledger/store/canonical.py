"""Canonical JSON: equal content gives equal bytes, and so equal ids, on every machine.

Sorted keys, no insignificant whitespace, UTF-8, no NaN/Infinity. Floats use Python's
shortest round-trip repr, which is deterministic across platforms.
"""

from __future__ import annotations

import json
import math

from ledger.errors import BadInput

_ENCODER = json.JSONEncoder(sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False)


def dumps(obj) -> bytes:
    """The canonical JSON bytes of `obj` (sorted keys, no spaces, UTF-8, no NaN/Infinity)."""
    try:
        return _ENCODER.encode(obj).encode("utf-8")
    except (TypeError, ValueError) as e:
        raise BadInput(f"value is not canonical JSON: {e}",
                       "use dicts with string keys, lists, str, int, finite float, bool, None") from e


def _no_duplicates(pairs):
    out = {}
    for k, v in pairs:
        if k in out:
            raise ValueError(f"duplicate key {k!r}")
        out[k] = v
    return out


def _reject_constant(name):
    raise ValueError(f"non-finite number {name}")


def loads(data: bytes | str, *, strict: bool = False):
    """Parse JSON, rejecting duplicate keys and NaN/Infinity.

    With strict=True the input must also be byte-for-byte canonical, which is what
    journal records and structured objects must be (so their ids are well-defined).
    """
    try:
        text = data.decode("utf-8") if isinstance(data, (bytes, bytearray, memoryview)) else data
        if strict:
            # The re-encoding below must give back the input byte for byte, which a duplicate key
            # (kept once) or a NaN (refused by dumps) cannot: the C parser without hooks suffices,
            # and is what makes a journal of millions of records cheap to check.
            obj = json.loads(text)
        else:
            obj = json.loads(text, object_pairs_hook=_no_duplicates, parse_constant=_reject_constant)
    except (UnicodeDecodeError, ValueError, RecursionError) as e:
        raise BadInput(f"not valid JSON: {e}", "the bytes are damaged or not JSON") from e
    if strict:
        # compared as text: the bytes decoded without error, so equal text is equal UTF-8 bytes
        try:
            again = _ENCODER.encode(obj)
        except RecursionError:
            again = None
        except (TypeError, ValueError) as e:
            raise BadInput(f"value is not canonical JSON: {e}",
                           "use dicts with string keys, lists, str, int, finite float, bool, None") from e
        if again != text:
            raise BadInput("JSON is not in canonical form", "structured objects must be written by ledger")
    return obj


def is_finite_json(obj) -> bool:
    """True if `obj` holds no NaN or infinite float anywhere (canonical JSON forbids them)."""
    if isinstance(obj, float):
        return math.isfinite(obj)
    if isinstance(obj, dict):
        return all(isinstance(k, str) and is_finite_json(v) for k, v in obj.items())
    if isinstance(obj, (list, tuple)):
        return all(is_finite_json(v) for v in obj)
    return obj is None or isinstance(obj, (str, int, bool))
