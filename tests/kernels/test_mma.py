"""The PTX wrappers of cuda/mma.cuh (mma.sync m16n8k16, ldmatrix, cp.async)
under the simulator, one at a time: each lane's registers against the fragment
layouts of the PTX ISA, written out here independently of the emulation, and
the products against NumPy. g = lane // 4 and t = lane % 4 throughout."""

import numpy as np
import pytest

from rawpage.dtypes import bf16_from_f32, bf16_to_f32
from rawpage.ops.launch import cuda_source_dir
from tests.kernels.test_simulator import CASES


@pytest.fixture(scope="module")
def wrappers():
    from rawpage.sim import SimModule

    return SimModule(CASES / "mma_wrappers.cu", debug=True, workers=1, include_dirs=(cuda_source_dir(),))


def bits16(x: np.ndarray, dtype: str) -> np.ndarray:
    """float32 values -> their 16-bit patterns in dtype (values already representable)."""
    return bf16_from_f32(x) if dtype == "bfloat16" else x.astype(np.float16).view(np.uint16)


def from_bits16(b: np.ndarray, dtype: str) -> np.ndarray:
    return bf16_to_f32(b) if dtype == "bfloat16" else b.view(np.float16).astype(np.float32)


def pair(bits: np.ndarray, r: int, c: int) -> int:
    """The register holding bits[r, c] (low half) and bits[r, c + 1] (high half)."""
    return int(bits[r, c]) | int(bits[r, c + 1]) << 16


def random_matrix(rng, shape, dtype):
    """Small integers times powers of two: exact in both dtypes, and their
    products and sums of 16 are exact in float32, so results compare exactly."""
    return (rng.integers(-8, 9, shape) * 2.0 ** rng.integers(-3, 2, shape)).astype(np.float32)


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_mma_m16n8k16_fragments(wrappers, dtype):
    rng = np.random.default_rng(1)
    A, B = random_matrix(rng, (16, 16), dtype), random_matrix(rng, (16, 8), dtype)
    C = random_matrix(rng, (16, 8), dtype)
    a_bits, bt_bits = bits16(A, dtype), bits16(B.T.copy(), dtype)  # B^T: column n contiguous in k
    a = np.zeros((32, 4), np.uint32)
    b = np.zeros((32, 2), np.uint32)
    c = np.zeros((32, 4), np.float32)
    for lane in range(32):
        g, t = lane // 4, lane % 4
        a[lane] = [
            pair(a_bits, g, 2 * t),
            pair(a_bits, g + 8, 2 * t),
            pair(a_bits, g, 2 * t + 8),
            pair(a_bits, g + 8, 2 * t + 8),
        ]
        b[lane] = [pair(bt_bits, g, 2 * t), pair(bt_bits, g, 2 * t + 8)]
        c[lane] = [C[g, 2 * t], C[g, 2 * t + 1], C[g + 8, 2 * t], C[g + 8, 2 * t + 1]]
    d = np.full((32, 4), np.nan, np.float32)
    suffix = "bf16" if dtype == "bfloat16" else "f16"
    wrappers.get_function(f"mma_regs_{suffix}")((1,), (32,), (d, a, b, c))
    want = A @ B + C
    for lane in range(32):
        g, t = lane // 4, lane % 4
        expect = [want[g, 2 * t], want[g, 2 * t + 1], want[g + 8, 2 * t], want[g + 8, 2 * t + 1]]
        np.testing.assert_array_equal(d[lane], expect, err_msg=f"lane {lane}")


def test_ldmatrix_x4_and_trans_fragments(wrappers):
    rng = np.random.default_rng(2)
    m = rng.integers(0, 1 << 16, (32, 8), dtype=np.uint16)
    rows = rng.permutation(32).astype(np.int32)  # lane l addresses row rows[l]
    out = np.zeros((32, 8), np.uint32)
    wrappers.get_function("ldmatrix_regs")((1,), (32,), (out, m, rows))
    for lane in range(32):
        g, t = lane // 4, lane % 4
        for j in range(4):
            M = m[rows[8 * j : 8 * j + 8]]  # matrix j: its rows as the lanes 8j..8j+7 addressed them
            assert out[lane, j] == pair(M, g, 2 * t), (lane, j)
            assert out[lane, 4 + j] == pair(M.T.copy(), g, 2 * t), (lane, j, "trans")


def test_cp_async_copies_or_zero_fills_at_the_wait(wrappers):
    rng = np.random.default_rng(3)
    src = rng.integers(0, 1 << 32, (64, 4), dtype=np.uint32)
    valid = (rng.random(64) < 0.7).astype(np.int32)
    out = np.zeros((64, 4), np.uint32)
    early = np.zeros((32, 4), np.uint32)
    wrappers.get_function("cp_async_roundtrip")((1,), (32,), (out, early, src, valid))
    swapped = np.arange(64) ^ 1  # each lane reads its neighbour's chunk after the wait
    np.testing.assert_array_equal(out, np.where(valid[swapped, None] != 0, src[swapped], 0))
    # Read before its wait_group retired it: the simulator's poison, not the data.
    np.testing.assert_array_equal(early, np.full((32, 4), 0xFFFFFFFF, np.uint32))


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_ldmatrix_feeds_mma_as_attention_does(wrappers, dtype):
    """S = Q K^T with both operands through ldmatrix (K rows are B's columns),
    and O = Q[:, :16] V with V through ldmatrix .trans."""
    rng = np.random.default_rng(4)
    Q, K = random_matrix(rng, (16, 32), dtype), random_matrix(rng, (16, 32), dtype)
    V = random_matrix(rng, (16, 16), dtype)
    s = np.full((16, 16), np.nan, np.float32)
    o = np.full((16, 16), np.nan, np.float32)
    suffix = "bf16" if dtype == "bfloat16" else "f16"
    args = (s, o, bits16(Q, dtype), bits16(K, dtype), bits16(V, dtype))
    wrappers.get_function(f"qk_pv_{suffix}")((1,), (32,), args)
    np.testing.assert_array_equal(s, Q @ K.T)
    np.testing.assert_array_equal(o, Q[:, :16] @ V)


def test_emulated_values_round_trip_through_bits():
    """The helpers above encode what they decode (guards the test's own packing)."""
    x = np.array([1.5, -0.25, 3.0], np.float32)
    for dtype in ("float16", "bfloat16"):
        np.testing.assert_array_equal(from_bits16(bits16(x, dtype), dtype), x)


def test_ldmatrix_traps_on_a_misaligned_row(wrappers):
    from rawpage.sim import SimLaunchError

    out = np.zeros(32, np.uint32)
    wrappers.get_function("ldmatrix_misaligned")((1,), (32,), (out, np.int32(0)))
    with pytest.raises(SimLaunchError, match="16-byte aligned"):
        wrappers.get_function("ldmatrix_misaligned")((1,), (32,), (out, np.int32(4)))
