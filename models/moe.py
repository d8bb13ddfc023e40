"""Mixture of experts: a router picks k of E gated MLPs for each token, and the
token's output is their weighted sum (Mixtral, Qwen3-MoE).

    p = softmax(x W_router^T)               (T, E), in float32
    top-k experts per token; w = p[top-k], renormalized to sum 1 (Mixtral always,
    Qwen3-MoE when norm_topk_prob)
    y_t = sum_j w_tj * down_e(act(gate_e(x_t)) * up_e(x_t)),  e = top-k expert j

The step's (token, expert) pairs are sorted by expert, so each expert's tokens
are one run of rows (M = T k rows in all). The gate/up and the down projections
are then one grouped GEMM each over all experts (backend.grouped_linear): on
sim and cuda a single kernel launch (cuda/moe_grouped_gemm.cu) whatever E is;
on cpu one GEMM per expert that has tokens. Either way the work is the routed
rows' FLOPs, which grow with the experts in use, not with E. The weighted sum
gathers each token's k rows back (no atomics). The routing decision is small
(T x E) and is made on the host, which is why an MoE model decodes without
CUDA graphs (rawpage/engine.py).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from rawpage.backends.base import Array, Backend
from rawpage.dtypes import from_float32, to_float32
from rawpage.ops.moe_grouped_gemm import sort_by_expert


@dataclass
class MoEWeights:
    router: Array  # (E, dim)
    gate_up: list[Array]  # E x (2 I, dim)   [gate | up] of each expert
    down: list[Array]  # E x (dim, I)
    # The same experts stacked, (E, 2 I, dim) and (E, dim, I), where the backend runs
    # grouped GEMMs on stacks (then gate_up and down are views into them); else None.
    gate_up_stacked: Array | None = None
    down_stacked: Array | None = None

    @classmethod
    def build(cls, b: Backend, router: Array, gate_up: list[Array], down: list[Array]) -> MoEWeights:
        gu, dn = b.stack_experts(gate_up), b.stack_experts(down)
        if gu is None or dn is None:
            return cls(router, gate_up, down)
        return cls(router, list(gu), list(dn), gu, dn)

    def arrays(self) -> list[Array]:
        if self.gate_up_stacked is not None:
            return [self.router, self.gate_up_stacked, self.down_stacked]
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
    order, offsets = sort_by_expert(experts, len(moe.gate_up))  # (T k,), (E + 1,)
    expert_tokens += np.diff(offsets)
    xs = x[b.asarray(order // k, np.int32)]  # (M, dim): row i is token order[i] // k
    h = activation(b.grouped_linear(xs, moe.gate_up, moe.gate_up_stacked, offsets))  # (M, I)
    y = b.grouped_linear(h, moe.down, moe.down_stacked, offsets)  # (M, dim), sorted by expert
    inverse = np.empty_like(order)
    inverse[order] = np.arange(len(order), dtype=np.int32)  # flat (t, j) -> its sorted row
    y = to_float32(y)[b.asarray(inverse, np.int32)].reshape(T, k, dim)
    out = (y * b.asarray(weights[:, :, None], np.float32)).sum(axis=1)  # (T, dim)
    return from_float32(out, b.dtype)
