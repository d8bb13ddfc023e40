"""Mixture-of-experts routing and expert dispatch (models/moe.py) against a dense
NumPy reference that runs every expert on every token."""

import numpy as np
import pytest

from rawpage.backends import get_backend
from rawpage.models.moe import MoEWeights, moe_forward, route
from rawpage.ops.activation import silu_and_mul_ref

E, DIM, INTER = 8, 16, 12


def _experts(rng):
    gate_up = [rng.standard_normal((2 * INTER, DIM)).astype(np.float32) / 4 for _ in range(E)]
    down = [rng.standard_normal((DIM, INTER)).astype(np.float32) / 4 for _ in range(E)]
    return gate_up, down


def _dense_reference(x, router, gate_up, down, k, renormalize):
    """Every expert on every token, weighted by a mask of each token's top k."""
    z = x @ router.T  # (T, E)
    p = np.exp(z - z.max(1, keepdims=True))
    p /= p.sum(1, keepdims=True)
    out = np.zeros_like(x)
    for t in range(len(x)):
        top = sorted(range(E), key=lambda e: -p[t, e])[:k]
        w = p[t, top] / (p[t, top].sum() if renormalize else 1.0)
        for e, we in zip(top, w):
            out[t] += we * (silu_and_mul_ref(x[t : t + 1] @ gate_up[e].T) @ down[e].T)[0]
    return out


def _router_preferring(rng, favourites, strength=8.0):
    """A router whose logits are large for the favourite experts, whatever the token."""
    router = rng.standard_normal((E, DIM)).astype(np.float32) * 0.1
    router[favourites] += strength / DIM
    return router


@pytest.mark.parametrize("device", ["cpu", "sim"])
@pytest.mark.parametrize("k,renormalize", [(2, True), (2, False), (1, True), (3, False)])
@pytest.mark.parametrize("case", ["spread", "some idle", "all to two"])
def test_moe_matches_dense_reference(device, k, renormalize, case):
    rng = np.random.default_rng(0)
    T = 13
    x = np.abs(rng.standard_normal((T, DIM)).astype(np.float32))  # positive, so a favourite wins everywhere
    gate_up, down = _experts(rng)
    router = {
        "spread": rng.standard_normal((E, DIM)).astype(np.float32),
        "some idle": _router_preferring(rng, [1, 2, 5, 6], 2.0),
        "all to two": _router_preferring(rng, [3, 6], 30.0),
    }[case]
    b = get_backend(device)
    moe = MoEWeights(
        b.prepare_linear(b.asarray(router)),
        [b.prepare_linear(b.asarray(w)) for w in gate_up],
        [b.prepare_linear(b.asarray(w)) for w in down],
    )
    counts = np.zeros(E, np.int64)
    got = b.to_numpy(moe_forward(b, b.asarray(x), moe, k, renormalize, b.silu_and_mul, counts))
    np.testing.assert_allclose(got, _dense_reference(x, router, gate_up, down, k, renormalize), rtol=1e-4, atol=1e-5)
    assert counts.sum() == T * k
    if case == "all to two" and k == 2:
        assert counts[3] == counts[6] == T  # every token to experts 3 and 6, none elsewhere
    if case == "some idle":
        assert (counts == 0).any()


def test_route_renormalizes_the_top_k():
    logits = np.log(np.array([[0.1, 0.5, 0.2, 0.2], [0.4, 0.3, 0.2, 0.1]], np.float32))
    experts, weights = route(logits, 2, renormalize=False)
    np.testing.assert_array_equal(experts[:, 0], [1, 0])
    np.testing.assert_allclose(weights.sum(1), [0.7, 0.7], rtol=1e-6)
    _, weights = route(logits, 2, renormalize=True)
    np.testing.assert_allclose(weights.sum(1), [1.0, 1.0], rtol=1e-6)


class _CountingBackend:
    """The cpu backend, counting GEMMs by the number of rows they multiply."""

    def __init__(self):
        self.inner, self.gemms = get_backend("cpu"), 0

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def linear(self, x, w, bias=None):
        self.gemms += 1
        return self.inner.matmul(x, w, bias)


def test_cost_follows_the_active_experts_not_the_total():
    """With 64 experts of which the router picks 2 for every token, a step runs the
    router and 2 experts (2 GEMMs each): 5 GEMMs, not 64 experts' worth."""
    rng = np.random.default_rng(1)
    b = _CountingBackend()
    n_experts = 64
    router = np.zeros((n_experts, DIM), np.float32)
    router[[10, 40]] = 1.0
    w_up = [b.prepare_linear(rng.standard_normal((2 * INTER, DIM)).astype(np.float32)) for _ in range(n_experts)]
    w_down = [b.prepare_linear(rng.standard_normal((DIM, INTER)).astype(np.float32)) for _ in range(n_experts)]
    moe = MoEWeights(b.prepare_linear(router), w_up, w_down)
    x = np.abs(rng.standard_normal((32, DIM)).astype(np.float32))
    moe_forward(b, x, moe, 2, True, b.silu_and_mul, np.zeros(n_experts, np.int64))
    assert b.gemms == 1 + 2 * 2
