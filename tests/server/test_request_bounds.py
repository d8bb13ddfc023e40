"""Issue 44 over HTTP, on the default model: per-request lists are bounded by the vocabulary,
and parameters that overflow float32 give greedy text instead of an empty completion."""

import httpx
import pytest

from tests.server.test_errors import assert_error

CMPL = "/v1/completions"
VOCAB = 49152  # the default model's
PROMPT = "The capital of France is"


def complete(server, **body) -> httpx.Response:
    return httpx.post(server.url + CMPL, json={"prompt": PROMPT, "max_tokens": 6, **body})


def test_lists_beyond_the_vocabulary_are_400s_and_the_whole_vocabulary_runs(server):
    r = complete(server, stop_token_ids=[1] * (VOCAB + 1))
    assert_error(r, 400, "stop_token_ids", f"more than the vocabulary size ({VOCAB})")
    r = complete(server, logit_bias={str(t): 1 for t in range(VOCAB)} | {"49152": 1})
    assert_error(r, 400, "logit_bias", "more than the vocabulary size")
    every = list(range(VOCAB))
    r = complete(server, stop_token_ids=every, min_tokens=3, logit_bias={str(t): 0.5 for t in every}, temperature=0)
    assert r.status_code == 200, r.text
    choice = r.json()["choices"][0]  # min_tokens masks every stop id; then the first token stops
    assert choice["finish_reason"] == "stop" and len(r.json()["choices"]) == 1


@pytest.mark.parametrize(
    "extreme", [{"temperature": 1e-300, "top_p": 1e-300}, {"temperature": 1e-300}, {"repetition_penalty": 1e-300}]
)
def test_parameters_that_overflow_float32_give_text_not_an_empty_completion(server, extreme):
    r = complete(server, ignore_eos=True, seed=0, **extreme)
    assert r.status_code == 200, r.text
    text = r.json()["choices"][0]["text"]
    assert text and r.json()["usage"]["completion_tokens"] == 6
    if "top_p" in extreme:  # temperature 0.01 and a nucleus of one token: the greedy text
        assert text == complete(server, ignore_eos=True, temperature=0).json()["choices"][0]["text"]


def test_ids_too_large_for_int64_are_400s_not_500s(server):
    huge = 10**23
    assert_error(complete(server, logit_bias={str(huge): 5}), 400, "logit_bias", "out of vocabulary")
    assert_error(complete(server, stop_token_ids=[huge]), 400, "stop_token_ids", "out of vocabulary")
    r = complete(server, allowed_token_ids=[huge])
    assert_error(r, 400, "allowed_token_ids", "out of vocabulary")
