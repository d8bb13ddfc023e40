"""Structured outputs, tool calls and the no-silent-ignore rule through the stock `openai`
client against the default model. The 135M model writes poor JSON on its own; every
output here validates because the grammar leaves it no other choice."""

import json
import os
import re
from typing import Literal

import httpx
import openai
import pytest
from openai.types import completion_create_params as completion_params
from openai.types.chat import completion_create_params as chat_params
from pydantic import BaseModel, ConfigDict, Field

from rawpage.server.request import NO_EFFECT_FIELDS

MODEL = "SmolLM2-135M-Instruct"
CHAT = "/v1/chat/completions"


class Address(BaseModel):
    model_config = ConfigDict(extra="forbid")
    city: str = Field(max_length=16)
    zip: int = Field(ge=10000, le=99999)


class Person(BaseModel):
    model_config = ConfigDict(extra="forbid")
    name: str = Field(max_length=16)
    age: int = Field(ge=0, le=120)
    role: Literal["admin", "user", "guest"]
    address: Address
    tags: list[Literal["a", "b", "c"]] = Field(max_length=3)


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server.url + "/v1", api_key="unused", timeout=600)


def ask(content):
    return [{"role": "user", "content": content}]


def test_parse_with_a_pydantic_model_50_seeded_samples_at_temperature_one(client):
    r = client.chat.completions.parse(
        model=MODEL,
        messages=ask("Describe a person as JSON."),
        response_format=Person,
        n=50,
        temperature=1.0,
        seed=7,
        max_tokens=120,
    )
    assert len(r.choices) == 50
    for c in r.choices:  # parse() already raised if any choice failed to validate
        assert isinstance(c.message.parsed, Person) and c.finish_reason == "stop"
        assert Person.model_validate_json(c.message.content) == c.message.parsed
    assert len({c.message.content for c in r.choices}) > 10, "samples should differ"


def test_json_object_streamed_and_not(client):
    # (a prompt whose greedy object closes well within max_tokens: "Give me a JSON object
    # about cats." ran into a list that counted to the limit once the CPU kernels' rounding changed)
    kw = dict(
        model=MODEL,
        messages=ask("Describe a cat as a JSON object with its name and age."),
        temperature=0,
        max_tokens=200,
        response_format={"type": "json_object"},
    )
    r = client.chat.completions.create(**kw)
    text = r.choices[0].message.content
    assert r.choices[0].finish_reason == "stop" and isinstance(json.loads(text), dict)
    streamed = "".join(c.choices[0].delta.content or "" for c in client.chat.completions.create(**kw, stream=True))
    assert streamed == text


@pytest.mark.parametrize(
    "extra, check",
    [
        ({"guided_choice": ["positive", "negative"]}, lambda t: t in ("positive", "negative")),
        ({"guided_regex": r"\d{3}-\d{4}"}, lambda t: re.fullmatch(r"\d{3}-\d{4}", t)),
        (
            {"guided_grammar": 'start: "yes" | "no" | "maybe " NUM\nNUM: /[0-9]/'},
            lambda t: re.fullmatch(r"yes|no|maybe [0-9]", t),
        ),
        ({"structured_outputs": {"choice": ["red", "blue"]}}, lambda t: t in ("red", "blue")),
        (
            {
                "guided_json": {
                    "type": "object",
                    "properties": {"ok": {"type": "boolean"}},
                    "required": ["ok"],
                    "additionalProperties": False,
                }
            },
            lambda t: isinstance(json.loads(t)["ok"], bool),
        ),
    ],
)
def test_vllm_guided_fields_on_both_endpoints(client, extra, check):
    r = client.chat.completions.create(
        model=MODEL, messages=ask("Answer."), n=4, temperature=1.0, seed=1, max_tokens=40, extra_body=extra
    )
    for c in r.choices:
        assert check(c.message.content), c.message.content
    r = client.completions.create(
        model=MODEL, prompt="Answer:", n=2, temperature=1.0, seed=2, max_tokens=40, extra_body=extra
    )
    for c in r.choices:
        assert check(c.text), c.text


WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Current weather in a city",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string", "maxLength": 20}, "unit": {"enum": ["celsius", "fahrenheit"]}},
            "required": ["city", "unit"],
            "additionalProperties": False,
        },
    },
}
TIME = {
    "type": "function",
    "function": {
        "name": "get_time",
        "parameters": {
            "type": "object",
            "properties": {"tz": {"enum": ["UTC", "CET"]}},
            "required": ["tz"],
            "additionalProperties": False,
        },
    },
}


def calls(tool_calls):
    return [(c.function.name, json.loads(c.function.arguments)) for c in tool_calls]


def test_agent_round_trip_with_required_tool_choice(client):
    messages = ask("What is the weather in Paris?")
    kw = dict(model=MODEL, tools=[WEATHER, TIME], tool_choice="required", temperature=0, max_tokens=80)
    r = client.chat.completions.create(messages=messages, **kw)
    msg = r.choices[0].message
    assert r.choices[0].finish_reason == "tool_calls" and msg.content is None
    (name, args), *_ = calls(msg.tool_calls)
    assert name in ("get_weather", "get_time") and msg.tool_calls[0].id.startswith("call_")
    # streamed: the same calls, their arguments in delta.tool_calls pieces as they are written
    chunks = list(client.chat.completions.create(messages=messages, stream=True, **kw))
    entries = [tc for ch in chunks for tc in ch.choices[0].delta.tool_calls or []]
    streamed = [e.model_copy(deep=True) for e in entries if e.id]
    for e in entries:
        if not e.id:
            streamed[e.index].function.arguments += e.function.arguments
    assert len(entries) > len(streamed)  # the arguments came in pieces
    assert calls(streamed) == calls(msg.tool_calls) and chunks[-1].choices[0].finish_reason == "tool_calls"
    # the tool's result goes back, and the model answers in prose
    messages += [
        msg.model_dump(exclude_none=True),
        {"role": "tool", "tool_call_id": msg.tool_calls[0].id, "content": '{"temperature": 21}'},
    ]
    final = client.chat.completions.create(
        model=MODEL, messages=messages, tools=[WEATHER, TIME], tool_choice="none", temperature=0, max_tokens=30
    )
    assert final.choices[0].message.content and not final.choices[0].message.tool_calls


def test_named_tool_choice_and_parallel_calls(client):
    named = {"type": "function", "function": {"name": "get_time"}}
    r = client.chat.completions.create(
        model=MODEL,
        messages=ask("Time?"),
        tools=[WEATHER, TIME],
        tool_choice=named,
        n=4,
        temperature=1.0,
        seed=3,
        max_tokens=40,
    )
    for c in r.choices:
        assert calls(c.message.tool_calls)[0][0] == "get_time" and c.finish_reason == "tool_calls"
        assert json.loads(c.message.tool_calls[0].function.arguments)["tz"] in ("UTC", "CET")
    r = client.chat.completions.create(
        model=MODEL,
        messages=ask("Weather in Oslo and Rome?"),
        tools=[WEATHER],
        tool_choice="required",
        parallel_tool_calls=False,
        n=4,
        temperature=1.0,
        seed=4,
        max_tokens=80,
    )
    assert all(len(c.message.tool_calls) == 1 for c in r.choices)


def test_auto_tool_choice_returns_content_or_calls_never_an_error(client):
    r = client.chat.completions.create(
        model=MODEL,
        messages=ask("What is the weather in Paris?"),
        tools=[WEATHER],
        n=2,
        temperature=1.0,
        seed=5,
        max_tokens=30,
    )
    for c in r.choices:
        assert c.message.content or c.message.tool_calls


# --- never accept a parameter silently -------------------------------------------------------
# vLLM's extra fields that we do not implement; each must be refused, naming itself.
VLLM_EXTRAS = [
    "guided_decoding_backend",
    "guided_whitespace_pattern",
    "echo",
    "documents",
    "continue_final_message",
    "return_tokens_as_token_ids",
    "spaces_between_special_tokens",
    "truncate_prompt_tokens",
    "bad_words",
    "allowed_token_ids",
    "logits_processors",
    "cache_salt",
    "mm_processor_kwargs",
    "vllm_xargs",
]
PROBE = {"__probe__": [1, "x"]}  # a value no real field takes as given


@pytest.mark.parametrize(
    "endpoint, fields",
    [
        (CHAT, sorted(chat_params.CompletionCreateParamsBase.__annotations__) + ["stream"] + VLLM_EXTRAS),
        ("/v1/completions", sorted(completion_params.CompletionCreateParamsBase.__annotations__) + ["stream"]),
    ],
)
def test_every_request_field_is_used_or_refused_by_name(server, endpoint, fields):
    """Walk the openai SDK's request models (plus vLLM's extras): each field sent with a
    nonsense value must be a 400 that names it, whether we implement it (and so validate
    it) or not (and so refuse it); only the README's no-effect fields may pass."""
    base = {"messages": ask("hi")} if endpoint == CHAT else {"prompt": "hi"}
    base["max_tokens"] = 1
    for field in fields:
        if field in ("model", "messages", "prompt"):
            continue
        if field in NO_EFFECT_FIELDS:  # a string within its limit passes (issue 44: it is checked)
            r = httpx.post(server.url + endpoint, json={**base, field: "end-user-7"}, timeout=60)
            assert r.status_code == 200, (field, r.text)
        r = httpx.post(server.url + endpoint, json={**base, field: PROBE}, timeout=60)
        assert r.status_code == 400, (field, r.status_code, r.text)
        assert r.json()["error"]["param"].startswith(field), (field, r.json())


def test_unsupported_nested_fields_and_conflicts_are_refused(server):
    for body, param in [
        (
            {"stream": True, "stream_options": {"include_usage": True, "include_obfuscation": True}},
            "stream_options.include_obfuscation",
        ),
        (
            {"response_format": {"type": "json_schema", "json_schema": {"schema": {"type": "object"}, "x": 1}}},
            "response_format.json_schema.x",
        ),
        ({"response_format": {"type": "json_object"}, "guided_regex": "a+"}, "guided_regex"),
        ({"guided_json": {"type": "nonsense"}}, "structured_outputs"),
        ({"guided_regex": "(unclosed"}, "structured_outputs"),
        ({"response_format": {"type": "json_object"}, "tools": [WEATHER], "tool_choice": "required"}, "tool_choice"),
    ]:
        r = httpx.post(server.url + CHAT, json={"messages": ask("hi"), "max_tokens": 1, **body}, timeout=60)
        assert r.status_code == 400 and r.json()["error"]["param"] == param, (body, r.text)


def test_readme_lists_exactly_the_no_effect_fields():
    readme = open(os.path.join(os.path.dirname(__file__), "..", "..", "README.md")).read()
    listed = re.search(r"<!-- no-effect-fields -->(.*?)<!-- /no-effect-fields -->", readme, re.S).group(1)
    assert set(re.findall(r"`(\w+)`", listed)) == set(NO_EFFECT_FIELDS)
