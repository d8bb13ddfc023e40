"""Issue 31 ("a real drop-in"), items 6-12, through the openai client where it can carry
the request (vLLM's extras go in extra_body) and raw HTTP for vLLM's own routes."""

import concurrent.futures
import json
import time

import httpx
import openai
import pytest

MODEL = "SmolLM2-135M-Instruct"
JAPAN = [{"role": "user", "content": "What is the capital of Japan?"}]
# A tool whose parameters use local $defs (what pydantic, LangChain and the Agents SDK write).
VISIT = {
    "type": "function",
    "function": {
        "name": "visit",
        "parameters": {
            "type": "object",
            "properties": {"where": {"$ref": "#/$defs/Place"}},
            "required": ["where"],
            "$defs": {"Place": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}},
        },
    },
}


@pytest.fixture(scope="module")
def client(plain_server):
    return openai.OpenAI(base_url=plain_server.url + "/v1", api_key="unused")


def chat(client, **kw):
    return client.chat.completions.create(model=MODEL, messages=kw.pop("messages", JAPAN), temperature=0, **kw)


# --- item 6: vLLM's request extras ---------------------------------------------------------
def test_continuous_usage_stats_puts_usage_on_every_chunk(client):
    opts = {"include_usage": True, "continuous_usage_stats": True}
    chunks = list(chat(client, max_tokens=4, stream=True, stream_options=opts))
    assert all(c.usage is not None for c in chunks)
    with_text = [c for c in chunks if c.choices]
    assert with_text[-1].usage.completion_tokens == 4 == chunks[-1].usage.completion_tokens


def test_prompt_logprobs_and_token_ids_and_the_keys_vllm_always_sends(client):
    plain = chat(client, max_tokens=3)
    assert plain.prompt_logprobs is None and plain.prompt_token_ids is None  # present, null
    assert plain.choices[0].token_ids is None
    r = chat(client, max_tokens=3, extra_body={"prompt_logprobs": 1, "return_token_ids": True})
    assert len(r.prompt_token_ids) == r.usage.prompt_tokens == len(r.prompt_logprobs)
    assert r.prompt_logprobs[0] is None and all(len(e) >= 1 for e in r.prompt_logprobs[1:])
    first = next(iter(r.prompt_logprobs[1].values()))
    assert set(first) == {"logprob", "rank", "decoded_token"}
    assert len(r.choices[0].token_ids) == r.usage.completion_tokens
    c = client.completions.create(model=MODEL, prompt="Hi", max_tokens=2, extra_body={"prompt_logprobs": 0})
    assert c.choices[0].prompt_token_ids is None and len(c.choices[0].prompt_logprobs) == 1


def test_streamed_token_ids_include_tokens_that_end_no_text(client):
    """The default model answers this with an emoji spelled in three byte tokens, two of which
    end no character: their ids go out on chunks of their own, as vLLM's, so the stream's ids
    are the reply's ids (vLLM's test_chat_completion_with_emoji_and_token_ids)."""
    cats = [
        {"role": "system", "content": "You like to use emojis in your responses."},
        {"role": "user", "content": "Repeat after me: I love cats \U0001f431"},
    ]
    ids = {"return_token_ids": True}
    whole = chat(client, messages=cats, max_tokens=20, extra_body=ids).choices[0]
    streamed = [c.choices[0] for c in chat(client, messages=cats, max_tokens=20, stream=True, extra_body=ids)]
    assert [i for c in streamed for i in c.token_ids] == whole.token_ids
    assert "".join(c.delta.content or "" for c in streamed) == whole.message.content


def test_return_tokens_as_token_ids_and_logprob_token_ids(client):
    r = chat(client, max_tokens=2, logprobs=True, top_logprobs=2, extra_body={"return_tokens_as_token_ids": True})
    item = r.choices[0].logprobs.content[0]
    assert item.token.startswith("token_id:") and all(t.token.startswith("token_id:") for t in item.top_logprobs)
    r = chat(client, max_tokens=2, logprobs=True, extra_body={"logprob_token_ids": [11, 12]})
    for item in r.choices[0].logprobs.content:
        assert {t.token for t in item.top_logprobs} >= {client_token(client, 11), client_token(client, 12)}


def client_token(client, token_id):
    return httpx.post(str(client.base_url).replace("/v1/", "/detokenize"), json={"tokens": [token_id]}).json()["prompt"]


def test_echo_and_continue_final_message(client):
    start = "The capital of Japan is"
    msgs = [*JAPAN, {"role": "assistant", "content": start}]
    extra = {"add_generation_prompt": False, "continue_final_message": True, "echo": True}
    r = chat(client, messages=msgs, max_tokens=4, extra_body=extra)
    assert r.choices[0].message.content.startswith(start + " Tokyo")
    assert r.prompt_logprobs is not None  # vLLM: an echoed chat brings the prompt's logprobs
    streamed = chat(client, messages=msgs, max_tokens=4, stream=True, extra_body=extra)
    assert "".join(c.choices[0].delta.content or "" for c in streamed if c.choices) == r.choices[0].message.content
    with pytest.raises(openai.BadRequestError, match="add_generation_prompt"):
        chat(client, messages=msgs, max_tokens=1, extra_body={"continue_final_message": True})


def test_tokenize_always_sends_token_strs(plain_server):
    r = httpx.post(plain_server.url + "/tokenize", json={"prompt": "Hello"}).json()
    assert "token_strs" in r and r["token_strs"] is None


# --- item 7: vLLM's routes, metrics and load report -------------------------------------------
def test_invocations_dispatch_by_body_shape(plain_server):
    url = plain_server.url + "/invocations"
    r = httpx.post(url, json={"messages": JAPAN, "max_tokens": 2}, timeout=60)
    assert r.status_code == 200 and r.json()["object"] == "chat.completion"
    r = httpx.post(url, json={"prompt": "Hi", "max_tokens": 2}, timeout=60)
    assert r.status_code == 200 and r.json()["object"] == "text_completion"
    r = httpx.post(url, json={"input": "Hi"}, timeout=60)
    assert r.status_code == 400 and "'messages'" in r.json()["error"]["message"]


def test_batch_chat_completions(plain_server):
    body = {"messages": [JAPAN, [{"role": "user", "content": "Hi"}]], "max_tokens": 3, "temperature": 0}
    r = httpx.post(plain_server.url + "/v1/chat/completions/batch", json=body, timeout=60).json()
    assert [c["index"] for c in r["choices"]] == [0, 1] and r["usage"]["completion_tokens"] == 6
    r = httpx.post(plain_server.url + "/v1/chat/completions/batch", json={**body, "stream": True})
    assert r.status_code == 400 and r.json()["error"]["param"] == "stream"


def test_load_tokenizer_info_and_orca_header(plain_server):
    assert httpx.get(plain_server.url + "/load").json() == {"server_load": 0}
    assert httpx.post(plain_server.url + "/reset_prefix_cache").status_code == 404  # --server-dev-mode only
    info = httpx.get(plain_server.url + "/tokenizer_info").json()
    assert info["eos_token"] == "<|im_end|>" and "<|im_start|>" in info["chat_template"]
    body = {"prompt": "Hi", "max_tokens": 1}
    for fmt, prefix in (("text", "TEXT named_metrics.kv_cache_usage_perc="), ("json", "JSON {")):
        r = httpx.post(plain_server.url + "/v1/completions", json=body, headers={"endpoint-load-metrics-format": fmt})
        assert r.headers["endpoint-load-metrics"].startswith(prefix)
    assert "endpoint-load-metrics" not in httpx.post(plain_server.url + "/v1/completions", json=body).headers


def test_load_counts_a_request_in_flight(plain_server):
    body = {"prompt": "Once", "max_tokens": 200, "ignore_eos": True}
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        pending = pool.submit(httpx.post, plain_server.url + "/v1/completions", json=body, timeout=120)
        seen = set()
        while not pending.done():
            seen.add(httpx.get(plain_server.url + "/load").json()["server_load"])
            time.sleep(0.05)
    assert pending.result().status_code == 200 and 1 in seen
    assert httpx.get(plain_server.url + "/load").json() == {"server_load": 0}


def test_load_counts_a_stream_until_its_last_event(plain_server):
    """A stream counts while its events are still being sent, not only until its first one."""
    body = {"prompt": "Once", "max_tokens": 200, "ignore_eos": True, "stream": True}
    with httpx.stream("POST", plain_server.url + "/v1/completions", json=body, timeout=120) as r:
        events = r.iter_lines()
        assert next(e for e in events if e.startswith("data: "))  # the first event is out: the stream runs on
        loads = []
        for _ in range(5):  # read nothing for a while: the stream is held open
            loads.append(httpx.get(plain_server.url + "/load").json()["server_load"])
            time.sleep(0.1)
        assert loads == [1] * 5
        assert [e for e in events if e.startswith("data: ")][-1] == "data: [DONE]"
    deadline = time.monotonic() + 10  # the count drops once the response has ended, just after [DONE]
    while httpx.get(plain_server.url + "/load").json()["server_load"] != 0:
        assert time.monotonic() < deadline, "a finished stream is still counted"
        time.sleep(0.05)


def test_vllm_metric_names_beside_ours(plain_server):
    chat_body = {"messages": JAPAN, "max_tokens": 2}
    httpx.post(plain_server.url + "/v1/chat/completions", json=chat_body, timeout=60)
    text = httpx.get(plain_server.url + "/metrics").text
    for name in (
        "vllm:num_requests_running",
        "vllm:num_requests_waiting",
        "vllm:kv_cache_usage_perc",
        "vllm:prompt_tokens_total",
        "vllm:generation_tokens_total",
        "vllm:iteration_tokens_total_bucket",
        "vllm:time_to_first_token_seconds_bucket",
        "vllm:e2e_request_latency_seconds_bucket",
        "rawpage:prompt_tokens_total",
    ):
        line = next((x for x in text.splitlines() if x.startswith(name + "{")), "")
        assert f'model_name="{MODEL}"' in line, name
        if name.startswith("vllm:"):  # vLLM's labels: model_name and engine
            assert 'engine="0"' in line, name
    assert plain_server.metric("vllm:generation_tokens_total") == plain_server.metric("rawpage:generation_tokens_total")


# --- item 8: validation as vLLM's ------------------------------------------------------------
def test_custom_roles_and_string_booleans_pass(client):
    r = chat(client, messages=[{"role": "narrator", "content": "It was dark."}, *JAPAN], max_tokens=2)
    assert r.choices[0].message.content
    r = chat(client, max_tokens=1, extra_body={"logprobs": "true", "top_logprobs": 1})
    assert r.choices[0].logprobs.content[0].top_logprobs


def test_validation_errors_vllm_answers(plain_server):
    url = plain_server.url + "/v1/chat/completions"
    cases = [
        ({"stream_options": {"include_usage": True}}, "stream_options", "'stream': true"),
        ({"logprobs": True, "top_logprobs": -1}, "top_logprobs", "--max-logprobs 20"),
        ({"logit_bias": {"abc": 1}}, "logit_bias", "'abc'"),
        ({"logit_bias": {"5": 101}}, "logit_bias", "between -100 and 100, got 101"),
    ]
    for extra, param, says in cases:
        r = httpx.post(url, json={"messages": JAPAN, "max_tokens": 1, **extra})
        err = r.json()["error"]
        assert r.status_code == 400 and err["param"] == param and says in err["message"], (extra, err)


# --- item 9: required tools with $defs; echo of a token-id prompt -----------------------------
def test_required_tool_with_local_defs_gives_a_call(client):
    r = chat(client, tools=[VISIT], tool_choice="required", max_tokens=40)
    call = r.choices[0].message.tool_calls[0]
    assert call.function.name == "visit" and set(json.loads(call.function.arguments)) == {"where"}


def test_echo_of_token_ids_keeps_special_tokens_consistent_with_offsets(client):
    c = client.completions.create(model=MODEL, prompt=[1, 28, 2], max_tokens=2, echo=True, logprobs=0, temperature=0)
    lp, text = c.choices[0].logprobs, c.choices[0].text
    assert text.startswith("<|im_start|>")
    for token, at in list(zip(lp.tokens, lp.text_offset))[:3]:  # the prompt's tokens, special ones too
        assert text[at : at + len(token)] == token


# --- item 10: tools on a default server ---------------------------------------------------------
def test_tools_with_auto_choice_on_a_server_without_tool_flags(client, plain_server):
    r = chat(client, tools=[VISIT], max_tokens=40)
    assert r.choices[0].finish_reason in ("stop", "length", "tool_calls")
    assert "hermes" in plain_server.output()  # the log says which parser it picked


# --- item 11: strict schemas are closed; a cut call is no call -------------------------------
def test_strict_schema_closes_objects(plain_server):
    schema = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
    rf = {"type": "json_schema", "json_schema": {"name": "c", "strict": True, "schema": schema}}
    body = {"messages": JAPAN, "max_tokens": 40, "temperature": 0, "response_format": rf}
    r = httpx.post(plain_server.url + "/v1/chat/completions", json=body, timeout=60).json()
    assert set(json.loads(r["choices"][0]["message"]["content"])) == {"city"}


def test_max_tokens_cutting_a_required_call(client):
    r = chat(client, tools=[VISIT], tool_choice="required", max_tokens=3)
    c = r.choices[0]
    assert c.finish_reason == "length" and not c.message.tool_calls and c.message.content == ""


# --- item 12: GET /v1/models/{id}, and 404s that say what is served ----------------------------
def test_retrieve_model_and_404s(client, plain_server):
    assert client.models.retrieve(MODEL).id == MODEL
    with pytest.raises(openai.NotFoundError, match="does not exist"):
        client.models.retrieve("gpt-4o")
    r = httpx.post(plain_server.url + "/v1/images/generations", json={"prompt": "hi"})
    assert r.status_code == 404 and "POST /v1/chat/completions" in r.json()["error"]["message"]
