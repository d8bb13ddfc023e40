"""The sampler's NumPy arithmetic on one row or a batch of logits (rawpage/sampler.py
decides which rows get what; these only compute)."""

from __future__ import annotations

import numpy as np

# A 49k-entry row is searched a block at a time: NumPy's cumsum is a scalar loop (0.5 ms
# a row in float64), a full sort ~3 ms and a partition ~0.3 ms, where a pass of vector
# arithmetic over the row costs ~5-40 us.
_BLOCK = 512


def log_softmax(x: np.ndarray) -> np.ndarray:
    x = x - x.max(axis=-1, keepdims=True)
    return x - np.log(np.exp(x).sum(axis=-1, keepdims=True))


def nucleus_mask(p: np.ndarray, top_p: float) -> None:
    """Zero every token outside the smallest most-likely set whose mass reaches top_p. In place.

    That set is the tokens above some probability, so it is looked for among the tokens
    within 2^-6, 2^-12, ... of the most likely one: the first such candidate set whose
    mass reaches top_p holds the whole nucleus, and only it is sorted (ties: lower id first)."""
    total, top = p.sum(), p.max()
    for shift in (6, 12, 18, 24):
        cand = np.flatnonzero(p >= top * 2.0**-shift)
        if p[cand].sum() >= top_p * total:
            break
    else:  # a flat distribution: sort it all
        cand = np.arange(p.size)
    order = cand[np.argsort(-p[cand], kind="stable")]
    mass = np.cumsum(p[order])
    keep = int(np.searchsorted(mass, top_p * total)) + 1  # include the token that crosses top_p
    dropped = np.ones(p.size, dtype=bool)
    dropped[order[:keep]] = False
    p[dropped] = 0.0


def kth_largest(row: np.ndarray, k: int) -> float:
    """The k-th largest entry of a row (1 <= k <= row.size), exactly. The k largest block
    maxima come from k different blocks, so at least k entries reach the k-th of them: only
    the entries at or above it can be among the k largest, and only they are partitioned."""
    n = row.size // _BLOCK * _BLOCK
    if k <= n // _BLOCK:
        maxima = row[:n].reshape(-1, _BLOCK).max(axis=1)
        row = row[~(row < np.partition(maxima, -k)[-k])]  # NaNs kept: np.partition ranks them largest
    return float(np.partition(row, -k)[-k])


def inverse_cdf(p: np.ndarray, u: float) -> int:
    """The token a uniform u in [0, 1) draws from the unnormalized probabilities p (V,): the
    first whose cumulative sum (float64) passes u times the row's total, so a token of
    probability 0 is never drawn. Block sums find the block, then one block is summed."""
    starts = np.arange(0, p.size, _BLOCK)
    ends = np.cumsum(np.add.reduceat(p, starts, dtype=np.float64))  # cumulative sum at each block's end
    target = u * ends[-1]
    b = min(int(np.count_nonzero(ends <= target)), len(ends) - 1)
    before = ends[b - 1] if b else 0.0
    inside = before + np.cumsum(p[starts[b] : starts[b] + _BLOCK], dtype=np.float64)
    inside[-1] = ends[b]  # the block's end as the block sums have it: some token passes the target
    return int(starts[b] + np.argmax(inside > target))


def top_k_ids(row: np.ndarray, k: int) -> np.ndarray:
    """Ids of the k largest entries, largest first."""
    k = min(k, row.size)
    if k == 0:
        return np.zeros(0, dtype=np.int64)
    ids = np.argpartition(-row, k - 1)[:k]
    return ids[np.argsort(-row[ids], kind="stable")]
