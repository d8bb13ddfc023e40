"""FP8 e4m3 in NumPy: the table, rounding, saturation, and weight quantization."""

import numpy as np
import pytest

from rawpage.quantization.fp8 import E4M3_MAX, e4m3_from_f32, e4m3_to_f32, quantize_fp8


def test_known_codes():
    assert e4m3_to_f32(np.array([0x00, 0x38, 0x7E, 0x01, 0xB8, 0x08]).astype(np.uint8)).tolist() == [
        0.0,
        1.0,
        448.0,
        2.0**-9,
        -1.0,
        2.0**-6,
    ]
    assert np.isnan(e4m3_to_f32(np.array([0x7F, 0xFF], np.uint8))).all()


def test_every_finite_code_round_trips():
    codes = np.array([c for c in range(256) if c & 0x7F != 0x7F], np.uint8)
    back = e4m3_from_f32(e4m3_to_f32(codes))
    assert (back[codes != 0x80] == codes[codes != 0x80]).all()  # -0 may come back as +0


def test_rounds_to_nearest_even_and_saturates():
    # 1.0 = 0x38, next 1.125 = 0x39, next 1.25 = 0x3A: the midpoints go to the even code
    x = np.array([1.0625, 1.1875, 1.1, 1000.0, -1000.0, 2.0**-10, 2.0**-10 * 1.01], np.float32)
    assert e4m3_from_f32(x).tolist() == [0x38, 0x3A, 0x39, 0x7E, 0xFE, 0x00, 0x01]


@pytest.mark.parametrize("per_channel", [True, False])
def test_quantize_fp8_relative_error(per_channel):
    w = np.random.default_rng(0).standard_normal((16, 64)).astype(np.float32)
    w[3] *= 100  # one loud channel
    bits, scales = quantize_fp8(w, per_channel)
    back = e4m3_to_f32(bits) * scales[:, None]
    assert np.abs(back).max() <= E4M3_MAX * scales.max() * 1.0001
    rel = np.abs(back - w) / np.abs(w).max(axis=1, keepdims=True)
    # 3 mantissa bits: half a step is 2^-4 of a binade; a quiet row of a per-tensor scale can sit
    # a binade lower than its own maximum would put it
    assert rel.max() < (2**-4 if per_channel else 2**-3)
