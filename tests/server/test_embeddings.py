"""POST /v1/embeddings through the stock `openai` SDK, on a tiny random Qwen3 served with
--runner pooling: vectors equal the offline engine's, every input shape, base64,
dimensions, batching, and bad input as 4xx in OpenAI's shape while the server serves on."""

import base64
import threading
import time

import httpx
import numpy as np
import openai
import pytest

from rawpage import LLM
from tests.server.harness import ServerProcess
from tests.tiny_families import write_family

KEY = "sk-test"
MAX_LEN = 64


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return write_family(str(tmp_path_factory.mktemp("embed") / "qwen3"), "qwen3")


@pytest.fixture(scope="module")
def server(folder):
    s = ServerProcess(
        folder, "--runner", "pooling", "--max-model-len", str(MAX_LEN), "--api-key", KEY, "--metrics-public"
    )
    yield s
    assert s.stop() == 0, s.output()


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server.url + "/v1", api_key=KEY)


@pytest.fixture(scope="module")
def offline(folder):
    return LLM(folder, runner="pooling", max_model_len=MAX_LEN, kv_cache_memory="16MiB")


def post(server, body, path="/v1/embeddings", key=KEY):
    return httpx.post(server.url + path, json=body, headers={"Authorization": f"Bearer {key}"})


def test_a_string_and_a_list_match_the_offline_engine(client, offline):
    texts = ["hello world", "the cat sat on the mat", "x"]
    want = [o.outputs.embedding for o in offline.embed(texts, use_tqdm=False)]
    one = client.embeddings.create(model="qwen3", input=texts[0])  # the SDK asks for base64 and decodes it
    assert one.object == "list" and one.model == "qwen3" and len(one.data) == 1
    np.testing.assert_allclose(one.data[0].embedding, want[0], atol=1e-6)
    many = client.embeddings.create(model="qwen3", input=texts, encoding_format="float")
    assert [d.index for d in many.data] == [0, 1, 2] and all(d.object == "embedding" for d in many.data)
    np.testing.assert_allclose([d.embedding for d in many.data], want, atol=1e-6)
    n = sum(len(o.prompt_token_ids) for o in offline.embed(texts, use_tqdm=False))
    assert many.usage.prompt_tokens == many.usage.total_tokens == n


def test_base64_is_little_endian_float32(server, client):
    floats = post(server, {"input": "hello", "encoding_format": "float"}).json()
    raw = post(server, {"input": "hello", "encoding_format": "base64"}).json()
    assert set(raw) == {"object", "data", "model", "usage"} and set(raw["data"][0]) == {"object", "index", "embedding"}
    decoded = np.frombuffer(base64.b64decode(raw["data"][0]["embedding"]), dtype="<f4")
    np.testing.assert_array_equal(decoded, np.float32(floats["data"][0]["embedding"]))
    sdk = client.embeddings.create(model="qwen3", input="hello", encoding_format="base64")
    assert isinstance(sdk.data[0].embedding, str)  # asked for explicitly, the SDK leaves it encoded


def test_dimensions_truncate_and_renormalise(client):
    full = np.array(client.embeddings.create(model="qwen3", input="hello").data[0].embedding)
    cut = np.array(client.embeddings.create(model="qwen3", input="hello", dimensions=16).data[0].embedding)
    assert full.shape == (64,) and cut.shape == (16,)
    np.testing.assert_allclose(cut, full[:16] / np.linalg.norm(full[:16]), atol=1e-6)


def test_token_ids_and_vllm_extras(server, offline):
    ids = [5, 6, 7, 8, 9]
    want = offline.embed([ids], use_tqdm=False)[0].outputs.embedding
    for body in ({"input": ids}, {"input": [ids, ids[:3]]}):
        r = post(server, {**body, "encoding_format": "float", "user": "u1"})
        assert r.status_code == 200, r.text
        np.testing.assert_allclose(r.json()["data"][0]["embedding"], want, atol=1e-6)
    plain = post(server, {"input": "hello", "add_special_tokens": False}).json()["usage"]["prompt_tokens"]
    assert plain == len(offline.get_tokenizer().encode("hello", add_special_tokens=False))
    raw = post(server, {"input": ids, "normalize": False, "encoding_format": "float"}).json()
    assert abs(np.linalg.norm(raw["data"][0]["embedding"]) - 1) > 1e-3
    long = list(range(3, 3 + MAX_LEN + 20))
    r = post(server, {"input": long, "truncate_prompt_tokens": 10, "encoding_format": "float"})
    assert r.status_code == 200 and r.json()["usage"]["prompt_tokens"] == 10
    first = offline.embed([long[:10]], use_tqdm=False)[0].outputs.embedding  # vLLM's side for pooling: "right"
    np.testing.assert_allclose(r.json()["data"][0]["embedding"], first, atol=1e-6)
    r = post(server, {"input": long, "truncate_prompt_tokens": 10, "truncation_side": "left"})
    last = offline.embed([long[-10:]], use_tqdm=False)[0].outputs.embedding
    np.testing.assert_allclose(r.json()["data"][0]["embedding"], last, atol=1e-6)


def test_64_inputs_run_batched(server, client):
    steps = server.metric("rawpage:engine_steps_total")
    texts = [f"input number {i} " + "word " * (i % 7) for i in range(64)]
    r = client.embeddings.create(model="qwen3", input=texts)
    assert len(r.data) == 64
    assert server.metric("rawpage:engine_steps_total") - steps < 64, "the inputs ran one by one"
    assert server.metric("rawpage:request_success_total") >= 64


@pytest.mark.parametrize(
    "body, param",
    [
        ({"input": 5}, "input"),
        ({"input": [1, "a"]}, "input"),
        ({"input": [[1, 2], []]}, "input"),
        ({"input": [True, False]}, "input"),
        ({"input": ""}, "input"),
        ({"input": []}, "input"),
        ({"input": ["fine", ""]}, "input"),
        ({}, "input"),
        ({"input": list(range(3, 3 + MAX_LEN + 1))}, "input"),
        ({"input": "word " * 200}, "input"),
        ({"input": [400]}, "input"),
        ({"input": ["a"] * 129}, "input"),
        ({"input": "hi", "encoding_format": "int8"}, "encoding_format"),
        ({"input": "hi", "dimensions": 0}, "dimensions"),
        ({"input": "hi", "dimensions": 65}, "dimensions"),
        ({"input": "hi", "normalize": "maybe"}, "normalize"),  # ("yes" is true, as in pydantic)
        ({"input": "hi", "truncate_prompt_tokens": MAX_LEN + 1}, "truncate_prompt_tokens"),
        ({"input": "hi", "truncate_prompt_tokens": 1, "truncation_side": "up"}, "truncation_side"),
        ({"input": "hi", "temperature": 0.5}, "temperature"),
        ({"input": "hi", "model": "other"}, "model"),
    ],
)
def test_bad_input_is_a_4xx_and_the_server_serves_on(server, body, param):
    r = post(server, body)
    assert 400 <= r.status_code < 500, r.text
    err = r.json()["error"]
    assert set(err) == {"message", "type", "param", "code"} and err["param"] == param, err
    assert post(server, {"input": "still here"}).status_code == 200


def test_auth_and_model_listing(server):
    assert post(server, {"input": "hi"}, key="wrong").status_code == 401
    (model,) = httpx.get(server.url + "/v1/models", headers={"Authorization": f"Bearer {KEY}"}).json()["data"]
    assert model["runner"] == "pooling" and model["max_model_len"] == MAX_LEN


def test_a_pooling_server_does_not_generate(server):
    for path, body in [
        ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}]}),
        ("/v1/completions", {"prompt": "hi"}),
    ]:
        r = post(server, body, path)
        assert r.status_code == 400 and "pooling model" in r.json()["error"]["message"], r.text


def test_a_generating_server_says_how_to_embed(folder):
    s = ServerProcess(folder, "--max-model-len", str(MAX_LEN))
    try:
        r = httpx.post(s.url + "/v1/embeddings", json={"input": "hi"})
        assert r.status_code == 400 and "--runner pooling" in r.json()["error"]["message"], r.text
        assert httpx.get(s.url + "/v1/models").json()["data"][0]["runner"] == "generate"
        assert httpx.post(s.url + "/v1/completions", json={"prompt": "hi", "max_tokens": 2}).status_code == 200
    finally:
        assert s.stop() == 0, s.output()


def test_the_benchmark_runs(server):
    from tools.bench_embeddings import make_texts, measure

    headers = {"Authorization": f"Bearer {KEY}"}
    texts = make_texts(server.url, headers, 4, 16)
    result = measure(server.url, headers, texts, 1)
    assert result["inputs_per_s"] > 0 and 4 * 12 <= result["prompt_tokens"] <= 4 * 20, result


def test_a_small_request_runs_while_a_large_one_is_in_progress(folder):
    """Issue 44: a request keeps at most 2 x --max-num-batched-tokens of its inputs queued, so
    a small request sent meanwhile runs within a few steps, not behind every large input.
    Here a step takes one 64-token input: three large requests need 384 steps, and the small
    one, sent once they are under way, must finish before them and within 128 steps (the
    three windows hold 6 inputs; the rest is the HTTP round trip on a busy machine, where a
    step of this tiny model takes a few milliseconds). It took 46 steps; with every input
    queued at once, 316."""
    s = ServerProcess(folder, "--runner", "pooling", "--max-model-len", str(MAX_LEN), "--max-num-batched-tokens", "64")
    try:
        ids = [[3 + (i + j) % 300 for j in range(MAX_LEN)] for i in range(128)]
        large_done: list[float] = []

        def large():
            r = httpx.post(s.url + "/v1/embeddings", json={"input": ids})
            assert r.status_code == 200 and len(r.json()["data"]) == 128, r.text
            large_done.append(time.monotonic())

        threads = [threading.Thread(target=large) for _ in range(3)]
        for t in threads:
            t.start()
        start = s.metric("rawpage:engine_steps_total")
        while s.metric("rawpage:engine_steps_total") < start + 8:
            time.sleep(0.01)
        before = s.metric("rawpage:engine_steps_total")
        r = httpx.post(s.url + "/v1/embeddings", json={"input": [5, 6, 7]})
        steps, small_done = s.metric("rawpage:engine_steps_total") - before, time.monotonic()
        assert r.status_code == 200 and len(r.json()["data"]) == 1
        for t in threads:
            t.join()
        assert steps <= 128, f"the small request waited {steps:.0f} steps"
        assert len(large_done) == 3 and small_done < min(large_done)
    finally:
        assert s.stop() == 0, s.output()
