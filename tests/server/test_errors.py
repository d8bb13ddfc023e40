"""Every error case through raw HTTP: status and OpenAI's JSON error shape."""

import httpx
import pytest

from tests.server.harness import ServerProcess


def assert_error(r: httpx.Response, status: int, param: str | None = None, match: str = ""):
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert set(err) == {"message", "type", "param", "code"}
    assert isinstance(err["message"], str) and err["message"]
    if param is not None:
        assert err["param"] == param
    assert match in err["message"]


CHAT = "/v1/chat/completions"
MSGS = [{"role": "user", "content": "hi"}]


@pytest.mark.parametrize(
    "path,body,param",
    [
        (CHAT, {"messages": "hi"}, "messages"),
        (CHAT, {}, "messages"),
        (CHAT, {"messages": [{"content": "no role"}]}, "messages[0]"),
        (CHAT, {"messages": MSGS, "max_tokens": "ten"}, "max_tokens"),
        (CHAT, {"messages": MSGS, "max_tokens": 0}, "max_tokens"),
        (CHAT, {"messages": MSGS, "temperature": -1}, "temperature"),
        (CHAT, {"messages": MSGS, "top_p": 0}, "top_p"),
        (CHAT, {"messages": MSGS, "n": 0}, "n"),
        (CHAT, {"messages": MSGS, "stream": "maybe"}, "stream"),  # "yes" is true, as pydantic (vLLM) reads it
        (CHAT, {"messages": MSGS, "stop": 5}, "stop"),
        (CHAT, {"messages": MSGS, "logit_bias": {"x": 1}}, "logit_bias"),
        (CHAT, {"messages": MSGS, "top_logprobs": 3}, "top_logprobs"),
        (
            CHAT,
            {"messages": [{"role": "user", "content": [{"type": "image_url"}]}]},
            "messages[0].content[0]",  # an image part without its url
        ),
        (CHAT, {"messages": [{"role": "user", "content": [{"type": "input_audio"}]}]}, "messages[0].content[0]"),
        ("/v1/completions", {"prompt": 7}, "prompt"),
        ("/v1/completions", {"prompt": ""}, "prompt"),
        ("/v1/completions", {"prompt": "hi", "logprobs": 50}, "logprobs"),
        ("/v1/completions", {"prompt": "hi", "min_tokens": 9, "max_tokens": 3}, "min_tokens"),
    ],
)
def test_bad_fields_are_400_naming_the_param(server, path, body, param):
    assert_error(httpx.post(server.url + path, json=body), 400, param)


def test_malformed_json(server):
    r = httpx.post(server.url + CHAT, content=b"{not json", headers={"content-type": "application/json"})
    assert_error(r, 400, match="not valid JSON")
    assert_error(httpx.post(server.url + CHAT, json=[1, 2]), 400, match="JSON object")


def test_prompt_plus_max_tokens_over_the_context(server):
    r = httpx.post(server.url + "/v1/completions", json={"prompt": "hello world", "max_tokens": 8191})
    assert_error(
        r,
        400,
        "prompt",
        match="(2 tokens) plus max_tokens (8191) is 8193 tokens, more than --max-model-len 8192",
    )
    r = httpx.post(server.url + "/v1/completions", json={"prompt": "hello " * 9000, "max_tokens": 10})
    assert_error(r, 400, "prompt", match="--max-model-len 8192")


def test_unknown_model_is_404(server):
    assert_error(httpx.post(server.url + CHAT, json={"model": "gpt-4", "messages": MSGS}), 404, "model")


def test_unknown_route_and_method(server):
    assert_error(httpx.get(server.url + "/v1/nothing"), 404)
    assert_error(httpx.get(server.url + CHAT), 405)


def test_oversized_body_is_413(server):
    big = {"messages": [{"role": "user", "content": "x" * (5 << 20)}]}
    assert_error(httpx.post(server.url + CHAT, json=big), 413)


def test_tokenize_and_detokenize(server):
    r = httpx.post(server.url + "/tokenize", json={"prompt": "Hello world"}).json()
    assert r["count"] == len(r["tokens"]) == 2 and r["max_model_len"] == 8192
    assert httpx.post(server.url + "/detokenize", json={"tokens": r["tokens"]}).json() == {"prompt": "Hello world"}
    chat = httpx.post(server.url + "/tokenize", json={"messages": MSGS}).json()
    assert chat["count"] > 10
    assert_error(httpx.post(server.url + "/detokenize", json={"tokens": [-1]}), 400, "tokens")


def test_health_version_and_request_id(server):
    assert httpx.get(server.url + "/health").json() == {"status": "ok"}
    assert "version" in httpx.get(server.url + "/version").json()
    r = httpx.post(
        server.url + CHAT,
        json={"messages": MSGS, "max_tokens": 2},
        headers={"X-Request-Id": "my-id-1"},
    )
    assert r.json()["id"] == "my-id-1" and r.headers["x-request-id"] == "my-id-1"


def test_metrics(server):
    httpx.post(server.url + CHAT, json={"messages": MSGS, "max_tokens": 3})
    text = httpx.get(server.url + "/metrics").text
    for name in (
        "rawpage:num_requests_running",
        "rawpage:num_requests_waiting",
        "rawpage:kv_cache_usage_perc",
        "rawpage:prompt_tokens_total",
        "rawpage:generation_tokens_total",
        "rawpage:num_preemptions_total",
        "rawpage:time_to_first_token_seconds_bucket",
        "rawpage:inter_token_latency_seconds_bucket",
        "rawpage:e2e_request_latency_seconds_bucket",
    ):
        assert name in text, name
    assert server.metric("rawpage:generation_tokens_total") >= 3


def test_api_key_and_loading_503():
    s = ServerProcess("--api-key", "sekret", "--max-model-len", "2048", wait=False)
    try:
        r = httpx.get(s.url + "/health", timeout=30) if _wait_listening(s) else None
        assert r is not None and r.status_code == 503 and r.json() == {"status": "loading"}
        assert_error(
            httpx.post(s.url + CHAT, json={"messages": MSGS}, headers={"Authorization": "Bearer sekret"}),
            503,
        )
        s.wait_ready()
        assert_error(httpx.post(s.url + CHAT, json={"messages": MSGS}), 401)
        assert_error(
            httpx.post(s.url + CHAT, json={"messages": MSGS}, headers={"Authorization": "Bearer nope"}),
            401,
        )
        ok = httpx.post(
            s.url + CHAT,
            json={"messages": MSGS, "max_tokens": 2},
            headers={"Authorization": "Bearer sekret"},
        )
        assert ok.status_code == 200
        assert httpx.get(s.url + "/health").status_code == 200  # health needs no key
    finally:
        assert s.stop() == 0, s.output()


def _wait_listening(s, timeout=60.0):
    import time

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            httpx.get(s.url + "/version", timeout=1)
            return True
        except httpx.HTTPError:
            time.sleep(0.05)
    return False
