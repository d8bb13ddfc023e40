"""Prefix-cache isolation (issue 15 B): block names that cannot be forged, and salts."""

import builtins

import numpy as np
import pytest

from rawpage import LLM, SamplingParams
from rawpage.block_hash import block_digest, root_digest
from tests.model_harness import assert_no_leaks

GREEDY = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True)
BS = 16


@pytest.fixture
def llm(tiny_model_dir):
    return LLM(tiny_model_dir, max_model_len=256, block_size=BS)


def _prompts():
    rng = np.random.default_rng(7)
    a = rng.integers(3, 400, 3 * BS + 5).tolist()
    b = rng.integers(3, 400, 3 * BS + 5).tolist()
    b[BS:] = a[BS:]  # same tail, different first block
    return a, b


def test_a_collision_of_the_old_block_names_no_longer_shares_kv(llm, tiny_model_dir, monkeypatch):
    """Blocks used to be named hash((parent, tuple(tokens))). Python's tuple hash is
    unkeyed and invertible step by step: the audit found two different 16-token blocks
    with one name in under 4 minutes of search. A search of ~2**32 is too slow for a
    test, so this test *injects* such a pair: `hash` in the block manager's module maps
    B's first block onto A's. With the old naming, B was served A's KV (and A's answer);
    with SHA-256 names, `hash` is not consulted and B computes its own."""
    a, b = _prompts()
    fresh = LLM(tiny_model_dir, max_model_len=256, block_size=BS, enable_prefix_caching=False)
    b_alone = fresh.generate({"prompt_token_ids": b}, GREEDY, use_tqdm=False)[0].outputs[0].token_ids

    forged = {tuple(b[:BS]): tuple(a[:BS])}

    def colliding_hash(x):
        if isinstance(x, tuple) and len(x) == 2 and isinstance(x[1], tuple):
            x = (x[0], forged.get(x[1], x[1]))
        return builtins.hash(x)

    import rawpage.block_manager as bm_module

    monkeypatch.setattr(bm_module, "hash", colliding_hash, raising=False)
    llm.generate({"prompt_token_ids": a}, GREEDY, use_tqdm=False)
    out = llm.generate({"prompt_token_ids": b}, GREEDY, use_tqdm=False)[0]
    assert out.num_cached_tokens == 0
    assert out.outputs[0].token_ids == b_alone
    assert_no_leaks(llm.engine)


def test_requests_share_blocks_only_within_one_salt(llm):
    a, _ = _prompts()
    first = llm.generate({"prompt_token_ids": a, "cache_salt": "tenant-1"}, GREEDY, use_tqdm=False)[0]
    same = llm.generate({"prompt_token_ids": a, "cache_salt": "tenant-1"}, GREEDY, use_tqdm=False)[0]
    other = llm.generate({"prompt_token_ids": a, "cache_salt": "tenant-2"}, GREEDY, use_tqdm=False)[0]
    unsalted = llm.generate({"prompt_token_ids": a}, GREEDY, use_tqdm=False)[0]
    assert first.num_cached_tokens == 0
    assert same.num_cached_tokens == 3 * BS
    assert other.num_cached_tokens == 0 and unsalted.num_cached_tokens == 0
    assert first.outputs[0].token_ids == same.outputs[0].token_ids == other.outputs[0].token_ids
    assert_no_leaks(llm.engine)


def test_extra_keys_are_tagged_and_length_prefixed():
    assert root_digest(None) == root_digest({}) == root_digest({"cache_salt": None})
    assert root_digest({"cache_salt": "x"}) != root_digest({"lora": "x"})  # vLLM #44701
    assert root_digest({"cache_salt": "ab"}) != root_digest({"cache_salt": "a", "lora": "b"})
    assert root_digest({"a": "b=c"}) != root_digest({"a=b": "c"})
    p = root_digest()
    assert block_digest(p, [1, 2]) != block_digest(p, [2, 1])
    assert block_digest(p, [256]) != block_digest(p, [1, 0])  # ids are fixed-width, not bytes
    assert len(block_digest(p, range(16))) == 32
