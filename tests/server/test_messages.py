"""POST /v1/messages and /v1/messages/count_tokens through the stock anthropic SDK
(issue 33): text, streaming, tool use, stop reasons, token counts; errors in
Anthropic's shape, the key as x-api-key, and the engine serving on after bad input."""

import httpx
import pytest

anthropic = pytest.importorskip("anthropic")

MODEL = "SmolLM2-135M-Instruct"
ASK = [{"role": "user", "content": "What is the capital of Japan?"}]
WEATHER = {
    "name": "weather",
    "description": "The weather in a city.",
    "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
}
GREEDY = {"extra_body": {"temperature": 0}}  # the SDK has no temperature argument of its own


@pytest.fixture(scope="module")
def client(server):
    return anthropic.Anthropic(base_url=server.url, api_key="unused", timeout=600)


def test_text_streamed_and_not_agree(client):
    m = client.messages.create(model=MODEL, max_tokens=16, messages=ASK, system="Answer briefly.", **GREEDY)
    assert m.type == "message" and m.role == "assistant" and m.stop_reason == "end_turn"
    assert "Tokyo" in m.content[0].text and m.usage.input_tokens > 0 and m.usage.output_tokens > 0
    with client.messages.stream(model=MODEL, max_tokens=16, messages=ASK, system="Answer briefly.", **GREEDY) as s:
        kinds = [e.type for e in s]
        streamed = s.get_final_message()
    assert [b.text for b in streamed.content] == [b.text for b in m.content]
    assert streamed.usage.output_tokens == m.usage.output_tokens
    assert kinds[0] == "message_start" and "content_block_delta" in kinds and kinds[-1] == "message_stop"
    count = client.messages.count_tokens(model=MODEL, messages=ASK, system="Answer briefly.")
    assert count.input_tokens == m.usage.input_tokens


def test_stop_reasons(client):
    m = client.messages.create(model=MODEL, max_tokens=2, messages=ASK, **GREEDY)
    assert m.stop_reason == "max_tokens" and m.usage.output_tokens == 2
    m = client.messages.create(model=MODEL, max_tokens=16, messages=ASK, stop_sequences=["Japan"], **GREEDY)
    assert m.stop_reason == "stop_sequence" and m.stop_sequence == "Japan" and "Japan" not in m.content[0].text


@pytest.mark.parametrize("choice", [{"type": "any"}, {"type": "tool", "name": "weather"}])
def test_tool_use_streamed_and_not_agree_and_its_result(client, choice):
    kw = dict(model=MODEL, max_tokens=40, tools=[WEATHER], tool_choice=choice, **GREEDY)
    ask = [{"role": "user", "content": "Weather in Paris?"}]
    m = client.messages.create(messages=ask, **kw)
    (use,) = [b for b in m.content if b.type == "tool_use"]
    assert m.stop_reason == "tool_use" and use.name == "weather" and "city" in use.input
    with client.messages.stream(messages=ask, **kw) as s:
        streamed = s.get_final_message()
    assert [b.input for b in streamed.content if b.type == "tool_use"] == [use.input]
    result = {"type": "tool_result", "tool_use_id": use.id, "content": "Sunny, 21 C"}
    turn = [*ask, {"role": "assistant", "content": m.content}, {"role": "user", "content": [result]}]
    after = client.messages.create(
        model=MODEL, max_tokens=8, messages=turn, tools=[WEATHER], tool_choice={"type": "none"}
    )
    assert after.content[0].type == "text"


def test_a_reply_with_a_call_ends_tool_use_even_when_max_tokens_cut_it_after_the_call(client):
    kw = dict(model=MODEL, tools=[WEATHER], tool_choice={"type": "tool", "name": "weather"}, **GREEDY)
    ask = [{"role": "user", "content": "Weather in Paris?"}]
    whole = client.messages.create(messages=ask, max_tokens=40, **kw)
    cut = whole.usage.output_tokens - 1  # the call's JSON is whole; its end-of-turn token is not
    m = client.messages.create(messages=ask, max_tokens=cut, **kw)
    assert [b.type for b in m.content] == ["tool_use"] and m.stop_reason == "tool_use"
    with client.messages.stream(messages=ask, max_tokens=cut, **kw) as s:
        streamed = s.get_final_message()
    assert streamed.stop_reason == "tool_use" and streamed.content[-1].input == m.content[0].input


def test_every_request_field_is_used_or_refused_by_name(server):
    from anthropic.types import message_create_params

    fields = sorted(message_create_params.MessageCreateParamsBase.__annotations__)
    for field in [*fields, "temperature", "top_p", "top_k", "stream"]:
        if field in ("model", "messages", "max_tokens"):
            continue
        body = {"model": MODEL, "messages": ASK, "max_tokens": 1, field: {"__probe__": [1, "x"]}}
        r = httpx.post(server.url + "/v1/messages", json=body, timeout=60)
        assert r.status_code == 400 and r.json()["type"] == "error", (field, r.text)
        assert r.json()["error"]["type"] == "invalid_request_error", (field, r.text)


TOOL_USE = {"role": "assistant", "content": [{"type": "tool_use", "id": "toolu_1", "name": "weather", "input": {}}]}


@pytest.mark.parametrize(
    "body, status, kind",
    [
        ({"messages": ASK}, 400, "invalid_request_error"),  # no max_tokens
        ({"messages": ASK, "max_tokens": "many"}, 400, "invalid_request_error"),
        ({"messages": [], "max_tokens": 4}, 400, "invalid_request_error"),
        ({"messages": "hi", "max_tokens": 4}, 400, "invalid_request_error"),
        (
            {"messages": [{"role": "user", "content": [{"type": "image"}]}], "max_tokens": 4},
            400,
            "invalid_request_error",
        ),
        ({"messages": [{"role": "robot", "content": "hi"}], "max_tokens": 4}, 400, "invalid_request_error"),
        (
            {
                "messages": [{"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_x"}]}],
                "max_tokens": 4,
            },
            400,
            "invalid_request_error",
        ),
        (
            {
                "messages": [
                    ASK[0],
                    TOOL_USE,
                    {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_2"}]},
                ],
                "max_tokens": 4,
            },
            400,
            "invalid_request_error",
        ),
        (
            {"messages": ASK, "max_tokens": 4, "tools": [{"type": "web_search_20250305", "name": "s"}]},
            400,
            "invalid_request_error",
        ),
        ({"messages": ASK, "max_tokens": 4, "temperature": 1.5}, 400, "invalid_request_error"),
        ({"messages": ASK, "max_tokens": 4, "thinking": {"type": "sometimes"}}, 400, "invalid_request_error"),
        (
            {"messages": ASK, "max_tokens": 4, "thinking": {"type": "enabled"}},  # no budget_tokens
            400,
            "invalid_request_error",
        ),
        ({"messages": [{"role": "user", "content": "hi " * 9000}], "max_tokens": 4}, 400, "invalid_request_error"),
        ({"messages": [{"role": "user", "content": "x" * (5 << 20)}], "max_tokens": 4}, 413, "request_too_large"),
        ({"model": "claude-opus", "messages": ASK, "max_tokens": 4}, 404, "not_found_error"),
    ],
)
def test_bad_input_is_a_4xx_in_anthropic_shape(server, body, status, kind):
    r = httpx.post(server.url + "/v1/messages", json={"model": MODEL, **body}, timeout=60)
    assert r.status_code == status, r.text
    assert r.json()["type"] == "error" and r.json()["error"]["type"] == kind and r.json()["error"]["message"], r.text


def test_other_errors_in_anthropic_shape(server, client):
    r = httpx.post(server.url + "/v1/messages/nope", json={})
    assert r.status_code == 404 and r.json()["error"]["type"] == "not_found_error"
    r = httpx.post(server.url + "/v1/messages", content=b"{}", headers={"content-type": "text/plain"})
    assert r.status_code == 415 and r.json()["type"] == "error"
    bad = {"model": MODEL, "messages": [{"role": "user", "content": [{"type": "document"}]}]}
    r = httpx.post(server.url + "/v1/messages/count_tokens", json=bad)
    assert r.status_code == 400 and r.json()["type"] == "error"
    assert client.messages.create(model=MODEL, max_tokens=2, messages=ASK).stop_reason == "max_tokens"  # still serving


def test_the_key_as_x_api_key_or_bearer(keyed_server):
    url = keyed_server.url + "/v1/messages"
    body = {"model": MODEL, "max_tokens": 2, "messages": ASK}
    assert anthropic.Anthropic(base_url=keyed_server.url, api_key="key-a").messages.create(**body).content
    assert httpx.post(url, json=body, headers={"authorization": "Bearer key-b"}).status_code == 200
    r = httpx.post(url, json=body, headers={"x-api-key": "wrong"})
    assert r.status_code == 401 and r.json()["error"]["type"] == "authentication_error"
    # x-api-key is Anthropic's header: the OpenAI routes keep to the bearer token
    assert httpx.get(keyed_server.url + "/v1/models", headers={"x-api-key": "key-a"}).status_code == 401
