"""native/vision_ops.c against its NumPy references (ops/layer_ops.py,
ops/paged_attention.py), on every instruction-set path this machine runs: row lengths
with vector tails, rows that are views into a wider array, and the encoder's blocked
attention (the CPU backend's, with the C softmax) against the whole score matrix, in
windows of rows too (Qwen2.5-VL's)."""

import numpy as np
import pytest

from rawpage.native import vision_ops
from rawpage.ops import paged_attention
from rawpage.ops.layer_ops import fused_add_layer_norm_ref, gelu_erf_ref, gelu_tanh_ref
from rawpage.ops.paged_attention import encoder_attention_ref, softmax_rows_ref


def rows(T: int, n: int, seed: int, scale: float = 1.0) -> np.ndarray:
    return (np.random.default_rng(seed).standard_normal((T, n)) * scale).astype(np.float32)


@pytest.mark.parametrize("n", [1, 7, 16, 33, 1152])
def test_fused_add_layer_norm_matches_numpy(lib, n):
    x, residual = rows(9, n, 0, 3.0), rows(9, n, 1) + 5.0  # an offset mean, as a residual stream has
    w, b = rows(1, n, 2)[0], rows(1, n, 3)[0]
    want_normed, want_sum = fused_add_layer_norm_ref(x, residual, w, b, 1e-6)
    normed, summed = vision_ops.fused_add_layer_norm(lib, x.copy(), residual.copy(), w, b, 1e-6, 2)
    np.testing.assert_allclose(summed, want_sum, rtol=1e-6)
    np.testing.assert_allclose(normed, want_normed, rtol=1e-5, atol=2e-5)
    wide = rows(9, n + 5, 4)  # x's rows inside a wider array: read in place, the results new
    normed, summed = vision_ops.fused_add_layer_norm(lib, wide[:, :n], residual.copy(), w, b, 1e-6, 2)
    want_normed, _ = fused_add_layer_norm_ref(wide[:, :n], residual, w, b, 1e-6)
    np.testing.assert_allclose(normed, want_normed, rtol=1e-5, atol=2e-5)


@pytest.mark.parametrize("n", [5, 16, 43, 4304])
def test_gelu_tanh_matches_numpy(lib, n):
    x = rows(6, n + 3, 0, 4.0)[:, :n]
    np.testing.assert_allclose(vision_ops.gelu_tanh(lib, x, 2), gelu_tanh_ref(x), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("n", [5, 43, 5120])
def test_gelu_erf_matches_numpy(lib, n):
    """libm's erff against the reference's Abramowitz-Stegun erf (error under 1.5e-7)."""
    x = rows(6, n + 3, 0, 4.0)[:, :n]
    np.testing.assert_allclose(vision_ops.gelu_erf(lib, x, 2), gelu_erf_ref(x), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("n", [1, 15, 16, 100, 4096])
def test_softmax_rows_matches_numpy_in_place(lib, n):
    x = rows(20, n, 0, 8.0)
    x[3, : n // 2] = -np.inf  # fully masked entries are exactly 0
    want = softmax_rows_ref(x.copy())
    assert vision_ops.softmax_rows(lib, x, 2) is x
    np.testing.assert_allclose(x, want, rtol=1e-5, atol=1e-7)
    np.testing.assert_allclose(x.sum(axis=1), 1.0, rtol=1e-5)


def test_softmax_refuses_rows_it_cannot_write(lib):
    with pytest.raises(ValueError):
        vision_ops.softmax_rows(lib, rows(4, 8, 0).astype(np.float64), 1)
    with pytest.raises(ValueError):
        vision_ops.softmax_rows(lib, rows(4, 8, 0).T, 1)


def whole_attention(q: np.ndarray, k: np.ndarray, v: np.ndarray, Dh: int) -> np.ndarray:
    """Every head's (n, n) scores at once: (n, heads, Dh)."""
    qh, kh, vh = (a.transpose(1, 0, 2) for a in (q, k, v))
    scores = qh @ kh.transpose(0, 2, 1) * Dh**-0.5  # (heads, n, n)
    probs = np.exp(scores - scores.max(-1, keepdims=True))
    return (probs / probs.sum(-1, keepdims=True) @ vh).transpose(1, 0, 2)


@pytest.mark.parametrize("n", [5, 37])  # one block, and blocks with a short last one
def test_blocked_attention_matches_the_whole_score_matrix(lib, n, monkeypatch):
    monkeypatch.setattr(paged_attention, "ENCODER_ATTENTION_ROWS", 16)
    heads, Dh = 3, 8
    qkv = rows(n, 3 * heads * Dh, 0)
    q, k, v = (qkv[:, i * heads * Dh : (i + 1) * heads * Dh].reshape(n, heads, Dh) for i in range(3))
    want = whole_attention(q, k, v, Dh)
    np.testing.assert_allclose(encoder_attention_ref(q, k, v, Dh**-0.5), want, rtol=1e-5, atol=1e-6)
    c_softmax = lambda s: vision_ops.softmax_rows(lib, s, 2)  # noqa: E731
    np.testing.assert_allclose(encoder_attention_ref(q, k, v, Dh**-0.5, c_softmax), want, rtol=1e-5, atol=1e-6)


def test_attention_in_windows_is_each_windows_own(lib, monkeypatch):
    """cu_seqlens: each window's rows see its keys only; windows longer and shorter than a
    block of queries (a short window's scores are a strided slice of the buffer)."""
    monkeypatch.setattr(paged_attention, "ENCODER_ATTENTION_ROWS", 16)
    heads, Dh, cu = 2, 8, np.array([0, 20, 24, 40, 41])
    qkv = rows(41, 3 * heads * Dh, 1)
    q, k, v = (qkv[:, i * heads * Dh : (i + 1) * heads * Dh].reshape(41, heads, Dh) for i in range(3))
    want = np.concatenate([whole_attention(q[a:b], k[a:b], v[a:b], Dh) for a, b in zip(cu, cu[1:])])
    c_softmax = lambda s: vision_ops.softmax_rows(lib, s, 2)  # noqa: E731
    for softmax in (paged_attention.softmax_rows_ref, c_softmax):
        got = encoder_attention_ref(q, k, v, Dh**-0.5, softmax, cu)
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
