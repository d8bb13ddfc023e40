"""The sampler's NumPy arithmetic on one row or a batch of logits (rawpage/sampler.py
decides which rows get what; these only compute)."""

from __future__ import annotations

import numpy as np

# Top-p first looks for the nucleus among this many most likely tokens; a full
# sort of a 49k vocabulary costs ~3 ms a row, a partition ~0.5 ms.
_TOP_P_CANDIDATES = 1024


def log_softmax(x: np.ndarray) -> np.ndarray:
    x = x - x.max(axis=-1, keepdims=True)
    return x - np.log(np.exp(x).sum(axis=-1, keepdims=True))


def nucleus_mask(p: np.ndarray, top_p: float) -> None:
    """Zero every token outside the smallest most-likely set whose mass reaches top_p. In place."""
    total = p.sum()
    m = min(_TOP_P_CANDIDATES, p.size - 1)
    cand = np.argpartition(-p, m)[:m]
    if p[cand].sum() < top_p * total:  # flat distribution: the nucleus is larger, sort it all
        cand = np.arange(p.size)
    order = cand[np.argsort(-p[cand], kind="stable")]
    mass = np.cumsum(p[order])
    keep = int(np.searchsorted(mass, top_p * total)) + 1  # include the token that crosses top_p
    dropped = np.ones(p.size, dtype=bool)
    dropped[order[:keep]] = False
    p[dropped] = 0.0


def top_k_ids(row: np.ndarray, k: int) -> np.ndarray:
    """Ids of the k largest entries, largest first."""
    k = min(k, row.size)
    if k == 0:
        return np.zeros(0, dtype=np.int64)
    ids = np.argpartition(-row, k - 1)[:k]
    return ids[np.argsort(-row[ids], kind="stable")]
