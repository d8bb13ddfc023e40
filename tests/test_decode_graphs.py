"""The decode-graph bookkeeping, run on the CPU and the simulator, where
Backend.capture_graph records nothing and a replay runs the forward pass again:
bucket choice, padding, the fixed metadata buffer graphs read, and that a padded
replay computes what an unpadded eager step does."""

import numpy as np
import pytest

from rawpage.backends import get_backend
from rawpage.backends.base import Graph
from rawpage.batch_buffer import BatchBuffer, HostBatch
from rawpage.decode_graphs import DecodeGraphs, graph_batch_sizes, pad_decode_batch, pick_bucket
from rawpage.models.llama import LlamaModel
from tests.kernels.test_model_sim import tiny_llama

BS = 16


def test_buckets():
    assert graph_batch_sizes(256) == [1, 2, 4] + list(range(8, 257, 8))
    assert graph_batch_sizes(12) == [1, 2, 4, 8, 12]
    assert graph_batch_sizes(3) == [1, 2, 3]
    assert graph_batch_sizes(1) == [1]
    sizes = graph_batch_sizes(20)
    assert [pick_bucket(sizes, b) for b in (1, 3, 4, 5, 8, 9, 17, 20, 21)] == [1, 4, 4, 8, 8, 16, 20, 20, None]


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
    p = pad_decode_batch(hb, 4, width=8)
    np.testing.assert_array_equal(p.input_ids, [11, 12, 0, 0])
    np.testing.assert_array_equal(p.slot_mapping, [3 * BS + 4, 2 * BS + 3, -1, -1])
    np.testing.assert_array_equal(p.seq_lens, [5, 20, 1, 1])
    np.testing.assert_array_equal(p.query_start_loc, [0, 1, 2, 3, 4])
    np.testing.assert_array_equal(p.logits_indices, [0, 1, 2, 3])
    assert p.block_tables.shape == (4, 8)
    np.testing.assert_array_equal(p.block_tables[:2, :2], [[3, 0], [7, 2]])
    with pytest.raises(ValueError):
        pad_decode_batch(hb, 1, width=8)  # too many sequences for the bucket
    prefill = HostBatch(
        *(np.zeros(3, np.int32) for _ in range(3)),
        np.array([3], np.int32),
        np.array([0, 3], np.int32),
        np.array([2], np.int32),
        np.zeros((1, 1), np.int32),
    )
    with pytest.raises(ValueError):
        pad_decode_batch(prefill, 4, width=8)


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
    config, tensors = tiny_llama(seed)
    backend = get_backend(device)
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
    graphs = DecodeGraphs(model, rec, kv, [1, 2, 4, 8], max_model_len=1024, block_size=BS)
    assert rec.captured == [8, 4, 2, 1], "one capture per bucket, largest first"
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
        assert graphs.can_run(hb)
        got = backend.to_numpy(graphs.run(hb))
        B = len(hb.seq_lens)
        assert got.shape[0] == pick_bucket(graphs.sizes, B)
        want = backend.to_numpy(model.forward(BatchBuffer(backend).upload(hb), eager_kv))
        np.testing.assert_allclose(got[:B], want, rtol=1e-5, atol=1e-5)
        assert np.isfinite(got).all(), "padding rows compute something finite, not garbage"
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
    assert graphs.num_replays == {1: 1, 2: 0, 4: 1, 8: 1}


def test_only_pure_decode_batches_that_fit_a_bucket_replay():
    model, backend, kv = model_and_cache("cpu")
    graphs = DecodeGraphs(model, backend, kv, [1, 2], max_model_len=32, block_size=BS)
    assert graphs.can_run(decode_batch([5, 9], [[1], [2]], [1, 2]))
    assert not graphs.can_run(decode_batch([5, 9, 3], [[1], [2], [3]], [1, 2, 3]))  # B > largest bucket
    assert not graphs.can_run(decode_batch([40], [[1, 2, 3]], [1]))  # wider than max_model_len allows
    chunk = HostBatch(
        np.zeros(4, np.int32),
        np.arange(4, dtype=np.int32),
        np.arange(4, dtype=np.int32),
        np.array([4], np.int32),
        np.array([0, 4], np.int32),
        np.array([3], np.int32),
        np.zeros((1, 1), np.int32),
    )
    assert not graphs.can_run(chunk)


def test_graph_views_alias_the_metadata_buffer():
    model, backend, kv = model_and_cache("cpu")
    seen = []
    real_forward = model.forward

    def spy(batch, caches):
        seen.append(batch)
        return real_forward(batch, caches)

    model.forward = spy
    graphs = DecodeGraphs(model, backend, kv, [2], max_model_len=32, block_size=BS)
    buffer = graphs.buffer
    graphs.run(decode_batch([5], [[1]], [7]))
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
    eager = LLM(tiny_model_dir, max_num_seqs=8, max_model_len=256)
    want = [o.outputs[0].token_ids for o in eager.generate(prompts, params, use_tqdm=False)]
    monkeypatch.setattr(CPUBackend, "supports_graphs", True)
    llm = LLM(tiny_model_dir, max_num_seqs=8, max_model_len=256, max_num_batched_tokens=64)
    runner = llm.engine.runner
    assert runner.graphs is not None and runner.graphs.sizes == [1, 2, 4, 8]
    got = [o.outputs[0].token_ids for o in llm.generate(prompts, params, use_tqdm=False)]
    assert got == want
    replays = runner.graphs.num_replays
    assert replays[8] > 0 and replays[4] > 0, f"batches shrink as requests finish: {replays}"
    off = LLM(tiny_model_dir, max_num_seqs=8, max_model_len=256, enforce_eager=True)
    assert off.engine.runner.graphs is None


def test_graphs_are_the_default_on_cuda():
    """Issue 11: decode graphs on unless --enforce-eager (the engine checks both)."""
    from rawpage.backends.cuda import CudaBackend
    from rawpage.engine_args import EngineArgs

    assert CudaBackend.supports_graphs and not EngineArgs().enforce_eager
