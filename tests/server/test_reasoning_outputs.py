"""--reasoning-parser with structured outputs (issue 29 item 3, vllm#27447): the default
model never thinks, so it never writes </think>; the grammar must still apply, from
the first token, and the reply is content, not reasoning. A template that closes the
block in the prompt (Qwen3 with enable_thinking: false) constrains from the start too;
one that leaves it open lets the model think first."""

import json

import httpx
import pytest

from tests.server.harness import ServerProcess

CHAT = "/v1/chat/completions"
SCHEMA = {
    "type": "object",
    "properties": {"city": {"type": "string", "maxLength": 12}, "ok": {"type": "boolean"}},
    "required": ["city", "ok"],
    "additionalProperties": False,
}
TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "parameters": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 12}}},
    },
}
# SmolLM2's ChatML, with the think block closed (or left open) after the generation prompt
CHATML = (
    "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}<|im_start|>assistant\n"
)
CLOSED = CHATML + "<think>\n\n</think>\n\n"
OPENED = CHATML + "<think>\n"


@pytest.fixture(scope="module")
def server():
    s = ServerProcess("--reasoning-parser", "deepseek_r1", "--trust-request-chat-template", "--max-model-len", "1024")
    yield s
    assert s.stop() == 0, s.output()


def chat(server, **kw):
    body = {"messages": [{"role": "user", "content": "Where is Tokyo? Answer in JSON."}], "max_tokens": 40, **kw}
    r = httpx.post(server.url + CHAT, json={"temperature": 0, **body}, timeout=300)
    assert r.status_code == 200, r.text
    return r.json()["choices"][0]


def test_response_format_applies_when_the_model_never_thinks(server):
    rf = {"type": "json_schema", "json_schema": {"name": "place", "schema": SCHEMA}}
    c = chat(server, response_format=rf)
    assert c["finish_reason"] == "stop", c
    assert set(json.loads(c["message"]["content"])) == {"city", "ok"}
    assert c["message"]["reasoning_content"] is None


def test_guided_choice_and_a_stream_apply_from_the_first_token(server):
    c = chat(server, guided_choice=["Japan", "France"])
    assert c["message"]["content"] in ("Japan", "France") and c["finish_reason"] == "stop", c
    body = {"messages": [{"role": "user", "content": "Where is Tokyo?"}], "guided_choice": ["Japan", "France"]}
    with httpx.stream("POST", server.url + CHAT, json={**body, "stream": True}, timeout=300) as r:
        events = [json.loads(line[6:]) for line in r.iter_lines() if line.startswith("data: {")]
    text = "".join(e["choices"][0]["delta"].get("content") or "" for e in events if e["choices"])
    assert text in ("Japan", "France"), events


def test_tool_choice_required_calls_a_tool(server):
    c = chat(server, tools=[TOOL], tool_choice="required")
    assert c["finish_reason"] == "tool_calls", c
    assert c["message"]["tool_calls"][0]["function"]["name"] == "get_weather"


def test_a_template_that_closes_the_block_is_constrained_from_the_start(server):
    c = chat(server, chat_template=CLOSED, guided_choice=["Japan", "France"])
    assert c["message"]["content"] in ("Japan", "France") and c["finish_reason"] == "stop", c


def test_a_template_that_opens_the_block_lets_the_model_think_first(server):
    c = chat(server, chat_template=OPENED, guided_choice=["Japan", "France"], max_tokens=8)
    # this model never closes the block: 8 tokens of free reasoning, no answer yet
    assert c["finish_reason"] == "length" and c["message"]["reasoning_content"], c
    assert not c["message"]["content"]
