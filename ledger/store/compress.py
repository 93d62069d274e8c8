"""Compressed small structured objects: `objects/ab/<62 hex>.z` (docs/store-format.md, Z1–Z6).

A learn cycle writes ~60 KB of canonical JSON (turn batches, verdicts, receipts, plans,
checkpoint manifests) against an adapter of ~80 KB on the built-in model; zstd shrinks the turn
batches ~13x and the rest ~2x. The compression is an encoding of the file only: the object's id
is the BLAKE3 of its *uncompressed* bytes, every read decompresses (bounded) and rehashes, and
nothing outside this store ever sees the compressed form (bundles, remotes and children get the
object's bytes), so two stores holding one object may encode it differently.

File layout (big-endian): `"ledger-zstd\\0\\0\\0\\0\\1"` (16 B), size u64 (the uncompressed size),
then one zstd frame (content size in its header, no checksum: BLAKE3 of the whole checks).
"""

from __future__ import annotations

import io
import struct

try:
    import zstandard  # module top, in a try: a `pip install --no-deps` checkout may lack it (Z5)
except ImportError:  # pragma: no cover - a `pip install --no-deps` checkout
    # Without the wheel a format-2 store refuses both to write an object it would compress and
    # to read a `.z` file, with a typed error naming the package (Z5): writing it whole instead
    # would be a second, quiet path through every write.
    zstandard = None

from ledger.errors import CorruptObject, UnsupportedFormat

SUFFIX = ".z"
MAGIC = b"ledger-zstd\0\0\0\0\1"
HEADER = struct.Struct(">16sQ")
MIN_SIZE = 512            # smaller objects gain a few bytes at most: stored whole
MAX_SIZE = 16 << 20       # the largest object stored compressed (= chunks.THRESHOLD: above it, chunks)
LEVEL = 19                # fixed: the same bytes encode the same way with one zstd version
LEVEL_LARGE = 3           # above LARGE level 19 costs seconds; the level is part of no id
LARGE = 1 << 20


def _missing(what: str) -> UnsupportedFormat:
    return UnsupportedFormat(f"{what} and the zstandard package is not installed",
                             "pip install zstandard (a dependency of ledger)")


def encode(data: bytes) -> bytes | None:
    """The `.z` file for `data`, or None when compressing is not worth it (too small, too large,
    or not at least 1/8 smaller). UnsupportedFormat without the wheel (Z5)."""
    if not MIN_SIZE <= len(data) <= MAX_SIZE:
        return None
    if zstandard is None:
        raise _missing("this store compresses structured objects (format 2)")
    level = LEVEL if len(data) <= LARGE else LEVEL_LARGE
    frame = zstandard.ZstdCompressor(level=level, write_checksum=False, write_content_size=True,
                                     write_dict_id=False).compress(data)
    out = HEADER.pack(MAGIC, len(data)) + frame
    return out if len(out) * 8 <= len(data) * 7 else None


def declared_size(head: bytes, oid: str, path) -> int:
    """The uncompressed size a `.z` file's header declares (CorruptObject if the header is not
    one, or declares more than MAX_SIZE: Z4)."""
    if len(head) < HEADER.size:
        raise CorruptObject(oid, f"object {oid} is damaged: {path} is too short for a compressed object")
    magic, size = HEADER.unpack_from(head)
    if magic != MAGIC:
        raise CorruptObject(oid, f"object {oid} is damaged: {path} does not start as a compressed object")
    if size > MAX_SIZE:
        raise CorruptObject(oid, f"object {oid} is damaged: {path} declares {size} bytes, "
                                 f"more than the {MAX_SIZE} a compressed object may hold")
    return size


def decode(raw: bytes, oid: str, path) -> bytes:
    """The uncompressed bytes of a `.z` file, never more than its header declares (a frame that
    inflates past it — a decompression bomb — is CorruptObject after reading at most one byte
    more). The caller checks the hash."""
    size = declared_size(raw, oid, path)
    if zstandard is None:
        raise _missing(f"object {oid} is stored compressed")
    try:
        with zstandard.ZstdDecompressor().stream_reader(io.BytesIO(raw[HEADER.size:]),
                                                        read_across_frames=False) as r:
            out = bytearray()
            while len(out) <= size:      # read() may return less than asked: read to the bound
                part = r.read(size + 1 - len(out))
                if not part:
                    break
                out += part
    except zstandard.ZstdError as e:
        raise CorruptObject(oid, f"object {oid} is damaged: {path} does not decompress ({e})") from None
    if len(out) != size:
        raise CorruptObject(oid, f"object {oid} is damaged: {path} decompresses to "
                                 f"{'more' if len(out) > size else len(out)} bytes, not the {size} it declares")
    return bytes(out)


def file_limit() -> int:
    """The most bytes a `.z` file may take on disk: encode() keeps a frame only if it is at least
    1/8 smaller than MAX_SIZE bytes at most, so a larger file is refused unread (Z4)."""
    return HEADER.size + MAX_SIZE
