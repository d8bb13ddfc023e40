"""Many clients at once: disconnects free their blocks, batching multiplies throughput,
fuzzed bodies never produce a 500, and SIGTERM lets in-flight streams finish."""

import asyncio
import json
import random
import signal
import threading
import time

import httpx
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.server.harness import ServerProcess

CHAT = "/v1/chat/completions"


async def stream_chat(client, url, question, max_tokens, stop_after=None):
    """Stream one chat completion; with stop_after, hang up after that many chunks."""
    body = {
        "messages": [{"role": "user", "content": question}],
        "max_tokens": max_tokens,
        "temperature": 0,
        "stream": True,
    }
    text, chunks = "", 0
    async with client.stream("POST", url + CHAT, json=body) as r:
        assert r.status_code == 200
        async for line in r.aiter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunks += 1
            for c in json.loads(line[6:])["choices"]:
                text += c["delta"].get("content") or ""
            if stop_after is not None and chunks >= stop_after:
                return None  # leaving the block closes the connection mid-stream
    return text


def wait_idle(server, timeout=60.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if server.metric("rawpage:num_requests_running") == 0 and server.metric("rawpage:num_requests_waiting") == 0:
            return
        time.sleep(0.2)
    raise TimeoutError("requests still running")


def test_disconnecting_clients_free_their_blocks(server):
    questions = [f"Tell me a fact about the number {i}." for i in range(20)]
    expected = {}
    for q in questions:  # the reference answers, one at a time, not streamed
        r = httpx.post(
            server.url + CHAT,
            json={"messages": [{"role": "user", "content": q}], "max_tokens": 24, "temperature": 0},
            timeout=120,
        )
        expected[q] = r.json()["choices"][0]["message"]["content"]
    rnd = random.Random(0)

    async def main():
        async with httpx.AsyncClient(timeout=300) as done_client:
            leavers = []
            for i in range(20):
                c = httpx.AsyncClient(timeout=300)  # own connection, so hanging up really closes it
                leavers.append(
                    (
                        c,
                        stream_chat(c, server.url, f"Write a long poem number {i}.", 200, rnd.randint(1, 15)),
                    )
                )
            stayers = [stream_chat(done_client, server.url, q, 24) for q in questions]
            results = await asyncio.gather(*stayers, *(coro for _, coro in leavers))
            for c, _ in leavers:
                await c.aclose()
            return results[:20]

    completed = asyncio.run(main())
    assert completed == [expected[q] for q in questions]
    wait_idle(server)
    assert server.metric("rawpage:kv_cache_usage_perc") == 0.0
    assert httpx.get(server.url + "/health").status_code == 200


def test_a_disconnect_logs_one_aborted_line(server):
    """Issue 42: a client that hangs up mid-stream leaves a line naming its request."""

    async def hang_up() -> str:
        async with httpx.AsyncClient(timeout=300) as c:
            body = {"messages": [{"role": "user", "content": "Count to 500."}], "max_tokens": 400, "stream": True}
            async with c.stream("POST", server.url + CHAT, json=body) as r:
                async for line in r.aiter_lines():
                    if line.startswith("data: {"):
                        return r.headers["x-request-id"]
        raise AssertionError("no chunk came")

    rid = asyncio.run(hang_up())
    deadline = time.monotonic() + 60
    while not (lines := [x for x in server.output().splitlines() if f"request {rid}#" in x and "aborted" in x]):
        assert time.monotonic() < deadline, server.output()[-3000:]
        time.sleep(0.2)
    assert len(lines) == 1 and lines[0].endswith(": aborted, the client disconnected") and " INFO " in lines[0]


def test_startup_complete_is_said_once_the_model_has_loaded(server):
    """Issue 42: uvicorn's 'Application startup complete.' came before the model loaded (and
    before the error of a load that failed); the server says it itself once it is ready."""
    lines = server.output().splitlines()
    (ready,) = [i for i, line in enumerate(lines) if "startup complete" in line]
    assert lines[ready].endswith(" INFO rawpage.server: Application startup complete.")
    assert any(" INFO rawpage: loaded " in line for line in lines[:ready]), lines[: ready + 1]


def test_concurrent_streams_share_steps(server):
    """32 concurrent streams are served in shared iterations: their 32 x 32 tokens take far
    fewer engine steps than one step per token would. (Throughput itself is a benchmark,
    in docs/benchmarks.md; a ratio of timings would fail on a busy machine.)"""

    async def one(client, i):
        body = {
            "messages": [{"role": "user", "content": f"Story {i}:"}],
            "max_tokens": 32,
            "temperature": 0.8,
            "seed": i,
            "ignore_eos": True,
            "stream": True,
        }
        async with client.stream("POST", server.url + CHAT, json=body) as r:
            assert r.status_code == 200
            return [line async for line in r.aiter_lines() if line.startswith("data: ")][-1] == "data: [DONE]"

    async def run(n):
        async with httpx.AsyncClient(timeout=600) as client:
            return all(await asyncio.gather(*[one(client, i) for i in range(n)]))

    wait_idle(server)
    gen0, steps0 = server.metric("rawpage:generation_tokens_total"), server.metric("rawpage:engine_steps_total")
    assert asyncio.run(run(32))
    generated = server.metric("rawpage:generation_tokens_total") - gen0
    steps = server.metric("rawpage:engine_steps_total") - steps0
    print(f"{generated:.0f} tokens in {steps:.0f} steps ({generated / steps:.1f} tokens per step)")
    assert generated == 32 * 32
    assert generated / steps >= 8


_json = st.recursive(
    st.none() | st.booleans() | st.integers(-10, 10**6) | st.floats(allow_nan=True) | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3),
    max_leaves=6,
)
_fields = {
    "model": st.sampled_from(["SmolLM2-135M-Instruct"] * 4 + ["other"]),
    "temperature": st.floats(-1, 3) | _json,
    "top_p": st.floats(-0.5, 1.5) | _json,
    "top_k": st.integers(-3, 100) | _json,
    "n": st.integers(-1, 3) | _json,
    "stop": st.lists(st.text(max_size=3), max_size=3) | _json,
    "seed": st.integers(-(2**64), 2**64) | _json,
    "logprobs": st.booleans() | st.integers(-1, 30) | _json,
    "top_logprobs": st.integers(-1, 30) | _json,
    "logit_bias": st.dictionaries(
        st.text(max_size=6) | st.integers(-(2**80), 2**80).map(str), st.floats(-200, 200), max_size=3
    )
    | _json,
    "presence_penalty": st.floats(-3, 3) | _json,
    "repetition_penalty": st.floats(-1, 3) | _json,
    "min_tokens": st.integers(-1, 5) | _json,
    "stop_token_ids": st.lists(st.integers(-5, 60000) | st.integers(-(2**80), 2**80), max_size=3) | _json,
    "use_beam_search": st.booleans() | _json,
    "length_penalty": st.floats(allow_nan=True, allow_infinity=True) | _json,
    "cache_salt": st.text(max_size=5) | _json,
    "chat_template": st.text(max_size=20) | _json,
    "priority": st.integers(-3, 3) | _json,
    "max_completion_tokens": st.integers(-1, 4) | _json,
    "min_p": st.floats(-1, 2) | _json,
    "echo": st.booleans() | _json,
    "stream": st.booleans(),
    "stream_options": st.fixed_dictionaries({"include_usage": st.booleans() | _json}) | _json,
}
_messages = (
    st.lists(
        st.fixed_dictionaries(
            {
                "role": st.sampled_from(["user", "system", "assistant", "wizard"]) | _json,
                "content": st.text(max_size=30) | _json,
            }
        ),
        max_size=3,
    )
    | _json
)
_max_tokens = st.integers(1, 4) | st.sampled_from([0, -1, "4", 2.5, [], {}])  # never unbounded: keep it quick


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_fuzzed_bodies_never_500(server, data):
    """300 random bodies: never a 500, every error in OpenAI's shape, and the engine is
    still healthy after each one."""
    chat = data.draw(st.booleans())
    body = data.draw(st.fixed_dictionaries({}, optional=_fields))
    body["max_tokens"] = data.draw(_max_tokens)
    if chat:
        body["messages"] = data.draw(_messages)
    else:
        body["prompt"] = data.draw(st.text(max_size=40) | st.lists(st.integers(-3, 60000), max_size=5) | _json)
    raw = json.dumps(body).encode()  # NaN and Infinity included, as a careless client might send
    r = httpx.post(
        server.url + (CHAT if chat else "/v1/completions"),
        content=raw,
        timeout=120,
        headers={"content-type": "application/json"},
    )
    assert r.status_code in (200, 400, 404), (body, r.status_code, r.text)
    if r.status_code != 200:
        assert set(r.json()["error"]) == {"message", "type", "param", "code"}
    elif body.get("stream") is True:
        assert 'data: {"error"' not in r.text, r.text
    assert httpx.get(server.url + "/health", timeout=60).status_code == 200


def test_sigterm_lets_streams_finish():
    s = ServerProcess("--max-model-len", "1024")
    result = {}

    def client():
        result["text"] = asyncio.run(_stream_one(s.url))

    t = threading.Thread(target=client)
    t.start()
    time.sleep(1.0)  # the stream is under way
    s.proc.send_signal(signal.SIGTERM)
    t.join(120)
    code = s.proc.wait(60)  # it exits by itself once the stream is done
    assert result.get("text"), s.output()
    assert code == 0, s.output()
    s.stop()


async def _stream_one(url):
    async with httpx.AsyncClient(timeout=120) as c:
        return await stream_chat(c, url, "Write a paragraph about rivers.", 40)
