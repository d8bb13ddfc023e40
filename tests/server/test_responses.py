"""POST /v1/responses through the stock openai SDK (issue 33): text, streaming, tools,
text.format, previous_response_id chains and the bounded, per-key store; bad input
gets a 4xx in OpenAI's shape and the engine keeps serving."""

import json

import httpx
import openai
import pytest

MODEL = "SmolLM2-135M-Instruct"
ASK = "What is the capital of Japan?"
WEATHER = {
    "type": "function",
    "name": "weather",
    "description": "The weather in a city.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
}


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server.url + "/v1", api_key="unused", timeout=600)


def streamed(client, **kw):
    """The response of a stream's last event (completed or incomplete: the SDK's
    get_final_response wants a completed one), and the event types in order."""
    with client.responses.stream(**kw) as s:
        events = list(s)
    return events[-1].response, [e.type for e in events]


def test_text_streamed_and_not_agree(client):
    kw = dict(model=MODEL, input=ASK, max_output_tokens=16, temperature=0, metadata={"k": "v"})
    r = client.responses.create(**kw)
    assert r.object == "response" and r.status == "completed" and r.metadata == {"k": "v"}
    assert "Tokyo" in r.output_text and r.output[0].type == "message"
    assert r.usage.total_tokens == r.usage.input_tokens + r.usage.output_tokens
    assert r.usage.output_tokens_details.reasoning_tokens == 0
    s, kinds = streamed(client, **kw)
    assert s.output_text == r.output_text and s.usage.output_tokens == r.usage.output_tokens
    assert kinds[:4] == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
    ]
    assert kinds[-4:] == [
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.completed",
    ]


def test_cut_by_max_output_tokens_is_incomplete(client):
    r = client.responses.create(model=MODEL, input="Write a long story.", max_output_tokens=4, temperature=0)
    assert r.status == "incomplete" and r.incomplete_details.reason == "max_output_tokens"
    s, kinds = streamed(client, model=MODEL, input="Write a long story.", max_output_tokens=4, temperature=0)
    assert kinds[-1] == "response.incomplete" and s.output_text == r.output_text


@pytest.mark.parametrize("choice", ["required", {"type": "function", "name": "weather"}])
def test_function_tools_streamed_and_not_agree(client, choice):
    kw = dict(
        model=MODEL, input="Weather in Paris?", tools=[WEATHER], tool_choice=choice, max_output_tokens=40, temperature=0
    )
    r = client.responses.create(**kw)
    (call,) = [o for o in r.output if o.type == "function_call"]
    assert call.name == "weather" and "city" in json.loads(call.arguments)
    s, kinds = streamed(client, **kw)
    (scall,) = [o for o in s.output if o.type == "function_call"]
    assert scall.arguments == call.arguments and "response.function_call_arguments.done" in kinds


def test_text_format_json_schema(client):
    schema = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
    fmt = {"format": {"type": "json_schema", "name": "place", "schema": schema, "strict": True}}
    r = client.responses.create(model=MODEL, input=ASK, text=fmt, max_output_tokens=40, temperature=0)
    assert set(json.loads(r.output_text)) == {"city"}
    r = client.responses.create(
        model=MODEL, input=ASK, text={"format": {"type": "json_object"}}, max_output_tokens=40, temperature=0
    )
    assert r.status != "completed" or isinstance(json.loads(r.output_text), dict)


def test_previous_response_id_chain_get_and_delete(client):
    first = client.responses.create(
        model=MODEL,
        input="Weather in Paris?",
        tools=[WEATHER],
        tool_choice="required",
        max_output_tokens=40,
        temperature=0,
    )
    call = first.output[-1]
    out = {"type": "function_call_output", "call_id": call.call_id, "output": "Sunny, 21 C"}
    second = client.responses.create(
        model=MODEL, previous_response_id=first.id, input=[out], max_output_tokens=16, temperature=0
    )
    assert second.previous_response_id == first.id and second.status == "completed"
    # an output that answers no call of the conversation is a 400, with or without the chain
    with pytest.raises(openai.BadRequestError, match="answers no function_call"):
        client.responses.create(model=MODEL, input=[out], max_output_tokens=4)
    assert client.responses.retrieve(second.id).output_text == second.output_text
    client.responses.delete(second.id)
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(second.id)
    with pytest.raises(openai.NotFoundError) as e:
        client.responses.create(model=MODEL, previous_response_id=second.id, input="and?", max_output_tokens=4)
    assert e.value.body["code"] == "previous_response_not_found"
    assert client.responses.cancel(first.id).status == "completed"  # finished: returned as it is


def test_store_false_keeps_nothing(client):
    r = client.responses.create(model=MODEL, input=ASK, max_output_tokens=4, store=False)
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(r.id)


def test_eviction_and_keys(keyed_server):
    a = openai.OpenAI(base_url=keyed_server.url + "/v1", api_key="key-a")
    b = openai.OpenAI(base_url=keyed_server.url + "/v1", api_key="key-b")
    first = a.responses.create(model=MODEL, input=ASK, max_output_tokens=4)
    with pytest.raises(openai.NotFoundError):  # another key's response does not exist for it
        b.responses.retrieve(first.id)
    with pytest.raises(openai.NotFoundError):
        b.responses.create(model=MODEL, previous_response_id=first.id, input="and?", max_output_tokens=4)
    chained = a.responses.create(model=MODEL, previous_response_id=first.id, input="and?", max_output_tokens=4)
    a.responses.create(model=MODEL, input=ASK, max_output_tokens=4)  # the third: `first` is evicted
    with pytest.raises(openai.NotFoundError) as e:
        a.responses.create(model=MODEL, previous_response_id=first.id, input="and?", max_output_tokens=4)
    assert "evicted" in e.value.body["message"]
    assert a.responses.retrieve(chained.id).id == chained.id


def test_one_keys_flood_never_evicts_anothers_responses(keyed_server):
    """Issue 44 item 3: key B stores many responses; A's stored one and its
    previous_response_id chain still work (each key holds 2 here, the store 4)."""
    a = openai.OpenAI(base_url=keyed_server.url + "/v1", api_key="key-a")
    b = openai.OpenAI(base_url=keyed_server.url + "/v1", api_key="key-b")
    kept = a.responses.create(model=MODEL, input=ASK, max_output_tokens=2)
    for _ in range(6):
        b.responses.create(model=MODEL, input="flood", max_output_tokens=1, user="u" * 256)
    assert a.responses.retrieve(kept.id).id == kept.id
    assert a.responses.create(model=MODEL, previous_response_id=kept.id, input="and?", max_output_tokens=2).id
    with pytest.raises(openai.NotFoundError):  # and B still cannot see it
        b.responses.retrieve(kept.id)


PROBE = {"__probe__": [1, "x"]}  # a value no real field takes


def test_every_request_field_is_used_or_refused_by_name(server):
    from openai.types.responses import response_create_params

    for field in sorted(response_create_params.ResponseCreateParamsBase.__annotations__) + ["stream"]:
        if field in ("model", "input"):
            continue
        body = {"model": MODEL, "input": "hi", "max_output_tokens": 1, field: PROBE}
        if field == "safety_identifier":  # no effect here (README), but a string within its limit
            ok = httpx.post(server.url + "/v1/responses", json={**body, field: "end-user-7"}, timeout=60)
            assert ok.status_code == 200, (field, ok.text)
        r = httpx.post(server.url + "/v1/responses", json=body, timeout=60)
        assert r.status_code == 400, (field, r.status_code, r.text)
        assert r.json()["error"]["param"].startswith(field), (field, r.json())


@pytest.mark.parametrize(
    "body, status, param",
    [
        ({"input": 7}, 400, "input"),
        ({"input": ""}, 400, "input"),
        ({"input": []}, 400, "input"),
        ({}, 400, "input"),
        ({"input": [{"type": "web_search_call"}]}, 400, "input[0].type"),
        # an image to a text model: refused naming the model (tests/server/test_images.py)
        ({"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "x"}]}]}, 400, "input"),
        (
            {"input": [{"role": "user", "content": [{"type": "input_file", "file_id": "x"}]}]},
            400,
            "input[0].content[0].type",
        ),
        (
            {"input": [{"role": "assistant", "content": [{"type": "input_image", "image_url": "x"}]}]},
            400,
            "input[0].content[0].type",
        ),
        ({"input": [{"role": "wizard", "content": "hi"}]}, 400, "input[0].role"),
        ({"input": [{"type": "function_call_output", "call_id": "nope", "output": "x"}]}, 400, "input[0].call_id"),
        ({"input": [{"type": "function_call", "call_id": "c", "name": "f"}]}, 400, "input[0].arguments"),
        ({"input": "hi", "tools": [{"type": "web_search"}]}, 400, "tools[0].type"),
        ({"input": "hi", "tools": [WEATHER], "tool_choice": {"type": "function", "name": "nope"}}, 400, "tool_choice"),
        ({"input": "hi", "text": {"format": {"type": "json_schema"}}}, 400, "text.format"),
        ({"input": "hi", "temperature": "hot"}, 400, "temperature"),
        ({"input": "hi", "max_output_tokens": 0}, 400, "max_output_tokens"),
        ({"input": "hi", "background": True}, 400, "background"),
        ({"input": "hi " * 9000}, 400, "input"),  # over --max-model-len
        ({"input": "x" * (5 << 20)}, 413, None),  # over --max-request-bytes
        ({"input": "hi", "previous_response_id": "resp_none"}, 404, "previous_response_id"),
    ],
)
def test_bad_input_is_a_4xx_in_openai_shape(server, body, status, param):
    r = httpx.post(server.url + "/v1/responses", json={"model": MODEL, "max_output_tokens": 4, **body}, timeout=60)
    assert r.status_code == status, r.text
    error = r.json()["error"]
    assert error["message"] and error["param"] == param, error


def test_the_engine_serves_after_bad_input(client):
    assert client.responses.create(model=MODEL, input=ASK, max_output_tokens=4).status == "incomplete"
    assert httpx.get(client.base_url.join("/v1/responses/nope").__str__()).status_code == 404
