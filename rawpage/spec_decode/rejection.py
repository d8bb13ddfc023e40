"""Acceptance of drafted tokens.

Greedy: accept the longest prefix of the draft that matches the target's argmax, then
emit the target's own token at the first mismatch (or the bonus token after a full match).

Sampled (Leviathan et al. 2023, Chen et al. 2023): draft token d_j drawn from q_j is
accepted with probability min(1, p_j(d_j) / q_j(d_j)); at the first rejection the token
is drawn from the recovered distribution norm(max(0, p_j - q_j)); after k acceptances
the bonus token is drawn from p_k. Every emitted token is then distributed exactly as
the target p. A deterministic proposer (n-gram lookup, a greedy draft model) has a
one-hot q: accept with probability p(d), recover from p with d removed.
"""

from __future__ import annotations

import numpy as np

from rawpage.ops.sampling import inverse_cdf


def greedy_accept(draft_ids: np.ndarray, target_ids: np.ndarray) -> int:
    """draft_ids (K,), target_ids (K+1,): how many drafts match the target's choices."""
    mismatch = np.flatnonzero(draft_ids != target_ids[: len(draft_ids)])
    return int(mismatch[0]) if mismatch.size else len(draft_ids)


def rejection_sample(
    target_probs: np.ndarray,
    draft_ids: np.ndarray,
    u_accept: np.ndarray,
    u_draw: np.ndarray,
    draft_probs: np.ndarray | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """B independent sequences, K drafts each, vocabulary V.

    target_probs (B, K+1, V): p at each draft position, and after the last draft;
    draft_ids (B, K); u_accept (B, K), u_draw (B,): uniforms in [0, 1);
    draft_probs (B, K, V) q, or None for a deterministic (one-hot) draft.
    Returns num_accepted (B,) and next_token (B,): the recovered token at the first
    rejection, or the bonus token when every draft was accepted."""
    B, K = draft_ids.shape
    b = np.arange(B)
    p_d = np.take_along_axis(target_probs[:, :K], draft_ids[..., None], axis=-1)[..., 0]  # (B, K)
    q_d = 1.0 if draft_probs is None else np.take_along_axis(draft_probs, draft_ids[..., None], axis=-1)[..., 0]
    accepted = u_accept * q_d < p_d  # with probability min(1, p/q)
    rejected = ~accepted.all(axis=1)  # (B,)
    num_accepted = np.where(rejected, accepted.argmin(axis=1), K)  # (B,) the first rejection, or K
    dist = target_probs[b, num_accepted].astype(np.float64)  # (B, V) p at the stopping position
    if rejected.any():
        r = np.flatnonzero(rejected)
        j = num_accepted[r]
        if draft_probs is None:
            residual = dist[r].copy()
            residual[np.arange(r.size), draft_ids[r, j]] = 0.0
        else:
            residual = np.maximum(dist[r] - draft_probs[r, j], 0.0)
        ok = residual.sum(axis=1) > 0  # p == q leaves nothing (and a rejection had probability 0)
        dist[r[ok]] = residual[ok]
    next_token = np.array([inverse_cdf(row, u) for row, u in zip(dist, u_draw)], dtype=np.int64)
    return num_accepted, next_token
