"""GGUF weights on the CPU kernels (rawpage/native/gguf_matmul.c, gguf.py): the panel
repack, the GEMV/GEMM and the row lookup, for every format of the table on every
instruction-set path this machine runs.

The reference of the product is the exact one (float64) with x replaced by its int8
rounding (matmul_ref; parts=2, the LM head's, rounds the remainder again). The integer
parts are exact, so the only differences are float32 rounding of the per-group scales
and sums: each output is held to 2e-6 of the sum of its terms' sizes. Blocks are random
bits in every field with finite, small float16 scales (tests/kernels random_blocks),
and for the formats `gguf` can quantize, real quantized Gaussian weights too."""

from __future__ import annotations

import functools

import numpy as np
import pytest

from rawpage.native import isa
from rawpage.native.gguf import (
    NATIVE_GGUF,
    PANEL,
    gguf_matmul,
    gguf_rows,
    matmul_ref,
    panel_bytes,
    quantize,
    quantize_ref,
    repack,
    repack_ref,
    scratch_bytes,
)
from rawpage.native.library import load_path
from rawpage.quantization.gguf import FORMATS, gguf_dequantize_ref
from tests.kernels.test_gguf_linear import random_blocks

TOKENS = [1, 2, 3, 9, 17, 70]
# (N, K): N not a multiple of the 16-row panel, and one that is; K one block and several,
# with Qwen2.5-0.5B's 896 (no multiple of 256: the 32-value formats there) and 7B's 3584
SHAPES = {32: [(7, 32), (37, 96), (16, 896)], 256: [(5, 256), (21, 768), (16, 3584)]}
CASES = [(q, N, K) for q in sorted(NATIVE_GGUF) for N, K in SHAPES[FORMATS[q].block]]


@functools.cache
def weight(qtype: str, N: int, K: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(blocks (N, row_bytes), their panels, the dequantized (N, K) float64), made once."""
    data = random_blocks(np.random.default_rng(N * K), qtype, N, K)
    return data, repack_ref(data, qtype, (N, K)), gguf_dequantize_ref(data, qtype, (N, K)).astype(np.float64)


def assert_close(got: np.ndarray, x: np.ndarray, w: np.ndarray, parts: int = 1, bias: np.ndarray | None = None):
    want = matmul_ref(x, w, parts) + (0 if bias is None else bias)
    xq, dx = quantize_ref(x, parts)
    T, K = x.shape
    size = np.abs(xq.reshape(T, parts, K // 32, 32) * dx.reshape(T, parts, -1, 1)).sum(axis=1).reshape(T, K)
    bound = 2e-6 * (size @ np.abs(w).T) + 1e-30  # float32 rounding of each term, summed
    assert np.all(np.abs(got - want) <= bound), f"worst {np.max(np.abs(got - want) / bound):.2f} x the bound"


@pytest.mark.parametrize("T", TOKENS)
@pytest.mark.parametrize("qtype,N,K", CASES)
def test_matmul_matches_reference(lib, qtype, N, K, T):
    _, panels, w = weight(qtype, N, K)
    x = np.random.default_rng(T + K).standard_normal((T, K)).astype(np.float32)
    got = gguf_matmul(lib, x, panels, qtype, (N, K), nthreads=2)
    assert got.shape == (T, N) and got.dtype == np.float32 and got.flags.c_contiguous
    assert_close(got, x, w)


@pytest.mark.parametrize("qtype", sorted(NATIVE_GGUF))
@pytest.mark.parametrize("T", [1, 2, 5])
def test_the_lm_heads_two_roundings(lib, qtype, T):
    """parts=2: x rounded, then its remainder rounded again; the result is x W^T to about
    15 bits of x, far closer than one rounding."""
    N, K = 37, 2 * FORMATS[qtype].block
    _, panels, w = weight(qtype, N, K)
    x = np.random.default_rng(T).standard_normal((T, K)).astype(np.float32)
    got = gguf_matmul(lib, x, panels, qtype, (N, K), nthreads=2, parts=2)
    assert_close(got, x, w, parts=2)
    exact = x.astype(np.float64) @ w.T
    once = gguf_matmul(lib, x, panels, qtype, (N, K), nthreads=2)
    assert np.abs(got - exact).max() < np.abs(once - exact).max() / 20


@pytest.mark.parametrize("qtype", sorted(NATIVE_GGUF))
def test_every_path_gives_the_same_bits(qtype):
    """Every instruction-set path makes the same float operations in the same order for
    each (token, row) (gguf_matmul.c's header), so all agree with the plain-C path bit
    for bit, parts 1 and 2, with a bias, at decode's 1 and 2 tokens too."""
    N, K = 21, 2 * FORMATS[qtype].block
    _, panels, _ = weight(qtype, N, K)
    rng = np.random.default_rng(5)
    x, bias = rng.standard_normal((6, K)).astype(np.float32), rng.standard_normal(N).astype(np.float32)
    for parts, T in ((1, 6), (2, 6), (1, 1), (1, 2), (2, 1)):
        want = gguf_matmul(load_path("scalar"), x[:T], panels, qtype, (N, K), 1, bias, parts)
        for path in isa.runnable_paths():
            got = gguf_matmul(load_path(path), x[:T], panels, qtype, (N, K), 2, bias, parts)
            np.testing.assert_array_equal(got, want, err_msg=f"{path}, parts {parts}, T {T}")


@pytest.mark.parametrize("qtype", sorted(NATIVE_GGUF))
def test_a_token_gets_the_same_bits_in_any_batch_and_split(lib, qtype):
    """y[t] depends on x[t] alone, bit for bit, whatever T is (tiles of 1-8 tokens, token
    blocks, rows or tokens split over threads): a sequence decodes the same tokens alone
    or batched. 70 tokens over 3 panels take the split by tokens."""
    N, K = 37, FORMATS[qtype].block * (2 if FORMATS[qtype].block == 256 else 8)
    _, panels, _ = weight(qtype, N, K)
    x = np.random.default_rng(7).standard_normal((70, K)).astype(np.float32)
    alone = np.stack([gguf_matmul(lib, x[t : t + 1], panels, qtype, (N, K), 1)[0] for t in range(len(x))])
    for T, nth in ((2, 2), (3, 3), (9, 2), (70, 2), (70, 3)):
        np.testing.assert_array_equal(gguf_matmul(lib, x[:T], panels, qtype, (N, K), nth), alone[:T])


@pytest.mark.parametrize("qtype", ["Q4_0", "Q4_K", "Q6_K"])
def test_a_call_shared_out_for_stealing_computes_every_row_once(lib, qtype):
    """A call split by panels (a decode step's T <= 8, a prefill's more tokens than
    tiles) hands its panels out 4 at a time, each thread stealing from the back of the
    others' shares when done with its own: 23 panels (no multiple of 4) over 2, 3 and 7
    threads (more than the cores: some are slow, the others steal) give every row, bit
    for bit as one thread does."""
    N, K = 16 * 22 + 5, FORMATS[qtype].block * (2 if FORMATS[qtype].block == 256 else 8)
    data = random_blocks(np.random.default_rng(11), qtype, N, K)
    panels = repack(lib, data, qtype, (N, K), 2)
    x = np.random.default_rng(12).standard_normal((70, K)).astype(np.float32)
    for T in (1, 2, 8, 20, 70):
        one = gguf_matmul(lib, x[:T], panels, qtype, (N, K), 1)
        for nth in (2, 3, 7):
            for _ in range(5):
                np.testing.assert_array_equal(gguf_matmul(lib, x[:T], panels, qtype, (N, K), nth), one)


@pytest.mark.parametrize("qtype", ["Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0"])
def test_real_quantized_weights(lib, qtype):
    """Blocks as a model file has them (gguf.quants.quantize of Gaussian weights)."""
    from gguf import GGMLQuantizationType
    from gguf.quants import quantize as gguf_quantize

    rng = np.random.default_rng(11)
    N, K = 45, 576
    data = gguf_quantize(rng.standard_normal((N, K)).astype(np.float32) * 0.05, GGMLQuantizationType[qtype])
    x = rng.standard_normal((3, K)).astype(np.float32)
    got = gguf_matmul(lib, x, repack(lib, data, qtype, (N, K), 2), qtype, (N, K), nthreads=2)
    assert_close(got, x, gguf_dequantize_ref(data, qtype, (N, K)).astype(np.float64))


def test_input_layouts_and_edge_values(lib):
    """A strided x is made contiguous; an all-zero chunk gets scale 0 and zeros."""
    _, panels, w = weight("Q4_1", 16, 896)
    x = np.random.default_rng(3).standard_normal((896, 4)).astype(np.float32).T  # (4, 896) F-order
    x[1, 32:64] = 0.0
    x[2, :] = 0.0
    got = gguf_matmul(lib, x, panels, "Q4_1", (16, 896), nthreads=2)
    assert_close(got, np.ascontiguousarray(x), w)
    assert not got[2].any()
    assert gguf_matmul(lib, x[:0], panels, "Q4_1", (16, 896), nthreads=2).shape == (0, 16)


@pytest.mark.parametrize("qtype", sorted(NATIVE_GGUF))
@pytest.mark.parametrize("parts", [1, 2])
def test_quantization_is_the_reference(lib, qtype, parts):
    """The kernel's int8 activations are quantize_ref's exactly; s and xo are each
    group's dx sum xq and -offset sum xq (0 on AVX2 for the 8-bit formats' sign trick)."""
    T, K = 5, 2 * FORMATS[qtype].block
    x = (np.random.default_rng(T).standard_normal((T, K)) * 3).astype(np.float32)
    x[0, :32] = 0.0
    x[-1, -32:] = np.float32(0.5) * np.arange(32, dtype=np.float32)  # exact halves: round to even
    got = quantize(lib, x, qtype, parts)
    want_q, want_d = quantize_ref(x, parts)
    np.testing.assert_array_equal(got["xq"], want_q)
    np.testing.assert_array_equal(got["dx"], want_d)
    f = FORMATS[qtype]
    sums = want_q.reshape(T * parts, K // f.group, f.group).sum(axis=2, dtype=np.int32)
    np.testing.assert_array_equal(got["s"], np.repeat(want_d, 32 // f.group, axis=1) * sums.astype(np.float32))
    sign_trick = lib.path == "avx2" and f.offset == 128
    np.testing.assert_array_equal(got["xo"], 0 if sign_trick else -f.offset * sums)


@pytest.mark.parametrize("qtype,N,K", CASES)
def test_rows_are_the_formats_dequantization(lib, qtype, N, K):
    _, panels, w = weight(qtype, N, K)
    w = w.astype(np.float32)
    ids = np.array([N - 1, 0, 2, 2, N // 2])
    np.testing.assert_array_equal(gguf_rows(lib, panels, qtype, (N, K), ids, nthreads=2), w[ids])
    big = np.random.default_rng(1).integers(0, N, 300)  # enough values to split over threads
    np.testing.assert_array_equal(gguf_rows(lib, panels, qtype, (N, K), big, nthreads=3), w[big])


@pytest.mark.parametrize("qtype,N,K", CASES)
def test_the_kernels_repack_is_the_reference(lib, qtype, N, K):
    """rp_gguf_pack lays out the NumPy decode as repack_ref does, byte for byte (the padding
    rows of the last panel zero), on every path and thread count; also in steps of rows
    (a 3584-wide weight of 1200 rows is two of repack's steps)."""
    data, panels, _ = weight(qtype, N, K)
    for nth in (1, 3):
        np.testing.assert_array_equal(repack(lib, data, qtype, (N, K), nth), panels)
    big = random_blocks(np.random.default_rng(4), qtype, 1200, 3584) if K == 3584 else None
    if big is not None:
        np.testing.assert_array_equal(repack(lib, big, qtype, (1200, 3584), 2), repack_ref(big, qtype, (1200, 3584)))


@pytest.mark.parametrize("qtype", sorted(NATIVE_GGUF))
def test_the_panels_hold_the_files_bytes(lib, qtype):
    """Python's layout is the kernel's (panel and scratch sizes), and a panel holds as
    many bytes as its 16 rows of blocks, but for the 6-bit scales of Q3_K and IQ4_XS, kept as
    bytes (+3.6% and +1.5%). Q4_K and Q5_K, the bulk of a Q4_K_M or Q5_K_M file, keep their
    6-bit scales and mins in the file's 12 bytes a row (scale_bits 6)."""
    f = FORMATS[qtype]
    K = 3 * f.block
    assert lib.fn.rp_gguf_panel_bytes(f.ggml_type, K) == panel_bytes(qtype, K)
    assert lib.fn.rp_gguf_scratch_bytes(f.ggml_type, 7, K, 2) == scratch_bytes(qtype, 7, K, 2)
    extra = panel_bytes(qtype, K) / (PANEL * K // f.block * f.block_bytes) - 1
    assert extra == 0 or (qtype in ("Q3_K", "IQ4_XS") and extra < 0.04)
    if f.scale_bits == 6:  # the top bits of 8 groups' sc and m fill one 32-bit word a row
        assert f.mins == 2 and f.groups <= 8


def test_bad_arguments_say_what_is_wrong(lib):
    data, panels, _ = weight("Q4_K", 5, 256)
    with pytest.raises(ValueError, match="multiple of the 256-value block"):
        gguf_matmul(lib, np.zeros((1, 200), np.float32), panels, "Q4_K", (5, 200), nthreads=1)
    with pytest.raises(ValueError, match="wants \\(T, 256\\)"):
        gguf_matmul(lib, np.zeros((1, 128), np.float32), panels, "Q4_K", (5, 256), nthreads=1)
    with pytest.raises(ValueError, match="uint8 panels"):
        gguf_matmul(lib, np.zeros((1, 256), np.float32), data, "Q4_K", (5, 256), nthreads=1)
    with pytest.raises(ValueError, match="no native CPU kernel"):
        gguf_matmul(lib, np.zeros((1, 256), np.float32), panels, "IQ2_XS", (5, 256), nthreads=1)
    with pytest.raises(ValueError, match="row ids must be in 0 .. 4"):
        gguf_rows(lib, panels, "Q4_K", (5, 256), np.array([5]), nthreads=1)
    with pytest.raises(ValueError, match="uint8 blocks"):
        repack(lib, data[:, :100], "Q4_K", (5, 256), 1)
