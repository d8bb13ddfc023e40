"""Tool-call parsers and the reply splitter on recorded model outputs, whole and streamed
at every character boundary: the stream must carry exactly the whole reply's content
and calls, and malformed calls come back as plain content."""

import json

import pytest

from rawpage.server.args import ServerConfig
from rawpage.server.chat_reply import ReplyParser
from rawpage.server.protocol import APIError, Body
from rawpage.server.reasoning import PARSERS as REASONING
from rawpage.server.tool_parsers import HermesToolParser, Llama3JsonToolParser
from rawpage.server.tools import tool_request_from

WEATHER = {"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}
TIME = {"type": "function", "function": {"name": "get_time"}}

# (recorded text, expected content, expected [(name, arguments)])
HERMES = [
    (
        '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>',
        "",
        [("get_weather", {"city": "Paris"})],
    ),
    (
        'Let me check.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Oslo"}}\n</tool_call>\n'
        '<tool_call>\n{"name": "get_time", "arguments": {}}\n</tool_call>',
        "Let me check.\n\n",
        [("get_weather", {"city": "Oslo"}), ("get_time", {})],
    ),
    ('<tool_call>{"name": "get_time", "arguments": "{\\"tz\\": \\"UTC\\"}"}', "", [("get_time", {"tz": "UTC"})]),
    ("Paris is sunny. < tool_call > is a tag.", "Paris is sunny. < tool_call > is a tag.", []),
    ('<tool_call>\n{"name": "get_weather", "arguments": {"city": "Par', None, []),  # cut off by max_tokens
    ('<tool_call>\n{"nome": "get_weather"}\n</tool_call>', None, []),  # no name
    ("<tool_call>not json</tool_call> and more", None, []),
    ("a < b and <tool_ is not a call", None, []),
]
LLAMA3 = [
    ('{"name": "get_weather", "parameters": {"city": "Paris"}}', "", [("get_weather", {"city": "Paris"})]),
    (
        '<|python_tag|>{"name": "get_time", "parameters": {}}; {"name": "get_weather", "parameters": {"city": "Rome"}}',
        "",
        [("get_time", {}), ("get_weather", {"city": "Rome"})],
    ),
    ('  {"name": "get_weather", "parameters": {"city": "Lima"}}\n', "", [("get_weather", {"city": "Lima"})]),
    ("The weather is fine.", "The weather is fine.", []),
    ('{"name": "get_weather", "parameters": {"city": ', None, []),
    ('{"name": "get_weather", "parameters": {}} and then prose', None, []),
    ("{not json at all}", None, []),
]


def calls_of(tool_calls):
    return [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in tool_calls or []]


def auto(parser: str, parallel: bool = True):
    body = Body({"tools": [WEATHER, TIME], "parallel_tool_calls": parallel})
    return tool_request_from(body, ServerConfig(enable_auto_tool_choice=True, tool_call_parser=parser))


def merged_calls(deltas):
    """OpenAI's streamed tool_calls entries, added up per index as a client does: the first
    entry of a call brings its id, type and name; the rest only add to its arguments."""
    calls = {}
    for d in deltas:
        for e in d.get("tool_calls", []):
            if e["index"] not in calls:
                assert e["id"] and e["type"] == "function" and e["function"]["name"], e
                calls[e["index"]] = {"id": e["id"], "type": "function", "function": {**e["function"]}}
            else:
                assert set(e) == {"index", "function"} and set(e["function"]) == {"arguments"}, e
                calls[e["index"]]["function"]["arguments"] += e["function"]["arguments"]
    assert sorted(calls) == list(range(len(calls)))
    return [calls[i] for i in sorted(calls)]


def streamed(reply: ReplyParser, text: str, cuts: list[int]):
    s = reply.stream()
    deltas = [s.feed(text[a:b]) for a, b in zip([0, *cuts], [*cuts, len(text)])]
    last, finish = s.finish("stop")
    deltas.append(last)
    content = "".join(d.get("content", "") for d in deltas)
    reasoning = "".join(d.get("reasoning_content", "") for d in deltas)
    return content, reasoning, merged_calls(deltas), finish


@pytest.mark.parametrize("parser, cases", [("hermes", HERMES), ("llama3_json", LLAMA3)])
def test_recorded_outputs_whole_and_streamed_at_every_boundary(parser, cases):
    reply = ReplyParser(auto(parser), None)
    for text, content, calls in cases:
        msg, finish = reply.message(text, "stop")
        assert calls_of(msg.get("tool_calls")) == calls, text
        expected = (text if content is None else content) or None
        assert msg["content"] == (expected if calls else text), text
        assert finish == ("tool_calls" if calls else "stop")
        for cut in range(len(text) + 1):
            got, _, got_calls, got_finish = streamed(reply, text, [cut])
            assert got == (msg["content"] or ""), (text, cut)
            assert got_finish == finish
            if calls:  # the stream's calls add up to the whole reply's, exactly
                assert [c["function"] for c in got_calls] == [c["function"] for c in msg["tool_calls"]]
        got, _, got_calls, _ = streamed(reply, text, list(range(1, len(text))))  # one character at a time
        assert got == (msg["content"] or "")
        if calls:
            assert [c["function"] for c in got_calls] == [c["function"] for c in msg["tool_calls"]]


def test_parallel_tool_calls_false_keeps_the_first_call():
    msg, _ = ReplyParser(auto("hermes", parallel=False), None).message(HERMES[1][0], "stop")
    assert calls_of(msg["tool_calls"]) == [("get_weather", {"city": "Oslo"})]


def test_parsers_alone():
    assert HermesToolParser().scan("Hi <tool", final=False).content == "Hi "
    assert Llama3JsonToolParser().scan("Hello", final=False).content == "Hello"
    assert Llama3JsonToolParser().scan("  {", final=False).content == ""


@pytest.mark.parametrize(
    "body, param",
    [
        ({"tool_choice": "required"}, "tool_choice"),
        ({"tools": [WEATHER], "tool_choice": "auto"}, "tool_choice"),  # the server has no --enable-auto-tool-choice
        ({"tools": [WEATHER]}, "tool_choice"),  # "auto" is the default
        ({"tools": [WEATHER], "tool_choice": {"type": "function", "function": {"name": "nope"}}}, "tool_choice"),
        ({"tools": [{"type": "function", "function": {"name": "bad name"}}], "tool_choice": "required"}, "tools[0]"),
        ({"tools": [WEATHER, WEATHER], "tool_choice": "required"}, "tools"),
        ({"tools": [{"type": "retrieval"}], "tool_choice": "required"}, "tools[0]"),
    ],
)
def test_tool_fields_are_checked(body, param):
    with pytest.raises(APIError) as e:
        tool_request_from(Body(body), ServerConfig())
    assert e.value.param == param


def test_required_and_named_choices_bring_a_grammar():
    req = tool_request_from(
        Body({"tools": [WEATHER, TIME], "tool_choice": "required", "parallel_tool_calls": False}), ServerConfig()
    )
    schema = req.constraint().json
    assert schema["type"] == "array" and schema["maxItems"] == 1 and len(schema["items"]["anyOf"]) == 2
    named = tool_request_from(
        Body({"tools": [WEATHER], "tool_choice": {"type": "function", "function": {"name": "get_weather"}}}),
        ServerConfig(),
    )
    assert named.constraint().json == {"type": "object", "additionalProperties": False}  # closed (issue 31)
    content, calls = named.extract('{"city": "Paris"}')
    assert content == "" and calls[0].name == "get_weather" and json.loads(calls[0].arguments) == {"city": "Paris"}


THINK = [
    ("<think>The user wants a city.</think>Paris", "The user wants a city.", "Paris"),
    ("\n<think>\nhmm</thi</think>\n\nRome", "\nhmm</thi", "\n\nRome"),
    ("<think>still thinking when max_tokens hit", "still thinking when max_tokens hit", ""),
    ("No thinking at all.", None, "No thinking at all."),
    ("<thin>not a tag", None, "<thin>not a tag"),
]


@pytest.mark.parametrize("text, reasoning, content", THINK)
def test_qwen3_reasoning_whole_and_streamed_at_every_boundary(text, reasoning, content):
    reply = ReplyParser(None, REASONING["qwen3"])
    msg, _ = reply.message(text, "stop")
    assert (msg["reasoning_content"], msg["content"]) == (reasoning, content)
    for cut in range(len(text) + 1):
        got_content, got_reasoning, _, _ = streamed(reply, text, [cut])
        assert (got_reasoning, got_content) == (reasoning or "", content), cut
    got_content, got_reasoning, _, _ = streamed(reply, text, list(range(1, len(text))))
    assert (got_reasoning, got_content) == (reasoning or "", content)


def test_deepseek_r1_reasoning_starts_implicitly_and_composes_with_tool_calls():
    text = 'I should call the tool.</think>\n<tool_call>{"name": "get_time", "arguments": {}}</tool_call>'
    reply = ReplyParser(auto("hermes"), REASONING["deepseek_r1"])
    msg, finish = reply.message(text, "stop")
    assert msg["reasoning_content"] == "I should call the tool."
    assert calls_of(msg["tool_calls"]) == [("get_time", {})] and finish == "tool_calls"
    for cut in range(len(text) + 1):
        content, reasoning, calls, _ = streamed(reply, text, [cut])
        assert reasoning == msg["reasoning_content"] and content == (msg["content"] or "")
        assert calls_of(calls) == [("get_time", {})]
    assert REASONING["deepseek_r1"].split("no end tag") == ("no end tag", "")


class CharTokenizer:
    """Token i is chr(i): prompts in plain sight."""

    @staticmethod
    def decode(ids, skip_special_tokens=True):
        return "".join(map(chr, ids))


@pytest.mark.parametrize("name", ["deepseek_r1", "qwen3"])
@pytest.mark.parametrize(
    "prompt, text, reasoning, content",
    [
        ("assistant:", '{"a": 1}', None, '{"a": 1}'),  # a model that does not think: all content
        ("assistant: <think>\n\n</think>\n\n", "Tokyo", None, "Tokyo"),  # enable_thinking: false
        ("assistant: <think>\n", "hmm</think>Tokyo", "hmm", "Tokyo"),  # the template opened it
        ("assistant: <think>\n", "still thinking", "still thinking", ""),
        ("assistant:", "<think>hmm</think>Tokyo", "hmm", "Tokyo"),  # the model opened it
    ],
)
def test_the_prompt_decides_where_the_reply_starts(name, prompt, text, reasoning, content):
    """issue 29 item 3: deepseek_r1 took a reply with no tags for reasoning, even after a
    prompt with no think block; the reply was empty."""
    reply = ReplyParser(None, REASONING[name]).for_prompt(CharTokenizer, [ord(c) for c in prompt])
    msg, _ = reply.message(text, "stop")
    assert (msg["reasoning_content"], msg["content"]) == (reasoning, content)
    got_content, got_reasoning, _, _ = streamed(reply, text, list(range(1, len(text))))
    assert (got_reasoning, got_content) == (reasoning or "", content)
