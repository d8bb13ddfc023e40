"""cuda/moe_grouped_gemm.cu against its NumPy reference, through the real launch code:
groups that are empty, that hold every row, that end mid-tile, and odd N and K."""

import numpy as np
import pytest

from rawpage.ops.moe_grouped_gemm import (
    BM,
    MMA_BM,
    grouped_gemm_flops,
    grouped_gemm_ref,
    launch_grouped_gemm,
    row_tiles,
    sort_by_expert,
)
from tests.kernels.conftest import DTYPES, assert_close

# (group sizes per expert, N, K): idle experts, one expert with all rows, a group
# of BM + 1 rows (a one-row tile), N and K not multiples of the tile.
CASES = [
    ([3, 0, 5, 0], 24, 16),
    ([0, 0, 40, 0, 0, 0], 70, 33),
    ([BM + 1, 1, 0, 7], 65, 64),
    ([MMA_BM + 3, 0, 2], 136, 96),
    ([1], 8, 8),
    ([0, 0, 0], 16, 16),
]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("sizes,N,K", CASES)
def test_grouped_gemm_matches_reference(device, dtype, sizes, N, K):
    rng = np.random.default_rng(len(sizes) + N + K)
    offsets = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int32)
    M, E = int(offsets[-1]), len(sizes)
    x = device.rounded(rng.standard_normal((M, K)), dtype)
    w = device.rounded(rng.standard_normal((E, N, K)) / np.sqrt(K), dtype)
    got = launch_grouped_gemm(device.xp, device.loader, device.put(x, dtype), device.put(w, dtype), offsets)
    assert got.shape == (M, N)
    assert_close(device.get(got), grouped_gemm_ref(x, w, offsets), dtype)


def test_tiles_skip_idle_experts_and_cover_every_row():
    offsets = np.array([0, 0, 70, 70, 71], np.int32)
    experts, rows = row_tiles(offsets)
    np.testing.assert_array_equal(experts, [1, 1, 1, 3])
    np.testing.assert_array_equal(rows, [0, BM, 2 * BM, 70])


def test_sort_by_expert_groups_pairs():
    experts = np.array([[2, 0], [2, 1], [0, 2]])
    order, offsets = sort_by_expert(experts, 4)
    np.testing.assert_array_equal(offsets, [0, 2, 3, 6, 6])
    np.testing.assert_array_equal(experts.ravel()[order], [0, 0, 1, 2, 2, 2])
    np.testing.assert_array_equal(order[:2], [1, 4])  # stable: token order kept within an expert


def test_flops_count_routed_rows_only():
    assert grouped_gemm_flops(np.array([0, 0, 5, 5, 8]), 10, 4) == 2 * 8 * 10 * 4


def test_bad_offsets_are_refused(device):
    x = device.put(np.zeros((4, 8)), "float32")
    w = device.put(np.zeros((2, 8, 8)), "float32")
    with pytest.raises(ValueError, match="do not match"):
        launch_grouped_gemm(device.xp, device.loader, x, w, np.array([0, 3, 5]))
