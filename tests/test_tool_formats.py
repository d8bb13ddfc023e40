"""Every tool-call format (issue 43 items 2 and 3): recorded replies read whole and
streamed at every character boundary, where the streamed argument deltas must add up to
the non-streamed call in OpenAI's, Anthropic's and the Responses API's shapes; truncated
and malformed calls are content, never an exception; formats read off chat templates."""

import json

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rawpage.outputs import CompletionOutput
from rawpage.server.args import ServerConfig
from rawpage.server.chat_reply import ReplyParser
from rawpage.server.chat_request import TokenCounts
from rawpage.server.messages_output import MessageEvents, message_object
from rawpage.server.protocol import Body
from rawpage.server.responses_output import OutputItems, ResponseEvents, finished, new_envelope
from rawpage.server.tool_parsers import TOOL_PARSERS, template_tool_format
from rawpage.server.tool_parsers.grammar import SpecialTokens
from rawpage.server.tools import tool_request_from
from tests.server.test_api_events import parse
from tests.test_tool_parsers import merged_calls

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}, "days": {"type": "integer"}, "metric": {"type": "boolean"}},
            "required": ["city"],
        },
    },
}
TIME = {"type": "function", "function": {"name": "get_time", "parameters": {"type": "object", "properties": {}}}}
PARIS, OSLO = ("get_weather", {"city": "Paris", "days": 3}), ("get_weather", {"city": "Oslo"})
DS = {k: f"<｜{k}｜>" for k in ("tool▁calls▁begin", "tool▁calls▁end", "tool▁call▁begin", "tool▁sep", "tool▁call▁end")}


def ds_call(name: str, args: str) -> str:
    sep, end = DS["tool▁sep"], DS["tool▁call▁end"]
    return f"{DS['tool▁call▁begin']}function{sep}{name}\n```json\n{args}\n```{end}"


def qwen3_call(name: str, params: dict) -> str:
    body = "".join(f"<parameter={k}>\n{v}\n</parameter>\n" for k, v in params.items())
    return f"<tool_call>\n<function={name}>\n{body}</function>\n</tool_call>"


# (parser, recorded text, expected content, expected [(name, arguments)])
RECORDED = [
    ("mistral", '[TOOL_CALLS][{"name": "get_weather", "arguments": {"city": "Paris", "days": 3}}]', "", [PARIS]),
    (
        "mistral",
        'Sure.[TOOL_CALLS][{"name": "get_weather", "arguments": {"city": "Oslo"}}, {"name": "get_time", "arguments": {}}]',
        "Sure.",
        [OSLO, ("get_time", {})],
    ),
    ("mistral", '[TOOL_CALLS]get_weather[ARGS]{"city": "Paris", "days": 3}', "", [PARIS]),
    (
        "mistral",
        'I will look.[TOOL_CALLS]get_weather[ARGS]{"city": "Oslo"}[TOOL_CALLS]get_time[CALL_ID]a1b2c3d4e[ARGS]{}',
        "I will look.",
        [OSLO, ("get_time", {})],
    ),
    ("mistral", "No tools needed: [1, 2] is a list.", None, []),
    (
        "deepseek_v3",
        "Let me check."
        + DS["tool▁calls▁begin"]
        + ds_call("get_weather", '{"city": "Paris", "days": 3}')
        + "\n"
        + ds_call("get_time", "{}")
        + DS["tool▁calls▁end"],
        "Let me check.",
        [PARIS, ("get_time", {})],
    ),
    ("deepseek_v3", DS["tool▁calls▁begin"] + ds_call("get_weather", '{"city": "Oslo"}'), "", [OSLO]),
    (
        "qwen3_coder",
        "I'll check.\n" + qwen3_call("get_weather", {"city": "Paris", "days": "3"}),
        "I'll check.\n",
        [PARIS],
    ),
    (
        "qwen3_coder",
        qwen3_call("get_weather", {"city": "New\nYork </param", "metric": "true"}) + "\n" + qwen3_call("get_time", {}),
        "\n",
        [("get_weather", {"city": "New\nYork </param", "metric": True}), ("get_time", {})],
    ),
    ("qwen3_coder", "<tool_call>\n<function=get_weather>\n<parameter=city>\nRome", None, []),  # cut off
    ("pythonic", '[get_weather(city="Paris", days=3)]', "", [PARIS]),
    (
        "pythonic",
        "<|python_start|>[get_weather(city='Oslo'), get_time()]<|python_end|>",
        "",
        [OSLO, ("get_time", {})],
    ),
    (
        "pythonic",
        "[get_weather(city=true, days=[1, {'a': None}])]",
        "",
        [("get_weather", {"city": True, "days": [1, {"a": None}]})],
    ),
    ("pythonic", "[1] is a footnote, not a call.", None, []),
    ("pythonic", "[get_weather(os.system('x'))]", None, []),  # positional, and no literal: never evaluated
    ("llama4_json", '{"name": "get_weather", "parameters": {"city": "Paris", "days": 3}}', "", [PARIS]),
    (
        "hermes",
        '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris", "days": 3}}\n</tool_call>',
        "",
        [PARIS],
    ),
]


def auto(parser: str, parallel: bool = True):
    body = Body({"tools": [WEATHER, TIME], "parallel_tool_calls": parallel})
    return tool_request_from(body, ServerConfig(enable_auto_tool_choice=True, tool_call_parser=parser))


def chat_stream(reply: ReplyParser, text: str, cuts: list[int], finish: str = "stop") -> list[dict]:
    s = reply.stream()
    deltas = [s.feed(text[a:b]) for a, b in zip([0, *cuts], [*cuts, len(text)])]
    last, _ = s.finish(finish)
    return [*deltas, last]


@pytest.mark.parametrize("parser, text, content, calls", RECORDED, ids=[f"{r[0]}-{i}" for i, r in enumerate(RECORDED)])
def test_recorded_replies_whole_and_streamed_at_every_boundary(parser, text, content, calls):
    reply = ReplyParser(auto(parser), None)
    msg, finish = reply.message(text, "stop")
    got = [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in msg.get("tool_calls") or []]
    assert got == calls
    assert msg["content"] == ((content or None) if calls else text)
    for cuts in [[c] for c in range(len(text) + 1)] + [list(range(1, len(text)))]:
        deltas = chat_stream(reply, text, cuts)
        assert "".join(d.get("content", "") for d in deltas) == (msg["content"] or ""), cuts
        if calls:  # the deltas add up to the non-streamed calls, arguments text and all
            assert [c["function"] for c in merged_calls(deltas)] == [c["function"] for c in msg["tool_calls"]]


@pytest.mark.parametrize("parser, text, content, calls", [r for r in RECORDED if r[3]], ids=lambda v: str(v)[:12])
def test_anthropic_and_responses_streams_add_up_to_the_unstreamed_calls(parser, text, content, calls):
    reply = ReplyParser(auto(parser), None)
    whole = reply.parse(text, "stop")
    deltas = chat_stream(reply, text, list(range(1, len(text))))  # a token per character: the finest stream
    o = CompletionOutput(0, text, [1], None, None, finish_reason="stop")
    counts = TokenCounts(5, 1, None)
    ev = MessageEvents("msg_1", "m", lambda text: "sig")
    events = parse(
        ev.start(counts) + [e for d in deltas for e in ev.feed(d)] + ev.finish(ev.reply("tool_calls"), o, counts)
    )
    uses, partial = [], {}
    for name, d in events:
        if name == "content_block_start" and d["content_block"]["type"] == "tool_use":
            uses.append(d["content_block"])
            partial[d["index"]] = ""
        elif name == "content_block_delta" and d["delta"]["type"] == "input_json_delta":
            partial[d["index"]] += d["delta"]["partial_json"]
    expected = [
        b
        for b in message_object("msg_1", "m", whole, o, counts, lambda text: "sig")["content"]
        if b["type"] == "tool_use"
    ]
    got = [{**u, "input": json.loads(p)} for u, p in zip(uses, partial.values())]
    assert [{**b, "id": None} for b in got] == [{**b, "id": None} for b in expected]  # ids are drawn per reply
    assert list(partial.values()) == [c.arguments for c in whole.calls]
    pieces = sum(1 for name, d in events if name == "content_block_delta" and "partial_json" in d["delta"])
    assert pieces > len(calls) or parser == "pythonic"  # pythonic arguments go out whole, as each call closes

    items, envelope = OutputItems(), new_envelope("resp_1", "m", {})
    rev = ResponseEvents(envelope, items)
    events = parse(rev.start() + [e for d in deltas for e in rev.feed(d)])
    closing, response = rev.finish(rev.reply("tool_calls"), {})
    events += parse(closing)
    args: dict[str, str] = {}
    for name, d in events:
        if name == "response.function_call_arguments.delta":
            args[d["item_id"]] = args.get(d["item_id"], "") + d["delta"]
    fcs = [i for i in response["output"] if i["type"] == "function_call"]
    assert [args[i["id"]] for i in fcs] == [c.arguments for c in whole.calls]
    assert [(i["name"], i["arguments"]) for i in fcs] == [(c.name, c.arguments) for c in whole.calls]
    assert (
        response["output"]
        == finished(envelope, rev.reply("tool_calls"), items.of(rev.reply("tool_calls")), {})["output"]
    )


def prefixes_and_junk(text: str) -> list[str]:
    return [text[:k] for k in range(len(text))] + [text + " trailing junk", text.replace("{", "{{", 1), text[::-1]]


@pytest.mark.parametrize("parser", sorted(TOOL_PARSERS))
def test_truncated_and_malformed_calls_are_content_never_errors(parser):
    reply = ReplyParser(auto(parser), None)
    for text in [r[1] for r in RECORDED if r[0] in (parser, "hermes")]:
        for bad in prefixes_and_junk(text):
            msg, _ = reply.message(bad, "length")
            json.dumps(msg).encode("utf-8")
            if "tool_calls" not in msg:
                assert msg["content"] == bad  # the model's text is the answer
            chat_stream(reply, bad, list(range(1, len(bad))))


PIECES = st.sampled_from(
    ["<tool_call>", "</tool_call>", "<function=get_weather>", "<parameter=city>", "</parameter>", "</function>"]
    + ["[TOOL_CALLS]", "[ARGS]", "[CALL_ID]", *DS.values(), "\n```json\n", "\n```", "function", "get_weather"]
    + ["<|python_start|>", "<|python_end|>", "<|python_tag|>", "(", ")", "=", "'", '"', "city", "\\", "\n"]
    + ['{"name": "get_weather"', '"arguments"', '"parameters"', ":", ",", ";", "{", "}", "[", "]", "5", "true"]
)


@settings(max_examples=150, deadline=None, suppress_health_check=list(HealthCheck))
@given(st.lists(st.one_of(PIECES, st.text(max_size=4)), max_size=30))
def test_fuzzed_text_never_raises_in_any_format(pieces):
    text = "".join(pieces)
    for parser in TOOL_PARSERS:
        reply = ReplyParser(auto(parser), None)
        msg, _ = reply.message(text, "stop")
        json.dumps(msg).encode("utf-8")
        s = reply.stream()
        for p in pieces:
            s.feed(p)
        s.finish("stop")


@pytest.mark.parametrize(
    "source, found",
    [
        ("{% for t in tools %}<tool_call>{{ t | tojson }}</tool_call>{% endfor %}", "hermes"),
        ("<tool_call>\n<function=example_function_name>\n<parameter=example_parameter_1>", "qwen3_coder"),
        ("{{ '[TOOL_CALLS]' + tool_calls | tojson }}", "mistral"),
        ("{{'<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>' + tool['type'] }}", "deepseek_v3"),
        ("{{- '<|python_tag|>' }} {{ tools }}", None),  # Llama: JSON or pythonic, a --tool-call-parser choice
    ],
)
def test_formats_are_read_off_chat_templates(source, found):
    assert template_tool_format(source) == found


def test_special_token_tags_are_kept_and_matched_as_tokens():
    tokens = SpecialTokens({"[TOOL_CALLS]": 5, "[ARGS]": 32})
    request = tool_request_from(
        Body({"tools": [WEATHER]}),
        ServerConfig(enable_auto_tool_choice=True, tool_call_parser="mistral"),
        tokens=tokens,
    )
    assert request.keeps_special_tokens()  # decoded with skip_special_tokens off, as vLLM's mistral parser asks
    grammar = request.constraint().grammar
    assert "<[5]>" in grammar and "<[32]>" in grammar and "[TOOL_CALLS]" not in grammar
    assert not auto("hermes").keeps_special_tokens()
    off = tool_request_from(
        Body({"tools": [WEATHER]}),
        ServerConfig(enable_auto_tool_choice=True, tool_call_parser="hermes", tool_call_grammar=False),
    )
    assert off.constraint() is None  # --no-tool-call-grammar: parse only


def test_named_and_required_choices_stream_their_arguments():
    named = tool_request_from(
        Body({"tools": [WEATHER], "tool_choice": {"type": "function", "function": {"name": "get_weather"}}}),
        ServerConfig(),
    )
    required = tool_request_from(Body({"tools": [WEATHER, TIME], "tool_choice": "required"}), ServerConfig())
    cases = [
        (named, '{"city": "Paris", "days": 3}'),
        (required, '[{"name": "get_weather", "arguments": {"city": "Oslo"}}, {"name": "get_time", "arguments": {}}]'),
    ]
    for request, text in cases:
        reply = ReplyParser(request, None)
        msg, finish = reply.message(text, "stop")
        deltas = chat_stream(reply, text, list(range(1, len(text))))
        assert [c["function"] for c in merged_calls(deltas)] == [c["function"] for c in msg["tool_calls"]]
        assert sum(len(d.get("tool_calls", [])) for d in deltas) > len(msg["tool_calls"])  # in pieces


def test_a_reply_cut_inside_a_call_keeps_the_calls_before_it():
    """max_tokens ends a reply inside its second call: the first stays a call, as its stream
    sent it; the stream had begun the second too (OpenAI's streams show such a call cut, with
    finish_reason "length"), which the whole reply drops."""
    first = '<tool_call>\n{"name": "get_time", "arguments": {}}\n</tool_call>\n'
    reply = ReplyParser(auto("hermes"), None)
    for text in [first + '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Pa', first[:-5]]:
        msg, finish = reply.message(text, "length")
        assert [c["function"] for c in msg["tool_calls"]] == [{"name": "get_time", "arguments": "{}"}]
        assert finish == "length"
        streamed = merged_calls(chat_stream(reply, text, list(range(1, len(text))), "length"))
        assert streamed[0]["function"] == msg["tool_calls"][0]["function"]
    assert [c["function"]["arguments"] for c in streamed] == ["{}"]
    assert (
        len(merged_calls(chat_stream(reply, first + '<tool_call>{"name": "get_weather", "arguments": {"ci', []))) == 2
    )
