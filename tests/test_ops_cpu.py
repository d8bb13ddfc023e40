"""The CPU backend's ops against their plain references and against first principles."""

import threading
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

import rawpage.backends.cpu as cpu_backend
from rawpage.backends.cpu import CPUBackend, decode_attention
from rawpage.ops.attention_metadata import AttentionMetadata, AttentionOptions
from rawpage.ops.paged_attention import paged_attention_ref
from rawpage.ops.rope import cos_sin_cache, rope_ref
from rawpage.ops.write_kv import write_kv_ref


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
def test_sliding_window_and_soft_cap(window, cap):
    """Reference and cpu backend against dense attention, for windows that start inside a
    block, span blocks, or exceed the context; prefill chunks and decodes in one batch."""
    rng = np.random.default_rng(2)
    D, BS, H, Hkv = 16, 4, 8, 2
    q_lens, ctx = [5, 1, 9, 1, 1], [5, 23, 30, 4, 17]
    q, kc, vc, bt, sl, qsl = _random_paged_batch(rng, q_lens, ctx, H, Hkv, D, BS, 40)
    meta, opts = AttentionMetadata.from_host(bt, sl, qsl), AttentionOptions(0.25, window, cap)
    ref = paged_attention_ref(q, kc, vc, meta, opts)
    cpu = CPUBackend().paged_attention(q, kc, vc, meta, opts)
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
def test_one_decoding_sequence_alone(window, cap, ctx):
    """Batch-1 decode reads the sequence's own keys (no padded batch, no mask): the
    reference's result, with windows inside the context, past it, and soft caps."""
    rng = np.random.default_rng(ctx)
    q, kc, vc, bt, sl, qsl = _random_paged_batch(rng, [1], [ctx], 8, 2, 16, 4, 20)
    meta, opts = AttentionMetadata(bt, sl, qsl, max_query_len=1, max_seq_len=ctx), AttentionOptions(0.25, window, cap)
    ref = paged_attention_ref(q, kc, vc, meta, opts)
    got = CPUBackend().paged_attention(q, kc, vc, meta, opts)
    np.testing.assert_allclose(got, ref, rtol=1e-5, atol=1e-6)


def test_cpu_batched_decode_matches_ref():
    rng = np.random.default_rng(1)
    q_lens = [1, 1, 7, 1, 1]
    ctx = [1, 40, 7, 17, 33]
    q, kc, vc, bt, sl, qsl = _random_paged_batch(rng, q_lens, ctx, 8, 2, 32, 16, 32)
    meta, opts = AttentionMetadata.from_host(bt, sl, qsl), AttentionOptions(0.2)
    got = CPUBackend().paged_attention(q, kc, vc, meta, opts)
    want = paged_attention_ref(q, kc, vc, meta, opts)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


def test_decode_attention_on_two_threads_is_the_one_thread_result(monkeypatch):
    """21 decoding sequences are 3 chunks of up to 8: dealt to this thread and a pool's,
    each chunk is the same computation, so the result is bitwise the serial one."""
    rng = np.random.default_rng(3)
    ctx = rng.integers(1, 60, 21).tolist()
    q, kc, vc, bt, sl, qsl = _random_paged_batch(rng, [1] * 21, ctx, 8, 2, 16, 4, 400)
    opts = AttentionOptions(0.25)
    serial = decode_attention(q, kc, vc, bt, sl, opts)
    want = paged_attention_ref(q, kc, vc, AttentionMetadata.from_host(bt, sl, qsl), opts)
    np.testing.assert_allclose(serial, want, rtol=1e-5, atol=1e-6)
    ran_on, chunk = [], cpu_backend._decode_chunk

    def recording(q, *args):
        ran_on.append((threading.current_thread().name, len(q)))
        return chunk(q, *args)

    monkeypatch.setattr(cpu_backend, "_decode_chunk", recording)
    with ThreadPoolExecutor(1, thread_name_prefix="pool") as pool:
        got = decode_attention(q, kc, vc, bt, sl, opts, pool=pool, threads=2)
        np.testing.assert_array_equal(got, serial)
        assert sorted(ran_on) == [("MainThread", 5), ("MainThread", 8), ("pool_0", 8)]
        ran_on.clear()
        decode_attention(q[:8], kc, vc, bt[:8], sl[:8], opts, pool=pool, threads=2)
        assert ran_on == [("MainThread", 8)]  # one chunk stays on one thread


def test_cpu_backend_threads_decode_attention_only_while_blas_sleeps(monkeypatch, caplog):
    if cpu_backend.CpuThreads().usable < 2:
        pytest.skip("one usable core: attention has no second thread to use")
    monkeypatch.setattr(cpu_backend, "spin_is_short", lambda: False)
    with caplog.at_level("INFO", logger="rawpage"):
        assert CPUBackend(cpu_threads=2).pool is None
    assert "decode attention and element-wise ops: on one thread (OpenBLAS's workers spin" in caplog.text
    monkeypatch.setattr(cpu_backend, "spin_is_short", lambda: True)
    ran_on, chunk = set(), cpu_backend._decode_chunk
    monkeypatch.setattr(
        cpu_backend, "_decode_chunk", lambda *a: ran_on.add(threading.current_thread().name) or chunk(*a)
    )
    rng = np.random.default_rng(4)
    q, kc, vc, bt, sl, qsl = _random_paged_batch(rng, [1] * 20, rng.integers(1, 40, 20).tolist(), 8, 2, 16, 4, 300)
    meta, opts = AttentionMetadata.from_host(bt, sl, qsl), AttentionOptions(0.25)
    want = paged_attention_ref(q, kc, vc, meta, opts)
    for flag, threads in ((2, {"MainThread", "rawpage-cpu_0"}), (1, {"MainThread"})):
        be, ran_on = CPUBackend(cpu_threads=flag), set()
        be.embedding(np.zeros(20, np.int64), np.zeros((4, 2), np.float32))  # sets the pass's thread count
        got = be.paged_attention(q, kc, vc, meta, opts)
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
        assert ran_on == threads


def test_elementwise_ops_split_many_rows_over_the_threads(monkeypatch):
    """600 rows (over the 512 that pay for a handoff) go half to a pool thread; the results
    are bitwise the one-thread references, on matmul's Fortran-order outputs too."""
    from rawpage.ops.activation import gelu_tanh_and_mul_ref, silu_and_mul_ref
    from rawpage.ops.rms_norm import fused_add_rms_norm_ref
    from rawpage.ops.rope import cos_sin_cache, rope_ref

    if cpu_backend.CpuThreads().usable < 2:
        pytest.skip("one usable core: nothing to split over")
    monkeypatch.setattr(cpu_backend, "spin_is_short", lambda: True)
    be, rng = CPUBackend(cpu_threads=2), np.random.default_rng(5)
    threads, submit = set(), be.pool.submit
    monkeypatch.setattr(be.pool, "submit", lambda fn, *a: submit(lambda *b: threads.add("pool") or fn(*b), *a))
    for T, split in ((600, True), (100, False)):
        threads.clear()
        be.embedding(np.zeros(T, np.int64), np.zeros((4, 2), np.float32))
        x = be.matmul(rng.standard_normal((T, 8), dtype=np.float32), rng.standard_normal((12, 8), dtype=np.float32))
        res = rng.standard_normal((T, 12), dtype=np.float32)
        for got, want in zip(
            be.fused_add_rms_norm(x, res, np.full(12, 0.5, np.float32), 1e-6),
            fused_add_rms_norm_ref(x, res, np.full(12, 0.5, np.float32), 1e-6),
        ):
            np.testing.assert_array_equal(got, want)
        np.testing.assert_array_equal(be.silu_and_mul(x), silu_and_mul_ref(x))
        np.testing.assert_array_equal(be.gelu_tanh_and_mul(x), gelu_tanh_and_mul_ref(x))
        q, k = rng.standard_normal((T, 4, 8), dtype=np.float32), rng.standard_normal((T, 2, 8), dtype=np.float32)
        q2, k2, pos = q.copy(), k.copy(), rng.integers(0, 100, T)
        cs = cos_sin_cache(1.0 / 10000 ** (np.arange(0, 8, 2) / 8), 100)
        be.rope(pos, q, k, cs, True)
        rope_ref(pos, q2, k2, cs, True)
        np.testing.assert_array_equal(q, q2)
        np.testing.assert_array_equal(k, k2)
        assert bool(threads) is split


def test_deal_by_cost_balances_the_parts():
    assert cpu_backend.deal_by_cost([], [], 2) == [[]]
    assert cpu_backend.deal_by_cost(["a"], [5.0], 2) == [["a"]]  # never an empty part
    parts = cpu_backend.deal_by_cost(list("abcde"), [9, 1, 4, 4, 2], 2)
    assert sorted(map(sorted, parts)) == [["a", "b"], ["c", "d", "e"]]  # 10 against 10
    assert cpu_backend.deal_by_cost(list("abc"), [1, 1, 1], 1) == [["a", "b", "c"]]


def test_prefill_attention_of_several_sequences_runs_on_the_threads(monkeypatch):
    """Prefill chunks on two threads, dealt by their query x key counts, BLAS on one
    thread meanwhile; the one decoding sequence among them goes with them (a lone
    decoding sequence needs no batched, padded GEMMs). The reference's result."""
    if cpu_backend.CpuThreads().usable < 2:
        pytest.skip("one usable core: nothing to split over")
    monkeypatch.setattr(cpu_backend, "spin_is_short", lambda: True)
    rng = np.random.default_rng(7)
    q_lens, ctx = [40, 1, 25, 60, 7], [90, 33, 25, 70, 50]
    q, kc, vc, bt, sl, qsl = _random_paged_batch(rng, q_lens, ctx, 8, 2, 16, 4, 200)
    meta, opts = AttentionMetadata.from_host(bt, sl, qsl), AttentionOptions(0.25)
    want = paged_attention_ref(q, kc, vc, meta, opts)
    ran_on, attend, blas_then, backend = [], cpu_backend.prefill_attention, set(), {}

    def recording(q, *args):
        ran_on.append((threading.current_thread().name, len(q)))
        blas_then.add(backend["be"].threads.blas)  # BLAS's threads while the sequences run
        return attend(q, *args)

    monkeypatch.setattr(cpu_backend, "prefill_attention", recording)
    for flag, parts in (
        (2, {"MainThread": [60, 7], "rawpage-cpu_0": [40, 25, 1]}),
        (1, {"MainThread": [60, 40, 25, 7, 1]}),
    ):
        be = backend["be"] = CPUBackend(cpu_threads=flag)
        ran_on.clear()
        blas_then.clear()
        try:
            be.embedding(np.zeros(len(q), np.int64), np.zeros((4, 2), np.float32))
            got = be.paged_attention(q, kc, vc, meta, opts)
            np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
            by_thread = {name: sorted((n for t, n in ran_on if t == name), reverse=True) for name, _ in ran_on}
            assert by_thread == parts  # costs 60 x 70 + 7 x 50 = 4550 against 40 x 90 + 25 x 25 + 1 x 33 = 4258
            assert blas_then == {1}  # two threads: one BLAS thread each; one thread: --cpu-threads 1
            assert be.threads.blas == flag  # the pass's count again after
        finally:
            be.threads.controller.limit(limits=cpu_backend.CpuThreads().usable)


@pytest.mark.parametrize(
    ("rows", "w_bytes", "split"),
    [
        (2, 7 << 20, True),  # SmolLM2's gate_up at batch 2
        (2, 2 << 20, False),  # its q/k/v: the handoff costs more than it saves
        (3, 7 << 20, False),
        (8, 113 << 20, True),  # its LM head at batch 8
        (64, 113 << 20, True),
        (1, 113 << 20, False),  # a GEMV: OpenBLAS threads it well
        (65, 113 << 20, False),
    ],
)
def test_which_gemms_matmul_splits_by_rows(rows, w_bytes, split):
    assert cpu_backend.splits_by_rows(rows, w_bytes) is split


def test_matmul_splits_big_gemms_of_few_rows_over_our_threads(monkeypatch):
    """A GEMM that splits_by_rows picks: W's rows in chunks that this thread and the
    pool's take in turn, BLAS on one thread meanwhile; the others stay OpenBLAS's, on
    the pass's threads. Same products either way."""
    from threadpoolctl import threadpool_info

    if cpu_backend.CpuThreads().usable < 2:
        pytest.skip("one usable core: nothing to split over")
    monkeypatch.setattr(cpu_backend, "spin_is_short", lambda: True)
    monkeypatch.setattr(cpu_backend, "splits_by_rows", lambda rows, w_bytes: rows == 2 and w_bytes > 100_000)
    rng = np.random.default_rng(6)
    w, bias = rng.standard_normal((3000, 64), dtype=np.float32), rng.standard_normal(3000, dtype=np.float32)
    for flag, T, W, split in ((2, 2, w, True), (2, 2, w[:100], False), (2, 3, w, False), (1, 2, w, False)):
        be = CPUBackend(cpu_threads=flag)
        ran_on, submit = set(), be.pool.submit if be.pool else None
        if be.pool:
            monkeypatch.setattr(
                be.pool, "submit", lambda fn, *a, s=submit, r=ran_on: s(lambda *b: r.add("pool") or fn(*b), *a)
            )
        blas, limit = [], be.threads.controller.limit
        monkeypatch.setattr(
            be.threads.controller, "limit", lambda limits, f=limit, b=blas: b.append(limits) or f(limits=limits)
        )
        try:
            be.embedding(np.zeros(T, np.int64), np.zeros((4, 2), np.float32))
            x = rng.standard_normal((T, 64), dtype=np.float32)
            got = be.matmul(x, W, bias[: len(W)])
            np.testing.assert_allclose(got, x @ W.T + bias[: len(W)], rtol=1e-5, atol=1e-5)
            assert got.shape == (T, len(W)) and bool(ran_on) is split
            assert blas == ([flag, 1, flag] if split else [flag])  # the pass's count, one for the split GEMM, back
            if any(i["user_api"] == "blas" for i in threadpool_info()):
                assert {i["num_threads"] for i in threadpool_info() if i["user_api"] == "blas"} == {blas[-1]}
        finally:
            limit(limits=cpu_backend.CpuThreads().usable)


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
