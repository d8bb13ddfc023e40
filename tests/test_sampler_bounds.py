"""Issue 44: per-request lists cost nothing per step, and extreme parameters never sample NaN.

stop_token_ids, min_tokens and logit_bias are turned into fixed lookups once per request
(SamplingParams), so a step's work does not grow with them; repetition_penalty 1e-300 or
temperature 1e-300 with top_p 1e-300 overflow float32, and such rows are decided greedily
(softmax's limit) instead of drawing token 0 from a NaN distribution."""

import numpy as np
import pytest

from rawpage.engine_args import EngineArgs
from rawpage.errors import InvalidRequestError
from rawpage.request_checks import check_request
from rawpage.sampler import Sampler, greedy_tokens
from rawpage.sampling_params import MIN_TEMPERATURE, SamplingParams
from rawpage.stop_checker import check_stop_token
from tests.test_sampler import EOS, V, seq_with


def test_stop_token_ids_become_a_set_and_a_sorted_array_once():
    p = SamplingParams(stop_token_ids=[7, 3, 7, 3, 9] * 1000)
    assert p.stop_token_set == frozenset({3, 7, 9})
    assert p.stop_token_array.tolist() == [3, 7, 9]
    assert p.stop_token_ids[:5] == [7, 3, 7, 3, 9]  # the request's own list is kept as given (vLLM echoes it)
    s = seq_with(p, output=[9])
    assert check_stop_token(s, [EOS]) == ("stop", 9)


def test_logit_bias_is_a_sparse_vector_applied_in_one_op():
    p = SamplingParams(logit_bias={5: 100.0, 2: -100.0})
    assert p.logit_bias_ids.tolist() == [5, 2] and p.logit_bias_values.tolist() == [100.0, -100.0]
    row = np.zeros((1, V), np.float32)
    out = Sampler(V, [EOS]).apply_processors(row, [seq_with(p)])
    assert out[0, 5] == 100 and out[0, 2] == -100 and np.count_nonzero(out) == 2


def test_min_tokens_masks_stop_ids_and_eos_until_reached():
    p = SamplingParams(temperature=0, min_tokens=2, stop_token_ids=[4, 4, 6], max_tokens=5)
    row = np.zeros((1, V), np.float32)
    row[0, [EOS, 4, 6]] = 10.0
    sampler = Sampler(V, [EOS])
    masked = sampler.apply_processors(row.copy(), [seq_with(p, output=[1])])
    assert np.isneginf(masked[0, [EOS, 4, 6]]).all() and np.isfinite(np.delete(masked[0], [EOS, 4, 6])).all()
    assert (sampler.apply_processors(row.copy(), [seq_with(p, output=[1, 2])]) == row).all()  # min_tokens reached
    free = SamplingParams(temperature=0, min_tokens=2, stop_token_ids=[4], ignore_eos=True, max_tokens=5)
    kept = sampler.apply_processors(row.copy(), [seq_with(free, output=[1])])
    assert kept[0, EOS] == 10.0 and np.isneginf(kept[0, 4])


def test_lists_longer_than_the_vocabulary_are_refused_before_any_scan():
    args = EngineArgs()
    for params, name in [
        (SamplingParams(stop_token_ids=[1] * (V + 1)), "stop_token_ids"),
        (SamplingParams(logit_bias={i: 1.0 for i in range(V + 1)}), "logit_bias"),
    ]:
        with pytest.raises(InvalidRequestError, match=f"{name} has {V + 1} entries, more than the vocabulary size"):
            check_request([1, 2], params, 100, V, args)
    check_request([1, 2], SamplingParams(stop_token_ids=list(range(V))), 100, V, args)  # the whole vocabulary


def test_repetition_penalty_that_overflows_is_decided_greedily_not_by_nan():
    """1e-300 divides every seen token's positive logit to +inf: the limit picks, among
    them, the one the model ranks first (token 3 here), whether greedy or sampled."""
    row = np.linspace(-1, 1, V).astype(np.float32)[None]  # token V-1 best overall
    row[0, 3], row[0, 2] = 0.9, 0.5  # seen tokens (the prompt is 1, 2, 3): 3 beats 2
    sampler = Sampler(V, [EOS])
    for temperature in (0.0, 1.0):
        for seed in range(5):
            p = SamplingParams(repetition_penalty=1e-300, temperature=temperature, seed=seed)
            out = sampler(row.copy(), [seq_with(p, seed=seed)])
            assert out.token_ids.tolist() == [3], (temperature, seed)


def test_tiny_temperature_and_top_p_sample_the_argmax():
    """vLLM's rule: a positive temperature below 0.01 runs at 0.01; top_p 1e-300 keeps one token."""
    p = SamplingParams(temperature=1e-300, top_p=1e-300)
    assert p.temperature == MIN_TEMPERATURE and not p.greedy
    row = np.random.default_rng(1).standard_normal((4, V)).astype(np.float32) * 30
    out = Sampler(V, [EOS])(row.copy(), [seq_with(p, seed=i) for i in range(4)])
    assert out.token_ids.tolist() == row.argmax(axis=-1).tolist()


def test_greedy_tokens_breaks_infinite_ties_by_the_raw_logits():
    edited = np.array([[np.inf, 1.0, np.inf, np.nan], [-np.inf] * 4, [0.0, 2.0, 1.0, -np.inf]], np.float32)
    raw = np.array([[0.1, 5.0, 0.3, 9.0], [0.0, 0.0, 4.0, 1.0], [9.0, 0.0, 0.0, 0.0]], np.float32)
    assert greedy_tokens(edited, raw).tolist() == [2, 2, 1]


def test_long_lists_apply_as_a_dense_row_with_the_same_result():
    """Past V / DENSE_FRACTION ids a list is one dense row added to the logits; same logits."""
    ids = list(range(1, V, 2))  # 25 of 50 ids: dense
    bias = {t: float(t % 7) - 3 for t in ids}
    p = SamplingParams(logit_bias=bias, min_tokens=3, stop_token_ids=ids, ignore_eos=True, max_tokens=5)
    assert p.dense_row("logit_bias", V) is not None and p.dense_row("stop", V) is not None
    assert SamplingParams(logit_bias={1: 1.0}).dense_row("logit_bias", V) is None  # a scatter to 1 id
    row = np.random.default_rng(2).standard_normal((1, V)).astype(np.float32)
    out = Sampler(V, [EOS]).apply_processors(row.copy(), [seq_with(p)])
    want = row.copy()
    want[0, ids] = -np.inf
    assert (out == want).all()
    p.min_tokens = 0
    out = Sampler(V, [EOS]).apply_processors(row.copy(), [seq_with(p)])
    want = row.copy()
    want[0, ids] += np.array([bias[t] for t in ids], np.float32)
    np.testing.assert_array_equal(out, want)
