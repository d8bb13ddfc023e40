"""The GGUF format table (rawpage/quantization/gguf.py): each row's canonical decode,
through the one NumPy dequantizer, is llama.cpp's dequantization bit for bit (the
`gguf` package is llama.cpp's own Python port), on random bits in every field and on
blocks that llama.cpp's quantizers made."""

from __future__ import annotations

import numpy as np
import pytest
from gguf import GGMLQuantizationType
from gguf.quants import dequantize, quantize

from rawpage.quantization.gguf import FORMATS, decode, gguf_dequantize_ref


def _llama_cpp(raw: np.ndarray, qtype: str, shape: tuple[int, int]) -> np.ndarray:
    return dequantize(raw, GGMLQuantizationType[qtype]).astype(np.float32).reshape(shape)


@pytest.mark.parametrize("qtype", sorted(FORMATS))
def test_every_bit_of_every_field_decodes_as_llama_cpp_does(qtype):
    f = FORMATS[qtype]
    N, K = 9, 4 * f.block
    raw = np.random.default_rng(f.ggml_type).integers(0, 256, (N, K // f.block * f.block_bytes), dtype=np.uint8)
    with np.errstate(invalid="ignore", over="ignore"):  # random float16 fields include inf and NaN
        want, got = _llama_cpp(raw, qtype, (N, K)), gguf_dequantize_ref(raw, qtype, (N, K))
    np.testing.assert_array_equal(got, want)  # NaN where llama.cpp has NaN


@pytest.mark.parametrize("qtype", sorted(q for q in FORMATS if q in ("Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0")))
def test_blocks_llama_cpp_quantized(qtype):
    """Weights as a model file has them (gguf.quants.quantize: the formats it can make)."""
    w = np.random.default_rng(3).standard_normal((5, 256)).astype(np.float32) * 0.05
    raw = quantize(w, GGMLQuantizationType[qtype])
    np.testing.assert_array_equal(gguf_dequantize_ref(raw, qtype, w.shape), _llama_cpp(raw, qtype, w.shape))


@pytest.mark.parametrize("qtype", sorted(FORMATS))
def test_the_canonical_form_has_the_rows_declared_widths(qtype):
    f = FORMATS[qtype]
    raw = np.random.default_rng(0).integers(0, 256, (4, f.block_bytes), dtype=np.uint8)
    b = decode(raw, qtype)
    assert b.q.shape == (4, f.block) and b.q.dtype == np.uint8 and int(b.q.max()) < 2**f.bits
    assert (b.sc is not None) == f.sub_scales and (b.sc is None or b.sc.shape == (4, f.groups))
    assert (b.dm is not None) == (f.mins > 0) and (b.m is not None) == (f.mins == 2)
    if f.scale_bits == 4:
        assert 0 <= b.sc.min() and b.sc.max() < 16 and b.m.max() < 16
