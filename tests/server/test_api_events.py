"""The Responses and Messages event writers without a model (issue 33): a stream of
reasoning, text and a tool call ends with the object the same Reply gives unstreamed,
and its events come in each API's order."""

import json

from rawpage.outputs import CompletionOutput
from rawpage.server.chat_reply import Reply
from rawpage.server.chat_request import TokenCounts
from rawpage.server.messages_output import MessageEvents, message_object
from rawpage.server.reasoning_seal import ReasoningSeal
from rawpage.server.responses_output import OutputItems, ResponseEvents, finished, new_envelope
from rawpage.server.tool_parsers import ToolCall

CALL = ToolCall("weather", '{"city": "Paris"}', "call_abc")
DELTAS = [
    {"reasoning_content": "The user "},
    {"reasoning_content": "wants weather."},
    {"content": "Let me check."},
    {"content": "", "tool_calls": [{"index": 0, **CALL.to_openai()}]},
]
REPLY = Reply("The user wants weather.", "Let me check.", [CALL], "tool_calls")
SEAL = ReasoningSeal("test secret")


def parse(events: list[str]) -> list[tuple[str, dict]]:
    out = []
    for e in events:
        name, data = e.strip().split("\n")
        out.append((name.removeprefix("event: "), json.loads(data.removeprefix("data: "))))
    return out


def test_a_response_stream_ends_with_the_unstreamed_object():
    items = OutputItems(SEAL.seal)  # include: ["reasoning.encrypted_content"]
    envelope = new_envelope("resp_1", "m", {"store": True})
    ev = ResponseEvents(envelope, items)
    events = ev.start() + [e for d in DELTAS for e in ev.feed(d)]
    usage = {"input_tokens": 1}
    closing, response = ev.finish(ev.reply("tool_calls"), usage)
    events = parse(events + closing)
    assert response == finished(envelope, REPLY, items.of(REPLY), usage)
    assert [o["type"] for o in response["output"]] == ["reasoning", "message", "function_call"]
    assert [d["sequence_number"] for _, d in events] == list(range(len(events)))
    assert all(name == d["type"] for name, d in events)
    kinds = [name for name, _ in events]
    assert kinds[:3] == ["response.created", "response.in_progress", "response.output_item.added"]
    assert kinds[-1] == "response.completed" and events[-1][1]["response"] == response
    done = [d["item"] for name, d in events if name == "response.output_item.done"]
    assert done == response["output"]  # each item is done as the final object has it
    assert SEAL.open(response["output"][0]["encrypted_content"], "x") == REPLY.reasoning


def test_a_message_stream_adds_up_to_the_unstreamed_message():
    o = CompletionOutput(0, "", [1, 2, 3], None, None, finish_reason="stop")
    counts = TokenCounts(5, 3, None)
    ev = MessageEvents("msg_1", "m", SEAL.seal)
    events = ev.start(counts) + [e for d in DELTAS for e in ev.feed(d)]
    events = parse(events + ev.finish(ev.reply("tool_calls"), o, counts))
    whole = message_object("msg_1", "m", REPLY, o, counts, SEAL.seal)
    blocks: list[dict] = []
    for name, d in events:  # rebuild the message as a client does
        if name == "content_block_start":
            blocks.append(dict(d["content_block"]))
        elif name == "content_block_delta":
            b, delta = blocks[d["index"]], d["delta"]
            kinds = {"text_delta": "text", "thinking_delta": "thinking", "signature_delta": "signature"}
            key = {**kinds, "input_json_delta": "partial_json"}[delta["type"]]
            b[key] = b.get(key, "") + delta[key]
    for b in blocks:
        if "partial_json" in b:
            b["input"] = json.loads(b.pop("partial_json"))
    assert blocks == whole["content"] and [b["type"] for b in blocks] == ["thinking", "text", "tool_use"]
    assert SEAL.open(blocks[0]["signature"], "x") == REPLY.reasoning  # signature_delta, as Anthropic sends it
    assert events[-2][1]["delta"]["stop_reason"] == whole["stop_reason"] == "tool_use"
    assert [name for name, _ in events][-1] == "message_stop"
