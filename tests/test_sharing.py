"""Sharing KV blocks: parallel sampling, copy-on-write, beam search, prefix caching, waste."""

import numpy as np
import pytest

from rawpage import LLM, SamplingParams
from rawpage.ops.sampling import log_softmax
from tests.model_harness import SingleSequence, assert_no_leaks
from tests.test_engine import GREEDY, random_prompts, tokens
from tools.bench_sharing import copying_forker


def run_tracking_peak(llm, prompts, params):
    """Generate step by step, recording the peak number of KV blocks in use."""
    eng = llm.engine
    for i, p in enumerate(prompts):
        eng.add_request(f"t{i}", p, params)
    peak, finals = 0, {}
    while eng.has_unfinished_requests():
        for out in eng.step():
            if out.finished:
                finals[out.request_id] = out
        peak = max(peak, eng.block_manager.num_used_blocks)
    return peak, [finals[f"t{i}"] for i in range(len(prompts))]


def test_parallel_samples_share_the_prompt(tiny_model_dir):
    prompt = random_prompts(1, 100, 101, seed=11)[0]  # 6 full blocks + 4 tokens
    params = SamplingParams(n=4, temperature=1.0, seed=9, max_tokens=40, ignore_eos=True)
    shared = LLM(tiny_model_dir, enable_prefix_caching=False)
    peak, (out,) = run_tracking_peak(shared, [prompt], params)
    # 140 tokens = 9 blocks per sample: 6 full prompt blocks stored once, 3 own blocks each
    assert peak == 6 + 4 * 3
    assert shared.engine.block_manager.num_cow_copies == 3  # the partial 7th block, for 3 of the 4
    separate = LLM(tiny_model_dir, enable_prefix_caching=False)
    separate.engine.forker = copying_forker(separate.engine)  # the benchmark's comparison point
    peak_separate, (out_separate,) = run_tracking_peak(separate, [prompt], params)
    assert peak_separate == 4 * 9
    # copy-on-write: diverging inside the shared block changes nothing about the tokens
    assert [o.token_ids for o in out.outputs] == [o.token_ids for o in out_separate.outputs]
    assert len({tuple(o.token_ids) for o in out.outputs}) == 4
    assert_no_leaks(shared.engine)
    assert_no_leaks(separate.engine)


def test_greedy_equals_the_single_beam(tiny_model_dir):
    llm = LLM(tiny_model_dir)
    prompts = random_prompts(3, 10, 60, seed=4)
    beam = SamplingParams(n=1, use_beam_search=True, max_tokens=24, ignore_eos=True)
    for p in prompts:
        greedy = tokens(llm.generate(p, GREEDY, use_tqdm=False))[0]
        assert llm.generate(p, beam, use_tqdm=False)[0].outputs[0].token_ids == greedy
    chat = LLM()
    msgs = [{"role": "user", "content": "What is the capital of Japan?"}]
    g = chat.chat(msgs, SamplingParams(temperature=0, max_tokens=20), use_tqdm=False)[0].outputs[0]
    b = chat.chat(msgs, SamplingParams(n=1, use_beam_search=True, max_tokens=20, early_stopping=True), use_tqdm=False)[
        0
    ].outputs[0]
    assert b.token_ids == g.token_ids and b.text == g.text


def reference_beam_search(model, prompt, width, steps):
    """Plain beam search, recomputing every hypothesis from scratch: (cum logprob, tokens) best first."""
    beams = [(0.0, [])]
    for _ in range(steps):
        cands = []
        for cum, toks in beams:
            lp = log_softmax(SingleSequence(model).feed(prompt + toks)[None])[0]
            for t in np.argsort(-lp)[: 2 * width]:
                cands.append((cum + float(lp[t]), toks + [int(t)]))
        beams = sorted(cands, key=lambda c: -c[0])[:width]
    return beams


def test_beam_search_matches_a_plain_reference_and_shares_blocks(tiny_model_dir):
    from rawpage.backends import get_backend
    from rawpage.loader import load_checkpoint
    from rawpage.models.llama import LlamaModel

    ckpt = load_checkpoint(tiny_model_dir)
    model = LlamaModel(ckpt.config, get_backend("cpu"), ckpt.tensors)
    prompt = random_prompts(1, 21, 22, seed=2)[0]["prompt_token_ids"]
    want = reference_beam_search(model, prompt, width=3, steps=6)
    llm = LLM(tiny_model_dir, enable_prefix_caching=False)
    params = SamplingParams(n=3, use_beam_search=True, max_tokens=6, ignore_eos=True, length_penalty=0.0)
    eng = llm.engine
    eng.add_request("b", {"prompt_token_ids": prompt}, params)
    saved, final = 0, None
    while eng.has_unfinished_requests():
        for out in eng.step():
            final = out
        saved = max(saved, eng.kv_usage().blocks_saved_by_sharing)
    got = [(o.cumulative_logprob, o.token_ids) for o in final.outputs]
    assert [t for _, t in got] == [t for _, t in want]
    np.testing.assert_allclose([c for c, _ in got], [c for c, _ in want], rtol=1e-4)
    assert saved >= 2  # beams point at the prompt's blocks rather than holding copies
    assert eng.block_manager.num_cow_copies <= 6 * 2  # at most a partial block per extra beam per step
    assert_no_leaks(eng)


def test_prefix_caching_reuses_a_shared_system_prompt(tiny_model_dir):
    rng = np.random.default_rng(5)
    system = rng.integers(3, 400, 300).tolist()
    prompts = [{"prompt_token_ids": system + rng.integers(3, 400, rng.integers(5, 40)).tolist()} for _ in range(40)]
    off = LLM(tiny_model_dir, enable_prefix_caching=False)
    expected = tokens(off.generate(prompts, GREEDY, use_tqdm=False))
    on = LLM(tiny_model_dir)
    first = on.generate(prompts[0], GREEDY, use_tqdm=False)  # computes and caches the system prompt
    before = on.engine.stats.prompt_tokens_total
    rest = on.generate(prompts[1:], GREEDY, use_tqdm=False)
    assert tokens(first + rest) == expected
    assert all(o.num_cached_tokens == 288 for o in rest)  # 18 full blocks of the 300 shared tokens
    unshared = sum(len(p["prompt_token_ids"]) - 288 for p in prompts[1:])
    assert on.engine.stats.prompt_tokens_total - before == unshared  # only those were computed
    bm = on.engine.block_manager
    assert bm.prefix_hits >= 39 * 288
    assert_no_leaks(on.engine)


def test_reset_prefix_cache_forgets_cached_prefixes(tiny_model_dir):
    """vLLM's LLM.reset_prefix_cache: the next run of a prompt computes all of it. With a
    request running, its blocks stay named unless reset_running_requests preempts it
    first; it then recomputes its tokens and ends with the tokens it would have."""
    prompt = {"prompt_token_ids": np.random.default_rng(7).integers(3, 400, 100).tolist()}
    llm = LLM(tiny_model_dir)
    (first,) = llm.generate(prompt, GREEDY, use_tqdm=False)
    assert llm.generate(prompt, GREEDY, use_tqdm=False)[0].num_cached_tokens == 96
    assert llm.reset_prefix_cache() is True and not llm.engine.block_manager.prefix_cache.cached
    assert llm.generate(prompt, GREEDY, use_tqdm=False)[0].num_cached_tokens == 0
    eng, long = llm.engine, SamplingParams(temperature=0, max_tokens=40, ignore_eos=True)
    eng.add_request("r", prompt, long)
    for _ in range(3):
        eng.step()  # prefilled, decoding: its full blocks are named and held
    assert eng.reset_prefix_cache() is False and eng.block_manager.prefix_cache.cached
    assert eng.reset_prefix_cache(reset_running_requests=True) is True
    assert eng.scheduler.num_preemptions == 1 and not eng.scheduler.running
    outs = []
    while eng.has_unfinished_requests():
        outs += [o for o in eng.step() if o.finished]
    assert outs[0].outputs[0].token_ids == tokens(llm.generate(prompt, long, use_tqdm=False))[0]
    assert first.outputs[0].token_ids == outs[0].outputs[0].token_ids[: len(first.outputs[0].token_ids)]
    assert_no_leaks(eng)


def test_prefix_cache_eviction_under_pressure_keeps_outputs_right(tiny_model_dir):
    rng = np.random.default_rng(6)
    systems = [rng.integers(3, 400, 100).tolist() for _ in range(3)]
    prompts = [{"prompt_token_ids": systems[i % 3] + rng.integers(3, 400, 20).tolist()} for i in range(24)]
    expected = tokens(LLM(tiny_model_dir, enable_prefix_caching=False).generate(prompts, GREEDY, use_tqdm=False))
    small = LLM(tiny_model_dir, num_gpu_blocks_override=28, max_model_len=384)
    got = [tokens(small.generate(p, GREEDY, use_tqdm=False))[0] for p in prompts]  # one at a time: hits and evictions
    assert got == expected
    bm = small.engine.block_manager
    assert bm.prefix_hits > 0 and bm.num_evictions > 0
    assert_no_leaks(small.engine)


@pytest.mark.parametrize("block_size", [16, 32])
def test_waste_stays_under_a_block_per_sequence(tiny_model_dir, block_size):
    llm = LLM(tiny_model_dir, block_size=block_size, enable_prefix_caching=False)
    eng = llm.engine
    for i, p in enumerate(random_prompts(40, 5, 200)):
        eng.add_request(str(i), p, GREEDY)
    worst = 0.0
    while eng.has_unfinished_requests():
        eng.step()
        u, running = eng.kv_usage(), len(eng.scheduler.running)
        if running:
            assert u.waste < block_size * running
            worst = max(worst, u.waste / running)
    print(f"block size {block_size}: worst waste {worst:.1f} slots per sequence")
    assert_no_leaks(eng)
