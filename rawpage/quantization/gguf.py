"""GGUF block formats: one row of FORMATS per format, as ggml-cpu's type_traits table.

A weight (N, K) is stored as in the .gguf file: each row a run of blocks of `block`
values in `block_bytes` bytes. Every format here is, per group of `group` values,
an affine map of small unsigned integers q:

    w = d sc_g (L[q] - offset) - dm m_g          (one block; g = value index // group)

    d, dm     the block's float16 scales (dm: formats with mins)
    sc_g      a signed sub-scale per group (K-quants, IQ4_XS), else 1
    m_g       an unsigned sub-min per group (Q2_K, Q4_K, Q5_K), else 1
    q         `bits`-bit integers; L the identity, or for IQ4 a 16-entry table of
              non-linear values (stored + 128, so that L[q] is unsigned too)

Each row's `decode` takes blocks as stored to that canonical form (`Blocks`), and is
the format's whole definition on our side: `dequantize` (the NumPy reference) and the
CPU kernels' repacked layout (native/gguf.py, gguf_matmul.c) both start from it, and the tests hold
it to the `gguf` package's dequantizers (llama.cpp's own Python port). The C kernels
get the table as constants (c_traits_header, in the header build.py generates); the
CUDA kernels read the blocks as stored, one struct a format in cuda/gguf_blocks.cuh.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np


@dataclass
class Blocks:
    """n blocks in the canonical form (module docstring): w = d sc (L[q] - offset) - dm m."""

    d: np.ndarray  # (n,) float32
    q: np.ndarray  # (n, block) uint8, `bits` bits each
    dm: np.ndarray | None = None  # (n,) float32, formats with mins
    sc: np.ndarray | None = None  # (n, groups) int8, formats with sub-scales
    m: np.ndarray | None = None  # (n, groups) uint8, formats with a min per group


@dataclass(frozen=True)
class BlockFormat:
    name: str  # GGML's name
    ggml_type: int  # GGML's type id (gguf.GGMLQuantizationType)
    block: int  # values per block
    block_bytes: int
    group: int  # values per scale: 32 or 16
    bits: int  # bits of q
    offset: int  # the integers' zero point
    sub_scales: bool  # sc_g per group
    mins: int  # 0: none; 1: dm once per block (m = 1); 2: dm m_g per group
    decode: Callable[[np.ndarray], Blocks]  # (n, block_bytes) uint8 -> Blocks
    lut: tuple[int, ...] | None = None  # L: 16 unsigned values (IQ4)
    # How the CPU panels hold sc_g and m_g: 8, a byte each; 4, a nibble each (Q2_K); 6,
    # 6 bits each, as in the file (Q4_K, Q5_K: at most 8 groups, unsigned, with mins)
    scale_bits: int = 8

    @property
    def groups(self) -> int:
        return self.block // self.group


def _f16(raw: np.ndarray, at: int) -> np.ndarray:
    """The float16 at byte `at` of each block, as float32 (n,)."""
    return np.ascontiguousarray(raw[:, at : at + 2]).view(np.float16)[:, 0].astype(np.float32)


def _nibbles(qs: np.ndarray) -> np.ndarray:
    """(n, 16 c) bytes, 32-value chunks of 16 bytes: byte i holds value i (low nibble)
    and value i + 16 (high) of its chunk -> (n, 32 c) values 0..15."""
    n = len(qs)
    qs = qs.reshape(n, -1, 1, 16)
    return np.concatenate([qs & 15, qs >> 4], axis=2).reshape(n, -1)


def _k_scales(s: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Q4_K/Q5_K's 12 scale bytes -> (sc, m), (n, 8) each, 6 bits: chunks 0-3 keep them
    in the low 6 bits of bytes j and j + 4; chunks 4-7 in the nibbles of byte j + 4, with
    their top 2 bits in the top bits of bytes j - 4 and j."""
    lo, hi = s[:, 0:4], s[:, 4:8]
    top = s[:, 8:12]
    sc = np.concatenate([lo & 63, (top & 15) | ((lo >> 6) << 4)], axis=1)
    m = np.concatenate([hi & 63, (top >> 4) | ((hi >> 6) << 4)], axis=1)
    return sc.astype(np.int8), m.astype(np.uint8)


def _bits_of(raw: np.ndarray, at: int, count: int) -> np.ndarray:
    """(n, 8 count) bits of `count` bytes from `at`, little-endian: bit i of byte b is
    column 8 b + i."""
    return np.unpackbits(raw[:, at : at + count], axis=1, bitorder="little")


def _decode_q8_0(raw: np.ndarray) -> Blocks:  # d, qs[32] int8
    return Blocks(_f16(raw, 0), (raw[:, 2:34].view(np.int8).astype(np.int16) + 128).astype(np.uint8))


def _decode_q4_0(raw: np.ndarray) -> Blocks:  # d, qs[16]
    return Blocks(_f16(raw, 0), _nibbles(raw[:, 2:18]))


def _decode_q4_1(raw: np.ndarray) -> Blocks:  # d, m, qs[16]: w = d q + m
    return Blocks(_f16(raw, 0), _nibbles(raw[:, 4:20]), dm=-_f16(raw, 2))


def _q5(raw: np.ndarray, qh_at: int) -> np.ndarray:
    """Q5_0/Q5_1's values: the nibbles, and bit j of the 32-bit qh as bit 4 of value j."""
    return _nibbles(raw[:, qh_at + 4 : qh_at + 20]) | (_bits_of(raw, qh_at, 4) << 4)


def _decode_q5_0(raw: np.ndarray) -> Blocks:  # d, qh[4], qs[16]
    return Blocks(_f16(raw, 0), _q5(raw, 2))


def _decode_q5_1(raw: np.ndarray) -> Blocks:  # d, m, qh[4], qs[16]
    return Blocks(_f16(raw, 0), _q5(raw, 4), dm=-_f16(raw, 2))


def _decode_q2_k(raw: np.ndarray) -> Blocks:
    """scales[16] (sc low nibble, m high), qs[64], d, dmin. Half h of 128 values reads
    qs[32 h ..]: value 128 h + 32 j + l takes bits 2 j of byte 32 h + l (l < 32)."""
    n = len(raw)
    qs = raw[:, 16:80].reshape(n, 2, 1, 32)
    q = (qs >> (2 * np.arange(4, dtype=np.uint8))[:, None]) & 3  # (n, half, j, l)
    s = raw[:, 0:16]
    return Blocks(_f16(raw, 80), q.reshape(n, 256), dm=_f16(raw, 82), sc=(s & 15).astype(np.int8), m=s >> 4)


def _decode_q3_k(raw: np.ndarray) -> Blocks:
    """hmask[32], qs[64], scales[12], d. Low 2 bits as Q2_K's; bit 2 of value
    128 h + 32 j + l is bit 4 h + j of hmask[l]; 16 6-bit scales, stored + 32."""
    n = len(raw)
    qs = raw[:, 32:96].reshape(n, 2, 1, 32)
    lo = (qs >> (2 * np.arange(4, dtype=np.uint8))[:, None]) & 3  # (n, half, j, l)
    hm = _bits_of(raw, 0, 32).reshape(n, 32, 8).transpose(0, 2, 1).reshape(n, 2, 4, 32)  # bit 4h + j of hmask[l]
    s = raw[:, 96:108]
    low4 = np.concatenate([s[:, 0:8] & 15, s[:, 0:8] >> 4], axis=1)  # scales 0-7 low nibbles, 8-15 high
    high2 = (s[:, 8:12, None] >> (2 * np.arange(4, dtype=np.uint8))) & 3  # byte 8 + i, bits 2 j: scale 4 j + i
    sc = low4 | (high2.transpose(0, 2, 1).reshape(n, 16) << 4)
    return Blocks(_f16(raw, 108), (lo | (hm << 2)).reshape(n, 256), sc=(sc.astype(np.int16) - 32).astype(np.int8))


def _decode_q4_k(raw: np.ndarray) -> Blocks:  # d, dmin, scales[12], qs[128]
    n = len(raw)
    qs = raw[:, 16:144].reshape(n, 4, 1, 32)  # chunks 2 g (low nibbles) and 2 g + 1 (high) share 32 bytes
    q = np.concatenate([qs & 15, qs >> 4], axis=2).reshape(n, 256)
    sc, m = _k_scales(raw[:, 4:16])
    return Blocks(_f16(raw, 0), q, dm=_f16(raw, 2), sc=sc, m=m)


def _decode_q5_k(raw: np.ndarray) -> Blocks:  # d, dmin, scales[12], qh[32], qs[128]
    n = len(raw)
    qs = raw[:, 48:176].reshape(n, 4, 1, 32)
    q = np.concatenate([qs & 15, qs >> 4], axis=2).reshape(n, 8, 32)
    qh = _bits_of(raw, 16, 32).reshape(n, 32, 8).transpose(0, 2, 1)  # bit j of qh[l]: bit 4 of value 32 j + l
    sc, m = _k_scales(raw[:, 4:16])
    return Blocks(_f16(raw, 0), (q | (qh << 4)).reshape(n, 256), dm=_f16(raw, 2), sc=sc, m=m)


def _decode_q6_k(raw: np.ndarray) -> Blocks:
    """ql[128], qh[64], scales[16] int8, d. Value 128 h + 32 r + l: nibble r // 2 of
    ql[64 h + 32 (r % 2) + l], bits 2 r of qh[32 h + l]; stored + 32."""
    n = len(raw)
    ql = raw[:, 0:128].reshape(n, 2, 2, 32)  # (half, r % 2, l)
    lo = np.stack([ql & 15, ql >> 4], axis=2).reshape(n, 2, 4, 32)  # (half, r // 2, r % 2, l) = (half, r, l)
    qh = raw[:, 128:192].reshape(n, 2, 1, 32)
    hi = (qh >> (2 * np.arange(4, dtype=np.uint8))[:, None]) & 3
    return Blocks(_f16(raw, 208), (lo | (hi << 4)).reshape(n, 256), sc=raw[:, 192:208].view(np.int8).copy())


# IQ4's 16 non-linear values (ggml's kvalues_iq4nl), + 128 so that they are unsigned.
IQ4_VALUES = (-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113)
_IQ4_LUT = tuple(v + 128 for v in IQ4_VALUES)


def _decode_iq4_nl(raw: np.ndarray) -> Blocks:  # d, qs[16]: value = d IQ4_VALUES[q]
    return Blocks(_f16(raw, 0), _nibbles(raw[:, 2:18]))


def _decode_iq4_xs(raw: np.ndarray) -> Blocks:
    """d, scales_h (u16), scales_l[4], qs[128]: chunk j's 6-bit scale is nibble j % 2 of
    scales_l[j // 2] and bits 2 j of scales_h, stored + 32."""
    n = len(raw)
    h = np.ascontiguousarray(raw[:, 2:4]).view(np.uint16)[:, 0, None] >> (2 * np.arange(8, dtype=np.uint16))
    low = np.stack([raw[:, 4:8] & 15, raw[:, 4:8] >> 4], axis=2).reshape(n, 8)
    sc = (low.astype(np.int16) | ((h & 3).astype(np.int16) << 4)) - 32
    return Blocks(_f16(raw, 0), _nibbles(raw[:, 8:136]), sc=sc.astype(np.int8))


FORMATS = {
    f.name: f
    for f in (
        #           name      id  block bytes group bits offset sub mins  decode
        BlockFormat("Q4_0", 2, 32, 18, 32, 4, 8, False, 0, _decode_q4_0),
        BlockFormat("Q4_1", 3, 32, 20, 32, 4, 0, False, 1, _decode_q4_1),
        BlockFormat("Q5_0", 6, 32, 22, 32, 5, 16, False, 0, _decode_q5_0),
        BlockFormat("Q5_1", 7, 32, 24, 32, 5, 0, False, 1, _decode_q5_1),
        BlockFormat("Q8_0", 8, 32, 34, 32, 8, 128, False, 0, _decode_q8_0),
        BlockFormat("Q2_K", 10, 256, 84, 16, 2, 0, True, 2, _decode_q2_k, scale_bits=4),
        BlockFormat("Q3_K", 11, 256, 110, 16, 3, 4, True, 0, _decode_q3_k),
        BlockFormat("Q4_K", 12, 256, 144, 32, 4, 0, True, 2, _decode_q4_k, scale_bits=6),
        BlockFormat("Q5_K", 13, 256, 176, 32, 5, 0, True, 2, _decode_q5_k, scale_bits=6),
        BlockFormat("Q6_K", 14, 256, 210, 16, 6, 32, True, 0, _decode_q6_k),
        BlockFormat("IQ4_NL", 20, 32, 18, 32, 4, 128, False, 0, _decode_iq4_nl, lut=_IQ4_LUT),
        BlockFormat("IQ4_XS", 23, 256, 136, 32, 4, 128, True, 0, _decode_iq4_xs, lut=_IQ4_LUT),
    )
}

# The block formats kept quantized (every backend reads them in their blocks): name -> (values, bytes).
GGUF_BLOCKS = {f.name: (f.block, f.block_bytes) for f in FORMATS.values()}


def decode(data: np.ndarray, qtype: str) -> Blocks:
    """(N, row_bytes) or (n, block_bytes) uint8 blocks -> the canonical form of every block, in order."""
    f = FORMATS[qtype]
    return f.decode(np.ascontiguousarray(data).reshape(-1, f.block_bytes))


def dequantize_blocks(b: Blocks, f: BlockFormat) -> np.ndarray:
    """Blocks -> (n, block) float32: w = d sc_g (L[q] - offset) - dm m_g."""
    q = np.asarray(f.lut, np.float32)[b.q] if f.lut else b.q.astype(np.float32)
    n = len(b.q)
    a = b.d[:, None] * (b.sc.astype(np.float32) if b.sc is not None else np.ones((n, 1), np.float32))
    w = (q - f.offset).reshape(n, -1, f.group) * a.reshape(n, -1, 1)
    if b.dm is not None:
        m = b.m.astype(np.float32) if b.m is not None else np.ones((n, 1), np.float32)
        w -= (b.dm[:, None] * m).reshape(n, -1, 1)
    return w.reshape(n, f.block)


def gguf_dequantize_ref(data: np.ndarray, qtype: str, shape: tuple[int, int]) -> np.ndarray:
    """(N, row_bytes) uint8 blocks -> (N, K) float32 (the NumPy reference of every
    GGUF kernel; the tests hold it to the `gguf` package's dequantizers)."""
    return dequantize_blocks(decode(data, qtype), FORMATS[qtype]).reshape(shape)


def check_gguf_shape(qtype: str, shape: tuple[int, int], data: Any) -> None:
    if qtype not in GGUF_BLOCKS:
        raise ValueError(f"GGUF type {qtype} is not kept quantized (supported: {', '.join(GGUF_BLOCKS)})")
    block, size = GGUF_BLOCKS[qtype]
    N, K = shape
    if K % block or tuple(data.shape) != (N, K // block * size) or data.dtype != np.uint8:
        raise ValueError(
            f"{qtype} weight {shape}: want ({N}, {K // block * size}) uint8 blocks, "
            f"K a multiple of {block}; got {tuple(data.shape)} {data.dtype}"
        )


def c_traits_header() -> str:
    """The table as C constants (in the header build.py generates): rp_format_traits
    per format, and RP_GGUF_FORMATS(X), which expands X(name, type id, traits) for each row."""
    lines = [
        "/* GGUF block formats: rawpage/quantization/gguf.py FORMATS (its docstring has the math). */",
        "typedef struct {",
        "    int type, block, block_bytes, group, bits, offset, sub_scales, mins, scale_bits, lut;",
        "} rp_format_traits;",
        "#define RP_GGUF_FORMATS(X) \\",
    ]
    for f in FORMATS.values():
        t = (f.ggml_type, f.block, f.block_bytes, f.group, f.bits, f.offset, int(f.sub_scales), f.mins, f.scale_bits)
        lines.append(
            f"    X({f.name}, {f.ggml_type}, ((rp_format_traits){{{', '.join(map(str, t))}, {int(bool(f.lut))}}})) \\"
        )
    lines.append("")
    lines.append(f"#define RP_IQ4_LUT {{{', '.join(map(str, _IQ4_LUT))}}} /* L[q] of the formats with lut = 1 */")
    return "\n".join(lines)
