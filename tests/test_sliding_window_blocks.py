"""Blocks that leave a sliding window are released while the sequence runs
(issue 17): block manager rules on fake sequences, then the engine on a tiny
windowed model with a pool far smaller than its sequences."""

import pytest

from rawpage import LLM, SamplingParams
from rawpage.block_manager import BlockManager
from rawpage.config import ModelConfig
from rawpage.rank_setup import kv_cache_window
from rawpage.sequence import NULL_BLOCK
from tests.model_harness import assert_no_leaks
from tests.test_scheduler import make_seq
from tests.test_sharing import run_tracking_peak
from tests.tiny_families import family_config, write_family
from tests.tiny_models import train_tokenizer


def run(bm, seq, n):
    """Schedule n more tokens of seq and mark them computed, as one engine step would."""
    assert bm.append_slots(seq, n)
    seq.num_computed_tokens += n
    bm.cache_full_blocks(seq)


def test_blocks_wholly_before_the_next_tokens_window_are_released():
    bm = BlockManager(32, 4, enable_prefix_caching=False, watermark=0.0, sliding_window=6)
    seq = make_seq(30, 0.0)
    run(bm, seq, 10)  # positions 0..9; the next token (10) sees keys 5..10: block 0 (0..3) is out
    assert seq.block_table[0] != NULL_BLOCK and bm.num_used_blocks == 3
    bm.append_slots(seq, 1)
    assert seq.block_table[0] == NULL_BLOCK and seq.block_table[1] != NULL_BLOCK
    assert bm.num_used_blocks == 2 and bm.num_window_releases == 1
    seq.num_computed_tokens += 1
    run(bm, seq, 19)  # a chunk: releases judged by its first token (11 sees 6..11)
    assert seq.block_table[:1] == [NULL_BLOCK] and NULL_BLOCK not in seq.block_table[1:]
    bm.append_slots(seq, 1)  # token 30 sees 25..30: blocks 0..5 are out
    assert seq.block_table[:6] == [NULL_BLOCK] * 6 and len(seq.block_table) == 8
    assert bm.usage([seq]).blocks_released_by_window == 6 == bm.num_window_releases
    bm.free(seq)
    assert bm.num_free_blocks == 32 and not any(bm.ref_counts)


def test_no_window_releases_nothing():
    bm = BlockManager(32, 4, enable_prefix_caching=False, watermark=0.0)
    seq = make_seq(30, 0.0)
    run(bm, seq, 30)
    bm.append_slots(seq, 1)
    assert NULL_BLOCK not in seq.block_table


def test_fork_swap_and_free_skip_released_entries():
    bm = BlockManager(16, 4, enable_prefix_caching=False, watermark=0.0, num_cpu_blocks=8, sliding_window=4)
    parent, child = make_seq(20, 0.0), make_seq(20, 0.0)
    run(bm, parent, 16)
    bm.append_slots(parent, 1)  # token 16 sees 13..16: blocks 0..2 released
    bm.fork(parent, child)
    assert child.block_table[:3] == [NULL_BLOCK] * 3 and bm.ref_counts[parent.block_table[3]] == 2
    mapping = bm.swap_out(child)
    assert [g for g, _ in mapping] == parent.block_table[3:] and child.cpu_block_table[:3] == [NULL_BLOCK] * 3
    assert bm.can_swap_in(child, 1)
    back = bm.swap_in(child)
    assert len(back) == 2 and child.block_table[:3] == [NULL_BLOCK] * 3 and len(bm.cpu_free) == 8
    bm.free(child)
    bm.free(parent)
    assert bm.num_free_blocks == 16 and not any(bm.ref_counts)


def test_released_blocks_keep_their_prefix_names_and_are_never_published_as_null():
    """A block is named when it fills, before it can leave the window: a later request with
    the same prefix revives it while its content is intact; NULL_BLOCK is never named."""
    bm = BlockManager(16, 4, enable_prefix_caching=True, watermark=0.0, sliding_window=4)
    first = make_seq(13, 0.0)
    bm.allocate(first, [])
    run(bm, first, 12)
    bm.append_slots(first, 1)  # token 12 sees 9..12: blocks 0 and 1 released, still named
    assert first.block_table[:2] == [NULL_BLOCK] * 2
    assert NULL_BLOCK not in bm.prefix_cache.cached.values() and len(bm.prefix_cache.cached) == 3
    second = make_seq(13, 1.0)  # the same 13 prompt tokens
    cached = bm.prefix_cache.match_prefix(second)
    assert len(cached) == 3 and NULL_BLOCK not in cached
    bm.allocate(second, cached)
    assert bm.ref_counts[cached[2]] == 2  # block 2 is still first's too
    bm.free(first)
    bm.free(second)
    assert not any(bm.ref_counts)


def test_only_a_window_in_every_layer_lets_blocks_go():
    assert kv_cache_window(ModelConfig.from_hf(family_config("mistral"))) == 16
    assert kv_cache_window(ModelConfig.from_hf(family_config("gemma2"))) is None  # global layers alternate
    assert kv_cache_window(ModelConfig.from_hf(family_config("gemma3"))) is None
    assert kv_cache_window(ModelConfig.from_hf(family_config("qwen3"))) is None


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    tok, d = train_tokenizer(), tmp_path_factory.mktemp("windowed")
    return {f: write_family(str(d / f), f, tok=tok) for f in ("mistral", "gemma2")}


@pytest.mark.parametrize("device,max_tokens", [("cpu", 120), ("sim", 48)])
def test_long_generation_in_a_tiny_pool_matches_a_large_one(folders, device, max_tokens):
    """Mistral (window 16, blocks of 8): 3 sequences of 12 + 120 tokens would need 17
    blocks each; a pool of 12 holds them all at once, because each holds at most 3,
    and the greedy tokens are the large pool's. On sim, the kernels meet the released
    (NULL_BLOCK) table entries and must never read them."""
    prompts = [{"prompt_token_ids": list(range(5 + i, 17 + i))} for i in range(3)]
    params = SamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=True)
    common = dict(block_size=8, max_model_len=160, enable_prefix_caching=False)
    big = LLM(folders["mistral"], device="cpu", **common)
    _, want = run_tracking_peak(big, prompts, params)
    small = LLM(folders["mistral"], device=device, num_gpu_blocks_override=12, **common)
    peak, got = run_tracking_peak(small, prompts, params)
    assert [list(o.outputs[0].token_ids) for o in got] == [list(o.outputs[0].token_ids) for o in want]
    assert peak <= 3 * 3 + 3  # 3 per sequence, plus the step's new blocks before releases
    assert small.engine.scheduler.num_preemptions == 0
    assert small.engine.block_manager.num_window_releases >= 3 * ((12 + max_tokens - 16) // 8 - 1)
    assert "older ones are released" in small.engine.memory.describe()
    assert_no_leaks(small.engine)


def test_a_model_with_global_layers_releases_nothing(folders):
    llm = LLM(folders["gemma2"], device="cpu", block_size=8, max_model_len=80, kv_cache_memory="1MiB")
    params = SamplingParams(temperature=0, max_tokens=40, ignore_eos=True)
    llm.generate([{"prompt_token_ids": list(range(5, 30))}], params, use_tqdm=False)
    assert llm.engine.block_manager.sliding_window is None
    assert llm.engine.block_manager.num_window_releases == 0


@pytest.mark.parametrize("blocks", [64, 5])
def test_prefix_cache_hits_on_released_blocks_give_the_same_tokens(folders, blocks):
    """The same 40-token prompt twice, one after the other: the second request revives
    the first one's released blocks by name where the pool has not reused them (64
    blocks), or recomputes from where the chain of names breaks (5: all reused); either way its
    greedy tokens are the first one's."""
    llm = LLM(folders["mistral"], device="cpu", block_size=8, max_model_len=120, num_gpu_blocks_override=blocks)
    params = SamplingParams(temperature=0, max_tokens=30, ignore_eos=True)
    prompt = {"prompt_token_ids": list(range(7, 47))}
    first = llm.generate([prompt], params, use_tqdm=False)[0]
    second = llm.generate([prompt], params, use_tqdm=False)[0]
    assert list(second.outputs[0].token_ids) == list(first.outputs[0].token_ids)
    bm = llm.engine.block_manager
    assert (bm.prefix_hits > 0) == (blocks == 64) and bm.num_window_releases > 0
    assert_no_leaks(llm.engine)
