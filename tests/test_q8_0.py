"""Our Q8_0 quantizer (rawpage/quantization/q8_0.py) against gguf's, byte for byte, and
`--quantization q8_0` on a float checkpoint: what it packs, what it refuses."""

from __future__ import annotations

import numpy as np
import pytest
from gguf import GGMLQuantizationType
from gguf.quants import quantize

from rawpage.errors import UnsupportedModelError
from rawpage.loader import load_checkpoint
from rawpage.loader.tensors import TensorSource
from rawpage.quantization.gguf import gguf_dequantize_ref
from rawpage.quantization.q8_0 import quantize_q8_0
from rawpage.quantization.select import apply_quantization_flag
from rawpage.quantization.weight import QuantizedWeight


def awkward_rows(rng: np.random.Generator) -> np.ndarray:
    """(8, 256) float32: normal rows, a zero block, exact halves after scaling (127 / max
    with max 127 makes every q_i = w_i: x.5 ties), tiny (float16-subnormal d) and huge values."""
    w = rng.standard_normal((8, 256)).astype(np.float32)
    w[1, 32:64] = 0
    w[2, :32] = np.arange(-63.5, 64.0, 4, dtype=np.float32)[:32]
    w[2, 31] = 127  # d = 1: the halves above stay ties
    w[3] *= 1e-6
    w[4] *= 1e4
    w[5, :32] = -w[5, :32].max()  # a block of one repeated value
    return w


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_quantize_q8_0_matches_gguf_bit_for_bit(seed):
    rng = np.random.default_rng(seed)
    for w in (awkward_rows(rng), rng.standard_normal((37, 96)).astype(np.float32) * 3):
        got = quantize_q8_0(w)
        want = quantize(w, GGMLQuantizationType.Q8_0)
        assert got.shape == want.shape == (w.shape[0], w.shape[1] // 32 * 34) and got.dtype == np.uint8
        np.testing.assert_array_equal(got, want)


def test_q8_0_reads_back_within_half_a_step():
    w = np.random.default_rng(3).standard_normal((16, 128)).astype(np.float32)
    back = gguf_dequantize_ref(quantize_q8_0(w), "Q8_0", w.shape)
    step = np.abs(w.reshape(16, 4, 32)).max(-1, keepdims=True) / 127  # d per block
    # half a step, plus d's float16 rounding (2^-11 relative) times |q| <= 127
    assert (np.abs(back - w).reshape(16, 4, 32) <= step * (0.5 + 127 * 2.0**-11)).all()


def test_quantize_q8_0_refuses_rows_of_partial_blocks():
    with pytest.raises(ValueError, match="multiple of 32"):
        quantize_q8_0(np.zeros((2, 48), np.float32))


def test_flag_packs_every_linear_weight_and_rounds_the_dense_readers(tiny_model_dir):
    tensors = apply_quantization_flag(load_checkpoint(tiny_model_dir).tensors, "q8_0")
    linear = [n for n in tensors if n.endswith(("_proj.weight", "embed_tokens.weight", "lm_head.weight"))]
    assert set(tensors.quantized_names()) == set(linear)
    for name in ("model.layers.0.self_attn.q_proj.weight", "model.embed_tokens.weight"):
        w = tensors.quantized(name)
        assert isinstance(w, QuantizedWeight) and (w.kind, w.qtype) == ("gguf", "Q8_0")
        np.testing.assert_array_equal(tensors[name], gguf_dequantize_ref(w.data, "Q8_0", w.shape))
    assert tensors.quantized("model.norm.weight") is None and tensors["model.norm.weight"].ndim == 1


def test_flag_refuses_a_checkpoint_quantized_otherwise():
    fp8 = QuantizedWeight("fp8", (4, 32), np.zeros((4, 32), np.uint8), scales=np.ones(4, np.float32))
    packed = TensorSource({"x.q_proj.weight": lambda: np.zeros((4, 32))}, {"x.q_proj.weight": lambda: fp8})
    with pytest.raises(UnsupportedModelError, match="already quantized \\(fp8\\)"):
        apply_quantization_flag(packed, "q8_0")
