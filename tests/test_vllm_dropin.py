"""Issue 31, items 6-12, without a server: the pieces that make rawpage read vLLM's requests
as vLLM does (lax booleans, top_logprobs -1, schema rewrites, VLLM_API_KEY, ORCA)."""

import argparse
import json

import pytest

from rawpage.server.args import ServerConfig, add_server_args
from rawpage.server.chat_reply import ReplyParser
from rawpage.server.json_schema import close_objects, rebase_refs
from rawpage.server.metrics import ServerMetrics
from rawpage.server.protocol import APIError, Body, logit_bias, logprobs_count, stream_options
from rawpage.server.reasoning import PARSERS as REASONING
from rawpage.server.state import open_final_message
from rawpage.server.tools import auto_tool_parser, tool_request_from

NESTED = {
    "type": "object",
    "properties": {"where": {"$ref": "#/$defs/Place"}, "tags": {"type": "array", "items": {"type": "object"}}},
    "required": ["where"],
    "$defs": {"Place": {"type": "object", "properties": {"city": {"type": "string"}}}},
}


@pytest.mark.parametrize("given, read", [("true", True), ("False", False), ("yes", True), ("0", False), (1, True)])
def test_booleans_are_read_as_pydantic_lax_mode_reads_them(given, read):
    assert Body({"logprobs": given}).bool("logprobs") is read


def test_a_non_boolean_still_names_the_field():
    with pytest.raises(APIError, match="'logprobs' must be a boolean") as e:
        Body({"logprobs": "maybe"}).bool("logprobs")
    assert e.value.param == "logprobs"


def test_top_logprobs_minus_one_is_the_vocabulary_within_max_logprobs():
    assert logprobs_count(Body({"top_logprobs": -1}), "top_logprobs", 100, 100) == 100
    with pytest.raises(APIError, match="whole vocabulary, 49152 tokens.*--max-logprobs 20"):
        logprobs_count(Body({"top_logprobs": -1}), "top_logprobs", 20, 49152)
    with pytest.raises(APIError, match="-1 for the whole vocabulary; got -2"):
        logprobs_count(Body({"top_logprobs": -2}), "top_logprobs", 20, 49152)


def test_logit_bias_errors_name_the_key_and_the_bound():
    with pytest.raises(APIError, match="key 'x' is not a token id"):
        logit_bias({"x": 1})
    with pytest.raises(APIError, match=r"\['7'\] must be between -100 and 100, got 150"):
        logit_bias({"7": 150})
    assert logit_bias({"7": -5}) == {7: -5.0}
    with pytest.raises(APIError, match=r"3 bad key\(s\): key 'x' .*\['7'\] .*\['8'\] must be a number"):
        logit_bias({"x": 1, "7": 150, "9": 1, "8": "a"})


def test_stream_options_need_stream_and_continuous_usage_needs_include_usage():
    with pytest.raises(APIError, match="only be given with 'stream': true"):
        stream_options(Body({"stream_options": {"include_usage": True}}))
    assert stream_options(Body({"stream": True, "stream_options": {"continuous_usage_stats": True}})) == (
        True,
        False,
        False,
    )
    both = {"include_usage": True, "continuous_usage_stats": True}
    assert stream_options(Body({"stream": True, "stream_options": both})) == (True, True, True)


def test_close_objects_closes_every_object_that_does_not_choose():
    closed = close_objects({**NESTED, "properties": {**NESTED["properties"], "free": {"additionalProperties": True}}})
    assert closed["additionalProperties"] is False
    assert closed["$defs"]["Place"]["additionalProperties"] is False
    assert closed["properties"]["tags"]["items"]["additionalProperties"] is False
    assert closed["properties"]["free"]["additionalProperties"] is True  # its own choice stays
    assert "additionalProperties" not in NESTED  # the request's schema is not changed


def test_rebase_refs_points_into_the_new_place():
    moved = rebase_refs({**NESTED, "properties": {**NESTED["properties"], "self": {"$ref": "#"}}}, "/x/0")
    assert moved["properties"]["where"]["$ref"] == "#/x/0/$defs/Place"
    assert moved["properties"]["self"]["$ref"] == "#/x/0"


def test_required_tool_grammar_with_local_defs_compiles():
    """Issue 31 item 9: the $ref of a tool's parameters must resolve inside the call array."""
    jsonschema = pytest.importorskip("jsonschema")
    tools = [{"type": "function", "function": {"name": "visit", "parameters": NESTED}}]
    schema = tool_request_from(Body({"tools": tools, "tool_choice": "required"}), ServerConfig()).constraint().json
    call = [{"name": "visit", "arguments": {"where": {"city": "Paris"}, "tags": []}}]
    jsonschema.validate(call, schema)  # resolves #/items/anyOf/0/properties/arguments/$defs/Place
    with pytest.raises(jsonschema.ValidationError):  # closed: an invented key is refused
        jsonschema.validate([{"name": "visit", "arguments": {"where": {"city": "P", "zip": 1}}}], schema)


def test_a_cut_required_call_is_no_call_and_no_content():
    tools = [{"type": "function", "function": {"name": "visit", "parameters": NESTED}}]
    req = tool_request_from(Body({"tools": tools, "tool_choice": "required"}), ServerConfig())
    msg, finish = ReplyParser(req, None).message('[{"name": "visit", "argum', "length")
    assert msg["content"] == "" and "tool_calls" not in msg and finish == "length"


def test_auto_parser_comes_from_a_known_template_unless_flags_say_otherwise():
    from rawpage.server.tools import _chatml_tools

    assert auto_tool_parser(ServerConfig(), _chatml_tools()) == "hermes"
    with pytest.raises(APIError, match="--enable-auto-tool-choice"):
        auto_tool_parser(ServerConfig(tool_call_parser="hermes"), _chatml_tools())  # vLLM's rule: both flags
    with pytest.raises(APIError):
        auto_tool_parser(ServerConfig(), None)
    assert auto_tool_parser(ServerConfig(enable_auto_tool_choice=True, tool_call_parser="llama3_json"), None) == (
        "llama3_json"
    )


def test_include_reasoning_false_drops_reasoning_content():
    text = "<think>hmm</think>Paris"
    msg, _ = ReplyParser(None, REASONING["qwen3"]).message(text, "stop")
    assert msg["reasoning"] == msg["reasoning_content"] == "hmm"  # vLLM's name and its older alias
    stream = ReplyParser(None, REASONING["qwen3"]).stream()
    deltas = [stream.feed(text[:9]), stream.feed(text[9:]), stream.finish("stop")[0]]
    assert "".join(d.get("reasoning", "") for d in deltas) == "hmm"
    assert all(d.get("reasoning") == d.get("reasoning_content") for d in deltas)
    msg, _ = ReplyParser(None, REASONING["qwen3"], include_reasoning=False).message(text, "stop")
    assert msg["reasoning"] is None and msg["reasoning_content"] is None and msg["content"] == "Paris"
    stream = ReplyParser(None, REASONING["qwen3"], include_reasoning=False).stream()
    deltas = [stream.feed(text[:9]), stream.feed(text[9:]), stream.finish("stop")[0]]
    assert all("reasoning_content" not in d and "reasoning" not in d for d in deltas)


def test_continue_final_message_cuts_after_the_last_content():
    text = "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\nThe answer is<|im_end|>\n"
    assert open_final_message(text, {"role": "assistant", "content": "The answer is "}).endswith("The answer is")
    with pytest.raises(APIError):
        open_final_message(text, {"role": "assistant", "content": "absent"})


def _config(monkeypatch, argv, **env):
    for k in ("RAWPAGE_API_KEY", "VLLM_API_KEY"):
        monkeypatch.delenv(k, raising=False)
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    parser = argparse.ArgumentParser()
    add_server_args(parser)
    return ServerConfig.from_cli_args(parser.parse_args(argv))


def test_vllm_api_key_protects_the_server_as_in_vllm(monkeypatch):
    assert _config(monkeypatch, [], VLLM_API_KEY="v").api_keys == ["v"]
    assert _config(monkeypatch, [], VLLM_API_KEY="v", RAWPAGE_API_KEY="r").api_keys == ["r"]
    assert _config(monkeypatch, ["--api-key", "k"], VLLM_API_KEY="v").api_keys == ["k"]
    assert _config(monkeypatch, []).api_keys == []


def test_orca_header_in_vllm_formats():
    m = ServerMetrics("m")
    assert m.orca_header("TEXT") == {
        "endpoint-load-metrics": "TEXT named_metrics.kv_cache_usage_perc=0.0, named_metrics.num_requests_waiting=0.0"
    }
    head = m.orca_header("json")["endpoint-load-metrics"]
    assert head.startswith("JSON ") and json.loads(head[5:]) == {
        "named_metrics": {"kv_cache_usage_perc": 0.0, "num_requests_waiting": 0.0}
    }
    assert m.orca_header("xml") == {}
