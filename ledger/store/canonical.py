"""Canonical JSON: equal content gives equal bytes, and so equal ids, on every machine.

Sorted keys, no insignificant whitespace, UTF-8, no NaN/Infinity. Floats use Python's
shortest round-trip repr, which is deterministic across platforms.
"""

from __future__ import annotations

import json
import math

import orjson

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


_SORTED = orjson.OPT_SORT_KEYS
# orjson writes some floats that Python's encoder (the definition above) writes otherwise:
# 1e-05 as 0.00001, 1e-07 as 1e-7. Those are all below 1e-4 in magnitude, and each such
# orjson form holds one of these; bytes holding neither are ones the two encoders agree on
# (tests/store/test_canonical_fast.py checks every code point, ints at the 64-bit edges and
# millions of floats of every magnitude).
_ORJSON_ONLY = (b"e-", b"0.0000")


def _fast_strict(data: bytes):
    """The value of `data` if it is canonical and orjson's re-encoding proves it (the same
    bytes back, none of them a form only orjson writes), else None: undecided, and Python's
    parser and encoder decide. Never accepts what the Python path would refuse: orjson parses
    what it accepts to the same values, and the bytes it gives back are Python's encoding of
    them. A duplicate key, NaN, a lone surrogate or a 65-bit integer never round-trips here."""
    if _ORJSON_ONLY[0] in data or _ORJSON_ONLY[1] in data:
        return None
    try:
        obj = orjson.loads(data)
        again = orjson.dumps(obj, option=_SORTED)
    except (orjson.JSONDecodeError, orjson.JSONEncodeError):
        return None
    return obj if again == data else None


def loads(data: bytes | str, *, strict: bool = False):
    """Parse JSON, rejecting duplicate keys and NaN/Infinity.

    With strict=True the input must also be byte-for-byte canonical, which is what
    journal records and structured objects must be (so their ids are well-defined). Bytes
    are first tried through orjson (`_fast_strict`: ~5 us for a 560-byte record, against
    ~12 us parsing and encoding in Python); what it cannot prove canonical takes the Python
    path, whose answer (the value, or BadInput) is the same for any input.
    """
    if strict and type(data) is bytes:
        obj = _fast_strict(data)
        if obj is not None:
            return obj
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
