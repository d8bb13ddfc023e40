"""Our packer: float weights -> GPTQ or AWQ 4-bit tensors in each format's published
layout (drawn in rawpage/quantization/int4.py), for test checkpoints and the GPU check's
1B model. A tool, not part of the engine: the engine reads packed checkpoints, never packs.

Round-to-nearest per group (not the GPTQ/AWQ error-correcting searches: the
layout is what we test, not the quantization quality).
"""

from __future__ import annotations

import numpy as np

from rawpage.quantization.int4 import AWQ_ORDER, pack_nibbles

_F16_TINY = float(np.finfo(np.float16).tiny)  # the smallest normal float16, 6.1e-5


def quantize_groups(w: np.ndarray, groups: np.ndarray, sym: bool) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """w (N, K) float, groups (K,) the group of each input -> q (N, K) 0..15,
    scales (ngroups, N) float16, zeros (ngroups, N) int. Asymmetric: the group's
    [min, max] onto 0..15; symmetric: zero 8, scale max|w| / 7."""
    N, K = w.shape
    ng = int(groups.max()) + 1
    scales, zeros = np.zeros((ng, N), np.float16), np.zeros((ng, N), np.int32)
    q = np.zeros((N, K), np.uint8)
    for g in range(ng):
        cols = groups == g
        wg = w[:, cols]
        # (the scales are stored as float16: an all-zero row's would round to 0 there, so
        # they are kept at float16's smallest normal at least)
        if sym:
            s, z = np.maximum(np.abs(wg).max(1) / 7, _F16_TINY), np.full(N, 8)
        else:
            lo, hi = np.minimum(wg.min(1), 0), np.maximum(wg.max(1), 0)
            s = np.maximum((hi - lo) / 15, _F16_TINY)
            z = np.clip(np.round(-lo / s), 0, 15).astype(np.int32)
        s16 = s.astype(np.float16)
        q[:, cols] = np.clip(np.round(wg / s16[:, None].astype(np.float32)) + z[:, None], 0, 15)
        scales[g], zeros[g] = s16, z
    return q, scales, zeros


def pack_gptq(w: np.ndarray, group_size: int, sym: bool, act_order: bool, seed: int = 0) -> dict[str, np.ndarray]:
    """w (N, K) -> {qweight, qzeros, scales, g_idx}. group_size -1: one group. With
    act_order the groups are taken in a random input order, as GPTQ's desc_act does
    (by decreasing activation size), and g_idx records each input's group."""
    N, K = w.shape
    G = K if group_size == -1 else group_size
    order = np.random.default_rng(seed).permutation(K) if act_order else np.arange(K)
    g_idx = np.empty(K, np.int32)
    g_idx[order] = np.arange(K) // G  # the i-th input in `order` belongs to group i // G
    q, scales, zeros = quantize_groups(w, g_idx, sym)
    return {
        "qweight": pack_nibbles(q.T, axis=0),  # (K/8, N)
        "qzeros": pack_nibbles((zeros - 1) & 15, axis=1),  # (ngroups, N/8), v1: z - 1
        "scales": scales,
        "g_idx": g_idx,
    }


def pack_awq(w: np.ndarray, group_size: int) -> dict[str, np.ndarray]:
    """w (N, K) -> {qweight, qzeros, scales} in AutoAWQ's GEMM packing (asymmetric)."""
    N, K = w.shape
    q, scales, zeros = quantize_groups(w, np.arange(K) // group_size, sym=False)

    def interleave(a: np.ndarray) -> np.ndarray:  # (rows, N) -> columns in AWQ's nibble order
        return a.reshape(a.shape[0], -1, 8)[:, :, AWQ_ORDER].reshape(a.shape)

    return {
        "qweight": pack_nibbles(interleave(q.T), axis=1),  # (K, N/8)
        "qzeros": pack_nibbles(interleave(zeros), axis=1),  # (ngroups, N/8)
        "scales": scales,
    }


def dequantize_packed(w: np.ndarray, groups: np.ndarray, sym: bool) -> np.ndarray:
    """What a packed weight holds, straight from quantize_groups: the round-trip's reference."""
    q, scales, zeros = quantize_groups(w, groups, sym)
    return scales.T.astype(np.float32)[:, groups] * (q.astype(np.float32) - zeros.T[:, groups])
