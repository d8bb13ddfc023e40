"""native/bf16_gemm.c (a vision tower in bfloat16) against its NumPy references
(ops/bf16_linear.py bf16_gemm_ref, ops/paged_attention.py encoder_attention_bf16_ref), on
every instruction-set path this machine runs (vdpbf16ps where the CPU has AVX512-BF16,
the same float32 chains in C elsewhere): shapes with row, column and odd-K tails, the
vision towers' K (896, 1152, 3584, 4304), rows that are views, and a row of the product
the same bits in any batch and on any thread count."""

import numpy as np
import pytest

from rawpage.native import bf16_gemm
from rawpage.ops.bf16_linear import bf16_gemm_ref
from rawpage.ops.paged_attention import encoder_attention_bf16_ref


def normal(shape, seed: int, scale: float = 1.0) -> np.ndarray:
    return (np.random.default_rng(seed).standard_normal(shape) * scale).astype(np.float32)


def within_summation_rounding(y: np.ndarray, x: np.ndarray, w: np.ndarray, want: np.ndarray) -> None:
    """|y - want| within float32 summation rounding of the products' magnitudes (the
    products themselves are exact: both factors are bf16)."""
    bound = np.abs(x).astype(np.float64) @ np.abs(w).astype(np.float64).T
    excess = np.abs(y - want) - 2e-6 * bound * np.sqrt(x.shape[1]) - 1e-6
    assert excess.max() <= 0, f"off by {np.abs(y - want).max():.3g}"


@pytest.mark.parametrize(
    "T,N,K", [(1, 1, 1), (3, 17, 5), (12, 32, 256), (13, 33, 257), (25, 80, 896), (7, 48, 3584), (40, 20, 4304)]
)
def test_gemm_matches_numpy(lib, T, N, K):
    x, w, bias = normal((T, K), 0), normal((N, K), 1, 0.05), normal(N, 2)
    panels = bf16_gemm.pack(lib, w, 2)
    assert panels.panels.shape == ((N + 15) // 16, (K + 1) // 2, 16, 2)
    within_summation_rounding(bf16_gemm.gemm(lib, x, panels, 2, bias), x, w, bf16_gemm_ref(x, w, bias))
    within_summation_rounding(bf16_gemm.gemm(lib, x, panels, 1), x, w, bf16_gemm_ref(x, w))


def test_gemm_reads_views_and_packs_strided_weights(lib):
    wide, w = normal((30, 1200), 0), normal((1152, 70), 1)  # x: rows of a wider array; W^T stored
    x = wide[:, :1152]
    from_t = bf16_gemm.pack(lib, w.T, 2)  # (70, 1152) read through its strides
    assert np.array_equal(from_t.panels, bf16_gemm.pack(lib, np.ascontiguousarray(w.T), 1).panels)
    within_summation_rounding(bf16_gemm.gemm(lib, x, from_t, 2), x, w.T, bf16_gemm_ref(x, w.T))


def test_a_row_is_the_same_bits_in_any_batch_and_thread_count(lib):
    x, w, bias = normal((29, 1152), 0), normal((200, 1152), 1, 0.05), normal(200, 2)
    panels = bf16_gemm.pack(lib, w, 2)
    whole = bf16_gemm.gemm(lib, x, panels, 2, bias)
    assert np.array_equal(whole, bf16_gemm.gemm(lib, x, panels, 1, bias))
    for rows in ([0], [5, 6, 7], list(range(3, 29, 2)), list(range(13, 29))):
        assert np.array_equal(bf16_gemm.gemm(lib, x[rows], panels, 2, bias), whole[rows])


def test_gemm_refuses_what_makes_no_product(lib):
    panels = bf16_gemm.pack(lib, normal((8, 16), 0), 1)
    with pytest.raises(ValueError, match="do not make a product"):
        bf16_gemm.gemm(lib, normal((2, 15), 1), panels, 1)
    with pytest.raises(ValueError, match="bias"):
        bf16_gemm.gemm(lib, normal((2, 16), 1), panels, 1, normal(9, 2))


def qkv_views(N: int, H: int, D: int, seed: int) -> tuple[np.ndarray, ...]:
    """q, k, v (N, H, D) as views of one fused (N, 3 H D) output, as the towers pass them."""
    qkv = normal((N, 3 * H * D), seed, 2.0)
    return tuple(qkv[:, i * H * D : (i + 1) * H * D].reshape(N, H, D) for i in range(3))


@pytest.mark.parametrize(
    "N,H,D,cu",
    [(1, 1, 1, None), (7, 2, 3, None), (50, 3, 72, None), (64, 2, 80, [0, 10, 10, 33, 64]), (300, 2, 64, None)],
)
def test_encoder_attention_matches_numpy(lib, N, H, D, cu):
    """The probabilities rounded to bf16 may land one bf16 step apart where the two exps
    differ by an ulp: a bound of 2^-8 of the values' size (so at most 2^-8 max |v| in a
    row), far below a wrong key or window (order max |v|)."""
    q, k, v = qkv_views(N, H, D, 0)
    cs = None if cu is None else np.array(cu)
    got = bf16_gemm.encoder_attention(lib, q, k, v, D**-0.5, 2, cs)
    want = encoder_attention_bf16_ref(q, k, v, D**-0.5, cs)
    np.testing.assert_allclose(got, want, atol=2**-8 * np.abs(v).max(), rtol=0)
    assert np.array_equal(got, bf16_gemm.encoder_attention(lib, q, k, v, D**-0.5, 1, cs))


def test_encoder_attention_takes_contiguous_inputs_and_refuses_bad_windows(lib):
    q, k, v = (np.ascontiguousarray(a) for a in qkv_views(20, 2, 16, 1))
    np.testing.assert_allclose(
        bf16_gemm.encoder_attention(lib, q, k, v, 0.25, 2), encoder_attention_bf16_ref(q, k, v, 0.25), atol=4e-3
    )
    with pytest.raises(ValueError, match="cu_seqlens"):
        bf16_gemm.encoder_attention(lib, q, k, v, 0.25, 2, np.array([0, 12, 8, 20]))
    with pytest.raises(ValueError, match="differ"):
        bf16_gemm.encoder_attention(lib, q, k[:10], v, 0.25, 2)
