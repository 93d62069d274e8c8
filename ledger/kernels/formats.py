"""Weight formats of the decode kernels, in numpy (no GPU, no torch).

bf16 tensors travel as ``uint16`` bit patterns: numpy has no bfloat16, and a bit pattern is
exact, so the float64 oracles see precisely the values the kernels see.

Formats
-------
``bf16``    W [N, K] bf16.
``int8``    W [N, K] int8 + one fp32 scale per output row (per channel): w = q * s[n].
            Symmetric, q in [-127, 127], s[n] = max|w[n, :]| / 127.
``q4b32``   4-bit blocks: each run of 32 consecutive k of one row shares one bf16 scale;
            w = (q - 8) * s[n, k // 32], q in [0, 15] (so q - 8 in [-8, 7]; the quantizer uses
            [-7, 7], s = absmax / 7, keeping the grid symmetric). Packed as uint8 [N, K / 2]:
            32-bit little-endian word j of a block holds elements 8j..8j+7, element 8j + 2i in
            bits [4i, 4i + 4) and element 8j + 2i + 1 in bits [16 + 4i, 16 + 4i + 4), i = 0..3.
            The interleave lets the kernel turn one word into a bf16 pair with a single lop3.
            Scales: bf16 [N, K / 32].
"""

from __future__ import annotations

import numpy as np

Q4_BLOCK = 32


# --- bf16 bit patterns ------------------------------------------------------------------
def f32_to_bf16_bits(a) -> np.ndarray:
    """Round float32 (or anything castable) to bf16, round-to-nearest-even; returns uint16."""
    f = np.ascontiguousarray(np.asarray(a, dtype=np.float32))
    u = f.view(np.uint32).astype(np.uint64)
    rounded = (u + 0x7FFF + ((u >> 16) & 1)) >> 16
    out = rounded.astype(np.uint16)
    nan = np.isnan(f)
    if nan.any():
        out[nan] = 0x7FC0
    return out


def bf16_bits_to_f32(b) -> np.ndarray:
    b = np.ascontiguousarray(np.asarray(b, dtype=np.uint16))
    return (b.astype(np.uint32) << 16).view(np.float32)


def bf16_bits_to_f64(b) -> np.ndarray:
    return bf16_bits_to_f32(b).astype(np.float64)


# --- int8 per channel ---------------------------------------------------------------------
def quantize_int8(w) -> tuple[np.ndarray, np.ndarray]:
    """w [N, K] float -> (q int8 [N, K], scale float32 [N]); |w - q*s| <= s/2 elementwise."""
    w = np.asarray(w, dtype=np.float64)
    amax = np.abs(w).max(axis=1)
    scale = np.where(amax > 0, amax / 127.0, 1.0).astype(np.float32)
    q = np.clip(np.rint(w / scale.astype(np.float64)[:, None]), -127, 127).astype(np.int8)
    return q, scale


def dequantize_int8(q, scale) -> np.ndarray:
    return np.asarray(q, dtype=np.float64) * np.asarray(scale, dtype=np.float64)[:, None]


# --- 4-bit blocks of 32 -------------------------------------------------------------------
def quantize_q4b32(w) -> tuple[np.ndarray, np.ndarray]:
    """w [N, K] float -> (q uint8 [N, K] in 0..15, scale bf16 bits [N, K/32]).

    s = absmax / 7 rounded to bf16; q = clip(round(w / s), -8, 7) + 8. Because s is rounded to
    nearest, w / s can exceed 7 by at most 7 * 2^-8, which still rounds to 7: |w - (q-8)*s| <= s/2.
    """
    w = np.asarray(w, dtype=np.float64)
    n, k = w.shape
    if k % Q4_BLOCK:
        raise ValueError(f"K={k} is not a multiple of {Q4_BLOCK}")
    blocks = w.reshape(n, k // Q4_BLOCK, Q4_BLOCK)
    amax = np.abs(blocks).max(axis=2)
    scale_bits = f32_to_bf16_bits(np.where(amax > 0, amax / 7.0, 1.0))
    scale = bf16_bits_to_f64(scale_bits)
    q = np.clip(np.rint(blocks / scale[:, :, None]), -8, 7) + 8
    return q.reshape(n, k).astype(np.uint8), scale_bits


def dequantize_q4b32(q, scale_bits) -> np.ndarray:
    q = np.asarray(q, dtype=np.float64)
    n, k = q.shape
    s = bf16_bits_to_f64(scale_bits)
    return ((q.reshape(n, k // Q4_BLOCK, Q4_BLOCK) - 8.0) * s[:, :, None]).reshape(n, k)


def pack_q4b32(q) -> np.ndarray:
    """q uint8 [N, K] (0..15) -> packed uint8 [N, K/2] in the interleaved layout above."""
    q = np.asarray(q, dtype=np.uint8)
    n, k = q.shape
    if k % 8:
        raise ValueError(f"K={k} is not a multiple of 8")
    e = q.reshape(n, k // 8, 8).astype(np.uint32)
    word = np.zeros((n, k // 8), dtype=np.uint32)
    for i in range(4):
        word |= e[:, :, 2 * i] << (4 * i)
        word |= e[:, :, 2 * i + 1] << (16 + 4 * i)
    return word.astype("<u4").view(np.uint8).reshape(n, k // 2)


def unpack_q4b32(packed) -> np.ndarray:
    packed = np.ascontiguousarray(np.asarray(packed, dtype=np.uint8))
    n, kh = packed.shape
    word = packed.reshape(n, kh // 4, 4).view("<u4").reshape(n, kh // 4)
    out = np.zeros((n, kh // 4, 8), dtype=np.uint8)
    for i in range(4):
        out[:, :, 2 * i] = (word >> (4 * i)) & 0xF
        out[:, :, 2 * i + 1] = (word >> (16 + 4 * i)) & 0xF
    return out.reshape(n, kh * 2)


# --- the int8 x16 path (decode_linear_x16), bit for bit -------------------------------------
# x is staged in fp16 scaled by 2^-p, p chosen from max|x| so that the largest element lands in
# [2^14, 2^15): no fp16 overflow, and every bf16 element down to 2^-28 of max|x| is exact in fp16.
X16_P_MIN, X16_P_MAX = -126, 114  # 2^-p and 2^p stay normal fp32


def x16_exponent(x_bits) -> int:
    """The kernel's p: bf16 exponent field of max|x| minus 141, clamped to [-126, 114]."""
    mag = np.asarray(x_bits, dtype=np.uint16) & np.uint16(0x7FFF)
    e = int(mag.max()) >> 7 if mag.size else 0
    return max(X16_P_MIN, min(X16_P_MAX, e - 141))


def x16_stage(x_bits) -> tuple[np.ndarray, int]:
    """(x * 2^-p as float16 -- the fp32 product rounded to nearest even, as cvt.rn.f16x2.f32 --, p)."""
    p = x16_exponent(x_bits)
    scaled = bf16_bits_to_f32(x_bits) * np.float32(2.0 ** -p)  # exact: a power of two
    return scaled.astype(np.float16), p


def byte_perm(x: int, y: int, s: int) -> int:
    """CUDA's __byte_perm (default mode): result byte i = byte (s >> 4i) & 7 of the pair (y:x)."""
    src = (int(y) << 32) | int(x)
    return sum(((src >> (8 * ((s >> (4 * i)) & 7))) & 0xFF) << (8 * i) for i in range(4))


def int8_word_to_f16_pairs(word: int) -> tuple[np.ndarray, np.ndarray]:
    """The kernel's dequant_i8_f16 on one 32-bit word (4 int8, element 0 in the low byte): two
    fp16 pairs (elements 0,1 and 2,3) = byte_perm into 1024 + (q + 128), then + (-1152)."""
    u = int(word) ^ 0x80808080
    pairs = []
    for sel in (0x4140, 0x4342):
        h = np.array([byte_perm(u, 0x64646464, sel)], dtype="<u4").view(np.float16)  # [low, high]
        pairs.append((h.astype(np.float32) + np.float32(-1152.0)).astype(np.float16))  # add.rn.f16x2
    return pairs[0], pairs[1]


def q4_word_to_f16_pairs(word: int) -> list[np.ndarray]:
    """The kernel's dequant_q4_f16 before the scale, on one 32-bit word of the q4b32 interleave:
    four fp16 pairs, pair i = elements (2i, 2i+1) of the word = nibble i of each 16-bit half.
    Pairs 0 and 2 (after >> 8): lop3 into 1024 + q, then + (-1032); pairs 1 and 3: lop3 into
    1024 + 16 q, then * (1/16) + (-72) as one fma. Each returns q - 8 exactly."""
    out = []
    for shift, hi in ((0, False), (0, True), (8, False), (8, True)):
        q = (int(word) >> shift) & 0xFFFFFFFF
        mask = 0x00F000F0 if hi else 0x000F000F
        h = np.array([(q & mask) | 0x64006400], dtype="<u4").view(np.float16).astype(np.float64)
        v = h * (1.0 / 16.0) - 72.0 if hi else h - 1032.0  # exact in fp16: small integers
        out.append(v.astype(np.float16))
    return out


# --- q4b32p: q4b32 with each 128-element chunk of a row pre-permuted (done once, at load) -----
# The q4b32-x16 kernel's mma takes, for lane t, the 32 elements of its 16 bytes as 8 k16 slices
# of 4; with the plain layout each slice mixes 4 lanes' scale blocks, so the scale must be applied
# per weight (HMUL2). q4b32p stores chunk element s = 32 t + 4 j + u (lane t, mma j = 0..7,
# u = 0..3) as logical element k = 32 (j // 2) + 16 (j % 2) + 4 t + u: every mma then covers 16
# elements of ONE scale block (block j // 2 of the chunk), and the kernel applies the scale once
# per block, in fp32, after the mma. Bytes are otherwise packed exactly as q4b32 (same nibble
# interleave, same size); scales stay bf16 [N, K/32] in logical order.
Q4P_CHUNK = 128


def q4p_logical_of_stored() -> np.ndarray:
    """k (logical position in a 128-chunk) of each stored position s."""
    s = np.arange(Q4P_CHUNK)
    t, j, u = s // 32, (s % 32) // 4, s % 4
    return 32 * (j // 2) + 16 * (j % 2) + 4 * t + u


def pack_q4b32p(q) -> np.ndarray:
    """q uint8 [N, K] (0..15, logical order) -> packed uint8 [N, K/2] in the q4b32p layout."""
    q = np.asarray(q, dtype=np.uint8)
    n, k = q.shape
    if k % Q4P_CHUNK:
        raise ValueError(f"K={k} is not a multiple of {Q4P_CHUNK}")
    logical = q4p_logical_of_stored()
    stored = q.reshape(n, k // Q4P_CHUNK, Q4P_CHUNK)[:, :, logical].reshape(n, k)
    return pack_q4b32(stored)


def unpack_q4b32p(packed) -> np.ndarray:
    """packed uint8 [N, K/2] (q4b32p) -> q uint8 [N, K] in logical order."""
    stored = unpack_q4b32(packed)
    n, k = stored.shape
    out = np.empty_like(stored)
    out.reshape(n, k // Q4P_CHUNK, Q4P_CHUNK)[:, :, q4p_logical_of_stored()] = stored.reshape(n, k // Q4P_CHUNK, Q4P_CHUNK)
    return out
