"""vLLM's request fields once refused with "not supported by this server" (issue 42), each
through the openai client as vLLM's users send them (extras in extra_body): allowed_token_ids,
logprob_token_ids, truncate_prompt_tokens with truncation_side, and on /v1/responses top_k
(with vLLM's other sampling extras), include ["message.output_text.logprobs"] and
enable_response_messages."""

import openai
import pytest

MODEL = "SmolLM2-135M-Instruct"
HELLO = [{"role": "user", "content": "Hello"}]


@pytest.fixture(scope="module")
def client(plain_server):
    return openai.OpenAI(base_url=plain_server.url + "/v1", api_key="unused")


def token_id(token: str) -> int:
    assert token.startswith("token_id:"), token
    return int(token.removeprefix("token_id:"))


def bad_request(call, *phrases):
    with pytest.raises(openai.BadRequestError) as e:
        call()
    for phrase in phrases:
        assert phrase in e.value.message, e.value.message
    return e.value


# --- allowed_token_ids and logprob_token_ids -----------------------------------------------
@pytest.mark.parametrize("stream", [False, True])
def test_completion_logprob_token_ids_with_allowed_token_ids(client, stream):
    """vLLM's own test, both ways: the one allowed id is sampled; top_logprobs holds it and the listed id."""
    extra = {"logprob_token_ids": [5000], "allowed_token_ids": [42], "return_tokens_as_token_ids": True}
    kw = dict(model=MODEL, prompt="Hello", max_tokens=1, temperature=0, logprobs=5, extra_body=extra)
    if not stream:
        lp = client.completions.create(**kw).choices[0].logprobs
        tokens, tops = lp.tokens, lp.top_logprobs
    else:
        chunks = [c.choices[0].logprobs for c in client.completions.create(stream=True, **kw) if c.choices]
        tokens = [t for lp in chunks if lp for t in lp.tokens]
        tops = [t for lp in chunks if lp for t in lp.top_logprobs]
    assert tokens == ["token_id:42"]
    assert len(tops) == 1 and set(tops[0]) == {"token_id:42", "token_id:5000"}
    assert all(-9999 <= v <= 0 for v in tops[0].values())


@pytest.mark.parametrize(("ids", "sampled"), [([5000], 42), ([100, 1000, 5000], 5000)])
def test_chat_logprob_token_ids_replace_the_top_n(client, ids, sampled):
    r = client.chat.completions.create(
        model=MODEL,
        messages=HELLO,
        max_tokens=1,
        temperature=0,
        logprobs=True,
        top_logprobs=5,
        extra_body={"logprob_token_ids": ids, "allowed_token_ids": [sampled], "return_tokens_as_token_ids": True},
    )
    item = r.choices[0].logprobs.content[0]
    assert token_id(item.token) == sampled
    returned = [token_id(t.token) for t in item.top_logprobs]
    assert sorted(returned) == sorted({*ids, sampled})  # each once, the sampled one among them


def test_allowed_token_ids_bound_every_sampled_token(client):
    extra = {"allowed_token_ids": [260, 314, 355], "ignore_eos": True, "return_token_ids": True}
    r = client.completions.create(
        model=MODEL, prompt="Once upon a time", max_tokens=8, temperature=1.2, seed=7, n=3, extra_body=extra
    )
    for c in r.choices:
        assert len(c.token_ids) == 8 and set(c.token_ids) <= {260, 314, 355}


def test_bad_token_id_lists_are_400s_in_vllms_words(client):
    def chat(**extra):
        return lambda: client.chat.completions.create(
            model=MODEL, messages=HELLO, max_tokens=1, logprobs=True, extra_body=extra
        )

    assert bad_request(chat(allowed_token_ids=[1, 10**6]), "out of vocabulary").param == "allowed_token_ids"
    bad_request(chat(allowed_token_ids=[]), "is not None and empty")
    bad_request(chat(logprob_token_ids=[1, 10**6]), "out of vocabulary")
    bad_request(chat(logprob_token_ids=list(range(129))), "greater than max allowed: 128")
    bad_request(chat(logprob_token_ids=[1], use_beam_search=True, n=2), "not supported with beam search")
    bad_request(
        lambda: client.completions.create(
            model=MODEL, prompt="hi", max_tokens=1, extra_body={"logprob_token_ids": [1]}
        ),
        "`logprobs` must be set",
    )


# --- truncate_prompt_tokens and truncation_side -------------------------------------------
def test_completion_truncation_keeps_the_side_asked(client):
    ids = list(range(100, 108))

    def kept(**extra):
        r = client.completions.create(
            model=MODEL, prompt=ids, max_tokens=1, temperature=0, extra_body={"return_token_ids": True, **extra}
        )
        assert r.usage.prompt_tokens == len(r.choices[0].prompt_token_ids)
        return r.choices[0].prompt_token_ids

    assert kept(truncate_prompt_tokens=4, truncation_side="right") == ids[:4]
    assert kept(truncate_prompt_tokens=4, truncation_side="left") == ids[-4:]
    assert kept(truncate_prompt_tokens=4) == ids[-4:]  # vLLM's side for generation: the prompt's end stays
    assert kept(truncate_prompt_tokens=-1) == ids  # -1: all that fit beside max_tokens
    assert kept(truncate_prompt_tokens=20) == ids  # a prompt already shorter is left alone


def test_chat_truncation_cuts_the_rendered_prompt(client):
    def prompt_ids(**extra):
        r = client.chat.completions.create(
            model=MODEL, messages=HELLO, max_tokens=1, temperature=0, extra_body={"return_token_ids": True, **extra}
        )
        return r.prompt_token_ids

    full = prompt_ids()
    assert prompt_ids(truncate_prompt_tokens=5) == full[-5:]
    assert prompt_ids(truncate_prompt_tokens=5, truncation_side="right") == full[:5]


def test_truncation_errors_name_the_field(client):
    def completion(**extra):
        return lambda: client.completions.create(model=MODEL, prompt="hi", max_tokens=16, extra_body=extra)

    e = bad_request(completion(truncate_prompt_tokens=8192), "cannot be greater than max_model_len - max_tokens")
    assert e.param == "truncate_prompt_tokens"
    bad_request(completion(truncate_prompt_tokens=-2), "greater_than_equal")
    assert bad_request(completion(truncate_prompt_tokens=4, truncation_side="middle")).param == "truncation_side"


# --- /v1/responses ------------------------------------------------------------------------
def test_responses_take_vllms_sampling_extras(client):
    """top_k 1 at temperature 1 is greedy: the same text as temperature 0."""
    ask = dict(model=MODEL, input="Write a short sentence", max_output_tokens=12)
    greedy = client.responses.create(temperature=0, **ask)
    top1 = client.responses.create(temperature=1.0, extra_body={"top_k": 1, "seed": 42}, **ask)
    assert top1.output_text == greedy.output_text
    extra = {"top_k": 40, "repetition_penalty": 1.2, "seed": 42, "stop": ["\n\n"]}
    r = client.responses.create(temperature=0.7, top_p=0.9, extra_body=extra, **ask)
    assert r.status in ("completed", "incomplete") and r.output_text
    bad_request(lambda: client.responses.create(extra_body={"top_k": -5}, **ask), "top_k")


def test_responses_output_logprobs_streamed_and_not(client):
    ask = dict(model=MODEL, input="Say hello.", max_output_tokens=8, temperature=0, top_logprobs=3)
    r = client.responses.create(include=["message.output_text.logprobs"], **ask)
    lps = r.output[0].content[0].logprobs
    assert len(lps) == r.usage.output_tokens
    assert all(lp.logprob <= 0 and 1 <= len(lp.top_logprobs) <= 3 for lp in lps)
    assert lps[0].top_logprobs[0].logprob >= lps[0].logprob  # the best first
    events = list(client.responses.create(include=["message.output_text.logprobs"], stream=True, **ask))
    deltas = [e for e in events if e.type == "response.output_text.delta"]
    assert deltas and all(e.logprobs for e in deltas)
    assert [lp.token for e in deltas for lp in e.logprobs] == [lp.token for lp in lps]
    assert events[-1].response.output[0].content[0].logprobs == lps
    plain = client.responses.create(**ask)  # top_logprobs without include asks for nothing
    assert plain.output[0].content[0].logprobs == [] and plain.top_logprobs is None
    bad_request(lambda: client.responses.create(include=["file_search_call.results"], **ask), "include")


@pytest.mark.parametrize("stream", [False, True])
def test_responses_raw_messages(client, stream):
    ask = dict(model=MODEL, input="Hello?", max_output_tokens=16, temperature=0)
    r = client.responses.create(extra_body={"enable_response_messages": True}, stream=stream, **ask)
    r = list(r)[-1].response if stream else r
    (given,), (made,) = r.input_messages, r.output_messages
    assert given["type"] == made["type"] == "raw_message_tokens"
    assert len(given["tokens"]) == r.usage.input_tokens and "Hello?" in given["message"]
    assert len(made["tokens"]) == r.usage.output_tokens and made["message"] == r.output_text
    assert "input_messages" not in client.responses.create(**ask).model_extra
