"""Numeric formats and the safetensors container used by tools/make_checkpoint.py.

Everything here is plain numpy and exact (bit manipulation or power-of-two arithmetic), so the same
inputs give the same bytes on every machine.

Formats (docs/v4-architecture.md §3):
  * BF16: float32 rounded to nearest, ties to even (bit arithmetic on the float32 pattern).
  * F8_E4M3 ("e4m3fn"): 1 sign, 4 exponent (bias 7), 3 mantissa bits; max 448, subnormal step 2^-9,
    codes 0x7F/0xFF are NaN and never produced. Encoding rounds to nearest, ties to even, and
    saturates at +-448.
  * e2m1 (FP4): 1 sign, 2 exponent (bias 1), 1 mantissa bit; magnitudes 0, .5, 1, 1.5, 2, 3, 4, 6.
    Encoding rounds to nearest, ties to the even code, saturates at +-6.
  * F8_E8M0: a power of two 2^(byte - 127); byte 255 is NaN and never produced.
  * FP8 block weights: F8_E4M3 [out, in] + F8_E8M0 scales [ceil(out/B), ceil(in/B)], one scale per
    BxB tile, scale = 2^ceil(log2(amax_tile / 448)).
  * FP4 expert weights: I8 [out, in/2] (two e2m1 codes per byte, low nibble = even K index) +
    F8_E8M0 scales [out, in/32], scale = 2^ceil(log2(amax_32 / 6)).
"""

from __future__ import annotations

import json
import os
import struct
from typing import Callable, Iterable, Iterator

import numpy as np

# ---------------------------------------------------------------------------------------------
# BF16

def f32_to_bf16_bits(x: np.ndarray) -> np.ndarray:
    """float32 -> bf16 bit patterns (uint16), round to nearest even. No NaN inputs expected."""
    u = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32)
    rounding = ((u >> np.uint32(16)) & np.uint32(1)) + np.uint32(0x7FFF)
    return ((u + rounding) >> np.uint32(16)).astype(np.uint16)


def bf16_bits_to_f32(b: np.ndarray) -> np.ndarray:
    return (np.asarray(b, dtype=np.uint16).astype(np.uint32) << np.uint32(16)).view(np.float32)


# ---------------------------------------------------------------------------------------------
# Minifloats (e4m3fn, e2m1)

def _minifloat_positive_values(exp_bits: int, man_bits: int, bias: int, n_codes: int) -> np.ndarray:
    """Values of the non-negative codes 0 .. n_codes-1 (ascending), float64."""
    vals = []
    for c in range(n_codes):
        e, m = c >> man_bits, c & ((1 << man_bits) - 1)
        if e == 0:
            vals.append(m / (1 << man_bits) * 2.0 ** (1 - bias))
        else:
            vals.append((1 + m / (1 << man_bits)) * 2.0 ** (e - bias))
    return np.array(vals, dtype=np.float64)


# e4m3fn: 127 finite non-negative codes (0x00 .. 0x7E); 0x7F is NaN.
E4M3_POS = _minifloat_positive_values(4, 3, 7, 127)
E4M3_MAX = 448.0
# e2m1: 8 non-negative codes.
E2M1_POS = _minifloat_positive_values(2, 1, 1, 8)
E2M1_MAX = 6.0


def _round_minifloat(a: np.ndarray, man_bits: int, emin: int, vmax: float) -> np.ndarray:
    """Round |x| (float64, >= 0) to the nearest minifloat value, ties to even mantissa.

    The quantum of a value in binade [2^e, 2^(e+1)) is 2^(e - man_bits), with e floored at the
    smallest normal exponent emin (subnormals share the quantum of the first normal binade).
    np.rint rounds half to even, and an even multiple of the quantum is an even mantissa, also
    when rounding carries into the next binade. Division by a power of two is exact.
    """
    a = np.minimum(a, vmax)
    _, e = np.frexp(a)  # a = f * 2^e, f in [0.5, 1) -> floor(log2 a) = e - 1 (a > 0)
    e = np.maximum(e.astype(np.int64) - 1, emin)
    quantum = np.ldexp(1.0, e - man_bits)
    return np.rint(a / quantum) * quantum


def _encode_minifloat(x: np.ndarray, pos_values: np.ndarray, man_bits: int, emin: int, vmax: float,
                      sign_bit: int) -> np.ndarray:
    x = np.asarray(x, dtype=np.float64)
    mag = _round_minifloat(np.abs(x), man_bits, emin, vmax)
    code = np.searchsorted(pos_values, mag).astype(np.uint8)  # exact match: mag is on the grid
    return np.where(np.signbit(x), code | np.uint8(sign_bit), code).astype(np.uint8)


def encode_e4m3(x: np.ndarray) -> np.ndarray:
    """Values -> e4m3fn codes (uint8), RNE, saturating at +-448; -0 keeps its sign (0x80)."""
    return _encode_minifloat(x, E4M3_POS, 3, -6, E4M3_MAX, 0x80)


def decode_e4m3(codes: np.ndarray) -> np.ndarray:
    """e4m3fn codes (uint8) -> float64 values; 0x7F/0xFF -> NaN."""
    c = np.asarray(codes, dtype=np.uint8)
    table = np.concatenate([E4M3_POS, [np.nan]])
    mag = table[c & 0x7F]
    return np.where(c & 0x80, -mag, mag)


def encode_e2m1(x: np.ndarray) -> np.ndarray:
    """Values -> e2m1 codes 0..15 (uint8; bit 3 = sign), RNE ties to even code, saturating at +-6."""
    return _encode_minifloat(x, E2M1_POS, 1, 0, E2M1_MAX, 0x8)


def decode_e2m1(codes: np.ndarray) -> np.ndarray:
    c = np.asarray(codes, dtype=np.uint8)
    mag = E2M1_POS[c & 0x7]
    return np.where(c & 0x8, -mag, mag)


# ---------------------------------------------------------------------------------------------
# E8M0 power-of-two scales

def ue8m0_exponent(amax: np.ndarray, qmax: float, floor: float = 2.0 ** -100) -> np.ndarray:
    """ceil(log2(max(amax, floor) / qmax)) exactly (float64 division, frexp), as int64."""
    r = np.maximum(np.asarray(amax, dtype=np.float64), floor) / qmax
    f, e = np.frexp(r)  # r = f * 2^e, f in [0.5, 1)
    e = e.astype(np.int64)
    return np.where(f == 0.5, e - 1, e)  # exact power of two 2^(e-1) needs no rounding up


def e8m0_encode(exp: np.ndarray) -> np.ndarray:
    exp = np.asarray(exp, dtype=np.int64)
    if np.any(exp < -127) or np.any(exp > 127):
        raise ValueError("scale exponent outside the E8M0 range")
    return (exp + 127).astype(np.uint8)


def e8m0_decode(b: np.ndarray) -> np.ndarray:
    b = np.asarray(b, dtype=np.uint8)
    return np.where(b == 255, np.nan, np.ldexp(1.0, b.astype(np.int64) - 127))


# ---------------------------------------------------------------------------------------------
# Block quantisation

def quantize_fp8_block(w: np.ndarray, block: int = 128) -> tuple[np.ndarray, np.ndarray]:
    """[out, in] float -> (e4m3 codes uint8 [out, in], e8m0 bytes uint8 [ceil(out/B), ceil(in/B)])."""
    w = np.asarray(w, dtype=np.float32)
    out_dim, in_dim = w.shape
    ro, ri = -(-out_dim // block), -(-in_dim // block)
    codes = np.empty((out_dim, in_dim), dtype=np.uint8)
    scales = np.empty((ro, ri), dtype=np.uint8)
    # Row stripes of one tile height keep temporaries small for large tensors.
    for bo in range(ro):
        stripe = w[bo * block:(bo + 1) * block].astype(np.float64)
        h = stripe.shape[0]
        padded = np.zeros((block, ri * block), dtype=np.float64)
        padded[:h, :in_dim] = stripe
        amax = np.abs(padded.reshape(block, ri, block)).max(axis=(0, 2))  # [ri]
        exp = ue8m0_exponent(amax, E4M3_MAX)
        scales[bo] = e8m0_encode(exp)
        inv = np.repeat(np.ldexp(1.0, -exp), block)[:in_dim]  # exact powers of two
        codes[bo * block:bo * block + h] = encode_e4m3(np.clip(stripe * inv, -E4M3_MAX, E4M3_MAX))
    return codes, scales


def dequantize_fp8_block(codes: np.ndarray, scales: np.ndarray, block: int = 128) -> np.ndarray:
    """-> float32 [out, in] (exact: e4m3 value times a power of two)."""
    out_dim, in_dim = codes.shape
    s = e8m0_decode(scales)
    s_full = np.repeat(np.repeat(s, block, axis=0), block, axis=1)[:out_dim, :in_dim]
    return (decode_e4m3(codes) * s_full).astype(np.float32)


def quantize_fp4_rows(w: np.ndarray, group: int = 32) -> tuple[np.ndarray, np.ndarray]:
    """[out, in] float -> (packed I8 [out, in/2] as int8, e8m0 bytes uint8 [out, in/group])."""
    w = np.asarray(w, dtype=np.float32)
    out_dim, in_dim = w.shape
    if in_dim % group or in_dim % 2:
        raise ValueError(f"FP4 needs in_dim % {group} == 0, got {in_dim}")
    packed = np.empty((out_dim, in_dim // 2), dtype=np.uint8)
    scales = np.empty((out_dim, in_dim // group), dtype=np.uint8)
    step = 1024  # rows per chunk (memory only; rows are independent)
    for r0 in range(0, out_dim, step):
        blk = w[r0:r0 + step].astype(np.float64).reshape(-1, in_dim // group, group)
        exp = ue8m0_exponent(np.abs(blk).max(axis=2), E2M1_MAX)
        scales[r0:r0 + step] = e8m0_encode(exp)
        q = np.clip(blk * np.ldexp(1.0, -exp)[..., None], -E2M1_MAX, E2M1_MAX)
        c = encode_e2m1(q).reshape(-1, in_dim)
        packed[r0:r0 + step] = c[:, 0::2] | (c[:, 1::2] << np.uint8(4))
    return packed.view(np.int8), scales


def unpack_fp4(packed: np.ndarray) -> np.ndarray:
    """I8 [out, in/2] -> e2m1 codes uint8 [out, in] (low nibble = even K index)."""
    u = np.asarray(packed).view(np.uint8)
    out = np.empty((u.shape[0], u.shape[1] * 2), dtype=np.uint8)
    out[:, 0::2] = u & 0xF
    out[:, 1::2] = u >> 4
    return out


def dequantize_fp4_rows(packed: np.ndarray, scales: np.ndarray, group: int = 32) -> np.ndarray:
    vals = decode_e2m1(unpack_fp4(packed))
    s = np.repeat(e8m0_decode(scales), group, axis=1)
    return (vals * s).astype(np.float32)


def quantize_fp8_rows(w: np.ndarray, group: int = 32) -> tuple[np.ndarray, np.ndarray]:
    """[rows, d] float -> (e4m3 codes uint8 [rows, d], e8m0 bytes uint8 [rows, d/group]): one scale per
    row per `group` consecutive values (V4.1 Engram tables), scale = 2^ceil(log2(amax_group / 448))."""
    w = np.asarray(w, dtype=np.float32)
    rows, d = w.shape
    if d % group:
        raise ValueError(f"row FP8 needs d % {group} == 0, got {d}")
    codes = np.empty((rows, d), dtype=np.uint8)
    scales = np.empty((rows, d // group), dtype=np.uint8)
    step = 1 << 14  # rows per chunk (memory only; rows are independent)
    for r0 in range(0, rows, step):
        blk = w[r0:r0 + step].astype(np.float64).reshape(-1, d // group, group)
        exp = ue8m0_exponent(np.abs(blk).max(axis=2), E4M3_MAX)
        scales[r0:r0 + step] = e8m0_encode(exp)
        q = np.clip(blk * np.ldexp(1.0, -exp)[..., None], -E4M3_MAX, E4M3_MAX)
        codes[r0:r0 + step] = encode_e4m3(q).reshape(-1, d)
    return codes, scales


def dequantize_fp8_rows(codes: np.ndarray, scales: np.ndarray, group: int = 32) -> np.ndarray:
    s = np.repeat(e8m0_decode(scales), group, axis=1)
    return (decode_e4m3(codes) * s).astype(np.float32)


# ---------------------------------------------------------------------------------------------
# safetensors

DTYPE_ITEMSIZE = {"F32": 4, "BF16": 2, "F16": 2, "F8_E4M3": 1, "F8_E8M0": 1, "I8": 1, "U8": 1,
                  "I32": 4, "I64": 8}


def tensor_nbytes(dtype: str, shape: Iterable[int]) -> int:
    n = DTYPE_ITEMSIZE[dtype]
    for d in shape:
        n *= int(d)
    return n


def storage_order(entries: dict[str, tuple[str, list[int]]], last: Iterable[str] = ()) -> list[str]:
    """Data-section order: widest dtype first, then by name (what safetensors' own serializer does).

    With an 8-byte aligned header every tensor is then naturally aligned for mmap readers, and the
    buffer has no holes. The JSON header lists tensors by name. Names in `last` (1-byte dtypes only,
    so alignment holds) go after everything else, in name order (V4.1 Engram tables: a sparse file
    can then leave them as one trailing hole).
    """
    last = set(last)
    for n in last:
        if DTYPE_ITEMSIZE[entries[n][0]] != 1:
            raise ValueError(f"{n}: only 1-byte tensors can be moved last")
    return sorted(entries, key=lambda n: (n in last, -DTYPE_ITEMSIZE[entries[n][0]], n))


def build_header(entries: dict[str, tuple[str, list[int]]], metadata: dict[str, str] | None = None,
                 last: Iterable[str] = ()) -> tuple[bytes, list[str]]:
    """-> (8-byte length + padded JSON header, tensor names in data order)."""
    order = storage_order(entries, last)
    offsets, pos = {}, 0
    for name in order:
        dtype, shape = entries[name]
        nb = tensor_nbytes(dtype, shape)
        offsets[name] = (pos, pos + nb)
        pos += nb
    header: dict = {}
    if metadata:
        header["__metadata__"] = {str(k): str(v) for k, v in sorted(metadata.items())}
    for name in sorted(entries):
        dtype, shape = entries[name]
        header[name] = {"dtype": dtype, "shape": [int(d) for d in shape],
                        "data_offsets": list(offsets[name])}
    text = json.dumps(header, separators=(",", ":"), ensure_ascii=True).encode("ascii")
    text += b" " * ((-(8 + len(text))) % 8)
    return struct.pack("<Q", len(text)) + text, order


def write_safetensors(path: str, entries: dict[str, tuple[str, list[int]]],
                      produce: Callable[[str], Iterator[bytes]],
                      metadata: dict[str, str] | None = None, last: Iterable[str] = (),
                      holes: Iterable[str] = ()) -> int:
    """Streams a safetensors file. `produce(name)` yields the tensor's bytes (any chunking), called
    once per tensor in data order. Returns the data-section size.

    `last`: names stored after all others (see storage_order). `holes`: names (a subset of `last`)
    whose data is all-zero bytes and is not written (seek past, then truncate to the full size), so
    on file systems with sparse files those bytes take no disk space."""
    holes = set(holes)
    if not holes <= set(last):
        raise ValueError("holes must be a subset of last")
    head, order = build_header(entries, metadata, last)
    total = 0
    tmp = path + ".partial"
    with open(tmp, "wb") as f:
        f.write(head)
        for name in order:
            want = tensor_nbytes(*entries[name])
            if name in holes:  # skipped: a hole once the file is extended past it
                f.seek(want, os.SEEK_CUR)
                total += want
                continue
            got = 0
            for chunk in produce(name):
                f.write(chunk)
                got += len(chunk)
            if got != want:
                raise RuntimeError(f"{name}: produced {got} bytes, header says {want}")
            total += got
        if holes:
            f.truncate(len(head) + total)
    os.replace(tmp, path)
    return total


def read_safetensors_header(path: str) -> tuple[dict, int]:
    """-> (header dict, offset of the data section)."""
    with open(path, "rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        return json.loads(f.read(n)), 8 + n
