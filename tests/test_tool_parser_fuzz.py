"""A model's own tool calls, however malformed, never raise (issue 29 item 8): bad JSON,
nesting past the parser's recursion, `"arguments": 5` or a list, lone surrogates. Each
comes back as content (auto) or as no call (a forced choice), and every reply can be
sent: its JSON encodes to UTF-8."""

import json

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rawpage.server.args import ServerConfig
from rawpage.server.chat_reply import ReplyParser
from rawpage.server.protocol import Body
from rawpage.server.reasoning import PARSERS as REASONING
from rawpage.server.tools import tool_request_from

WEATHER = {"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}
DEEP = "[" * 100_000 + "]" * 100_000
NASTY = [
    '{"name": "get_weather", "arguments": 5}',
    '{"name": "get_weather", "arguments": [1, 2]}',
    '{"name": "get_weather", "arguments": "[1]"}',
    '{"name": "get_weather", "arguments": "' + "[" * 5000 + '"}',
    '{"name": "get_weather", "arguments": ' + '{"a": ' * 5000 + "1" + "}" * 5000 + "}",
    '{"name": "get_weather", "arguments": {"city": "\\ud800"}}',
    '{"name": "\\udfff", "arguments": {}}',
    '{"name": 7, "arguments": {}}',
    '{"name": "get_weather", "arguments": {"x": NaN}}',
    DEEP,
    "[" + DEEP + "]",
    "<tool_call>" + DEEP + "</tool_call>",
    "<|python_tag|>" + DEEP,
    "<tool_call>[1, 2]</tool_call>",
    '[{"name": "get_weather", "arguments": 5}]',
]


def requests():
    cfg = lambda p: ServerConfig(enable_auto_tool_choice=True, tool_call_parser=p)  # noqa: E731
    named = {"type": "function", "function": {"name": "get_weather"}}
    out = [tool_request_from(Body({"tools": [WEATHER]}), cfg(p)) for p in ("hermes", "llama3_json")]
    out += [tool_request_from(Body({"tools": [WEATHER], "tool_choice": c}), cfg("hermes")) for c in ("required", named)]
    return out


def replies():
    return [ReplyParser(t, r) for t in requests() for r in (None, REASONING["deepseek_r1"])]


def check(reply: ReplyParser, text: str) -> None:
    msg, finish = reply.message(text, "stop")
    json.dumps(msg, ensure_ascii=False).encode("utf-8")  # what the response will send
    stream = reply.stream()
    stream.feed(text)
    json.dumps(stream.finish("stop"), ensure_ascii=False).encode("utf-8")


@pytest.mark.parametrize("text", NASTY, ids=range(len(NASTY)))
def test_malformed_model_calls_never_raise(text):
    for reply in replies():
        check(reply, text)
    msg, _ = ReplyParser(requests()[0], None).message(text, "stop")
    assert "tool_calls" not in msg and msg["content"] == text  # auto: the text is the answer


PIECES = st.sampled_from(
    ["<tool_call>", "</tool_call>", "<|python_tag|>", "<think>", "</think>", '{"name": "get_weather"', '"arguments"']
    + [":", ",", ";", "{", "}", "[", "]", '"', "\\ud800", "5", "null", "NaN", " ", "\n", '"parameters"']
)


@settings(max_examples=300, deadline=None, suppress_health_check=list(HealthCheck))
@given(st.lists(st.one_of(PIECES, st.text(max_size=6)), max_size=40))
def test_fuzzed_model_text_never_raises(pieces):
    text = "".join(pieces)
    for reply in replies():
        check(reply, text)
