"""Recorded forward passes on the CPU kernels (native/graph.c, library.Recording,
backends/cpu.py NativeGraph): a replay makes the recorded calls again on whatever the
arrays hold then; work outside the kernels is refused while recording; and the engine's
decode steps replayed from recordings give the eager engine's tokens."""

from __future__ import annotations

import logging

import numpy as np
import pytest

from rawpage import LLM, SamplingParams
from rawpage.backends import get_backend
from rawpage.backends.base import GraphNotCaptured
from rawpage.decode_graphs import DecodeGraphs, graph_shapes
from rawpage.models.llama import LlamaModel
from rawpage.native import layer_ops
from rawpage.native.library import Arena, NativeLibrary, NotCapturable, recording
from rawpage.ops.layer_ops import rms_norm_ref, silu_and_mul_ref
from tests.kernels.test_gguf_model_sim import quantized_tiny_llama
from tests.tiny_models import TINY_LLAMA, random_tensors, tiny_config, train_tokenizer, write_gguf

BS = 16


def test_a_replay_makes_the_recorded_calls_on_what_the_arrays_hold_now(lib: NativeLibrary):
    rng = np.random.default_rng(0)
    x = rng.standard_normal((3, 64)).astype(np.float32)
    w = rng.standard_normal(64).astype(np.float32)
    gate_up = rng.standard_normal((3, 128)).astype(np.float32)
    with recording(lib) as rec:
        normed = layer_ops.rms_norm(lib, x, w, 1e-6, 2)
        act = layer_ops.silu_and_mul(lib, gate_up, 2)
    assert len(rec.calls) == 2 and rec.temporaries == normed.nbytes + act.nbytes
    x[...] = rng.standard_normal((3, 64))
    gate_up[...] = rng.standard_normal((3, 128))
    for threads in (1, 2):  # a replay's thread count is its own; no result depends on it
        normed[...], act[...] = 0, 0
        rec.replay(threads)
        np.testing.assert_allclose(normed, rms_norm_ref(x, w, 1e-6), rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(act, silu_and_mul_ref(gate_up), rtol=1e-5, atol=1e-6)
    seconds = np.zeros(2)  # a timed replay (tools/profile_step.py) adds each call's time to its slot
    normed[...] = 0
    rec.replay(2, seconds)
    assert rec.op_names() == ["rp_rms_norm", "rp_silu_and_mul"] and (seconds > 0).all()
    np.testing.assert_allclose(normed, rms_norm_ref(x, w, 1e-6), rtol=1e-5, atol=1e-6)


def test_a_recording_reuses_the_bytes_of_temporaries_no_one_holds(lib: NativeLibrary):
    """Six norms in a chain, each input dropped once the next output exists: two slots
    of the arena take turns. A view keeps its temporary's bytes; the replay still gives
    the chain's result, and so does a second recording made in the same arena."""
    rng = np.random.default_rng(3)
    x = rng.standard_normal((2, 64)).astype(np.float32)
    w = (1 + rng.random(64)).astype(np.float32)
    arena = Arena()
    with recording(lib, arena) as rec:
        h, seen = x, []
        for _ in range(6):
            h = layer_ops.rms_norm(lib, h, w, 1e-6, 2)
            seen.append(h.ctypes.data)
        first_row = h[:1]  # a view: h's bytes stay taken while it lives
        del h
        other = layer_ops.rms_norm(lib, x, w, 1e-6, 2)
    assert len(set(seen)) == 2 and seen[0::2] == [seen[0]] * 3 and seen[1::2] == [seen[1]] * 3
    assert other.ctypes.data != first_row.ctypes.data
    x[...] = rng.standard_normal((2, 64))
    want = x
    for _ in range(6):
        want = rms_norm_ref(want, w, 1e-6)
    rec.replay(2)
    np.testing.assert_allclose(first_row, want[:1], rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(other, rms_norm_ref(x, w, 1e-6), rtol=1e-5, atol=1e-6)
    with recording(lib, arena):  # a new recording starts over in the same bytes
        again = layer_ops.rms_norm(lib, x, w, 1e-6, 2)
    assert again.ctypes.data == seen[0] and arena.nbytes == Arena.CHUNK


def test_copies_and_numpy_work_are_refused_while_recording(lib: NativeLibrary):
    backend = get_backend("cpu", cpu_kernels="native")
    x = np.asfortranarray(np.ones((4, 64), np.float32))  # would be copied to C order first
    with pytest.raises(NotCapturable, match="copied"), recording(lib):
        layer_ops.rms_norm(lib, x, np.ones(64, np.float32), 1e-6, 1)
    with pytest.raises(NotCapturable, match="BLAS"), recording(lib):
        backend.matmul(np.ones((2, 8), np.float32), np.ones((4, 8), np.float32))
    with pytest.raises(NotCapturable, match="cannot be replayed"), recording(lib):
        lib.call("rp_pool_selftest", nth=2)  # not an op graph.c knows


def gguf_model_and_cache(qtype: str = "Q4_1"):
    config, tensors = quantized_tiny_llama(qtype)
    backend = get_backend("cpu", cpu_kernels="native")
    model = LlamaModel(config, backend, tensors)
    shape = (16, BS, config.num_kv_heads, config.head_dim)
    rng = np.random.default_rng(1)
    kv = [(rng.standard_normal(shape).astype(np.float32), rng.standard_normal(shape).astype(np.float32))]
    kv = [(k.copy(), v.copy()) for k, v in kv * config.num_layers]
    return model, backend, kv


def test_decode_graphs_record_a_packed_model_and_check_each_recording():
    model, backend, kv = gguf_model_and_cache()
    graphs = DecodeGraphs(model, backend, kv, graph_shapes(4), max_model_len=64, block_size=BS)
    assert graphs.sizes == {1: [1, 2, 4]}
    assert all(g.needs_check for g in graphs.graphs.values())
    assert backend.graph_memory_bytes() > 0


def test_a_pass_that_does_numpy_work_is_caught_by_the_check():
    """Work no guard sees (here, the output scaled in NumPy after the last kernel) would be
    frozen at capture: the replay against a fresh run catches it."""
    model, backend, kv = gguf_model_and_cache()
    forward = model.forward
    model.forward = lambda batch, caches: forward(batch, caches) * np.float32(2.0)
    with pytest.raises(GraphNotCaptured, match="a replay of the 1-sequence step differs from running it"):
        DecodeGraphs(model, backend, kv, [(1, 1)], max_model_len=64, block_size=BS)
    with pytest.raises(GraphNotCaptured, match="BLAS"):
        backend.capture_graph(lambda: backend.matmul(np.ones((1, 8), np.float32), np.ones((2, 8), np.float32)))


@pytest.fixture(scope="module")
def tiny_gguf(tmp_path_factory) -> str:
    cfg = tiny_config(**TINY_LLAMA)
    path = str(tmp_path_factory.mktemp("gguf") / "tiny-q4_1.gguf")
    return write_gguf(path, cfg, random_tensors(cfg, seed=2), train_tokenizer(), qtype="Q4_1")


def test_engine_replays_decode_steps_and_generates_what_eager_does(tiny_gguf, caplog):
    prompts = [{"prompt_token_ids": list(range(3 + i, 30 + 7 * i))} for i in range(6)]
    params = [SamplingParams(temperature=0, max_tokens=5 + 4 * i, ignore_eos=True) for i in range(6)]
    kw = dict(max_num_seqs=8, max_model_len=256, kv_cache_memory="8MiB")
    eager = LLM(tiny_gguf, enforce_eager=True, **kw)
    assert eager.engine.runner.graphs is None
    want = [o.outputs[0].token_ids for o in eager.generate(prompts, params, use_tqdm=False)]
    with caplog.at_level(logging.INFO, logger="rawpage"):
        llm = LLM(tiny_gguf, **kw)
    assert "captured 4 decode graphs (batch sizes 1..8)" in caplog.text
    got = [o.outputs[0].token_ids for o in llm.generate(prompts, params, use_tqdm=False)]
    assert got == want
    replays = llm.engine.runner.graphs.num_replays
    assert replays[8, 1] > 0 and replays[4, 1] > 0 and replays[1, 1] > 0, replays


def test_a_dense_model_on_the_kernels_decodes_eagerly_and_says_so(tiny_model_dir, caplog):
    """Dense float32 weights run in BLAS, which a recording cannot replay."""
    with caplog.at_level(logging.INFO, logger="rawpage"):
        llm = LLM(tiny_model_dir, max_num_seqs=4, max_model_len=64, kv_cache_memory="4MiB")
    assert "decode steps run eagerly: a dense (BLAS)" in caplog.text
    assert llm.engine.runner.graphs is None
    out = llm.generate(["hello"], SamplingParams(max_tokens=4, ignore_eos=True), use_tqdm=False)
    assert len(out[0].outputs[0].token_ids) == 4


def test_speculative_verification_steps_replay_recordings_too(tiny_gguf):
    """n-gram speculation: verification steps (k + 1 query rows a sequence) replay their own
    recordings, and the greedy tokens are those of a plain eager run."""
    from tests.test_decode_graphs import NGRAM3, repetitive_prompts

    prompts, p = repetitive_prompts(4), SamplingParams(temperature=0, max_tokens=16, ignore_eos=True)
    kw = dict(max_num_seqs=4, max_model_len=128, kv_cache_memory="8MiB")
    want = [
        o.outputs[0].token_ids for o in LLM(tiny_gguf, enforce_eager=True, **kw).generate(prompts, p, use_tqdm=False)
    ]
    llm = LLM(tiny_gguf, speculative_config=NGRAM3, **kw)
    assert [o.outputs[0].token_ids for o in llm.generate(prompts, p, use_tqdm=False)] == want
    replays = llm.engine.runner.graphs.num_replays
    assert llm.engine.spec.stats.num_accepted_tokens > 0
    assert sum(n for (_, q), n in replays.items() if q == 4) > 0, replays
