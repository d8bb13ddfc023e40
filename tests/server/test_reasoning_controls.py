"""Reasoning controls through each API (issue 43 item 1, issue 42's reasoning output): chat's
reasoning_effort and thinking_token_budget, Responses' reasoning.effort / max_tokens and
encrypted_content, Anthropic's thinking with signed blocks, and --reasoning-budget. A tiny
random model whose template opens a <think> block thinks until it is stopped, so every
budget shows as the forced </think> at its place (tests/tiny_models.py)."""

import json

import httpx
import pytest

from rawpage.server.reasoning_seal import ReasoningSeal
from tests.server.harness import ServerProcess
from tests.tiny_models import write_thinking_model

anthropic = pytest.importorskip("anthropic")
openai = pytest.importorskip("openai")

SECRET = "a test secret"
USER = [{"role": "user", "content": "hi"}]
DEFAULT_BUDGET = 6  # the server's --reasoning-budget
END = 401  # </think> in the tiny vocabulary (tests/tiny_models.py: added after the 400 trained tokens)


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    model = write_thinking_model(str(tmp_path_factory.mktemp("think") / "m"))
    flags = ["--served-model-name", "thinker", "--reasoning-parser", "qwen3", "--reasoning-secret", SECRET]
    flags += ["--reasoning-budget", str(DEFAULT_BUDGET), "--max-model-len", "256", "--trust-request-chat-template"]
    s = ServerProcess("--model", model, *flags)
    yield s
    assert s.stop() == 0, s.output()


@pytest.fixture(scope="module")
def oai(server):
    return openai.OpenAI(base_url=server.url + "/v1", api_key="x", max_retries=0)


@pytest.fixture(scope="module")
def claude(server):
    return anthropic.Anthropic(base_url=server.url, api_key="x", max_retries=0)


GREEDY = {"temperature": 0, "max_tokens": 20, "extra_body": {"ignore_eos": True, "return_token_ids": True}}


def chat(oai, **kw):
    extra = {**GREEDY["extra_body"], **kw.pop("extra_body", {})}
    return oai.chat.completions.create(model="thinker", messages=USER, **{**GREEDY, **kw, "extra_body": extra})


def forced_at(r) -> int:
    return r.choices[0].token_ids.index(END)


def test_the_server_budget_applies_unless_the_request_sets_one(oai):
    r = chat(oai)
    m = r.choices[0].message
    assert forced_at(r) == DEFAULT_BUDGET and m.reasoning == m.reasoning_content and m.reasoning
    assert r.usage.completion_tokens_details.reasoning_tokens == DEFAULT_BUDGET + 1
    assert forced_at(chat(oai, extra_body={"thinking_token_budget": 2})) == 2
    unlimited = chat(oai, extra_body={"thinking_token_budget": -1})
    assert (
        END not in unlimited.choices[0].token_ids and unlimited.usage.completion_tokens_details.reasoning_tokens == 20
    )


def test_reasoning_effort_is_a_budget_where_the_template_has_no_switch(oai):
    none = chat(oai, reasoning_effort="none")  # budget 0: enable_thinking false closes the block in the prompt
    assert none.choices[0].message.reasoning is None and none.usage.completion_tokens_details.reasoning_tokens == 0
    low = chat(oai, reasoning_effort="low")  # 1024 tokens: more than this reply has
    assert END not in low.choices[0].token_ids
    switch = "{% for m in messages %}{{ m.content }}{% endfor %}effort={{ reasoning_effort }}<think>\n"
    steered = chat(oai, reasoning_effort="minimal", extra_body={"chat_template": switch})
    assert END not in steered.choices[0].token_ids  # the template reads it: no budget of ours
    with pytest.raises(openai.BadRequestError, match="reasoning_effort"):
        chat(oai, reasoning_effort="extreme")


def test_streamed_reasoning_and_include_reasoning(oai, server):
    def stream(**extra):
        body = {"model": "thinker", "messages": USER, "stream": True, "temperature": 0, "max_tokens": 12, **extra}
        with httpx.stream("POST", server.url + "/v1/chat/completions", json=body) as r:
            return [json.loads(line[6:]) for line in r.iter_lines() if line.startswith("data: {")]

    events = stream(thinking_token_budget=3, ignore_eos=True)
    deltas = [e["choices"][0]["delta"] for e in events if e["choices"]]
    reasoning = "".join(d.get("reasoning", "") for d in deltas)
    assert reasoning and reasoning == "".join(d.get("reasoning_content", "") for d in deltas)
    whole = chat(oai, max_tokens=12, extra_body={"thinking_token_budget": 3})
    assert reasoning == whole.choices[0].message.reasoning
    hidden = stream(thinking_token_budget=3, ignore_eos=True, include_reasoning=False)
    assert not any("reasoning" in e["choices"][0]["delta"] for e in hidden if e["choices"])
    assert "".join(e["choices"][0]["delta"].get("content") or "" for e in hidden if e["choices"])


def test_responses_effort_budget_and_encrypted_reasoning_round_trip(oai):
    kw = {"model": "thinker", "max_output_tokens": 20, "temperature": 0}
    r = oai.responses.create(
        input="hi", reasoning={"effort": "low", "max_tokens": 3}, include=["reasoning.encrypted_content"], **kw
    )
    item = r.output[0]
    assert item.type == "reasoning" and r.reasoning.effort == "low"
    assert r.usage.output_tokens_details.reasoning_tokens == 4
    assert ReasoningSeal(SECRET).open(item.encrypted_content, "x") == item.content[0].text  # signed, readable
    sent_back = {"type": "reasoning", "id": item.id, "summary": [], "encrypted_content": item.encrypted_content}
    back = [{"role": "user", "content": "hi"}, sent_back, {"role": "user", "content": "and?"}]
    assert oai.responses.create(input=back, store=False, **kw).status == "incomplete"
    signed, _, mac = item.encrypted_content.rpartition(".")
    back[1]["encrypted_content"] = signed[:-2] + ("AA" if not signed.endswith("AA") else "BB") + "." + mac
    with pytest.raises(openai.BadRequestError, match="encrypted_content"):
        oai.responses.create(input=back, **kw)
    plain = oai.responses.create(input="hi", reasoning={"effort": "high", "summary": "auto"}, **kw)
    assert plain.output[0].encrypted_content is None and plain.reasoning.summary == "auto"
    with pytest.raises(openai.BadRequestError, match="include"):
        oai.responses.create(input="hi", include=["file_search_call.results"], **kw)


def test_anthropic_thinking_blocks_signed_and_sent_back(claude):
    kw = {"model": "thinker", "max_tokens": 20, "extra_body": {"temperature": 0}}
    m = claude.messages.create(messages=USER, thinking={"type": "enabled", "budget_tokens": 4}, **kw)
    thinking, text = m.content[0], m.content[1]
    assert thinking.type == "thinking" and thinking.thinking and text.type == "text"
    assert ReasoningSeal(SECRET).open(thinking.signature, "x") == thinking.thinking
    with claude.messages.stream(messages=USER, thinking={"type": "enabled", "budget_tokens": 4}, **kw) as s:
        kinds = [e.delta.type for e in s if e.type == "content_block_delta"]
        streamed = s.get_final_message()
    assert "thinking_delta" in kinds and "signature_delta" in kinds
    assert streamed.content[0].thinking == thinking.thinking and streamed.content[0].signature == thinking.signature
    history = [*USER, {"role": "assistant", "content": [thinking.model_dump(), text.model_dump()]}, *USER]
    assert claude.messages.create(messages=history, **kw).stop_reason == "max_tokens"
    history[1]["content"][0]["thinking"] += " (edited)"
    with pytest.raises(anthropic.BadRequestError, match="signature"):
        claude.messages.create(messages=history, **kw)
    hidden = claude.messages.create(
        messages=USER, thinking={"type": "enabled", "budget_tokens": 4, "display": "omitted"}, **kw
    )
    assert hidden.content[0].thinking == "" and ReasoningSeal(SECRET).open(hidden.content[0].signature, "x")
    history = [*USER, {"role": "assistant", "content": [hidden.content[0].model_dump()]}, *USER]
    assert claude.messages.create(messages=history, **kw).stop_reason == "max_tokens"  # the signature restores it
    off = claude.messages.create(messages=USER, thinking={"type": "disabled"}, **kw)
    assert [b.type for b in off.content] == ["text"]
    with pytest.raises(anthropic.BadRequestError, match="thinking.type"):
        claude.messages.create(messages=USER, thinking={"type": "sometimes"}, **kw)
