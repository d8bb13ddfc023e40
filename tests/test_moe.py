"""Mixture-of-experts routing and expert dispatch (models/moe.py) against a dense
NumPy reference that runs every expert on every token."""

import numpy as np
import pytest

from rawpage.backends import get_backend
from rawpage.backends.cpu import CPUBackend
from rawpage.models.moe import MoEWeights, moe_forward, route
from rawpage.ops.layer_ops import silu_and_mul_ref

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
    moe = MoEWeights.build(
        b,
        b.prepare_linear(b.asarray(router)),
        [b.prepare_linear(b.asarray(w)) for w in gate_up],
        [b.prepare_linear(b.asarray(w)) for w in down],
    )
    assert (moe.gate_up_stacked is not None) == (device == "sim")  # sim runs the grouped GEMM kernel
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


class _CountingBackend(CPUBackend):
    """The cpu backend, counting the GEMMs of the Linear seam and their FLOPs."""

    def __init__(self):
        super().__init__()
        self.gemms = self.flops = 0

    def linear(self, x, w, bias=None):
        self.gemms += 1
        self.flops += 2 * x.shape[0] * w.shape[0] * w.shape[1]
        return super().linear(x, w, bias)


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
    T, k = 32, 2
    assert b.flops == 2 * T * DIM * n_experts + 2 * T * k * (2 * INTER * DIM + DIM * INTER)  # router + routed rows


class _CountingLoader:
    """The simulator's kernel loader, recording each grouped-GEMM launch's FLOPs."""

    def __init__(self, inner):
        self.inner, self.launches, self.flops = inner, [], 0

    def get_function(self, module, name):
        fn = self.inner.get_function(module, name)
        if module != "moe_grouped_gemm.cu":
            return fn

        def launch(grid, block, args, shared_mem=0):
            out, x = args[0], args[1]
            self.launches.append(name)
            self.flops += 2 * x.shape[0] * out.shape[1] * x.shape[1]
            return fn(grid, block, args, shared_mem)

        return launch


@pytest.mark.parametrize("n_experts", [8, 64])
def test_sim_runs_two_grouped_gemms_whatever_the_expert_count(n_experts):
    """On sim (and cuda) a layer's experts are two kernel launches, gate/up and down,
    and their FLOPs are the routed rows' only: the same for 8 or 64 experts."""
    rng = np.random.default_rng(2)
    b = get_backend("sim")
    b.loader = loader = _CountingLoader(b.loader)
    router = np.zeros((n_experts, DIM), np.float32)
    router[[1, 5]] = 1.0
    gate_up = [rng.standard_normal((2 * INTER, DIM)).astype(np.float32) for _ in range(n_experts)]
    down = [rng.standard_normal((DIM, INTER)).astype(np.float32) for _ in range(n_experts)]
    moe = MoEWeights.build(b, b.asarray(router), [b.asarray(w) for w in gate_up], [b.asarray(w) for w in down])
    T, k = 9, 2
    x = np.abs(rng.standard_normal((T, DIM)).astype(np.float32))
    moe_forward(b, b.asarray(x), moe, k, True, b.silu_and_mul, np.zeros(n_experts, np.int64))
    assert len(loader.launches) == 2
    assert loader.flops == 2 * T * k * (2 * INTER * DIM + DIM * INTER)


def test_sim_bfloat16_experts_take_the_tensor_core_kernel():
    """In bfloat16 the grouped GEMM is the mma.sync kernel; the layer still matches the
    dense reference (computed on the bfloat16-rounded weights and input)."""
    from rawpage.dtypes import bf16_from_f32, bf16_to_f32

    rng = np.random.default_rng(3)
    b = get_backend("sim", "bfloat16")
    b.loader = loader = _CountingLoader(b.loader)

    def rounded(a):
        return bf16_to_f32(bf16_from_f32(a))

    x = rounded(np.abs(rng.standard_normal((70, DIM)).astype(np.float32)))  # > 64 rows: two row tiles
    gate_up, down = [[rounded(w) for w in ws] for ws in _experts(rng)]
    router = rounded(_router_preferring(rng, [0, 4], 2.0))
    moe = MoEWeights.build(b, b.asarray(router), [b.asarray(w) for w in gate_up], [b.asarray(w) for w in down])
    got = b.to_numpy(moe_forward(b, b.asarray(x), moe, 2, True, b.silu_and_mul, np.zeros(E, np.int64)))
    np.testing.assert_allclose(got, _dense_reference(x, router, gate_up, down, 2, True), rtol=5e-2, atol=5e-2)
    assert loader.launches == ["moe_grouped_gemm_mma_bf16"] * 2
