"""The decode-graph bookkeeping, run on the CPU's NumPy path and the simulator, where
Backend.capture_graph records nothing and a replay runs the forward pass again:
bucket choice, padding, the fixed metadata buffer graphs read, and that a padded
replay computes what an unpadded eager step does, for plain decode steps and for
speculative verification steps (k + 1 query tokens a sequence)."""

import numpy as np
import pytest

from rawpage.backends import get_backend
from rawpage.backends.base import Graph
from rawpage.decode_graphs import DecodeGraphs, graph_batch_sizes, graph_shapes, pad_batch, padded_rows, pick_bucket
from rawpage.forward_batch import BatchBuffer, HostBatch
from rawpage.models.llama import LlamaModel
from tests.kernels.test_model_sim import tiny_llama
from tests.model_harness import assert_no_leaks

BS = 16


def test_buckets():
    assert graph_batch_sizes(256) == [1, 2, 4] + list(range(8, 257, 8))
    assert graph_batch_sizes(12) == [1, 2, 4, 8, 12]
    assert graph_batch_sizes(3) == [1, 2, 3]
    assert graph_batch_sizes(1) == [1]
    sizes = graph_batch_sizes(20)
    assert [pick_bucket(sizes, b) for b in (1, 3, 4, 5, 8, 9, 17, 20, 21)] == [1, 4, 4, 8, 8, 16, 20, 20, None]


def test_verification_shapes_are_the_decode_buckets_up_to_512_tokens():
    assert graph_shapes(8) == [(1, 1), (2, 1), (4, 1), (8, 1)]
    shapes = graph_shapes(256, 4)
    assert [s for s, q in shapes if q == 1] == graph_batch_sizes(256)
    assert [s for s, q in shapes if q == 5] == [1, 2, 4] + list(range(8, 97, 8)), "size * 5 <= 512"
    assert [s for s, q in graph_shapes(256, 16) if q == 17] == [1, 2, 4, 8, 16, 24]
    assert graph_shapes(1, 16) == [(1, 1), (1, 17)], "batch 1 always has its verification graph"


def decode_batch(seq_lens: list[int], tables: list[list[int]], tokens: list[int]) -> HostBatch:
    B, width = len(seq_lens), max(map(len, tables))
    bt = np.zeros((B, width), np.int32)
    for i, t in enumerate(tables):
        bt[i, : len(t)] = t
    pos = np.array(seq_lens, np.int32) - 1
    slots = bt[np.arange(B), pos // BS] * BS + pos % BS
    return HostBatch(
        np.array(tokens, np.int32),
        pos,
        slots.astype(np.int32),
        np.array(seq_lens, np.int32),
        np.arange(B + 1, dtype=np.int32),
        np.arange(B, dtype=np.int32),
        bt,
    )


def test_padding_rows_store_nothing_and_attend_to_one_key():
    hb = decode_batch([5, 20], [[3], [7, 2]], [11, 12])
    p = pad_batch(hb, 4, 1, width=8)
    np.testing.assert_array_equal(p.input_ids, [11, 12, 0, 0])
    np.testing.assert_array_equal(p.slot_mapping, [3 * BS + 4, 2 * BS + 3, -1, -1])
    np.testing.assert_array_equal(p.seq_lens, [5, 20, 1, 1])
    np.testing.assert_array_equal(p.query_start_loc, [0, 1, 2, 3, 4])
    np.testing.assert_array_equal(p.logits_indices, [0, 1, 2, 3])
    assert p.block_tables.shape == (4, 8)
    np.testing.assert_array_equal(p.block_tables[:2, :2], [[3, 0], [7, 2]])
    with pytest.raises(ValueError):
        pad_batch(hb, 1, 1, width=8)  # too many sequences for the bucket
    prefill = HostBatch(
        *(np.zeros(3, np.int32) for _ in range(3)),
        np.array([3], np.int32),
        np.array([0, 3], np.int32),
        np.array([2], np.int32),
        np.zeros((1, 1), np.int32),
    )
    with pytest.raises(ValueError):
        pad_batch(prefill, 4, 1, width=8)


def chunk_batch(seq_lens: list[int], tables: list[list[int]], chunks: list[list[int]]) -> HostBatch:
    """Sequence i brings chunks[i] as the last tokens of its seq_lens[i]-token context (a
    verification step: the new token and its drafts); logits for every row."""
    B, width = len(seq_lens), max(map(len, tables))
    bt = np.zeros((B, width), np.int32)
    for i, t in enumerate(tables):
        bt[i, : len(t)] = t
    n = np.array([len(c) for c in chunks], np.int32)
    qsl = np.concatenate([[0], np.cumsum(n)]).astype(np.int32)
    seq = np.repeat(np.arange(B), n)
    pos = (np.array(seq_lens, np.int32)[seq] - n[seq] + np.arange(qsl[-1]) - qsl[seq]).astype(np.int32)
    slots = bt[seq, pos // BS] * BS + pos % BS
    tokens = np.array([t for c in chunks for t in c], np.int32)
    T = len(tokens)
    return HostBatch(tokens, pos, slots.astype(np.int32), np.array(seq_lens, np.int32), qsl, np.arange(T), bt)


def test_verification_padding_puts_padding_rows_before_each_chunk():
    # three sequences with 0, 2 and 1 drafts (chunks of 1, 3, 2 tokens), k = 3: q = 4; the
    # third's first block has left a sliding window (NULL_BLOCK, -1)
    hb = chunk_batch([5, 20, 21], [[3], [7, 2], [-1, 4]], [[11], [12, 13, 14], [15, 16]])
    p = pad_batch(hb, 4, 4, width=8)
    np.testing.assert_array_equal(padded_rows(hb, 4), [3, 5, 6, 7, 10, 11])
    pad = -1
    np.testing.assert_array_equal(p.input_ids.reshape(4, 4), [[0, 0, 0, 11], [0, 12, 13, 14], [0, 0, 15, 16], [0] * 4])
    # each sequence's q rows are the last q positions of its context; the padding sequence's are 0..3
    np.testing.assert_array_equal(
        p.positions.reshape(4, 4), [[1, 2, 3, 4], [16, 17, 18, 19], [17, 18, 19, 20], [0, 1, 2, 3]]
    )
    slots = p.slot_mapping.reshape(4, 4)
    np.testing.assert_array_equal(slots[:, :1], [[pad]] * 4)
    np.testing.assert_array_equal(slots[0], [pad, pad, pad, 3 * BS + 4])
    np.testing.assert_array_equal(slots[1, 1:], [2 * BS + 1, 2 * BS + 2, 2 * BS + 3])
    np.testing.assert_array_equal(slots[2], [pad, pad, 4 * BS + 3, 4 * BS + 4])
    np.testing.assert_array_equal(slots[3], [pad] * 4)
    np.testing.assert_array_equal(p.seq_lens, [5, 20, 21, 4])
    np.testing.assert_array_equal(p.query_start_loc, [0, 4, 8, 12, 16])
    np.testing.assert_array_equal(p.logits_indices, np.arange(16))
    np.testing.assert_array_equal(p.lora_slots, [-1] * 4)
    np.testing.assert_array_equal(p.block_tables[:, :2], [[3, 0], [7, 2], [0, 4], [0, 0]])  # NULL -> block 0
    np.testing.assert_array_equal(pad_batch(hb, 3, 3, width=2).query_start_loc, [0, 3, 6, 9])
    with pytest.raises(ValueError, match="chunks of up to 3 tokens"):
        pad_batch(hb, 4, 2, width=8)  # a chunk longer than q
    with pytest.raises(ValueError):
        pad_batch(chunk_batch([3], [[1]], [[1, 2]]), 1, 4, width=8)  # context 3 < q: a row at position -1


class RecordingBackend:
    """A backend proxy that records captures, in order."""

    def __init__(self, backend):
        self.backend, self.captured = backend, []

    def __getattr__(self, name):
        return getattr(self.backend, name)

    def capture_graph(self, fn):
        graph = Graph(fn)
        self.captured.append(graph.output.shape[0])
        return graph


def model_and_cache(device: str, num_blocks: int = 16, seed: int = 0):
    """device cpu: the NumPy path, whose graphs run the pass again (the native kernels'
    recordings are tests/native/test_graph.py's)."""
    config, tensors = tiny_llama(seed)
    backend = get_backend(device, cpu_kernels="numpy") if device == "cpu" else get_backend(device)
    model = LlamaModel(config, backend, tensors)
    shape = (num_blocks, BS, config.num_kv_heads, config.head_dim)
    kv = [(backend.zeros(shape), backend.zeros(shape)) for _ in range(config.num_layers)]
    rng = np.random.default_rng(seed)
    for k, v in kv:  # a cache full of earlier context
        k[...] = rng.standard_normal(shape).astype(np.float32)
        v[...] = rng.standard_normal(shape).astype(np.float32)
    return model, backend, kv


@pytest.mark.parametrize("device", ["cpu", "sim"])
def test_padded_replay_equals_eager_and_reads_the_fixed_buffer(device):
    model, backend, kv = model_and_cache(device)
    rec = RecordingBackend(backend)
    # max_model_len 1024: the frozen decode launch splits contexts into P = 4 to 16
    # partitions (the simulator's 16 SMs want 64 blocks), so on sim the replays also
    # run the split path and the reduce; every context here fits in its first
    # 64-token partition, and the others are empty.
    seen, attend = [], backend.paged_attention  # the max_seq_len each captured launch is chosen for
    backend.paged_attention = lambda q, kc, vc, meta, opts: (
        seen.append(meta.max_seq_len) or attend(q, kc, vc, meta, opts)
    )
    graphs = DecodeGraphs(model, rec, kv, graph_shapes(8), max_model_len=1024, block_size=BS)
    del backend.paged_attention
    assert rec.captured == [8, 4, 2, 1], "one capture per bucket, largest first"
    assert set(seen) == {1024}, "every capture's attention launch is frozen for the longest context"
    assert graphs.buffer.frozen
    device_buffer = graphs.buffer.device

    steps = [
        decode_batch([5, 20, 33], [[3], [7, 2], [9, 10, 11]], [11, 12, 13]),  # bucket 4, one padding row
        decode_batch([6], [[3]], [14]),  # bucket 1, no padding
        decode_batch([21, 34, 7, 40, 8], [[7, 2], [9, 10, 11], [4], [12, 13, 14], [5]], [1, 2, 3, 4, 5]),  # 8
    ]
    eager_kv = [(k.copy(), v.copy()) for k, v in kv]  # eager runs on its own copy of the cache
    before = [k.copy() for k, _ in kv]
    for hb in steps:
        B = len(hb.seq_lens)
        assert graphs.pick(hb) == (pick_bucket(graphs.sizes[1], B), 1)
        got = backend.to_numpy(graphs.run(hb, graphs.pick(hb)))  # (B, dim): the rows hb asks for
        want = backend.to_numpy(model.forward(BatchBuffer(backend).upload(hb), eager_kv))
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
        padded = backend.to_numpy(graphs.graphs[graphs.pick(hb)].output)  # (bucket, dim)
        assert np.isfinite(padded).all(), "padding rows compute something finite, not garbage"
    written = np.zeros(kv[0][0].shape[:2], bool)  # (NB, BS): the slots the real tokens own
    for hb in steps:
        written.reshape(-1)[hb.slot_mapping] = True
    for (k, v), (ek, ev), k0 in zip(kv, eager_kv, before):
        # The same K/V as eager (to BLAS rounding: a padded batch is a different GEMM shape),
        # and not one slot more: padding rows store nothing.
        np.testing.assert_allclose(k, ek, rtol=1e-5, atol=1e-5)
        np.testing.assert_allclose(v, ev, rtol=1e-5, atol=1e-5)
        np.testing.assert_array_equal(k[~written], k0[~written])
        assert not np.array_equal(k[written], k0[written])
    assert graphs.buffer.device is device_buffer, "the buffer graphs read never moves"
    assert graphs.num_replays == {(1, 1): 1, (2, 1): 0, (4, 1): 1, (8, 1): 1}


def test_only_pure_decode_batches_that_fit_a_bucket_replay():
    model, backend, kv = model_and_cache("cpu")
    graphs = DecodeGraphs(model, backend, kv, graph_shapes(2), max_model_len=32, block_size=BS)
    assert graphs.pick(decode_batch([5, 9], [[1], [2]], [1, 2])) == (2, 1)
    assert graphs.pick(decode_batch([5, 9, 3], [[1], [2], [3]], [1, 2, 3])) is None  # B > largest bucket
    assert graphs.pick(decode_batch([40], [[1, 2, 3]], [1])) is None  # wider than max_model_len allows
    chunk = HostBatch(
        np.zeros(4, np.int32),
        np.arange(4, dtype=np.int32),
        np.arange(4, dtype=np.int32),
        np.array([4], np.int32),
        np.array([0, 4], np.int32),
        np.array([3], np.int32),
        np.zeros((1, 1), np.int32),
    )
    assert graphs.pick(chunk) is None


def test_graph_views_alias_the_metadata_buffer():
    model, backend, kv = model_and_cache("cpu")
    seen = []
    real_forward = model.forward

    def spy(batch, caches):
        seen.append(batch)
        return real_forward(batch, caches)

    model.forward = spy
    graphs = DecodeGraphs(model, backend, kv, [(2, 1)], max_model_len=32, block_size=BS)
    buffer = graphs.buffer
    graphs.run(decode_batch([5], [[1]], [7]), (2, 1))
    for batch in seen:
        for field in ("input_ids", "positions", "slot_mapping", "seq_lens", "block_tables"):
            assert np.shares_memory(getattr(batch, field), buffer.device)
    assert seen[-1].input_ids[0] == 7, "the replay read this step's token from the shared buffer"
    with pytest.raises(RuntimeError, match="captured graphs"):
        buffer.upload(decode_batch([5] * 3, [[1]] * 3, [1] * 3))  # bigger than bucket 2: would move it


def test_engine_with_graphs_generates_what_eager_does(tiny_model_dir, monkeypatch):
    """The whole engine on the CPU with the graph path switched on: prefill chunks run
    eagerly, decode steps replay, and the tokens are the eager engine's."""
    from rawpage import LLM, SamplingParams
    from rawpage.backends.cpu import CPUBackend

    prompts = [{"prompt_token_ids": list(range(3 + i, 40 + 9 * i))} for i in range(6)]
    params = [SamplingParams(temperature=0, max_tokens=6 + 3 * i, ignore_eos=True) for i in range(6)]
    eager = LLM(tiny_model_dir, max_num_seqs=8, max_model_len=256, cpu_kernels="numpy")
    want = [o.outputs[0].token_ids for o in eager.generate(prompts, params, use_tqdm=False)]
    monkeypatch.setattr(CPUBackend, "supports_graphs", True)
    llm = LLM(tiny_model_dir, max_num_seqs=8, max_model_len=256, max_num_batched_tokens=64, cpu_kernels="numpy")
    runner = llm.engine.runner
    assert runner.graphs is not None and runner.graphs.sizes == {1: [1, 2, 4, 8]}
    got = [o.outputs[0].token_ids for o in llm.generate(prompts, params, use_tqdm=False)]
    assert got == want
    replays = runner.graphs.num_replays
    assert replays[8, 1] > 0 and replays[4, 1] > 0, f"batches shrink as requests finish: {replays}"
    off = LLM(tiny_model_dir, max_num_seqs=8, max_model_len=256, enforce_eager=True, cpu_kernels="numpy")
    assert off.engine.runner.graphs is None


def test_graphs_are_the_default_on_cuda():
    """Issue 11: decode graphs on unless --enforce-eager (the engine checks both)."""
    from rawpage.backends.cuda import CudaBackend
    from rawpage.engine_args import EngineArgs

    assert CudaBackend.supports_graphs and not EngineArgs().enforce_eager


VERIFY_SHAPES = [(1, 1), (2, 1), (4, 1), (1, 4), (2, 4), (4, 4)]  # decode, and k = 3


def verification_steps() -> list[HostBatch]:
    """Verification steps with mixed draft counts (0..3), a pure decode step, and a short
    prefill tail whose engine asks only its last row (a gather of the padded rows)."""
    tail = chunk_batch([12, 30], [[5], [6, 8]], [[21, 22, 23], [24]])
    tail.logits_indices = np.array([2, 3], np.int32)
    return [
        chunk_batch([5, 20, 33], [[3], [7, 2], [9, 10, 11]], [[11], [12, 13, 14], [15, 16, 17, 18]]),  # bucket 4
        chunk_batch([9], [[4]], [[19, 20]]),  # bucket 1
        decode_batch([21, 34], [[7, 2], [9, 10, 11]], [1, 2]),  # a plain decode: the q = 1 graphs
        tail,
        chunk_batch([6, 40], [[12], [12, 13, 14]], [[1], [2]]),  # no drafts this step: a plain decode too
    ]


@pytest.mark.parametrize("device", ["cpu", "sim"])
def test_verification_replay_gives_the_eager_logits(device):
    """The hidden states and logits of every real row, and the K/V cache, as an eager step's."""
    model, backend, kv = model_and_cache(device)
    rec = RecordingBackend(backend)
    graphs = DecodeGraphs(model, rec, kv, VERIFY_SHAPES, max_model_len=256, block_size=BS)
    assert rec.captured == [16, 8, 4, 4, 2, 1], "largest first, by tokens (4 x 4 = 16 rows down to 1)"
    eager_kv = [(k.copy(), v.copy()) for k, v in kv]
    before = [k.copy() for k, _ in kv]
    steps = verification_steps()
    for hb in steps:
        hidden = graphs.run(hb, graphs.pick(hb))  # (N, dim)
        want = model.forward(BatchBuffer(backend).upload(hb), eager_kv)
        np.testing.assert_allclose(backend.to_numpy(hidden), backend.to_numpy(want), rtol=1e-5, atol=1e-5)
        got_logits, want_logits = (backend.to_numpy(model.compute_logits(h)) for h in (hidden, want))
        np.testing.assert_allclose(got_logits, want_logits, rtol=1e-5, atol=1e-5)
        np.testing.assert_array_equal(got_logits.argmax(-1), want_logits.argmax(-1))
    assert graphs.num_replays == {(1, 1): 0, (2, 1): 2, (4, 1): 0, (1, 4): 1, (2, 4): 1, (4, 4): 1}
    written = np.zeros(kv[0][0].shape[:2], bool)  # (NB, BS)
    for hb in steps:
        written.reshape(-1)[hb.slot_mapping] = True
    for (k, v), (ek, ev), k0 in zip(kv, eager_kv, before):
        np.testing.assert_allclose(k, ek, rtol=1e-5, atol=1e-5)
        np.testing.assert_allclose(v, ev, rtol=1e-5, atol=1e-5)
        np.testing.assert_array_equal(k[~written], k0[~written])  # padding rows store nothing


def test_only_steps_that_fit_a_verification_shape_replay():
    model, backend, kv = model_and_cache("cpu")
    graphs = DecodeGraphs(model, backend, kv, VERIFY_SHAPES, max_model_len=64, block_size=BS)
    assert graphs.pick(chunk_batch([9, 30], [[1], [2, 3]], [[1, 2, 3, 4], [5]])) == (2, 4)
    assert graphs.pick(chunk_batch([9] * 3, [[1]] * 3, [[1, 2]] * 3)) == (4, 4)
    assert graphs.pick(chunk_batch([9], [[1]], [[1, 2, 3, 4, 5]])) is None  # more than k drafts: a chunk
    assert graphs.pick(chunk_batch([9] * 5, [[1]] * 5, [[1, 2]] * 5)) is None  # more sequences than any bucket
    assert graphs.pick(chunk_batch([3, 30], [[1], [2, 3]], [[1, 2], [5]])) is None  # context 3 < q = 4
    assert graphs.pick(chunk_batch([70], [[1, 2, 3, 4, 5]], [[1, 2]])) is None  # wider than max_model_len allows


def repetitive_prompts(n: int) -> list[dict]:
    rng = np.random.default_rng(3)
    units = [rng.integers(3, 400, 4 + i).tolist() for i in range(n)]
    return [{"prompt_token_ids": u * 4 + u[:2]} for u in units]  # prompt lookup finds drafts


NGRAM3 = {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_min": 1, "prompt_lookup_max": 3}


@pytest.mark.parametrize("pool", ["roomy", "preempting"])
def test_greedy_speculation_with_graphs_gives_the_plain_tokens(tiny_model_dir, monkeypatch, caplog, pool):
    """The whole engine on the CPU with graphs forced on and n-gram speculation: verification
    steps replay their graphs, and the greedy tokens are those of a plain run without
    speculation; also with chunked prefill and a pool small enough to force preemption."""
    import logging

    from rawpage import LLM, SamplingParams
    from rawpage.backends.cpu import CPUBackend

    prompts = repetitive_prompts(6)
    params = [SamplingParams(temperature=0, max_tokens=12 + 3 * i, ignore_eos=True) for i in range(6)]
    plain = LLM(tiny_model_dir, max_num_seqs=8, max_model_len=256, cpu_kernels="numpy")
    want = [o.outputs[0].token_ids for o in plain.generate(prompts, params, use_tqdm=False)]
    monkeypatch.setattr(CPUBackend, "supports_graphs", True)  # the NumPy path's Graph runs the pass again
    kw = dict(max_model_len=256, cpu_kernels="numpy")
    if pool == "preempting":  # 12 blocks of 16 tokens for 6 sequences of up to 65; prefill in chunks of 40
        kw = dict(max_model_len=128, num_gpu_blocks_override=12, max_num_batched_tokens=40, cpu_kernels="numpy")
    with caplog.at_level(logging.INFO, logger="rawpage"):
        llm = LLM(tiny_model_dir, max_num_seqs=8, speculative_config=NGRAM3, **kw)
    assert "4 decode graphs (batch sizes 1..8) and 4 verification graphs (4 query tokens" in caplog.text
    graphs = llm.engine.runner.graphs
    assert graphs.sizes == {1: [1, 2, 4, 8], 4: [1, 2, 4, 8]}
    got = [o.outputs[0].token_ids for o in llm.generate(prompts, params, use_tqdm=False)]
    assert got == want
    assert llm.engine.spec.stats.num_accepted_tokens > 0
    assert (llm.engine.scheduler.num_preemptions > 0) == (pool == "preempting")
    assert_no_leaks(llm.engine)
    verified = {shape: n for shape, n in graphs.num_replays.items() if shape[1] == 4 and n}
    assert verified and sum(verified.values()) > 3, f"verification steps replayed: {graphs.num_replays}"


def test_sim_engine_replays_verification_graphs(tiny_model_dir, monkeypatch):
    """The engine on `--device sim` (our CUDA kernels: the verification graphs run the prefill
    attention kernel on the padded chunks) with graphs forced on: the cpu's plain tokens."""
    from rawpage import LLM, SamplingParams
    from rawpage.backends.sim import SimBackend

    prompts, p = repetitive_prompts(3), SamplingParams(temperature=0, max_tokens=10, ignore_eos=True)
    want = [o.outputs[0].token_ids for o in LLM(tiny_model_dir).generate(prompts, p, use_tqdm=False)]
    monkeypatch.setattr(SimBackend, "supports_graphs", True)
    sim = LLM(tiny_model_dir, device="sim", speculative_config=NGRAM3, max_num_seqs=4, max_model_len=128)
    assert [o.outputs[0].token_ids for o in sim.generate(prompts, p, use_tqdm=False)] == want
    replays = sim.engine.runner.graphs.num_replays
    assert sum(n for (_, q), n in replays.items() if q == 4) > 0, replays


@pytest.mark.parametrize("device", ["cpu", "sim"])
def test_verification_graphs_under_a_sliding_window(tmp_path, monkeypatch, device):
    """A tiny Mistral (window 16 in every layer) releases blocks as sequences run; the padding
    rows of a verification graph look up to k positions further back than the real rows, into
    released (NULL) table entries, which the padded table maps to block 0. Greedy tokens stay
    the plain run's."""
    from rawpage import LLM, SamplingParams
    from rawpage.backends.cpu import CPUBackend
    from rawpage.backends.sim import SimBackend
    from tests.tiny_families import write_family

    folder = write_family(str(tmp_path / "mistral"), "mistral")
    prompts, p = repetitive_prompts(3), SamplingParams(temperature=0, max_tokens=24, ignore_eos=True)
    kernels = dict(cpu_kernels="numpy")  # the NumPy path's Graph runs the pass again (and is sim's reference)
    want = [o.outputs[0].token_ids for o in LLM(folder, **kernels).generate(prompts, p, use_tqdm=False)]
    monkeypatch.setattr(CPUBackend if device == "cpu" else SimBackend, "supports_graphs", True)
    kw = dict(speculative_config=NGRAM3, max_num_seqs=4, max_model_len=128, **(kernels if device == "cpu" else {}))
    llm = LLM(folder, device=device, **kw)
    assert [o.outputs[0].token_ids for o in llm.generate(prompts, p, use_tqdm=False)] == want
    assert llm.engine.block_manager.num_window_releases > 0
    replays = llm.engine.runner.graphs.num_replays
    assert sum(n for (_, q), n in replays.items() if q == 4) > 0, replays
