"""Multi-LoRA through a real `rawpage serve` (issue 21): adapters as model names,
listed in /v1/models with the base model as parent; loading and unloading at run
time while requests run; an unknown adapter is a 404 in OpenAI's shape; three
adapters in use under --max-loras 2 take turns (eviction) and stay exact."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

from rawpage import LLM, LoRARequest, SamplingParams
from tests.server.harness import ServerProcess
from tests.tiny_lora import write_adapter
from tests.tiny_models import random_tensors, tiny_config, train_tokenizer, write_hf_folder

CFG = tiny_config()
KEY = {"Authorization": "Bearer sesame"}
ADAPTERS = {"all8": (8, ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"])}
ADAPTERS["qv4"] = (4, ["q_proj", "v_proj"])
ADAPTERS["mlp16"] = (16, ["gate_proj", "up_proj", "down_proj"])
PROMPT = "The quick brown fox"


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    root = tmp_path_factory.mktemp("lora_server")
    model = write_hf_folder(str(root / "base"), CFG, random_tensors(CFG, seed=5), train_tokenizer())
    paths = {
        name: write_adapter(str(root / name), CFG, r, targets, 2 * r, seed=i)
        for i, (name, (r, targets)) in enumerate(ADAPTERS.items())
    }
    args = ["--model", model, "--served-model-name", "tiny", "--api-key", "sesame", "--enable-lora"]
    args += ["--max-loras", "2", "--max-lora-rank", "16", "--lora-modules", f"all8={paths['all8']}"]
    server = ServerProcess(*args)
    yield server, model, paths
    assert server.stop() == 0, server.output()


@pytest.fixture(scope="module")
def offline(setup):
    """The same greedy completions from the offline API, one adapter at a time."""
    _, model, paths = setup
    llm = LLM(model, device="cpu", enable_lora=True, max_loras=1, max_lora_rank=16)
    params = SamplingParams(max_tokens=24, temperature=0, ignore_eos=True)
    want = {None: llm.generate(PROMPT, params, use_tqdm=False)[0].outputs[0].text}
    for i, name in enumerate(ADAPTERS):
        lora = LoRARequest(name, i + 1, paths[name])
        want[name] = llm.generate(PROMPT, params, use_tqdm=False, lora_request=lora)[0].outputs[0].text
    return want


def _complete(server, model: str, max_tokens: int = 24) -> httpx.Response:
    body = {"model": model, "prompt": PROMPT, "max_tokens": max_tokens, "temperature": 0, "ignore_eos": True}
    return httpx.post(server.url + "/v1/completions", json=body, headers=KEY, timeout=120)


def _post(server, path: str, body: dict, headers: dict | None = KEY) -> httpx.Response:
    return httpx.post(server.url + path, json=body, headers=headers or {}, timeout=60)


def test_adapters_are_models_listed_with_their_parent(setup, offline):
    server, _, paths = setup
    data = httpx.get(server.url + "/v1/models", headers=KEY).json()["data"]
    by_id = {m["id"]: m for m in data}
    assert set(by_id) == {"tiny", "all8"}
    assert by_id["all8"]["parent"] == "tiny" and by_id["all8"]["root"] == paths["all8"]
    assert _complete(server, "tiny").json()["choices"][0]["text"] == offline[None]
    reply = _complete(server, "all8").json()
    assert reply["choices"][0]["text"] == offline["all8"] and reply["model"] == "all8"
    assert offline["all8"] != offline[None]
    chat = {"model": "all8", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
    r = httpx.post(server.url + "/v1/chat/completions", json=chat, headers=KEY, timeout=60)
    assert r.status_code == 200 and r.json()["model"] == "all8"


def test_unknown_adapter_is_a_404_in_openai_shape(setup):
    server, _, _ = setup
    r = _complete(server, "no-such-adapter")
    assert r.status_code == 404
    err = r.json()["error"]
    assert err["code"] == "model_not_found" and err["param"] == "model" and "all8" in err["message"]
    r = _post(server, "/v1/unload_lora_adapter", {"lora_name": "no-such-adapter"})
    assert r.status_code == 404 and r.json()["error"]["type"] == "not_found_error"


def test_load_and_unload_need_the_key_and_a_real_adapter(setup, tmp_path):
    server, _, paths = setup
    assert (
        _post(server, "/v1/load_lora_adapter", {"lora_name": "x", "lora_path": paths["qv4"]}, None).status_code == 401
    )
    r = _post(server, "/v1/load_lora_adapter", {"lora_name": "x", "lora_path": str(tmp_path)})
    assert r.status_code == 400 and "adapter_config.json" in r.json()["error"]["message"]
    r = _post(server, "/v1/load_lora_adapter", {"lora_name": "all8", "lora_path": paths["all8"]})
    assert r.status_code == 400 and "already loaded" in r.json()["error"]["message"]


def test_load_unload_while_requests_run_and_evict_under_max_loras_2(setup, offline):
    """all8 requests are running while qv4 and mlp16 are loaded; then all three adapters
    are in use at once under --max-loras 2, so one waits for a slot and takes the least
    recently used one. Every answer equals the offline one; unloading ends the name."""
    server, _, paths = setup
    with ThreadPoolExecutor(12) as pool:
        running = [pool.submit(_complete, server, "all8", 200) for _ in range(3)]  # long: still running
        for name in ("qv4", "mlp16"):
            r = _post(server, "/v1/load_lora_adapter", {"lora_name": name, "lora_path": paths[name]})
            assert r.status_code == 200, r.text
        mixed = [(name, pool.submit(_complete, server, name)) for name in ("qv4", "mlp16", "all8", "tiny") * 2]
        for f in running:  # greedy: the first 24 tokens are the offline answer
            assert f.result().json()["choices"][0]["text"].startswith(offline["all8"])
        for name, f in mixed:
            assert f.result().json()["choices"][0]["text"] == offline[None if name == "tiny" else name], name
    assert "evicting" in server.output()
    ids = {m["id"] for m in httpx.get(server.url + "/v1/models", headers=KEY).json()["data"]}
    assert ids == {"tiny", "all8", "qv4", "mlp16"}
    assert _post(server, "/v1/unload_lora_adapter", {"lora_name": "qv4"}).status_code == 200
    assert _complete(server, "qv4").status_code == 404
    assert _complete(server, "mlp16").json()["choices"][0]["text"] == offline["mlp16"]
