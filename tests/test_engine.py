"""The engine end to end: continuous batching, preemption, aborts, stops, and the LLM API."""

import logging

import numpy as np
import pytest

from rawpage import LLM, SamplingParams
from tests.model_harness import assert_no_leaks

GREEDY = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True)


def random_prompts(n, lo, hi, seed=0, vocab=400):
    rng = np.random.default_rng(seed)
    return [{"prompt_token_ids": rng.integers(3, vocab, rng.integers(lo, hi)).tolist()} for _ in range(n)]


def tokens(outs):
    return [o.outputs[0].token_ids for o in outs]


def test_batch_invariance_alone_together_and_under_preemption(tiny_model_dir):
    prompts = random_prompts(40, 5, 200)
    llm = LLM(tiny_model_dir, enable_prefix_caching=False)
    alone = [tokens(llm.generate(p, GREEDY, use_tqdm=False))[0] for p in prompts]
    together = tokens(llm.generate(prompts, GREEDY, use_tqdm=False))
    assert together == alone
    assert_no_leaks(llm.engine)

    # 20 blocks of 16 tokens hold only a couple of these sequences at once
    small = LLM(
        tiny_model_dir,
        num_gpu_blocks_override=20,
        max_num_batched_tokens=64,
        max_model_len=320,
        enable_prefix_caching=False,
    )
    squeezed = tokens(small.generate(prompts, GREEDY, use_tqdm=False))
    assert small.engine.scheduler.num_preemptions >= 10, "the pool was meant to force preemption"
    assert squeezed == alone
    assert_no_leaks(small.engine)


def test_default_model_batch_invariance(default_checkpoint):
    questions = [
        "What is the capital of Japan?",
        "Name a color.",
        "What is 2 + 2?",
        "Say hello in Spanish.",
        "Who wrote Hamlet?",
        "What is water made of?",
        "Give me a fruit.",
        "What day comes after Monday?",
    ]
    convs = [[{"role": "user", "content": q}] for q in questions]
    p = SamplingParams(temperature=0, max_tokens=16)
    llm = LLM()
    alone = [tokens(llm.chat(c, p, use_tqdm=False))[0] for c in convs]
    assert tokens(llm.chat(convs, p, use_tqdm=False)) == alone
    small = LLM(num_gpu_blocks_override=8, max_num_batched_tokens=48, max_model_len=128)
    assert tokens(small.chat(convs, p, use_tqdm=False)) == alone
    assert small.engine.scheduler.num_preemptions > 0
    assert_no_leaks(small.engine)


def test_default_model_answers_tokyo():
    llm = LLM()
    out = llm.chat(
        [{"role": "user", "content": "What is the capital of Japan?"}],
        SamplingParams(temperature=0, max_tokens=20),
        use_tqdm=False,
    )[0].outputs[0]
    assert "Tokyo" in out.text and out.finish_reason == "stop"


def test_stop_string_split_across_tokens_is_caught():
    llm = LLM()
    msgs = [{"role": "user", "content": "What is the capital of Japan?"}]
    plain = llm.chat(msgs, SamplingParams(temperature=0, max_tokens=20), use_tqdm=False)[0].outputs[0]
    assert plain.text.startswith("The capital of Japan is Tokyo")
    tok = llm.get_tokenizer()
    pieces = [tok.decode([t]) for t in plain.token_ids]
    assert " of" in pieces and " Japan" in pieces  # so "of Ja" spans two tokens
    out = llm.chat(msgs, SamplingParams(temperature=0, max_tokens=20, stop=["of Ja"]), use_tqdm=False)[0].outputs[0]
    assert out.text == "The capital " and out.finish_reason == "stop" and out.stop_reason == "of Ja"
    keep = SamplingParams(temperature=0, max_tokens=20, stop="Tokyo", include_stop_str_in_output=True)
    assert llm.chat(msgs, keep, use_tqdm=False)[0].outputs[0].text == "The capital of Japan is Tokyo"


def test_aborts_mid_generation_free_everything(tiny_model_dir):
    llm = LLM(tiny_model_dir, num_gpu_blocks_override=40, max_model_len=640)
    eng = llm.engine
    for i, p in enumerate(random_prompts(10, 20, 80)):
        eng.add_request(str(i), p, SamplingParams(temperature=0.7, max_tokens=50, ignore_eos=True))
    for _ in range(6):
        eng.step()
    assert eng.block_manager.num_used_blocks > 0
    eng.abort_request([str(i) for i in range(0, 10, 2)])
    finished = {}
    while eng.has_unfinished_requests():
        for out in eng.step():
            if out.finished:
                finished[out.request_id] = out
    assert {r for r, o in finished.items() if o.outputs[0].finish_reason == "abort"} == {
        "0",
        "2",
        "4",
        "6",
        "8",
    }
    assert all(len(finished[str(i)].outputs[0].token_ids) == 50 for i in range(1, 10, 2))
    assert_no_leaks(eng)


def test_requests_that_cannot_fit_are_rejected_at_once(tiny_model_dir):
    llm = LLM(tiny_model_dir, max_model_len=160, num_gpu_blocks_override=10)
    with pytest.raises(ValueError, match=r"prompt \(155 tokens\) plus max_tokens \(10\) is 165 tokens.*160"):
        llm.generate({"prompt_token_ids": [5] * 155}, SamplingParams(max_tokens=10), use_tqdm=False)
    with pytest.raises(ValueError, match="empty"):
        llm.generate("", use_tqdm=False)
    with pytest.raises(ValueError, match="out of vocabulary"):
        llm.generate({"prompt_token_ids": [5, 100000]}, use_tqdm=False)
    assert_no_leaks(llm.engine)


def test_seeded_sampling_is_independent_of_the_batch(tiny_model_dir):
    llm = LLM(tiny_model_dir)
    p = SamplingParams(temperature=0.9, top_p=0.95, top_k=50, seed=7, max_tokens=20, ignore_eos=True)
    prompt = random_prompts(1, 30, 31, seed=5)[0]
    alone = tokens(llm.generate(prompt, p, use_tqdm=False))[0]
    others = random_prompts(6, 10, 120, seed=9)
    mixed = llm.generate(
        [*others[:3], prompt, *others[3:]],
        [SamplingParams(temperature=1.0, max_tokens=15)] * 3 + [p] + [SamplingParams(max_tokens=30)] * 3,
        use_tqdm=False,
    )
    assert tokens(mixed)[3] == alone
    p8 = SamplingParams(temperature=0.9, top_p=0.95, top_k=50, seed=8, max_tokens=20, ignore_eos=True)
    other_seed = tokens(llm.generate(prompt, p8, use_tqdm=False))[0]
    assert other_seed != alone


def test_parallel_sampling_and_logprobs(tiny_model_dir):
    llm = LLM(tiny_model_dir)
    p = SamplingParams(n=3, temperature=1.0, seed=3, max_tokens=10, ignore_eos=True, logprobs=2, prompt_logprobs=1)
    out = llm.generate(random_prompts(1, 20, 21)[0], p, use_tqdm=False)[0]
    assert [o.index for o in out.outputs] == [0, 1, 2]
    assert len({tuple(o.token_ids) for o in out.outputs}) == 3  # three different samples
    for o in out.outputs:
        assert len(o.token_ids) == 10 and len(o.logprobs) == 10
        for tok, lp in zip(o.token_ids, o.logprobs):
            assert tok in lp and lp[tok].logprob <= 0 and len(lp) >= 2
        assert o.cumulative_logprob == pytest.approx(sum(lp[t].logprob for t, lp in zip(o.token_ids, o.logprobs)))
    assert len(out.prompt_logprobs) == 20 and out.prompt_logprobs[0] is None
    assert all(out.prompt_token_ids[i] in out.prompt_logprobs[i] for i in range(1, 20))
    assert_no_leaks(llm.engine)


def test_max_tokens_min_tokens_and_lengths(tiny_model_dir):
    llm = LLM(tiny_model_dir, max_model_len=64)
    out = llm.generate(random_prompts(1, 10, 11)[0], SamplingParams(max_tokens=7, ignore_eos=True), use_tqdm=False)
    assert len(out[0].outputs[0].token_ids) == 7 and out[0].outputs[0].finish_reason == "length"
    out = llm.generate(
        random_prompts(1, 60, 61)[0],
        SamplingParams(max_tokens=None, ignore_eos=True),
        use_tqdm=False,
    )
    assert len(out[0].outputs[0].token_ids) == 4  # up to --max-model-len
    eos = llm.engine.model_config.eos_token_ids[0]
    biased = SamplingParams(temperature=0, logit_bias={eos: 100.0}, min_tokens=3, max_tokens=10)
    o = llm.generate(random_prompts(1, 10, 11)[0], biased, use_tqdm=False)[0].outputs[0]
    assert len(o.token_ids) == 4 and o.token_ids[-1] == eos and o.finish_reason == "stop"


def test_stats_are_logged_while_busy(tiny_model_dir, caplog):
    llm = LLM(tiny_model_dir, log_stats_interval=1e-9)
    with caplog.at_level(logging.INFO, logger="rawpage"):
        llm.generate(random_prompts(3, 10, 20), SamplingParams(max_tokens=3), use_tqdm=False)
    line = next(r.getMessage() for r in caplog.records if "KV cache" in r.getMessage())
    assert "running" in line and "waiting" in line and "tok/s" in line


def test_llm_rejects_unknown_keywords():
    with pytest.raises(TypeError, match="max_num_seq"):
        LLM(max_num_seq=4)


def test_pool_too_small_for_max_model_len_says_which_flag(tiny_model_dir):
    from rawpage.memory import OutOfMemoryError

    with pytest.raises(
        OutOfMemoryError,
        match="Lower --max-model-len to 320 or less, or raise --num-gpu-blocks-override to 64",
    ):
        LLM(tiny_model_dir, num_gpu_blocks_override=20)
    with pytest.raises(
        OutOfMemoryError,
        match="Lower --max-model-len to 144 or less, or raise --kv-cache-memory to 2MiB",
    ):
        LLM(tiny_model_dir, kv_cache_memory="300KiB")


@pytest.mark.parametrize("cpu_blocks", [400, 3])  # room for everything / so little that it falls back to recompute
def test_swap_preemption_gives_identical_outputs(tiny_model_dir, cpu_blocks):
    prompts = random_prompts(24, 5, 200, seed=3)
    ref = LLM(tiny_model_dir, enable_prefix_caching=False)
    expected = tokens(ref.generate(prompts, GREEDY, use_tqdm=False))
    block_bytes = 2 * 4 * 16 * 2 * 32 * 4  # K and V x 4 layers x 16 slots x 2 KV heads x 32 dims x float32
    llm = LLM(
        tiny_model_dir,
        num_gpu_blocks_override=20,
        max_model_len=320,
        max_num_batched_tokens=64,
        preemption_mode="swap",
        swap_space=cpu_blocks * block_bytes / 2**30,
        enable_prefix_caching=False,
    )
    assert llm.engine.block_manager.num_cpu_blocks == cpu_blocks
    assert tokens(llm.generate(prompts, GREEDY, use_tqdm=False)) == expected
    sc = llm.engine.scheduler
    assert sc.num_swap_outs > 0 and sc.num_swap_ins == sc.num_swap_outs
    if cpu_blocks == 3:
        assert sc.num_preemptions > sc.num_swap_outs  # some fell back to recompute
    assert_no_leaks(llm.engine)
    assert len(llm.engine.block_manager.cpu_free) == cpu_blocks


@pytest.mark.parametrize("calls", [3, 17, 40, 77])
def test_an_interrupt_inside_a_step_leaves_the_engine_clean(tiny_model_dir, calls):
    """Ctrl-C in `rawpage chat` lands anywhere in a step, even mid-forward: after aborting,
    the next request must come out exactly as on a fresh engine, with no block leaked."""
    prompts = random_prompts(3, 20, 60, seed=8)
    fresh = tokens(LLM(tiny_model_dir).generate(prompts[1], GREEDY, use_tqdm=False))
    llm = LLM(tiny_model_dir)
    eng = llm.engine
    real, count = eng.backend.paged_attention, [0]

    def interrupting(*a, **kw):
        count[0] += 1
        if count[0] == calls:
            raise KeyboardInterrupt
        return real(*a, **kw)

    eng.backend.paged_attention = interrupting
    eng.add_request("a", prompts[0], GREEDY)
    eng.add_request("b", prompts[2], GREEDY)
    with pytest.raises(KeyboardInterrupt):
        while eng.has_unfinished_requests():
            eng.step()
    eng.backend.paged_attention = real
    eng.abort_request(["a", "b"])
    while eng.has_unfinished_requests():
        eng.step()
    assert_no_leaks(eng)
    assert tokens(llm.generate(prompts[1], GREEDY, use_tqdm=False)) == fresh
