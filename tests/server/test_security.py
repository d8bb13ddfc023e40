"""The security audit's findings (issue 15), each replayed against a real server.

Every test here failed before the fix it covers: one request could stop the engine,
a request's chat_template read files, templates froze the event loop, limits were
missing, and errors disclosed internals."""

import asyncio
import json
import socket
import threading
import time

import httpx
import pytest

from tests.server.harness import ServerProcess
from tests.server.test_errors import assert_error

CHAT = "/v1/chat/completions"
CMPL = "/v1/completions"
MSGS = [{"role": "user", "content": "hi"}]


def healthy_and_serving(server) -> None:
    assert httpx.get(server.url + "/health").status_code == 200
    r = httpx.post(server.url + CMPL, json={"prompt": "The capital of France is", "max_tokens": 3, "temperature": 0})
    assert r.status_code == 200, r.text


# --- A1: one request must not stop the engine ---------------------------------------------


@pytest.mark.parametrize(
    "body,param",
    [
        ({"prompt": "hi", "max_tokens": 4, "min_tokens": 2, "stop_token_ids": [999999999]}, "stop_token_ids"),
        ({"prompt": "hi", "max_tokens": 4, "logit_bias": {"99999999999999999999999": 5}}, "logit_bias"),
        ({"prompt": "hi", "max_tokens": 4, "logit_bias": {"-3": 5}}, "logit_bias"),
        ({"prompt": "hi", "use_beam_search": True, "n": 2, "length_penalty": 600, "max_tokens": 3}, "length_penalty"),
        (
            {"prompt": "hi", "use_beam_search": True, "n": 2, "length_penalty": -1e308, "max_tokens": 3},
            "length_penalty",
        ),
        ({"prompt": "hi", "max_tokens": 4, "stop_token_ids": [-1]}, "stop_token_ids"),
    ],
)
def test_engine_killers_are_400s_and_the_engine_lives(server, body, param):
    assert_error(httpx.post(server.url + CMPL, json=body), 400, param)
    healthy_and_serving(server)


# --- A2: chat_template in a request -----------------------------------------------------------


def test_request_chat_template_is_refused_without_the_flag(server):
    for template in ("/etc/passwd", "{{ messages[0].content }}"):
        body = {"messages": MSGS, "max_tokens": 2, "chat_template": template}
        assert_error(httpx.post(server.url + CHAT, json=body), 400, "chat_template", "--trust-request-chat-template")
        r = httpx.post(server.url + "/tokenize", json={"messages": MSGS, "chat_template": template})
        assert_error(r, 400, "chat_template")


@pytest.fixture(scope="module")
def trusting(tmp_path_factory):
    """A server that accepts request templates, and shows cached tokens, CORS, two API keys and an admin key
    (and vLLM's development route /reset_prefix_cache)."""
    s = ServerProcess(
        "--trust-request-chat-template",
        "--enable-prompt-tokens-details",
        "--api-key",
        "k1,k2",
        "--admin-api-key",
        "adm",
        "--allowed-origins",
        "https://ok.example",
        "--max-model-len",
        "2048",
        "--server-dev-mode",
    )
    yield s
    assert s.stop() == 0, s.output()


AUTH = {"Authorization": "Bearer k2"}


def test_trusted_template_is_text_never_a_path(trusting):
    body = {"messages": MSGS, "chat_template": "/etc/passwd", "add_generation_prompt": False}
    r = httpx.post(trusting.url + "/tokenize", json={**body, "return_token_strs": True}, headers=AUTH)
    assert r.status_code == 200, r.text
    text = httpx.post(trusting.url + "/detokenize", json={"tokens": r.json()["tokens"]}, headers=AUTH).json()
    assert text["prompt"] == "/etc/passwd"  # the template's own text, not the file's content


# --- A3: templates cannot freeze the server ---------------------------------------------------

SLOW = "{% for i in range(15000) %}{% for j in range(15000) %}{% endfor %}{% endfor %}x"
HUGE = '{{ "a" * 10000000 }}'


# One expression is one C call, past the reach of the clock (issue 29): refused before it runs.
BOMBS = ["{{ ((10**64)**64)**64 > 1 }}", "{{ '%040000000d' % 1 }}", "{{ 'x'|center(40000000) }}"]


@pytest.mark.parametrize(
    "template,match", [(SLOW, "took longer than"), (HUGE, "over"), *((bomb, "limit is") for bomb in BOMBS)]
)
def test_hostile_templates_fail_fast_and_health_stays_responsive(trusting, template, match):
    gaps: list[float] = []
    stop = threading.Event()

    def probe():
        while not stop.is_set():
            t0 = time.monotonic()
            httpx.get(trusting.url + "/health", timeout=30)
            gaps.append(time.monotonic() - t0)
            time.sleep(0.05)

    t = threading.Thread(target=probe)
    t.start()
    try:
        body = {"messages": MSGS, "max_tokens": 2, "chat_template": template}
        r = httpx.post(trusting.url + CHAT, json=body, headers=AUTH, timeout=60)
    finally:
        stop.set()
        t.join()
    assert_error(r, 400, "chat_template", match)
    # The render runs in a worker thread; the event loop keeps answering. (Generous bound:
    # the point is "not frozen for seconds", on a machine that may be busy.)
    assert max(gaps) < 2.0, gaps


# --- B5 / C6 / C7: cached tokens, keys, CORS ---------------------------------------------------


def test_cached_tokens_only_with_prompt_tokens_details(server, trusting):
    body = {"prompt": "The capital of France is", "max_tokens": 2}
    assert "prompt_tokens_details" not in httpx.post(server.url + CMPL, json=body).json()["usage"]
    usage = httpx.post(trusting.url + CMPL, json=body, headers=AUTH).json()["usage"]
    assert "cached_tokens" in usage["prompt_tokens_details"]


def test_every_route_but_health_needs_a_key(trusting):
    for method, path, body in [
        ("POST", "/tokenize", {"prompt": "hi"}),
        ("POST", "/detokenize", {"tokens": [1]}),
        ("GET", "/version", None),
        ("GET", "/v1/models", None),
        ("POST", CHAT, {"messages": MSGS, "max_tokens": 2}),
    ]:
        assert_error(httpx.request(method, trusting.url + path, json=body), 401)
        ok = httpx.request(method, trusting.url + path, json=body, headers={"Authorization": "Bearer k1"})
        assert ok.status_code == 200, (path, ok.text)
    assert_error(httpx.get(trusting.url + "/metrics"), 401)
    assert_error(httpx.get(trusting.url + "/metrics", headers={"Authorization": "Bearer k1"}), 403, match="admin")
    assert httpx.get(trusting.url + "/metrics", headers={"Authorization": "Bearer adm"}).status_code == 200
    assert_error(httpx.get(trusting.url + "/v1/engine/events"), 401)  # an endless stream once open:
    with httpx.stream(
        "GET", trusting.url + "/v1/engine/events", headers={"Authorization": "Bearer k1"}, timeout=60
    ) as r:
        assert r.status_code == 200  # so it is only opened, not read
    assert httpx.get(trusting.url + "/health").status_code == 200


def test_cors_only_for_allowed_origins(server, trusting):
    pre = {"Origin": "https://ok.example", "Access-Control-Request-Method": "POST"}
    r = httpx.options(trusting.url + CHAT, headers=pre)
    assert r.headers.get("access-control-allow-origin") == "https://ok.example"
    r = httpx.options(trusting.url + CHAT, headers={**pre, "Origin": "https://evil.example"})
    assert r.headers.get("access-control-allow-origin") is None
    r = httpx.options(server.url + CHAT, headers=pre)  # off by default
    assert r.headers.get("access-control-allow-origin") is None


# --- C8: limits -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "path,body,param",
    [
        (CHAT, {"messages": [{"role": 5, "content": "hi"}]}, "messages[0]"),  # any string role passes (vLLM, issue 31)
        (CMPL, {"prompt": ["a"] * 1000}, "prompt"),
        (CMPL, {"prompt": "hi", "stop": ["x"] * 17}, "stop"),
        (CMPL, {"prompt": "hi", "stop": ["x" * 300]}, "stop"),
        (CMPL, {"prompt": "hi", "logprobs": 21}, "logprobs"),
        (CHAT, {"messages": MSGS, "logprobs": True, "top_logprobs": 21}, "top_logprobs"),
        (CMPL, {"prompt": "hi", "priority": -5}, "priority"),
        (CMPL, {"prompt": "hi", "n": 100}, "n"),
    ],
)
def test_limits(server, path, body, param):
    assert_error(httpx.post(server.url + path, json=body), 400, param)


def test_deep_json_and_lone_surrogates_are_400s(server):
    deep = "[" * 100000 + "]" * 100000
    r = httpx.post(server.url + CHAT, content=deep.encode(), headers={"content-type": "application/json"})
    assert_error(r, 400, match="nest")
    body = '{"messages": [{"role": "user", "content": "hi \\ud800 there"}], "max_tokens": 2}'
    r = httpx.post(server.url + CHAT, content=body.encode(), headers={"content-type": "application/json"})
    assert_error(r, 400, match="surrogate")
    healthy_and_serving(server)


# --- C11: less disclosure ------------------------------------------------------------------------


def test_no_paths_or_host_header_in_responses(server):
    model = httpx.get(server.url + "/v1/models").json()["data"][0]
    assert "/" not in model["root"] and model["root"] == model["id"]
    r = httpx.get(server.url + "/v1/models/", follow_redirects=False)
    assert r.status_code == 404 and "location" not in r.headers
    r = httpx.get(server.url + "/v1/models/", headers={"Host": "evil.example"}, follow_redirects=False)
    assert r.status_code == 421 and "location" not in r.headers  # not a name this server answers to


# --- issue 29, item 6: a web page elsewhere cannot use the API, key or no key ----------------------


def test_browser_requests_from_elsewhere_are_refused(server):
    """No --api-key: a text/plain body (a CORS "simple request", no preflight) is a 415, a
    request for another Host name (DNS rebinding) a 421, a POST from a foreign page a 403."""
    body = json.dumps({"prompt": "hi", "max_tokens": 1}).encode()
    r = httpx.post(server.url + CMPL, content=body, headers={"content-type": "text/plain"})
    assert_error(r, 415, match="application/json")
    assert_error(httpx.get(server.url + "/v1/models", headers={"Host": "rebound.example:8000"}), 421)
    assert_error(httpx.post(server.url + CMPL, content=body, headers={"Host": "rebound.example"}), 421)
    r = httpx.post(
        server.url + CMPL, json={"prompt": "hi", "max_tokens": 1}, headers={"Origin": "https://evil.example"}
    )
    assert_error(r, 403, match="--allowed-origins")
    same = {"Origin": server.url, "content-type": "application/json; charset=utf-8"}  # the built-in page
    assert httpx.post(server.url + CMPL, content=body, headers=same).status_code == 200
    assert httpx.get(server.url + "/v1/models", headers={"Host": "localhost"}).status_code == 200


# --- C9: backpressure -----------------------------------------------------------------------------


def test_overload_gives_fast_429s_and_admitted_requests_complete():
    """500 requests against --max-waiting-requests 50: the excess is refused at once with
    429 and Retry-After; every admitted request completes."""
    s = ServerProcess("--max-waiting-requests", "50", "--max-num-seqs", "4", "--max-model-len", "512")
    try:

        async def one(client, i):
            body = {"prompt": f"Count to {i}:", "max_tokens": 24, "temperature": 0, "ignore_eos": True}
            t0 = time.monotonic()
            r = await client.post(s.url + CMPL, json=body)
            return r.status_code, time.monotonic() - t0, r.headers.get("retry-after"), r.json()

        async def main():
            limits = httpx.Limits(max_connections=500)
            async with httpx.AsyncClient(timeout=300, limits=limits) as client:
                return await asyncio.gather(*[one(client, i) for i in range(500)])

        results = asyncio.run(main())
        codes = [c for c, *_ in results]
        assert set(codes) <= {200, 429}, set(codes)
        refused = [r for r in results if r[0] == 429]
        admitted = [r for r in results if r[0] == 200]
        assert len(refused) >= 300 and len(admitted) >= 50, (len(refused), len(admitted))
        assert all(r[2] == "1" and r[3]["error"]["type"] == "rate_limit_error" for r in refused)
        assert all(r[3]["usage"]["completion_tokens"] == 24 for r in admitted)
        # Refusals cost no engine work: each is answered long before the admitted ones finish.
        assert sorted(r[1] for r in refused)[len(refused) // 2] < max(r[1] for r in admitted)
        assert httpx.get(s.url + "/health").status_code == 200
    finally:
        assert s.stop() == 0, s.output()


def test_request_timeout_aborts_with_finish_reason_abort():
    s = ServerProcess("--request-timeout", "1", "--max-model-len", "2048")
    try:
        body = {"prompt": "Tell me a long story.", "max_tokens": 1500, "ignore_eos": True, "stream": True}
        last = None
        with httpx.stream("POST", s.url + CMPL, json=body, timeout=120) as r:
            for line in r.iter_lines():
                if line.startswith("data: {"):
                    last = json.loads(line[6:])
        assert last["choices"][0]["finish_reason"] == "abort"
        assert httpx.get(s.url + "/health").status_code == 200
    finally:
        assert s.stop() == 0, s.output()


def test_cache_salt_separates_tenants_over_http(trusting):
    prompt = "You are a helpful assistant for ACME. Your PIN is 4321. " * 6 + "Question:"

    def cached(salt):
        body = {"prompt": prompt, "max_tokens": 1, **({"cache_salt": salt} if salt else {})}
        r = httpx.post(trusting.url + CMPL, json=body, headers=AUTH, timeout=120)
        assert r.status_code == 200, r.text
        return r.json()["usage"]["prompt_tokens_details"]["cached_tokens"]

    assert cached("alice") == 0
    assert cached("alice") > 0
    assert cached("mallory") == 0
    assert cached(None) == 0
    r = httpx.post(trusting.url + CMPL, json={"prompt": "hi", "cache_salt": ""}, headers=AUTH)
    assert_error(r, 400, "cache_salt")


@pytest.mark.parametrize("api", ["responses", "messages"])
def test_cache_salt_separates_caches_on_responses_and_messages(trusting, api):
    """Issue 44: cache_salt on /v1/responses and /v1/messages salts the prefix-cache
    blocks as on completions: a second request with the same salt hits, another salt does not."""
    prompt = f"You are a helpful assistant for {api}. Your PIN is 4321. " * 6 + "Question: hi"

    if api == "responses":
        body, path = {"input": prompt, "max_output_tokens": 1}, "/v1/responses"
    else:
        body, path = {"messages": [{"role": "user", "content": prompt}], "max_tokens": 1}, "/v1/messages"

    def cached(salt):
        r = httpx.post(trusting.url + path, json={**body, "cache_salt": salt}, headers=AUTH, timeout=120)
        assert r.status_code == 200, r.text
        usage = r.json()["usage"]
        return (
            usage["input_tokens_details"]["cached_tokens"] if api == "responses" else usage["cache_read_input_tokens"]
        )

    assert cached(f"alice-{api}") == 0  # (the chat template's start is the same for both APIs)
    assert cached(f"alice-{api}") > 0
    assert cached(f"mallory-{api}") == 0
    r = httpx.post(trusting.url + path, json={**body, "cache_salt": ""}, headers=AUTH)
    assert r.status_code == 400 and "cache_salt" in r.text


def test_a_request_whose_client_left_while_queued_costs_no_compute():
    """With one sequence slot busy, a second request waits; its client hangs up; when the
    slot frees, the engine never computes the second prompt."""
    s = ServerProcess("--max-num-seqs", "1", "--max-model-len", "1024")
    try:
        before = s.metric("rawpage:prompt_tokens_total")
        # (600 tokens: the slot stays busy past the 1 s the second client waits; 120 took
        # about a second on the native CPU kernels)
        long_body = {"prompt": "Once upon a time", "max_tokens": 600, "ignore_eos": True, "stream": True}
        queued_body = {"prompt": "lorem ipsum " * 100, "max_tokens": 4}  # ~300 tokens, easy to spot

        async def main():
            async with httpx.AsyncClient(timeout=300) as a, httpx.AsyncClient(timeout=300) as b:
                async with a.stream("POST", s.url + CMPL, json=long_body) as r:
                    lines = r.aiter_lines()
                    await lines.__anext__()  # the long request is running and holds the only slot
                    queued = asyncio.ensure_future(b.post(s.url + CMPL, json=queued_body))
                    await asyncio.sleep(1.0)
                    queued.cancel()  # the client leaves while its request waits
                    await asyncio.gather(queued, return_exceptions=True)
                    await b.aclose()
                    return [line async for line in lines]

        asyncio.run(main())
        time.sleep(1.0)
        computed = s.metric("rawpage:prompt_tokens_total") - before
        assert computed < 50, f"{computed} prompt tokens computed: the queued prompt ran"
        assert s.metric("rawpage:kv_cache_usage_perc") == 0.0
    finally:
        assert s.stop() == 0, s.output()


# --- issue 29, item 4: the engine view and /metrics tell one tenant nothing of another ----------


def _first_snapshot(url: str, key: str, want=lambda snap: True, timeout: float = 60) -> dict:
    """The first snapshot the key's event stream sends that satisfies `want`."""
    deadline = time.monotonic() + timeout
    with httpx.stream("GET", url + "/v1/engine/events", headers={"Authorization": f"Bearer {key}"}, timeout=60) as r:
        assert r.status_code == 200, r.read()
        for line in r.iter_lines():
            if line.startswith("data: ") and want(json.loads(line[6:])):
                return json.loads(line[6:])
            assert time.monotonic() < deadline, "no such snapshot"
    raise AssertionError("the stream ended")


def running(snap: dict) -> bool:
    return any(q["request"].startswith("tenant-one-secret") for q in snap["queues"]["running"])


def test_the_engine_view_shows_each_key_only_its_own_requests(trusting):
    """k1's request (a secret X-Request-Id) runs; k2 sees its blocks only as anonymous
    occupancy (owner -2) and no prefix-cache totals; k1 sees its own request; the admin
    key sees everything."""
    body = {"prompt": "Once upon a time", "max_tokens": 400, "ignore_eos": True, "stream": True}
    headers = {"Authorization": "Bearer k1", "X-Request-Id": "tenant-one-secret"}
    done = threading.Event()

    def run():
        with httpx.stream("POST", trusting.url + CMPL, json=body, headers=headers, timeout=120) as r:
            for _ in r.iter_lines():
                if done.is_set():
                    return

    t = threading.Thread(target=run)
    t.start()
    try:
        admin = _first_snapshot(trusting.url, "adm", running)
        assert "prefix_hits" in admin["totals"] and "refs" in admin
        other = _first_snapshot(trusting.url, "k2")
        assert "tenant-one-secret" not in json.dumps(other) and other["queues"]["running"] == []
        assert other["counts"]["running"] == 0 and "prefix_hits" not in other["totals"] and "refs" not in other
        assert -2 in other["owner"][::2]  # k1's blocks: occupied, nobody's in particular
        own = _first_snapshot(trusting.url, "k1", running)
        assert "prefix_hits" not in own["totals"]
    finally:
        done.set()
        t.join()


def test_event_streams_are_capped_per_key(trusting):
    import contextlib

    def open_stream(stack, key):
        headers = {"Authorization": f"Bearer {key}"}
        return stack.enter_context(httpx.stream("GET", trusting.url + "/v1/engine/events", headers=headers, timeout=60))

    with contextlib.ExitStack() as stack:
        assert all(open_stream(stack, "k2").status_code == 200 for _ in range(4))  # --max-event-streams-per-key 4
        r = open_stream(stack, "k2")
        assert r.status_code == 429 and "--max-event-streams-per-key" in r.read().decode()
        assert open_stream(stack, "k1").status_code == 200  # another key is not held up


def _closed_within(sock, seconds: float) -> float | None:
    """Seconds until the server closed this socket (None: still open after `seconds`)."""
    t0 = time.monotonic()
    sock.settimeout(seconds)
    try:
        while sock.recv(4096):  # a 4xx the server may send first, then the close
            pass
    except TimeoutError:
        return None
    except ConnectionResetError:
        pass
    return time.monotonic() - t0


def test_a_slow_request_head_is_closed_at_the_header_timeout():
    """Issue 29 item 8 (slowloris): half a request line, or a next request begun on a
    kept-alive connection and never finished, held the socket forever."""
    s = ServerProcess("--request-header-timeout", "1", "--timeout-keep-alive", "30", "--max-model-len", "256")
    try:
        with socket.create_connection(("127.0.0.1", s.port)) as sock:
            sock.sendall(b"GET /hea")
            took = _closed_within(sock, 10)
            assert took is not None and took < 5, took
        with socket.create_connection(("127.0.0.1", s.port)) as sock:
            sock.sendall(b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
            assert sock.recv(4096).startswith(b"HTTP/1.1 200")  # a whole head is served...
            time.sleep(1.5)  # ...idle within --timeout-keep-alive, past the header timeout: kept
            sock.sendall(b"GET /health HTTP/1.1\r\nHo")  # the next head, never finished
            took = _closed_within(sock, 10)
            assert took is not None and took < 5, took
        healthy_and_serving(s)
    finally:
        assert s.stop() == 0, s.output()


def test_reset_prefix_cache_is_the_admins_and_forgets_cached_prefixes(trusting):
    """vLLM's dev-mode POST /reset_prefix_cache (AIPerf calls it between runs): every
    tenant's cached prefixes, so the admin key's call; afterwards a repeated prompt is
    computed again (cached_tokens 0), as the first time."""
    body = {"messages": [{"role": "user", "content": "Tell me about Japan. " * 12}], "max_tokens": 1}
    url, admin = trusting.url, {"Authorization": "Bearer adm"}
    cached = [
        httpx.post(url + "/v1/chat/completions", json=body, headers=AUTH, timeout=60).json()["usage"] for _ in range(2)
    ][1]["prompt_tokens_details"]["cached_tokens"]
    assert cached >= 32
    assert_error(httpx.post(url + "/reset_prefix_cache", headers=AUTH), 403, match="admin")
    r = httpx.post(url + "/reset_prefix_cache", headers=admin)
    assert r.status_code == 200 and r.content == b""
    again = httpx.post(url + "/v1/chat/completions", json=body, headers=AUTH, timeout=60).json()["usage"]
    assert again["prompt_tokens_details"]["cached_tokens"] == 0
    r = httpx.post(url + "/reset_prefix_cache?reset_running_requests=true&reset_external=false", headers=admin)
    assert r.status_code == 200
    assert_error(
        httpx.post(url + "/reset_prefix_cache?reset_running_requests=maybe", headers=admin),
        400,
        "reset_running_requests",
    )
    assert_error(httpx.post(url + "/reset_prefix_cache?everything=1", headers=admin), 400, "everything")
