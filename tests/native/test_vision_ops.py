"""native/vision_ops.c against the NumPy references in ops/vision_ops.py, on every
instruction-set path this machine runs: row lengths with vector tails, rows that are
views into a wider array, and the encoder's blocked attention against the whole
score matrix."""

import numpy as np
import pytest

from rawpage.models import siglip
from rawpage.native import vision_ops
from rawpage.ops import vision_ops as ref


def rows(T: int, n: int, seed: int, scale: float = 1.0) -> np.ndarray:
    return (np.random.default_rng(seed).standard_normal((T, n)) * scale).astype(np.float32)


@pytest.mark.parametrize("n", [1, 7, 16, 33, 1152])
def test_layer_norm_matches_numpy(lib, n):
    x = rows(9, n, 0, 3.0) + 5.0  # an offset mean, as a residual stream has
    wb = (rows(1, n, 1)[0], rows(1, n, 2)[0])
    got = vision_ops.layer_norm(lib, x, wb, 1e-6, 2)
    np.testing.assert_allclose(got, ref.layer_norm(x, wb, 1e-6), rtol=1e-5, atol=2e-5)
    wide = rows(9, n + 5, 3)  # rows of a view, spaced wider than they are long
    np.testing.assert_allclose(
        vision_ops.layer_norm(lib, wide[:, :n], wb, 1e-6, 2), ref.layer_norm(wide[:, :n], wb, 1e-6), atol=2e-5
    )


@pytest.mark.parametrize("n", [5, 16, 43, 4304])
def test_bias_gelu_matches_numpy_in_place(lib, n):
    x, bias = rows(6, n, 0, 4.0), rows(1, n, 1)[0]
    want = ref.gelu_tanh(x + bias)
    got = vision_ops.bias_gelu_tanh(lib, x, bias, 2)
    assert got is x
    np.testing.assert_allclose(x, want, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("n", [1, 15, 16, 100, 4096])
def test_softmax_rows_matches_numpy_in_place(lib, n):
    x = rows(20, n, 0, 8.0)
    x[3, : n // 2] = -np.inf  # fully masked entries are exactly 0
    want = ref.softmax_rows(x.copy())
    vision_ops.softmax_rows(lib, x, 2)
    np.testing.assert_allclose(x, want, rtol=1e-5, atol=1e-7)
    np.testing.assert_allclose(x.sum(axis=1), 1.0, rtol=1e-5)


def test_the_kernels_refuse_rows_they_cannot_write(lib):
    with pytest.raises(ValueError):
        vision_ops.softmax_rows(lib, rows(4, 8, 0).astype(np.float64), 1)
    with pytest.raises(ValueError):
        vision_ops.bias_gelu_tanh(lib, rows(4, 8, 0).T, np.zeros(4, np.float32), 1)


@pytest.mark.parametrize("n", [5, 37])  # one block, and blocks with a short last one
def test_blocked_attention_matches_the_whole_score_matrix(lib, n, monkeypatch):
    monkeypatch.setattr(siglip, "ATTENTION_ROWS", 16)
    heads, Dh = 3, 8
    qkv = rows(n, 3 * heads * Dh, 0)
    q, k, v = (qkv[:, i * heads * Dh : (i + 1) * heads * Dh].reshape(n, heads, Dh).transpose(1, 0, 2) for i in range(3))
    scores = q @ k.transpose(0, 2, 1) * Dh**-0.5  # (heads, n, n)
    probs = np.exp(scores - scores.max(-1, keepdims=True))
    want = (probs / probs.sum(-1, keepdims=True) @ v).transpose(1, 0, 2).reshape(n, -1)
    for ops in (vision_ops.NativeVisionOps(lib, None), ref.VisionOps()):
        np.testing.assert_allclose(siglip.attention(ops, qkv, heads), want, rtol=1e-5, atol=1e-6)
