"""Mixture of experts: a router picks k of E gated MLPs for each token, and the
token's output is their weighted sum (Mixtral, Qwen3-MoE).

    p = softmax(x W_router^T)               (T, E), in float32
    top-k experts per token; w = p[top-k], renormalized to sum 1 (Mixtral always,
    Qwen3-MoE when norm_topk_prob)
    y_t = sum_j w_tj * down_e(act(gate_e(x_t)) * up_e(x_t)),  e = top-k expert j

The experts run one at a time over just the tokens routed to them (gather, two
GEMMs, weighted scatter-add), so the cost grows with the experts in use, not
with E. The routing decision is small (T x E) and is made on the host, which
is why an MoE model decodes without CUDA graphs (rawpage/engine.py). On the GPU
this is one launch per active expert, not yet a grouped GEMM.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from rawpage.backends.base import Array, Backend
from rawpage.dtypes import from_float32, to_float32


@dataclass
class MoEWeights:
    router: Array  # (E, dim)
    gate_up: list[Array]  # E x (2 I, dim)   [gate | up] of each expert
    down: list[Array]  # E x (dim, I)

    def arrays(self) -> list[Array]:
        return [self.router, *self.gate_up, *self.down]


def route(router_logits: np.ndarray, k: int, renormalize: bool) -> tuple[np.ndarray, np.ndarray]:
    """router_logits: (T, E) -> (experts (T, k) int, weights (T, k) float32), best first."""
    z = router_logits.astype(np.float32)
    p = np.exp(z - z.max(axis=1, keepdims=True))
    p /= p.sum(axis=1, keepdims=True)  # (T, E)
    experts = np.argsort(-p, axis=1, kind="stable")[:, :k]  # (T, k)
    weights = np.take_along_axis(p, experts, axis=1)
    if renormalize:
        weights /= weights.sum(axis=1, keepdims=True)
    return experts, weights


def moe_forward(
    b: Backend,
    x: Array,
    moe: MoEWeights,
    k: int,
    renormalize: bool,
    activation: Callable[[Array], Array],
    expert_tokens: np.ndarray,
) -> Array:
    """x: (T, dim) -> (T, dim). expert_tokens: (E,) counts of tokens routed to each
    expert, added to (the step profile's expert load)."""
    T, dim = x.shape
    experts, weights = route(b.to_numpy(b.linear(x, moe.router)), k, renormalize)  # (T, k) each
    expert_tokens += np.bincount(experts.ravel(), minlength=len(expert_tokens))
    out = b.zeros((T, dim), np.float32)
    for e in np.unique(experts):  # only the experts that have tokens
        rows, slot = np.nonzero(experts == e)  # a token picks an expert at most once
        idx = b.asarray(rows.astype(np.int32), np.int32)
        y = b.linear(activation(b.linear(x[idx], moe.gate_up[e])), moe.down[e])  # (n_e, dim)
        out[idx] += to_float32(y) * b.asarray(weights[rows, slot][:, None], np.float32)
    return from_float32(out, b.dtype)
