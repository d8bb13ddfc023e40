"""The sampler on hand-made logits: filters never leak excluded tokens, seeds are per sequence."""

import itertools

import numpy as np
import pytest

from rawpage.sampler import Sampler
from rawpage.sampling_params import SamplingParams
from rawpage.sequence import Request, Sequence

V = 50
EOS = 0
_ids = itertools.count()


def seq_with(params, seed=0, prompt=(1, 2, 3), output=()):
    req = Request(f"r{next(_ids)}", None, list(prompt), params)
    s = Sequence(next(_ids), req, list(prompt) + list(output), 0, seed)
    req.seqs.append(s)
    return s


def logits_from_probs(probs):
    row = np.full(V, -30.0, np.float32)
    row[: len(probs)] = np.log(np.array(probs, np.float32))
    return row


def draw_many(params, row, n=3000):
    sampler = Sampler(V, [EOS])
    seqs = [seq_with(params, seed=i) for i in range(n)]
    return sampler(np.tile(row, (n, 1)), seqs).token_ids


def test_greedy_is_argmax():
    row = np.random.default_rng(0).standard_normal(V).astype(np.float32)
    out = Sampler(V, [EOS])(row[None], [seq_with(SamplingParams(temperature=0))])
    assert out.token_ids[0] == row.argmax()


def test_top_k_never_emits_excluded_tokens():
    row = logits_from_probs([0.3, 0.25, 0.2, 0.15, 0.1])
    toks = draw_many(SamplingParams(temperature=1.0, top_k=3), row)
    assert set(toks) == {0, 1, 2}


def test_top_p_never_emits_excluded_tokens_and_keeps_proportions():
    row = logits_from_probs([0.5, 0.3, 0.15, 0.05])
    toks = draw_many(SamplingParams(temperature=1.0, top_p=0.75), row)
    assert set(toks) == {0, 1}
    frac = (toks == 0).mean()  # renormalised: 0.5 / 0.8 = 0.625
    assert abs(frac - 0.625) < 0.04


def test_min_p_drops_unlikely_tokens():
    row = logits_from_probs([0.5, 0.3, 0.15, 0.05])
    toks = draw_many(SamplingParams(temperature=1.0, min_p=0.2), row)  # threshold 0.1
    assert set(toks) == {0, 1, 2}


def test_plain_sampling_follows_the_distribution():
    row = logits_from_probs([0.5, 0.3, 0.2])
    toks = draw_many(SamplingParams(temperature=1.0), row, n=5000)
    np.testing.assert_allclose(np.bincount(toks, minlength=3)[:3] / 5000, [0.5, 0.3, 0.2], atol=0.03)


def test_seed_gives_the_same_tokens_whatever_the_batch():
    rng = np.random.default_rng(1)
    rows = rng.standard_normal((6, 3, V)).astype(np.float32)  # 6 steps, 3 sequences
    p = SamplingParams(temperature=0.8, top_p=0.9, seed=1234)
    alone, mixed = seq_with(p, seed=1234), seq_with(p, seed=1234)
    others = [seq_with(SamplingParams(temperature=1.0), seed=s) for s in (5, 6)]
    sampler = Sampler(V, [EOS])
    a = [sampler(rows[t, :1], [alone]).token_ids[0] for t in range(6)]
    b = [sampler(rows[t, [1, 0, 2]], [others[0], mixed, others[1]]).token_ids[1] for t in range(6)]
    assert a == b
    c = [sampler(rows[t, :1], [seq_with(p, seed=99)]).token_ids[0] for t in range(6)]
    assert c != a  # a different seed does change things


def test_penalties_and_bias():
    s = Sampler(V, [EOS])
    row = np.zeros((1, V), np.float32)
    row[0, 5], row[0, 6] = 2.0, -2.0
    seq = seq_with(
        SamplingParams(frequency_penalty=0.5, presence_penalty=0.25, repetition_penalty=2.0, logit_bias={9: 3.0}),
        prompt=(6,),
        output=(5, 5, 7),
    )
    out = s.apply_processors(row.copy(), [seq])[0]
    assert out[5] == pytest.approx(2.0 / 2.0 - 0.5 * 2 - 0.25)  # repetition, then 2x frequency, presence
    assert out[6] == pytest.approx(-2.0 * 2.0)  # a prompt token: repetition only
    assert out[7] == pytest.approx(0.0 - 0.5 - 0.25)
    assert out[9] == pytest.approx(3.0)


def test_min_tokens_suppresses_eos_and_stop_tokens():
    row = logits_from_probs([0.9, 0.05, 0.05])  # EOS (0) is the favourite
    seq = seq_with(SamplingParams(temperature=0, min_tokens=2, stop_token_ids=[1]), output=(4,))
    assert Sampler(V, [EOS])(row[None], [seq]).token_ids[0] == 2


def test_logprobs_are_top_n_sorted_with_ranks():
    row = logits_from_probs([0.1, 0.6, 0.3])
    out = Sampler(V, [EOS])(row[None], [seq_with(SamplingParams(temperature=0, logprobs=2))])
    assert list(out.top_ids[0]) == [1, 2]
    np.testing.assert_allclose(np.exp(out.top_logprobs[0]), [0.6, 0.3], rtol=1e-4)
    assert out.token_ids[0] == 1 and out.ranks[0] == 1
    assert out.logprobs[0] == pytest.approx(np.log(0.6), rel=1e-4)


@pytest.mark.parametrize(
    "kwargs,name",
    [
        ({"top_p": 0}, "top_p"),
        ({"temperature": -1}, "temperature"),
        ({"top_k": -2}, "top_k"),
        ({"n": 0}, "n"),
        ({"max_tokens": 0}, "max_tokens"),
        ({"min_p": 1.5}, "min_p"),
        ({"logprobs": -1}, "logprobs"),
        ({"presence_penalty": 3}, "presence_penalty"),
        ({"repetition_penalty": 0}, "repetition_penalty"),
        ({"min_tokens": 5, "max_tokens": 2}, "min_tokens"),
        ({"stop": ["ok", ""]}, "stop"),
    ],
)
def test_invalid_params_name_the_parameter(kwargs, name):
    with pytest.raises(ValueError, match=f"^{name} "):
        SamplingParams(**kwargs)


def test_logprobs_zero_reports_only_the_sampled_token():
    out = Sampler(V, [EOS])(logits_from_probs([0.2, 0.8])[None], [seq_with(SamplingParams(temperature=0, logprobs=0))])
    assert len(out.top_ids[0]) == 0 and out.logprobs[0] == pytest.approx(np.log(0.8), rel=1e-4)


# The row searches at a real vocabulary's width (rawpage/ops/sampling.py works a block of
# 512 at a time there; the 50-token rows above are one block), against the plain NumPy.
WIDE = 49152 + 77  # not a multiple of the block


def wide_rows():
    rng = np.random.default_rng(5)
    peaked = rng.standard_normal(WIDE).astype(np.float32) * 4
    ties = np.round(rng.standard_normal(WIDE) * 2).astype(np.float32)  # many equal values
    flat = rng.random(WIDE).astype(np.float32) * 1e-3
    return {"peaked": peaked, "ties": ties, "flat": flat}


@pytest.mark.parametrize("name", ["peaked", "ties", "flat"])
def test_kth_largest_is_the_partitions(name):
    from rawpage.ops.sampling import kth_largest

    row = wide_rows()[name]
    for k in (1, 2, 40, 96, 97, 500, 5000, WIDE):
        assert kth_largest(row, k) == np.partition(row, -k)[-k], k
    row = row.copy()
    row[[3, 700, 9000]] = np.nan  # a model's overflow: as np.partition has it, never an error
    row[1000:1600] = -np.inf  # tokens allowed_token_ids or a grammar removed
    for k in (1, 3, 4, 40, 5000):
        np.testing.assert_equal(kth_largest(row, k), np.partition(row, -k)[-k], err_msg=str(k))


@pytest.mark.parametrize("name", ["peaked", "ties", "flat"])
def test_inverse_cdf_is_the_cumulative_sums(name):
    """The first token whose float64 cumulative sum passes u x total, as one cumsum over the
    row finds it; a token of probability 0 is never drawn, whatever u."""
    from rawpage.ops.sampling import inverse_cdf

    row = wide_rows()[name]
    p = np.exp(row - row.max())
    p[::7] = 0.0  # tokens a filter removed
    p[-600:] = 0.0  # a whole last block and then some
    cdf = np.cumsum(p, dtype=np.float64)
    for u in [0.0, 1e-12, 0.5, 1 - 1e-12, *np.random.default_rng(1).random(300)]:
        got = inverse_cdf(p, u)
        assert p[got] > 0, u
        want = int(np.argmax(cdf > u * cdf[-1]))
        # (the block sums may round the last ulp differently: then a neighbor within it)
        assert got == want or abs(cdf[got] - cdf[want]) <= 1e-12 * cdf[-1], (u, got, want)


@pytest.mark.parametrize("name", ["peaked", "ties", "flat"])
@pytest.mark.parametrize("top_p", [0.1, 0.9, 0.999])
def test_nucleus_is_the_full_sorts(name, top_p):
    from rawpage.ops.sampling import nucleus_mask

    row = wide_rows()[name]
    p = np.exp(row - row.max())
    got = p.copy()
    nucleus_mask(got, top_p)
    order = np.argsort(-p, kind="stable")  # ties: lower id first, as nucleus_mask keeps them
    keep = int(np.searchsorted(np.cumsum(p[order]), top_p * p.sum())) + 1
    want = np.zeros_like(p)
    want[order[:keep]] = p[order[:keep]]
    np.testing.assert_array_equal(got, want)
