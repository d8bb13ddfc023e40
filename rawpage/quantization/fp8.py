"""FP8 e4m3 ("e4m3fn", as in vLLM and llm-compressor checkpoints), in NumPy.

    bit  7     6 5 4 3    2 1 0
         sign  exponent   mantissa      bias 7, no infinities, 0x7f / 0xff = NaN
    normal     (-1)^s 2^(e-7) (1 + m/8)      largest 448 = 2^8 * 1.75
    subnormal  (-1)^s 2^-6 (m/8)              e = 0

Stored as uint8 bits (NumPy has no float8), like bfloat16 as uint16 (dtypes.py).
Encoding rounds to nearest even and saturates at +-448, as cvt.rn.satfinite does.
"""

from __future__ import annotations

import numpy as np

E4M3_MAX = 448.0


def _table() -> np.ndarray:
    b = np.arange(256)
    e, m = (b >> 3) & 15, b & 7
    mag = np.where(e == 0, m / 8 * 2.0**-6, (1 + m / 8) * 2.0 ** (e - 7))
    val = np.where(b & 0x80, -mag, mag)
    val[(b & 0x7F) == 0x7F] = np.nan
    return val.astype(np.float32)


E4M3_VALUES = _table()  # bits -> float32
_POSITIVE = E4M3_VALUES[:0x7F]  # codes 0 .. 0x7e: 0 .. 448, increasing


def e4m3_to_f32(bits: np.ndarray) -> np.ndarray:
    return E4M3_VALUES[np.asarray(bits, np.uint8)]


def e4m3_from_f32(x: np.ndarray) -> np.ndarray:
    """float -> uint8 e4m3 bits: round to nearest (ties to the even code), saturate."""
    x = np.asarray(x, np.float32)
    mag = np.minimum(np.abs(x), E4M3_MAX)
    hi = np.clip(np.searchsorted(_POSITIVE, mag), 1, 0x7E)  # first code >= mag
    lo = hi - 1
    d_lo, d_hi = mag - _POSITIVE[lo], _POSITIVE[hi] - mag
    code = np.where((d_hi < d_lo) | ((d_hi == d_lo) & (hi % 2 == 0)), hi, lo).astype(np.uint8)
    code = np.where(mag == 0, 0, code).astype(np.uint8)
    return code | np.where(np.signbit(x), 0x80, 0).astype(np.uint8)


def quantize_fp8(w: np.ndarray, per_channel: bool = True) -> tuple[np.ndarray, np.ndarray]:
    """w (N, K) float -> (bits (N, K) uint8, scales (N,) float32) with w ~ s[n] e4m3(bits):
    each row's (or the whole tensor's) max |w| maps to 448."""
    amax = np.abs(w).max(axis=1) if per_channel else np.full(w.shape[0], np.abs(w).max())
    scales = (np.maximum(amax, 1e-12) / E4M3_MAX).astype(np.float32)
    return e4m3_from_f32(w / scales[:, None]), scales


def fp8_dequantize_ref(bits: np.ndarray, scales: np.ndarray) -> np.ndarray:
    """bits (N, K) e4m3, scales (N,) -> float32 (N, K) = s[n] e4m3(bits[n])."""
    return e4m3_to_f32(np.asarray(bits)) * np.asarray(scales, np.float32)[:, None]
