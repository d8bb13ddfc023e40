"""Speculative decoding (rawpage/spec_decode/): greedy outputs are exactly the plain
greedy outputs, sampled outputs keep the target distribution, and no KV block leaks or
is published in the prefix cache holding a rejected draft."""

import json
import logging
import math
from types import SimpleNamespace

import numpy as np
import pytest

from rawpage import LLM, SamplingParams
from rawpage.spec_decode.config import SpeculativeConfig
from rawpage.spec_decode.ngram import ngram_lookup
from rawpage.spec_decode.rejection import greedy_accept, rejection_sample
from tests.model_harness import SingleSequence, assert_no_leaks

NGRAM = {"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_min": 1, "prompt_lookup_max": 3}
GREEDY = SamplingParams(temperature=0, max_tokens=40, ignore_eos=True)


def chisquare_p(counts: np.ndarray, expected: np.ndarray) -> float:
    """Pearson's chi-squared test: P(X >= statistic), X ~ chi2(bins - 1)."""
    x = float(((counts - expected) ** 2 / expected).sum()) / 2
    a = (len(counts) - 1) / 2
    # regularized lower incomplete gamma P(a, x) by its series; the p-value is 1 - P
    term = total = 1 / a
    n = 1
    while term > 1e-17 * total:
        term *= x / (a + n)
        total += term
        n += 1
    return max(0.0, 1 - math.exp(a * math.log(x) - x - math.lgamma(a)) * total) if x > 0 else 1.0


def kstest_uniform_p(samples: list[float]) -> float:
    """Kolmogorov-Smirnov against Uniform(0, 1), with the asymptotic distribution."""
    x, n = np.sort(samples), len(samples)
    d = max((np.arange(1, n + 1) / n - x).max(), (x - np.arange(n) / n).max())
    lam = (np.sqrt(n) + 0.12 + 0.11 / np.sqrt(n)) * d
    k = np.arange(1, 101)
    return float(np.clip(2 * ((-1.0) ** (k - 1) * np.exp(-2 * k**2 * lam**2)).sum(), 0, 1))


def prompts20():
    """Random prompts and repetitive ones (a pattern repeated, as in editing a given text)."""
    rng = np.random.default_rng(7)
    out = [rng.integers(3, 400, rng.integers(4, 60)).tolist() for _ in range(10)]
    for i in range(10):
        unit = rng.integers(3, 400, 3 + i).tolist()
        out.append(unit * (2 + i % 4) + unit[: i % 3])
    return [{"prompt_token_ids": p} for p in out]


def tokens(outs):
    return [c.token_ids for o in outs for c in o.outputs]


def assert_no_draft_leaks(llm):
    assert_no_leaks(llm.engine)
    proposer = llm.engine.spec.proposer
    if hasattr(proposer, "block_manager"):  # a draft model: its own pool, released at the next step
        llm.engine.step()
        bm = proposer.block_manager
        assert not proposer.states and bm.num_free_blocks == bm.num_blocks


@pytest.fixture(scope="module")
def plain(tiny_model_dir):
    llm = LLM(tiny_model_dir, enable_prefix_caching=False)
    return [tokens(llm.generate(p, GREEDY, use_tqdm=False))[0] for p in prompts20()]


@pytest.fixture(scope="module")
def other_tiny_dir(tmp_path_factory):
    """A second random model with the same tokenizer and vocabulary: a poor draft."""
    from tests.tiny_models import random_tensors, tiny_config, train_tokenizer, write_hf_folder

    cfg = tiny_config(
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=32,
        max_position_embeddings=1024,
    )
    return write_hf_folder(str(tmp_path_factory.mktemp("draft") / "hf"), cfg, random_tensors(cfg, 5), train_tokenizer())


def spec_configs(tiny_dir, other_dir):
    return {
        "ngram": NGRAM,
        "self_draft": {"model": tiny_dir, "num_speculative_tokens": 3},
        "other_draft": {"model": other_dir, "num_speculative_tokens": 2},
    }


@pytest.mark.parametrize("which", ["ngram", "self_draft", "other_draft"])
def test_greedy_is_exactly_plain_greedy_alone_batched_and_preempted(tiny_model_dir, other_tiny_dir, plain, which):
    spec = spec_configs(tiny_model_dir, other_tiny_dir)[which]
    llm = LLM(tiny_model_dir, speculative_config=spec, enable_prefix_caching=False)
    prompts = prompts20()
    assert [tokens(llm.generate(p, GREEDY, use_tqdm=False))[0] for p in prompts] == plain
    assert_no_draft_leaks(llm)
    s = llm.engine.spec.stats
    assert s.num_draft_tokens > 50
    if which == "other_draft":  # a random draft, rarely right (it backs off, adaptive.py): rejection and rollback
        assert s.num_accepted_tokens < s.num_draft_tokens / 2
    else:
        assert s.num_accepted_tokens > 0
    # batch 16 in a pool of 12 blocks of 16 tokens: preemption (recompute, then swap)
    for mode in ("recompute", "swap"):
        small = LLM(
            tiny_model_dir,
            speculative_config=spec,
            num_gpu_blocks_override=12,
            max_num_seqs=16,
            max_model_len=128,
            preemption_mode=mode,
            swap_space=0.01,
        )
        assert tokens(small.generate(prompts, GREEDY, use_tqdm=False)) == plain
        assert small.engine.scheduler.num_preemptions > 0, "the pool was meant to force preemption"
        assert_no_draft_leaks(small)
    if which == "self_draft":
        assert s.acceptance_rate > 0.9  # a model drafting for itself agrees with itself


def test_speculation_accepts_on_repetitive_text(tiny_model_dir):
    llm = LLM(tiny_model_dir, speculative_config=NGRAM)
    llm.generate(prompts20()[10:], GREEDY, use_tqdm=False)
    s = llm.engine.spec.stats
    assert s.mean_accepted_length > 1.5, s


def test_prefix_cache_never_holds_a_rejected_draft(tiny_model_dir, other_tiny_dir):
    """Every block named in the prefix cache holds the same K/V as a plain run's block of
    that name: the tokens it is named by, never a draft that was rejected."""
    prompts = prompts20()
    params = SamplingParams(temperature=0.8, seed=3, max_tokens=50, ignore_eos=True)
    spec = LLM(tiny_model_dir, speculative_config={"model": other_tiny_dir, "num_speculative_tokens": 4})
    outs = spec.generate(prompts, params, use_tqdm=False)
    assert spec.engine.spec.stats.num_accepted_tokens < spec.engine.spec.stats.num_draft_tokens  # some rejected
    ref = LLM(tiny_model_dir)
    full = [{"prompt_token_ids": p["prompt_token_ids"] + t} for p, t in zip(prompts, tokens(outs))]
    ref.generate(full, SamplingParams(max_tokens=1), use_tqdm=False)
    sb, rb = spec.engine.block_manager.prefix_cache, ref.engine.block_manager.prefix_cache
    common = set(sb.cached) & set(rb.cached)
    assert len(common) >= 20
    for h in common:
        for (sk, sv), (rk, rv) in zip(spec.engine.runner.kv_caches, ref.engine.runner.kv_caches):
            np.testing.assert_allclose(sk[sb.cached[h]], rk[rb.cached[h]], atol=1e-4)
            np.testing.assert_allclose(sv[sb.cached[h]], rv[rb.cached[h]], atol=1e-4)
    assert_no_draft_leaks(spec)


def test_rejection_sampling_keeps_the_target_distribution():
    """200,000+ emitted tokens, each position's against its target row (chi-squared)."""
    rng = np.random.default_rng(0)
    B, K, V = 120_000, 3, 8
    p = rng.dirichlet(np.ones(V), K + 1)  # (K+1, V): target at each position
    q = rng.dirichlet(np.ones(V), K)  # (K, V): draft
    drafts = np.stack([rng.choice(V, B, p=q[j]) for j in range(K)], axis=1)  # (B, K) drawn from q
    m, nxt = rejection_sample(
        np.broadcast_to(p, (B, K + 1, V)), drafts, rng.random((B, K)), rng.random(B), np.broadcast_to(q, (B, K, V))
    )
    emitted = 0
    for j in range(K + 1):
        # the token at position j: an accepted draft (m > j) or the next token (m == j)
        tok = np.where(m > j, drafts[:, min(j, K - 1)], nxt)[m >= j]
        emitted += tok.size
        counts = np.bincount(tok, minlength=V)
        assert chisquare_p(counts, p[j] * tok.size) > 0.001, j
    assert emitted >= 200_000
    # a one-hot (deterministic) draft: position 0 still follows p[0]
    d = np.full((B, K), 2)
    m, nxt = rejection_sample(np.broadcast_to(p, (B, K + 1, V)), d, rng.random((B, K)), rng.random(B))
    first = np.where(m > 0, 2, nxt)
    assert chisquare_p(np.bincount(first, minlength=V), p[0] * B) > 0.001


def test_greedy_acceptance_and_ngram_lookup():
    assert greedy_accept(np.array([5, 6, 7]), np.array([5, 6, 9, 1])) == 2
    assert greedy_accept(np.array([5, 6]), np.array([5, 6, 4])) == 2
    assert greedy_accept(np.array([1]), np.array([5, 6])) == 0
    t = np.array([1, 2, 3, 4, 9, 1, 2, 3, 5, 8, 1, 2, 3])
    assert ngram_lookup(t, 2, 1, 3) == [5, 8]  # the most recent earlier "1 2 3"
    assert ngram_lookup(t, 9, 3, 3) == [5, 8, 1, 2, 3]
    assert ngram_lookup(np.array([1, 2, 3]), 4, 1, 3) == []


@pytest.mark.parametrize("draft", ["self", "other"])
def test_sampled_outputs_follow_the_target_and_the_seed(tiny_model_dir, other_tiny_dir, draft):
    """Randomized probability integral transform of every sampled token under the target
    (temperature 0.3; with another draft also top_p and min_p) is uniform; the same seed
    gives the same tokens. Drafts are drawn from the draft model's own distribution q: the
    model itself (q close to p: drafts mostly accepted) or another random model (mostly
    rejected: the recovered distribution)."""
    spec = {"model": tiny_model_dir if draft == "self" else other_tiny_dir, "num_speculative_tokens": 3}
    llm = LLM(tiny_model_dir, speculative_config=spec, max_num_seqs=256)
    rep = prompts20()[12]
    cut = {} if draft == "self" else {"top_p": 0.9, "min_p": 0.02}
    params = [SamplingParams(temperature=0.3, seed=i, max_tokens=10, ignore_eos=True, **cut) for i in range(120)]
    outs = tokens(llm.generate([rep] * 120, params, use_tqdm=False))
    s = llm.engine.spec.stats
    assert s.num_draft_tokens > 500
    assert s.acceptance_rate > 0.8 if draft == "self" else 0 < s.num_draft_tokens - s.num_accepted_tokens
    assert tokens(llm.generate([rep] * 3, params[:3], use_tqdm=False)) == outs[:3]
    harness, rng, pit = SingleSequence(llm.engine.model), np.random.default_rng(1), []
    for out in outs:
        harness.length = 0
        logits = harness.feed(rep["prompt_token_ids"] + out, all_logits=True)[-len(out) - 1 : -1]
        p = llm.engine.sampler.probs(
            logits.copy(), [SimpleNamespace(request=SimpleNamespace(params=params[0]))] * len(out)
        )
        p /= p.sum(axis=1, keepdims=True)
        cdf = np.cumsum(p, axis=1)
        for row, t in enumerate(out):
            pit.append(cdf[row, t] - p[row, t] * rng.random())
    assert kstest_uniform_p(pit) > 0.001
    assert_no_draft_leaks(llm)


def test_composition_n_stop_max_tokens_logprobs_and_beam(tiny_model_dir, caplog):
    llm = LLM(tiny_model_dir)
    spec = LLM(tiny_model_dir, speculative_config=NGRAM)
    rep = prompts20()[15]
    base = llm.generate(rep, SamplingParams(temperature=0, max_tokens=30, ignore_eos=True, logprobs=2), use_tqdm=False)
    text = base[0].outputs[0].text
    # logprobs of accepted tokens, max_tokens reached mid-run (7 is not a multiple of k + 1)
    for mt in (7, 30):
        got = spec.generate(
            rep, SamplingParams(temperature=0, max_tokens=mt, ignore_eos=True, logprobs=2), use_tqdm=False
        )
        c, b = got[0].outputs[0], base[0].outputs[0]
        assert c.token_ids == b.token_ids[:mt] and c.finish_reason == "length"
        for lc, lb in zip(c.logprobs, b.logprobs[:mt]):
            assert lc.keys() == lb.keys()
            assert all(abs(lc[t].logprob - lb[t].logprob) < 1e-4 and lc[t].rank == lb[t].rank for t in lc)
    # a stop string in the middle of an accepted run
    stop = text[len(text) // 2 : len(text) // 2 + 3]
    p = SamplingParams(temperature=0, max_tokens=30, ignore_eos=True, stop=[stop])
    assert (
        spec.generate(rep, p, use_tqdm=False)[0].outputs[0].text
        == llm.generate(rep, p, use_tqdm=False)[0].outputs[0].text
    )
    # logit processors see each draft position as its own state (penalties, min_tokens, bias)
    for p in (
        SamplingParams(temperature=0, max_tokens=30, repetition_penalty=1.3, min_tokens=25, logit_bias={7: 3.0}),
        SamplingParams(temperature=0, max_tokens=30, ignore_eos=True, frequency_penalty=0.5, presence_penalty=0.3),
    ):
        assert tokens(spec.generate(rep, p, use_tqdm=False)) == tokens(llm.generate(rep, p, use_tqdm=False))
    # n > 1, sampled: reproducible per seed, every sample runs to max_tokens
    p = SamplingParams(n=4, temperature=1.0, seed=11, max_tokens=20, ignore_eos=True)
    a, b = tokens(spec.generate(rep, p, use_tqdm=False)), tokens(spec.generate(rep, p, use_tqdm=False))
    assert a == b and len(a) == 4 and all(len(t) == 20 for t in a)
    # beam search: no speculation, and a log line saying so
    with caplog.at_level(logging.INFO, logger="rawpage"):
        beam = SamplingParams(n=2, use_beam_search=True, max_tokens=10, ignore_eos=True)
        assert tokens(spec.generate(rep, beam, use_tqdm=False)) == tokens(llm.generate(rep, beam, use_tqdm=False))
    assert "speculative decoding is off for beam-search" in caplog.text
    assert_no_leaks(spec.engine)


def test_structured_outputs_check_drafts_against_the_grammar(tiny_model_dir):
    so = {"regex": r"(ab|cd){3,8}x"}
    llm = LLM(tiny_model_dir)
    spec = LLM(tiny_model_dir, speculative_config=NGRAM)
    prompts = [{"prompt_token_ids": list(range(5 + i, 25 + 2 * i))} for i in range(4)]
    g = SamplingParams(temperature=0, max_tokens=40, structured_outputs=so)
    assert tokens(spec.generate(prompts, g, use_tqdm=False)) == tokens(llm.generate(prompts, g, use_tqdm=False))
    s = SamplingParams(temperature=1.0, seed=2, max_tokens=40, structured_outputs=so)
    import re

    for o in spec.generate(prompts, s, use_tqdm=False):
        assert re.fullmatch(so["regex"], o.outputs[0].text), o.outputs[0].text
    assert spec.engine.spec.stats.num_draft_tokens > 0
    assert_no_leaks(spec.engine)


@pytest.mark.parametrize(
    "bad, msg",
    [
        ({"method": "eagle", "num_speculative_tokens": 2}, "method"),
        ({"method": "ngram"}, "num_speculative_tokens"),
        ({"method": "ngram", "num_speculative_tokens": 2, "prompt_lookup_min": 3, "prompt_lookup_max": 2}, "lookup"),
        ({"method": "ngram", "num_speculative_tokens": 2, "foo": 1}, "unknown"),
        ({"method": "draft_model", "num_speculative_tokens": 2}, "model"),
        ("{not json", "JSON"),
    ],
)
def test_bad_speculative_configs_are_refused(bad, msg):
    with pytest.raises(ValueError, match=msg):
        SpeculativeConfig.parse(bad)


def test_cli_flag_parses_json():
    import argparse

    from rawpage.engine_args import EngineArgs

    parser = argparse.ArgumentParser()
    EngineArgs.add_cli_args(parser)
    ns = parser.parse_args(["--speculative-config", json.dumps(NGRAM)])
    args = EngineArgs.from_cli_args(ns)
    assert args.speculative_config == SpeculativeConfig("ngram", 4, 1, 3)


def test_metrics_and_stats_log(tiny_model_dir, caplog):
    from prometheus_client import generate_latest

    from rawpage.server.metrics import ServerMetrics

    llm = LLM(tiny_model_dir, speculative_config=NGRAM)
    llm.engine.stats.log_interval = 1e-9  # a stats line after every step
    with caplog.at_level(logging.INFO, logger="rawpage"):
        llm.generate(prompts20()[10:14], GREEDY, use_tqdm=False)
    assert "speculative decoding: acceptance rate" in caplog.text
    m = ServerMetrics("tiny")
    m.on_step(llm.engine, [])
    text = generate_latest(m.registry).decode()
    s = llm.engine.spec.stats
    assert f'rawpage:spec_decode_num_accepted_tokens_total{{model_name="tiny"}} {float(s.num_accepted_tokens)}' in text
    assert f'rawpage:spec_decode_num_draft_tokens_total{{model_name="tiny"}} {float(s.num_draft_tokens)}' in text
    assert "rawpage:spec_decode_acceptance_rate" in text and "rawpage:spec_decode_draft_seconds_total" in text


@pytest.mark.slow
def test_sim_device_verifies_like_the_cpu(tiny_model_dir):
    """The engine on `--device sim` (our CUDA kernels: verification steps go to the
    prefill attention kernel with k + 1 query tokens a sequence) gives the cpu's tokens."""
    prompts = [prompts20()[14]]
    p = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True)
    cpu = tokens(LLM(tiny_model_dir, enable_prefix_caching=False).generate(prompts, p, use_tqdm=False))
    sim = LLM(tiny_model_dir, device="sim", speculative_config=NGRAM, enable_prefix_caching=False)
    assert tokens(sim.generate(prompts, p, use_tqdm=False)) == cpu
    assert sim.engine.spec.stats.num_accepted_tokens > 0


def test_default_model_greedy_with_prompt_lookup(default_checkpoint):
    """SmolLM2 (the default GGUF) answering an editing request: the same tokens with n-gram
    speculation as without, most drafts accepted (the answer copies the prompt)."""
    from tools.bench_spec import PROMPTS

    convs = [[{"role": "user", "content": PROMPTS["repetitive"]}]]
    p = SamplingParams(temperature=0, max_tokens=24)
    plain = tokens(LLM(enable_prefix_caching=False).chat(convs, p, use_tqdm=False))
    spec = LLM(speculative_config=NGRAM)
    assert tokens(spec.chat(convs, p, use_tqdm=False)) == plain
    assert spec.engine.spec.stats.acceptance_rate > 0.5
    assert_no_leaks(spec.engine)


def test_draft_model_shares_the_memory_plan(tiny_model_dir, other_tiny_dir, caplog):
    """The draft's pool has as many blocks as the target's (the same tokens), both pools
    come out of --kv-cache-memory, the startup log shows the draft's share, and a budget
    that holds the target's sequence but not the draft's too fails at startup."""
    from rawpage.memory import OutOfMemoryError, size_text
    from rawpage.model_runner import kv_bytes_per_block

    spec = {"model": other_tiny_dir, "num_speculative_tokens": 2}
    budget = 4 * 2**20
    with caplog.at_level(logging.INFO, logger="rawpage"):
        llm = LLM(tiny_model_dir, speculative_config=spec, kv_cache_memory=budget)
    plan, proposer, itemsize = llm.engine.memory, llm.engine.spec.proposer, llm.engine.backend.dtype.itemsize
    target_block = kv_bytes_per_block(llm.engine.model_config, 16, itemsize)  # 4 layers, Hkv 2, D 32
    draft_block = kv_bytes_per_block(proposer.model.config, 16, itemsize)  # 2 layers, Hkv 1, D 32
    assert plan.num_blocks == budget // (target_block + draft_block)
    assert proposer.block_manager.num_blocks == llm.engine.block_manager.num_blocks == plan.num_blocks
    assert sum(k.nbytes + v.nbytes for k, v in llm.engine.runner.kv_caches) == plan.kv_bytes
    assert sum(k.nbytes + v.nbytes for k, v in proposer.runner.kv_caches) == plan.draft_kv_bytes
    assert plan.kv_bytes + plan.draft_kv_bytes <= budget
    assert plan.draft.weights_bytes == proposer.model.num_bytes()
    share = f"draft model: {size_text(proposer.model.num_bytes())} weights, {size_text(plan.draft_kv_bytes)} KV"
    assert f"{share} for {plan.num_blocks} blocks" in caplog.text
    # 1024 tokens: 64 target blocks (2 MiB) fit 2.25 MiB; with the draft's, 64 pairs need 2.5 MiB
    small = {"speculative_config": spec, "max_model_len": 1024, "kv_cache_memory": 9 * 2**18}
    assert LLM(tiny_model_dir, **{**small, "speculative_config": None}).engine.memory.num_tokens >= 1024
    with pytest.raises(OutOfMemoryError) as e:
        LLM(tiny_model_dir, **small)
    n = 9 * 2**18 // (target_block + draft_block) * 16
    assert f"Lower --max-model-len to {n} or less, or raise --kv-cache-memory to 3MiB" in str(e.value)
    assert "or use a smaller draft model in --speculative-config" in str(e.value)


def test_draft_catch_up_runs_in_passes_of_max_num_batched_tokens(tiny_model_dir, other_tiny_dir, plain):
    """A draft catching up on whole prompts runs at most --max-num-batched-tokens tokens a
    pass (the activation peak the memory plan profiled); the output is unchanged."""
    spec = {"model": other_tiny_dir, "num_speculative_tokens": 2}
    llm = LLM(tiny_model_dir, speculative_config=spec, enable_prefix_caching=False, max_num_batched_tokens=32)
    runner, passes = llm.engine.spec.proposer.runner, []
    execute = runner.execute

    def spy(scheduled, logits_rows):
        passes.append(sum(n for _, n in scheduled))
        return execute(scheduled, logits_rows)

    runner.execute = spy
    assert tokens(llm.generate(prompts20(), GREEDY, use_tqdm=False)) == plain
    assert max(passes) == 32  # prompts of up to 60 tokens: split
    assert llm.engine.spec.stats.num_draft_tokens > 50
    assert_no_draft_leaks(llm)


def test_lookup_defaults_follow_vllm():
    """Neither bound given: 5 and 5; one given: that one for both (vLLM's rule)."""
    base = {"method": "ngram", "num_speculative_tokens": 3}
    assert SpeculativeConfig.parse(base) == SpeculativeConfig("ngram", 3, 5, 5)
    assert SpeculativeConfig.parse({**base, "prompt_lookup_max": 3}) == SpeculativeConfig("ngram", 3, 3, 3)
    assert SpeculativeConfig.parse({**base, "prompt_lookup_min": 2}) == SpeculativeConfig("ngram", 3, 2, 2)


def test_draft_lengths_grow_shrink_and_back_off():
    """k: +2 after a whole draft accepted (capped), -1 after a cut one (at least 1); a draft
    with nothing accepted sits out 1, 2, 4 ... MAX_BACKOFF steps, reset by any acceptance."""
    from rawpage.spec_decode.adaptive import MAX_BACKOFF, DraftLengths

    d = DraftLengths(5)
    assert d.allowed(7) == 5
    d.update(7, 5, 3)
    assert d.allowed(7) == 4
    d.update(7, 4, 4)
    assert d.allowed(7) == 5  # 4 + 2, capped at 5
    sat_out = []
    for _ in range(7):  # drafts that fail outright, one after another
        d.update(7, 1, 0)
        n = 0
        while d.allowed(7) == 0:
            n += 1
        sat_out.append(n)
    assert sat_out == [1, 2, 4, 8, 16, MAX_BACKOFF, MAX_BACKOFF] and d.allowed(7) == 1
    d.update(7, 1, 1)  # one accepted token ends the back-off
    d.update(7, 3, 0)
    assert [d.allowed(7), d.allowed(7)] == [0, 2]  # k: 1 + 2, then - 1
    d.keep_only({8})
    assert d.allowed(7) == 5  # a sequence seen again (after preemption) starts over


def test_failed_drafts_make_a_sequence_sit_out(tiny_model_dir):
    """A sequence whose drafts are all rejected stops drafting for a while: on random
    prompts (where lookup rarely finds the model's continuation) fewer drafts than steps."""
    llm = LLM(tiny_model_dir, speculative_config={**NGRAM, "prompt_lookup_min": 1, "prompt_lookup_max": 1})
    decoder = llm.engine.spec
    seen = []
    update = decoder.lengths.update
    decoder.lengths.update = lambda sid, d, a: (seen.append((sid, d, a)), update(sid, d, a))
    llm.generate(prompts20()[:1], SamplingParams(temperature=0, max_tokens=60, ignore_eos=True), use_tqdm=False)
    failed = [i for i, (_, _, a) in enumerate(seen) if a == 0]
    assert failed, "random text was expected to reject some drafts"
    assert decoder.stats.num_drafts < 59  # some decode steps drafted nothing
