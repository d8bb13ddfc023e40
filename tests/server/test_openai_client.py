"""The server through the real `openai` package, sync and async."""

import asyncio

import openai
import pytest

MODEL = "SmolLM2-135M-Instruct"
JAPAN = [{"role": "user", "content": "What is the capital of Japan?"}]


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server.url + "/v1", api_key="unused")


@pytest.fixture(scope="module")
def aclient(server):
    return openai.AsyncOpenAI(base_url=server.url + "/v1", api_key="unused")


def test_models(client):
    assert [m.id for m in client.models.list().data] == [MODEL]


def test_chat_non_streaming(client):
    r = client.chat.completions.create(model=MODEL, messages=JAPAN, max_tokens=20, temperature=0)
    c = r.choices[0]
    assert "Tokyo" in c.message.content and c.message.role == "assistant"
    assert c.finish_reason == "stop"
    assert r.usage.prompt_tokens > 10 and r.usage.completion_tokens > 0
    assert r.usage.total_tokens == r.usage.prompt_tokens + r.usage.completion_tokens
    assert r.id.startswith("chatcmpl-") and r.created > 0 and r.model == MODEL


def test_chat_streaming_matches_non_streaming_and_reports_usage(client):
    kw = dict(
        model=MODEL,
        messages=[{"role": "user", "content": "Write a haiku about the sea."}],
        max_tokens=30,
        temperature=0,
    )
    full = client.chat.completions.create(**kw).choices[0].message.content
    chunks = list(client.chat.completions.create(**kw, stream=True, stream_options={"include_usage": True}))
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == full
    assert chunks[0].choices[0].delta.role == "assistant"
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] in ("stop", "length")
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens > 0


def test_completions_streaming_and_not(client):
    kw = dict(model=MODEL, prompt="The capital of France is", max_tokens=12, temperature=0)
    full = client.completions.create(**kw)
    assert full.choices[0].text and full.usage.prompt_tokens == 5
    chunks = list(client.completions.create(**kw, stream=True))
    assert "".join(c.choices[0].text for c in chunks) == full.choices[0].text


def test_n_greater_than_one(client):
    r = client.chat.completions.create(model=MODEL, messages=JAPAN, n=3, max_tokens=12, temperature=1.0, seed=5)
    assert sorted(c.index for c in r.choices) == [0, 1, 2]
    assert all(c.message.content for c in r.choices) and len({c.message.content for c in r.choices}) > 1
    stream = client.completions.create(
        model=MODEL, prompt=["Once upon a time", "In a galaxy"], n=2, max_tokens=8, temperature=1.0, seed=3, stream=True
    )
    texts: dict[int, str] = {}
    for c in stream:
        for ch in c.choices:
            texts[ch.index] = texts.get(ch.index, "") + ch.text
    assert sorted(texts) == [0, 1, 2, 3] and all(texts.values())


def test_logprobs(client):
    r = client.chat.completions.create(
        model=MODEL, messages=JAPAN, max_tokens=5, temperature=0, logprobs=True, top_logprobs=3
    )
    content = r.choices[0].logprobs.content
    assert len(content) == r.usage.completion_tokens
    for item in content:
        assert item.logprob <= 0 and len(item.top_logprobs) == 3
        assert item.top_logprobs[0].logprob >= item.top_logprobs[1].logprob
        assert item.token == item.top_logprobs[0].token  # greedy picks the most likely
    c = client.completions.create(model=MODEL, prompt="Hello", max_tokens=4, temperature=0, logprobs=2, echo=True)
    lp = c.choices[0].logprobs
    assert c.choices[0].text.startswith("Hello")
    assert lp.token_logprobs[0] is None and len(lp.tokens) == 1 + 4  # the prompt's one token, then output
    assert all(len(t) == 2 or t is None for t in lp.top_logprobs[1:])


def test_stop(client):
    r = client.chat.completions.create(model=MODEL, messages=JAPAN, max_tokens=20, temperature=0, stop=["Tokyo"])
    assert r.choices[0].message.content == "The capital of Japan is " and r.choices[0].finish_reason == "stop"


def test_seed_reproducible(client):
    kw = dict(
        model=MODEL,
        messages=[{"role": "user", "content": "Tell me a story."}],
        max_tokens=16,
        temperature=1.0,
        seed=1234,
    )
    a = client.chat.completions.create(**kw).choices[0].message.content
    b = client.chat.completions.create(**kw).choices[0].message.content
    assert a == b


def test_vllm_extra_fields(client):
    r = client.completions.create(
        model=MODEL,
        prompt="1, 2, 3,",
        max_tokens=6,
        temperature=0,
        extra_body={"ignore_eos": True, "min_tokens": 6, "top_k": 5, "repetition_penalty": 1.1},
    )
    assert r.usage.completion_tokens == 6


def test_async_client_concurrent(aclient):
    async def one(i):
        r = await aclient.chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": f"Count to {i}."}], max_tokens=8, temperature=0
        )
        return r.choices[0].message.content

    async def streamed():
        s = await aclient.chat.completions.create(
            model=MODEL, messages=JAPAN, max_tokens=10, temperature=0, stream=True
        )
        return "".join([c.choices[0].delta.content or "" async for c in s if c.choices])

    async def main():
        return await asyncio.gather(*[one(i) for i in range(6)], streamed())

    results = asyncio.run(main())
    assert all(results) and "Tokyo" in results[-1]
