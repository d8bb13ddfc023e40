"""The CPU backend's ops, on the NumPy references and on the C kernels, against their
plain references and against first principles."""

import numpy as np
import pytest

from rawpage.backends.cpu import CPUBackend
from rawpage.native.library import native_kernels
from rawpage.ops.attention_metadata import AttentionMetadata, AttentionOptions
from rawpage.ops.kv_cache_fp8 import kv_scales_from_amax, paged_attention_fp8_ref, write_kv_fp8_ref
from rawpage.ops.layer_ops import cos_sin_cache, rope_ref, write_kv_ref
from rawpage.ops.paged_attention import paged_attention_ref
from rawpage.quantization.fp8 import e4m3_to_f32


@pytest.fixture(params=["numpy", "native"])
def backend(request) -> CPUBackend:
    """The CPU backend without the C kernels and, where they build, with them."""
    lib = native_kernels() if request.param == "native" else None
    if request.param == "native" and lib is None:
        pytest.skip("the CPU kernels did not build here")
    be = CPUBackend(lib, cpu_threads=2)
    be.threads.set_for(1)  # as a pass's embedding() does
    return be


def _random_paged_batch(rng, q_lens, ctx_lens, H, Hkv, D, BS, NB):
    """Random caches and scattered block tables for sequences with the given lengths."""
    k_cache = rng.standard_normal((NB, BS, Hkv, D)).astype(np.float32)
    v_cache = rng.standard_normal((NB, BS, Hkv, D)).astype(np.float32)
    max_blocks = max(-(-L // BS) for L in ctx_lens)
    perm = rng.permutation(NB)
    tables = np.zeros((len(ctx_lens), max_blocks), np.int32)
    used = 0
    for i, L in enumerate(ctx_lens):
        n = -(-L // BS)
        tables[i, :n] = perm[used : used + n]
        used += n
    qsl = np.concatenate([[0], np.cumsum(q_lens)]).astype(np.int32)
    q = rng.standard_normal((qsl[-1], H, D)).astype(np.float32)
    return q, k_cache, v_cache, tables, np.array(ctx_lens, np.int32), qsl


def _dense_attention(q, k, v, scale, window=None, cap=None):
    """Causal attention of the last n positions of one contiguous context. q (n,H,D), k/v (L,Hkv,D).
    window: position p sees keys p-window+1..p; cap: scores -> cap * tanh(scores / cap)."""
    n, H, D = q.shape
    L, Hkv = k.shape[:2]
    k = np.repeat(k, H // Hkv, axis=1)
    v = np.repeat(v, H // Hkv, axis=1)
    out = np.zeros_like(q)
    for t in range(n):
        p = L - n + t
        first = max(0, p + 1 - window) if window else 0
        s = np.einsum("hd,lhd->hl", q[t], k[first : p + 1]) * scale
        if cap:
            s = cap * np.tanh(s / cap)
        w = np.exp(s - s.max(-1, keepdims=True))
        w /= w.sum(-1, keepdims=True)
        out[t] = np.einsum("hl,lhd->hd", w, v[first : p + 1])
    return out


@pytest.mark.parametrize("H,Hkv", [(4, 4), (8, 2), (9, 3)])
def test_paged_attention_ref_matches_dense(H, Hkv):
    rng = np.random.default_rng(0)
    D, BS = 16, 4
    q_lens, ctx = [5, 1, 3], [5, 9, 12]
    q, kc, vc, bt, sl, qsl = _random_paged_batch(rng, q_lens, ctx, H, Hkv, D, BS, 16)
    out = paged_attention_ref(q, kc, vc, AttentionMetadata.from_host(bt, sl, qsl), AttentionOptions(0.25))
    for i, L in enumerate(ctx):
        blocks = bt[i, : -(-L // BS)]
        k = kc[blocks].reshape(-1, Hkv, D)[:L]
        v = vc[blocks].reshape(-1, Hkv, D)[:L]
        want = _dense_attention(q[qsl[i] : qsl[i + 1]], k, v, 0.25)
        np.testing.assert_allclose(out[qsl[i] : qsl[i + 1]], want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("window,cap", [(5, None), (16, None), (None, 1.5), (6, 2.0)])
def test_sliding_window_and_soft_cap(backend, window, cap):
    """Reference and cpu backend against dense attention, for windows that start inside a
    block, span blocks, or exceed the context; prefill chunks and decodes in one batch."""
    rng = np.random.default_rng(2)
    D, BS, H, Hkv = 16, 4, 8, 2
    q_lens, ctx = [5, 1, 9, 1, 1], [5, 23, 30, 4, 17]
    q, kc, vc, bt, sl, qsl = _random_paged_batch(rng, q_lens, ctx, H, Hkv, D, BS, 40)
    meta, opts = AttentionMetadata.from_host(bt, sl, qsl), AttentionOptions(0.25, window, cap)
    ref = paged_attention_ref(q, kc, vc, meta, opts)
    cpu = backend.paged_attention(q, kc, vc, meta, opts)
    plain = paged_attention_ref(q, kc, vc, meta, AttentionOptions(0.25))
    assert np.abs(ref - plain).max() > 1e-2  # the option changes the result
    for i, L in enumerate(ctx):
        blocks = bt[i, : -(-L // BS)]
        k = kc[blocks].reshape(-1, Hkv, D)[:L]
        v = vc[blocks].reshape(-1, Hkv, D)[:L]
        want = _dense_attention(q[qsl[i] : qsl[i + 1]], k, v, 0.25, window, cap)
        np.testing.assert_allclose(ref[qsl[i] : qsl[i + 1]], want, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(cpu, ref, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("window,cap", [(None, None), (5, None), (64, None), (None, 1.5), (6, 2.0)])
@pytest.mark.parametrize("ctx", [1, 4, 23])
def test_one_decoding_sequence_alone(backend, window, cap, ctx):
    """Batch-1 decode: the reference's result, with windows inside the context, past
    it, and soft caps."""
    rng = np.random.default_rng(ctx)
    q, kc, vc, bt, sl, qsl = _random_paged_batch(rng, [1], [ctx], 8, 2, 16, 4, 20)
    meta, opts = AttentionMetadata(bt, sl, qsl, max_query_len=1, max_seq_len=ctx), AttentionOptions(0.25, window, cap)
    ref = paged_attention_ref(q, kc, vc, meta, opts)
    got = backend.paged_attention(q, kc, vc, meta, opts)
    np.testing.assert_allclose(got, ref, rtol=1e-5, atol=1e-6)


def test_cpu_batched_decode_matches_ref(backend):
    rng = np.random.default_rng(1)
    q_lens = [1, 1, 7, 1, 1]
    ctx = [1, 40, 7, 17, 33]
    q, kc, vc, bt, sl, qsl = _random_paged_batch(rng, q_lens, ctx, 8, 2, 32, 16, 32)
    meta, opts = AttentionMetadata.from_host(bt, sl, qsl), AttentionOptions(0.2)
    got = backend.paged_attention(q, kc, vc, meta, opts)
    want = paged_attention_ref(q, kc, vc, meta, opts)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


def test_an_fp8_cache_runs_its_reference_on_both(backend):
    """No kernel reads a uint8 (e4m3) cache: the write and the attention are the FP8
    references on either path, the whole pool converted or only the batch's blocks alike."""
    rng = np.random.default_rng(8)
    q_lens, ctx = [1, 6, 1, 1], [9, 6, 30, 17]
    q, kc, vc, bt, sl, qsl = _random_paged_batch(rng, q_lens, ctx, 8, 2, 16, 4, 60)
    scales = kv_scales_from_amax(4.0, 4.0)
    backend.set_kv_scales(scales)
    k8, v8 = np.zeros(kc.shape, np.uint8), np.zeros(vc.shape, np.uint8)
    want8 = (k8.copy(), v8.copy())
    slots = rng.permutation(kc.shape[0] * kc.shape[1])[:7]
    backend.write_kv(kc[:7, 0], vc[:7, 0], k8, v8, slots)
    write_kv_fp8_ref(kc[:7, 0], vc[:7, 0], *want8, slots, scales)
    np.testing.assert_array_equal(k8, want8[0])
    np.testing.assert_array_equal(v8, want8[1])
    k8, v8 = (rng.integers(0, 110, kc.shape).astype(np.uint8) for _ in "kv")
    meta, opts = AttentionMetadata.from_host(bt, sl, qsl), AttentionOptions(0.25)
    got = backend.paged_attention(q, k8, v8, meta, opts)
    np.testing.assert_array_equal(got, paged_attention_fp8_ref(q, k8, v8, scales, meta, opts))
    whole = paged_attention_ref(q, e4m3_to_f32(k8) * scales[0], e4m3_to_f32(v8) * scales[1], meta, opts)
    np.testing.assert_array_equal(got, whole)


def test_matmul_is_x_times_w_transposed_plus_bias(backend):
    """Dense float weights are BLAS on either path, (out, in) as stored."""
    rng = np.random.default_rng(6)
    w, bias = rng.standard_normal((300, 64), dtype=np.float32), rng.standard_normal(300, dtype=np.float32)
    for T in (1, 2, 33):
        x = rng.standard_normal((T, 64), dtype=np.float32)
        got = backend.linear(x, backend.prepare_linear(w), bias)
        np.testing.assert_allclose(got, x @ w.T + bias, rtol=1e-5, atol=1e-5)


def test_write_kv_skips_minus_one():
    rng = np.random.default_rng(2)
    k = rng.standard_normal((3, 2, 4)).astype(np.float32)
    v = rng.standard_normal((3, 2, 4)).astype(np.float32)
    kc = np.zeros((4, 2, 2, 4), np.float32)
    vc = np.zeros_like(kc)
    write_kv_ref(k, v, kc, vc, np.array([5, -1, 0]))
    np.testing.assert_array_equal(kc[2, 1], k[0])
    np.testing.assert_array_equal(vc[0, 0], v[2])
    assert np.count_nonzero(kc) == 2 * 8


@pytest.mark.parametrize("is_neox", [True, False])
def test_rope_is_a_rotation_with_relative_angles(is_neox):
    """Rotations keep norms, and q.k after RoPE depends only on the position difference."""
    rng = np.random.default_rng(3)
    D = 8
    cs = cos_sin_cache(1.0 / (100.0 ** (np.arange(0, D, 2) / D)), 64)
    q0 = rng.standard_normal((1, 1, D)).astype(np.float32)
    k0 = rng.standard_normal((1, 1, D)).astype(np.float32)
    dots = []
    for p in (3, 10):
        q, k = q0.copy(), k0.copy()
        rope_ref(np.array([p + 5]), q, k, cs, is_neox)
        k2 = k0.copy()
        rope_ref(np.array([p]), k2.copy(), k2, cs, is_neox)
        np.testing.assert_allclose(np.linalg.norm(q), np.linalg.norm(q0), rtol=1e-5)
        dots.append(float((q * k2).sum()))
    np.testing.assert_allclose(dots[0], dots[1], rtol=1e-4)


def test_a_large_zeros_array_is_resident_only_where_written():
    """The KV pool (2 GiB by default) holds only the pages its blocks wrote to: the CPU
    backend maps large zero arrays instead of taking them from the heap, which calloc
    would write in full (rawpage/backends/cpu_malloc.py keeps such blocks there)."""

    def rss_kb() -> int:
        with open("/proc/self/status") as f:
            return next(int(line.split()[1]) for line in f if line.startswith("VmRSS"))

    before = rss_kb()
    pool = CPUBackend().zeros((64, 16, 8, 1024))  # 256 MiB of float32
    assert pool.flags.writeable and not pool.any()
    pool[3] = 1.0  # one block: 512 KiB
    assert rss_kb() - before < 64 * 1024, "the whole array became resident"
    assert pool[3].all() and not pool[4].any()
