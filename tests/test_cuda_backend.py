"""The cuda backend on a real GPU: gemmEx in every dtype, bfloat16 rounding on the
device, dummy weights, memory sizing by profiling, and CUDA graphs against eager.

Everything here skips where no GPU is visible (and fails where one is but CuPy
cannot use it: tests/gpu_required.py); the same logic is
covered on the CPU by test_cublas_gemm.py, test_memory.py and test_decode_graphs.py.
tools/gpu_check.sh runs this file.
"""

from pathlib import Path

import numpy as np
import pytest

from tests.gpu_required import skip_without_cuda


@pytest.fixture(autouse=True, scope="module")
def _needs_cuda():  # module scope: before the `cupy` fixture imports it
    skip_without_cuda()


TOL = {"float32": 1e-5, "float16": 2e-3, "bfloat16": 1.6e-2}


@pytest.fixture(scope="module")
def cupy():
    import cupy

    return cupy


@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
@pytest.mark.parametrize("T,K,N", [(1, 64, 96), (37, 576, 1536), (256, 4096, 128), (0, 64, 32)])
@pytest.mark.parametrize("bias", [False, True])
def test_gemm_ex_matches_numpy(cupy, dtype, T, K, N, bias):
    from rawpage.backends.cuda import CudaBackend

    b = CudaBackend(dtype)
    rng = np.random.default_rng(0)
    x, w, bb = rng.standard_normal((T, K)), rng.standard_normal((N, K)) / np.sqrt(K), rng.standard_normal(N)
    dx, dw, db = b.asarray(x), b.asarray(w), b.asarray(bb) if bias else None
    got = b.to_numpy(b.matmul(dx, dw, db))
    xr, wr, br = b.to_numpy(dx), b.to_numpy(dw), b.to_numpy(db) if bias else 0.0
    want = xr.astype(np.float64) @ wr.astype(np.float64).T + br
    assert got.shape == (T, N)
    np.testing.assert_allclose(got, want, rtol=TOL[dtype], atol=TOL[dtype] * 4)


def test_gemm_ex_takes_a_view_with_a_row_stride(cupy):
    from rawpage.backends.cuda import CudaBackend

    b = CudaBackend("bfloat16")
    rng = np.random.default_rng(1)
    wide, w = b.asarray(rng.standard_normal((9, 200))), b.asarray(rng.standard_normal((48, 64)))
    x = wide[:, 10:74]  # rows of 64, 200 elements apart
    want = b.to_numpy(x).astype(np.float64) @ b.to_numpy(w).astype(np.float64).T
    np.testing.assert_allclose(b.to_numpy(b.matmul(x, w)), want, rtol=2e-2, atol=5e-2)


def test_bfloat16_rounding_on_device_equals_host(cupy):
    from rawpage.backends.cuda import CudaBackend
    from rawpage.dtypes import bf16_from_f32

    x = np.random.default_rng(2).standard_normal(10000).astype(np.float32) * 1e3
    x[:3] = [np.nan, np.inf, -0.0]
    got = CudaBackend("bfloat16").asarray(x).get()
    np.testing.assert_array_equal(got, bf16_from_f32(x))


def test_uniform_is_deterministic_and_in_range(cupy):
    from rawpage.backends.cuda import CudaBackend

    b = CudaBackend("float16")
    a1, a2, a3 = (b.to_numpy(b.uniform((64, 32), 0.5, s, offset=1.0)) for s in (7, 7, 8))
    np.testing.assert_array_equal(a1, a2)
    assert not np.array_equal(a1, a3)
    assert a1.min() >= 0.5 - 1e-3 and a1.max() <= 1.5 + 1e-3


def test_device_logits_argmax_matches_numpy(cupy):
    from rawpage.backends.cuda import CudaBackend
    from rawpage.device_logits import DeviceLogits

    b = CudaBackend("bfloat16")
    logits = DeviceLogits(b, b.asarray(np.random.default_rng(3).standard_normal((6, 1000))))
    host = logits[np.arange(6)]
    np.testing.assert_array_equal(logits.argmax([0, 1, 2, 3, 4, 5]), host.argmax(-1))
    np.testing.assert_array_equal(logits.argmax([4, 1]), host[[4, 1]].argmax(-1))


def _greedy(tiny_model_dir, **kw):
    """Greedy tokens of 11 prompts. The pool is fixed at 512 blocks unless the caller
    asks for profiling: a tiny model in 90% of a large GPU would be millions of blocks."""
    from rawpage import LLM, SamplingParams

    kw.setdefault("num_gpu_blocks_override", 512)
    llm = LLM(tiny_model_dir, device="cuda", max_model_len=256, **kw)
    prompts = [{"prompt_token_ids": list(range(5 + 7 * i, 25 + 13 * i))} for i in range(11)]
    outs = llm.generate(prompts, SamplingParams(temperature=0, max_tokens=12, ignore_eos=True), use_tqdm=False)
    return llm, [o.outputs[0].token_ids for o in outs]


def test_graphs_replay_what_eager_computes(tiny_model_dir):
    """11 sequences decode as bucket 16 (5 padding rows); the tokens must be the ones
    eager computes, in float32 also the ones the CPU computes."""
    from rawpage import LLM, SamplingParams

    graphs, with_graphs = _greedy(tiny_model_dir, dtype="float32", max_num_seqs=16)
    _, eager = _greedy(tiny_model_dir, dtype="float32", max_num_seqs=16, enforce_eager=True)
    assert graphs.engine.runner.graphs is not None and graphs.engine.runner.graphs.num_replays[16, 1] > 0
    assert with_graphs == eager
    cpu = LLM(tiny_model_dir, device="cpu", max_model_len=256)
    prompts = [{"prompt_token_ids": list(range(5 + 7 * i, 25 + 13 * i))} for i in range(11)]
    outs = cpu.generate(prompts, SamplingParams(temperature=0, max_tokens=12, ignore_eos=True), use_tqdm=False)
    assert [o.outputs[0].token_ids for o in outs] == eager


def test_graphs_in_bfloat16_agree_with_eager(tiny_model_dir):
    _, with_graphs = _greedy(tiny_model_dir, dtype="bfloat16", max_num_seqs=8)
    _, eager = _greedy(tiny_model_dir, dtype="bfloat16", max_num_seqs=8, enforce_eager=True)
    assert with_graphs == eager


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_verification_graphs_replay_what_eager_computes(tiny_model_dir, dtype):
    """Speculative decoding (n-gram, k = 3) on repetitive prompts: verification steps replay
    their graphs (each sequence padded to 4 query tokens: the prefill attention kernel) and
    give eager's greedy tokens; in float32 also the CPU's tokens without speculation."""
    from rawpage import LLM, SamplingParams

    ngram = {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_min": 1, "prompt_lookup_max": 3}
    rng = np.random.default_rng(3)
    units = [rng.integers(3, 400, 4 + i).tolist() for i in range(6)]
    prompts = [{"prompt_token_ids": u * 4 + u[:2]} for u in units]  # prompt lookup finds drafts
    p = SamplingParams(temperature=0, max_tokens=20, ignore_eos=True)

    def greedy(**kw):
        llm = LLM(tiny_model_dir, dtype=dtype, max_model_len=256, num_gpu_blocks_override=512, max_num_seqs=8, **kw)
        return llm, [o.outputs[0].token_ids for o in llm.generate(prompts, p, use_tqdm=False)]

    graphed, with_graphs = greedy(device="cuda", speculative_config=ngram)
    _, eager = greedy(device="cuda", speculative_config=ngram, enforce_eager=True)
    replays = graphed.engine.runner.graphs.num_replays
    assert sum(n for (_, q), n in replays.items() if q == 4) > 0, replays
    assert with_graphs == eager
    if dtype == "float32":
        _, cpu = greedy(device="cpu")
        assert with_graphs == cpu


def test_memory_is_sized_by_profiling(tiny_model_dir, cupy):
    free, total = cupy.cuda.runtime.memGetInfo()
    util = round((total - free + (1 << 30)) / total, 3)  # about 1 GiB for the KV cache
    llm, _ = _greedy(tiny_model_dir, dtype="bfloat16", gpu_memory_utilization=util, num_gpu_blocks_override=None)
    plan = llm.engine.memory
    assert plan.total_bytes == total and plan.utilization == util and plan.activation_bytes > 0
    budget = int(plan.total_bytes * util) - plan.weights_bytes - plan.activation_bytes - plan.other_bytes
    assert 0 <= budget - plan.kv_bytes < plan.bytes_per_block
    assert "device memory" in plan.describe()


def test_dummy_llama_shape_loads_and_generates(tmp_path):
    """A small Llama-3-style dummy model end to end on the GPU, graphs on."""
    import json

    from rawpage import LLM, SamplingParams

    cfg = json.loads((Path(__file__).parent.parent / "tools/configs/llama-3.2-1b/config.json").read_text())
    cfg.update(
        num_hidden_layers=2,
        hidden_size=256,
        intermediate_size=512,
        num_attention_heads=4,
        num_key_value_heads=2,
        vocab_size=1000,
    )
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    llm = LLM(
        str(tmp_path / "config.json"),
        load_format="dummy",
        device="cuda",
        max_model_len=512,
        max_num_seqs=4,
        num_gpu_blocks_override=64,
    )
    out = llm.generate({"prompt_token_ids": [1, 2, 3]}, SamplingParams(max_tokens=5, ignore_eos=True), use_tqdm=False)
    assert len(out[0].outputs[0].token_ids) == 5
