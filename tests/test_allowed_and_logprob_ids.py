"""vLLM's allowed_token_ids and logprob_token_ids in SamplingParams and the sampler (issue 42):
only the allowed ids are ever drawn, and each step reports the listed ids' raw logprobs
with their true ranks, beside the sampled token's."""

import itertools

import numpy as np
import pytest

from rawpage import LLM
from rawpage.sampler import Sampler, plain_greedy, ranks_of
from rawpage.sampling_params import MAX_LOGPROB_TOKEN_IDS, SamplingParams
from rawpage.sequence import Request, Sequence

V = 50
_ids = itertools.count()


def seq_with(params, seed=0):
    req = Request(f"r{next(_ids)}", None, [1, 2, 3], params)
    s = Sequence(next(_ids), req, [1, 2, 3], 0, seed)
    req.seqs.append(s)
    return s


def test_allowed_token_ids_bound_greedy_and_sampled_draws():
    row = np.random.default_rng(0).standard_normal(V).astype(np.float32)
    allowed = [7, 3, 41, 3]  # duplicates are kept once
    greedy = SamplingParams(temperature=0, allowed_token_ids=allowed)
    assert greedy.allowed_token_ids == [7, 3, 41] and greedy.allowed_ids.tolist() == [3, 7, 41]
    assert not plain_greedy(seq_with(greedy))  # the device argmax would ignore the mask
    out = Sampler(V, [0])(row[None], [seq_with(greedy)])
    assert out.token_ids[0] == max(allowed, key=lambda t: row[t])
    sampled = SamplingParams(temperature=1.5, allowed_token_ids=allowed)
    seqs = [seq_with(sampled, seed=i) for i in range(400)]
    toks = Sampler(V, [0])(np.tile(row, (400, 1)), seqs).token_ids
    assert set(toks.tolist()) == {3, 7, 41}


def test_allowed_token_ids_leave_logprobs_raw():
    """vLLM reports logprobs of the model's own distribution: a masked token keeps a finite logprob."""
    row = np.random.default_rng(1).standard_normal(V).astype(np.float32)
    p = SamplingParams(temperature=0, allowed_token_ids=[5], logprobs=0, logprob_token_ids=[9])
    out = Sampler(V, [0])(row[None], [seq_with(p)])
    raw = row - np.log(np.exp(row).sum())
    assert out.token_ids[0] == 5
    assert np.isclose(out.logprobs[0], raw[5], atol=1e-5)
    assert np.isclose(out.top_logprobs[0][0], raw[9], atol=1e-5)


def test_logprob_token_ids_report_those_ids_with_true_ranks():
    row = np.random.default_rng(2).standard_normal(V).astype(np.float32)
    p = SamplingParams(temperature=0, logprob_token_ids=[11, 4, 11, 30])
    assert p.logprobs == 0 and p.logprob_token_ids == [11, 4, 30]  # alone, it turns logprobs on
    out = Sampler(V, [0])(row[None], [seq_with(p)])
    assert out.top_ids[0].tolist() == [11, 4, 30]
    order = np.argsort(-row)
    expect = [int(np.flatnonzero(order == t)[0]) + 1 for t in (11, 4, 30)]
    assert out.top_ranks[0].tolist() == expect


def test_ranks_of_counts_strictly_better_tokens():
    row = np.array([0.5, 0.9, 0.5, 0.1], np.float32)
    assert ranks_of(row, np.array([1, 0, 2, 3])).tolist() == [1, 2, 2, 4]


@pytest.mark.parametrize(
    ("kwargs", "phrase"),
    [
        ({"allowed_token_ids": []}, "is not None and empty"),
        ({"allowed_token_ids": [1, -2]}, "allowed_token_ids must hold token ids"),
        ({"logprob_token_ids": []}, "logprob_token_ids must be a non-empty list"),
        ({"logprob_token_ids": list(range(MAX_LOGPROB_TOKEN_IDS + 1))}, "greater than max allowed: 128"),
        ({"logprob_token_ids": [1], "use_beam_search": True, "n": 2, "temperature": 0}, "not supported with beam"),
    ],
)
def test_bad_token_id_lists_are_refused_by_name(kwargs, phrase):
    with pytest.raises(ValueError, match=phrase) as e:
        SamplingParams(**kwargs)
    assert str(e.value).split(" ", 1)[0] in kwargs  # the message starts with the field (a 400's param)


@pytest.fixture(scope="module")
def tiny_llm(tiny_model_dir):
    return LLM(tiny_model_dir, max_model_len=128, cpu_kernels="numpy")


def test_offline_llm_honours_allowed_and_logprob_token_ids(tiny_llm):
    """The offline API end to end: every generated token is allowed, and each step's
    logprobs hold the sampled token and the listed ids."""
    p = SamplingParams(temperature=0.8, seed=3, max_tokens=6, ignore_eos=True, allowed_token_ids=[5, 6, 7])
    (out,) = tiny_llm.generate([[1, 2, 3]], p, use_tqdm=False)
    assert set(out.outputs[0].token_ids) <= {5, 6, 7}
    q = SamplingParams(temperature=0, max_tokens=3, ignore_eos=True, logprob_token_ids=[9, 2])
    (out,) = tiny_llm.generate([[1, 2, 3]], q, use_tqdm=False)
    for tok, entry in zip(out.outputs[0].token_ids, out.outputs[0].logprobs):
        assert set(entry) == {tok, 9, 2}
        assert all(np.isfinite(v.logprob) and v.rank >= 1 for v in entry.values())


@pytest.mark.parametrize("name", ["allowed_token_ids", "logprob_token_ids"])
def test_ids_outside_the_vocabulary_are_refused(tiny_llm, name):
    with pytest.raises(ValueError, match=rf"{name}: token ids \[100000\] are out of vocabulary"):
        tiny_llm.generate([[1, 2, 3]], SamplingParams(max_tokens=2, **{name: [3, 100000]}), use_tqdm=False)
