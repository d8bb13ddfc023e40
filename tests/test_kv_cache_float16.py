"""--kv-cache-dtype float16 on the CPU (issue 30, item 5): float16 cache arrays, twice
the blocks of the float32 cache in the same budget, the NumPy attention reading them
as float32, and greedy tokens that follow the float32 cache."""

import numpy as np
import pytest

from rawpage import LLM, SamplingParams
from tests.test_engine import random_prompts, tokens

GREEDY = SamplingParams(temperature=0, max_tokens=32, ignore_eos=True)


def test_greedy_tokens_follow_the_float32_cache(tiny_model_dir):
    # Prompts of 5-120 tokens: prefills in one chunk, decodes batched together. A float16
    # cache moves K and V by ~5e-4 relative: a near-tie between the top two logits may
    # flip once, after which a text parts, so ask for most tokens, not all.
    prompts = random_prompts(8, 5, 120, seed=3)
    want = tokens(LLM(tiny_model_dir, device="cpu", kv_cache_memory="4MiB").generate(prompts, GREEDY, use_tqdm=False))
    llm = LLM(tiny_model_dir, device="cpu", kv_cache_memory="4MiB", kv_cache_dtype="float16")
    got = tokens(llm.generate(prompts, GREEDY, use_tqdm=False))
    k, v = llm.engine.runner.kv_caches[0]
    assert k.dtype == v.dtype == np.float16
    same = [sum(a == b for a, b in zip(w, g)) for w, g in zip(want, got)]
    assert sum(same) >= 0.95 * sum(map(len, want)), same  # measured: 255 of 256


def test_the_memory_plan_counts_two_byte_elements(tiny_model_dir):
    plain = LLM(tiny_model_dir, device="cpu", kv_cache_memory="4MiB").engine.memory
    half = LLM(tiny_model_dir, device="cpu", kv_cache_memory="4MiB", kv_cache_dtype="float16").engine.memory
    assert plain.bytes_per_block == 2 * half.bytes_per_block
    assert half.num_blocks == 2 * plain.num_blocks
    assert "KV cache dtype float16: 2 bytes an element" in half.describe()


def test_float16_is_refused_off_the_cpu(tiny_model_dir):
    with pytest.raises(ValueError, match="runs on --device cpu only, not sim"):
        LLM(tiny_model_dir, device="sim", kv_cache_memory="4MiB", kv_cache_dtype="float16")


@pytest.fixture(scope="module")
def tiny_gguf(tmp_path_factory):
    from tests.tiny_models import TINY_LLAMA, random_tensors, tiny_config, train_tokenizer, write_gguf

    cfg = tiny_config(**TINY_LLAMA)
    return write_gguf(
        str(tmp_path_factory.mktemp("gguf") / "m.gguf"), cfg, random_tensors(cfg, seed=1), train_tokenizer()
    )


@pytest.mark.parametrize(
    ("model", "kwargs", "want"),
    [
        ("gguf", {}, np.float16),  # auto: a GGUF's checkpoint dtype is float16, as llama.cpp's cache
        ("gguf", {"dtype": "float32"}, np.float32),  # asked for float32
        ("folder", {}, np.float32),  # a float32 checkpoint
        ("folder", {"kv_cache_dtype": "float16"}, np.float16),
    ],
)
def test_auto_takes_float16_for_a_float16_checkpoint(tiny_gguf, tiny_model_dir, model, kwargs, want):
    llm = LLM(tiny_gguf if model == "gguf" else tiny_model_dir, device="cpu", kv_cache_memory="4MiB", **kwargs)
    k, v = llm.engine.runner.kv_caches[0]
    assert k.dtype == v.dtype == want
    assert ("KV cache dtype float16" in llm.engine.memory.describe()) == (want == np.float16)
