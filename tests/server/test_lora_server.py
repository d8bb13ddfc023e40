"""Multi-LoRA through a real `rawpage serve` (issue 21): adapters as model names,
listed in /v1/models with the base model as parent; loading and unloading at run
time while requests run; an unknown adapter is a 404 in OpenAI's shape; three
adapters in use under --max-loras 2 take turns (eviction) and stay exact."""

from __future__ import annotations

import json
import os
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

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
    args += ["--allow-runtime-lora-updating", "--lora-dir", str(root)]
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
    assert by_id["all8"]["parent"] == "tiny" and by_id["all8"]["root"] == "all8" and by_id["tiny"]["parent"] is None
    assert [p["object"] for m in data for p in m["permission"]] == ["model_permission"] * 2
    assert str(paths["all8"]) not in httpx.get(server.url + "/v1/models", headers=KEY).text  # no paths on disk
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
    empty = os.path.join(os.path.dirname(paths["qv4"]), "empty")
    os.makedirs(empty, exist_ok=True)
    r = _post(server, "/v1/load_lora_adapter", {"lora_name": "x", "lora_path": "empty"})  # relative: from --lora-dir
    assert r.status_code == 400 and "adapter_config.json" in r.json()["error"]["message"]
    assert empty not in r.text  # the client's own path, not where --lora-dir lies
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


# --- issue 29, item 7: runtime loads read only inside --lora-dir, checked before they cost anything --


def _load(server, path: str, name: str = "x") -> httpx.Response:
    return _post(server, "/v1/load_lora_adapter", {"lora_name": name, "lora_path": path})


def test_runtime_loads_read_only_inside_the_lora_dir(setup, tmp_path):
    server, _, paths = setup
    outside = write_adapter(str(tmp_path / "outside"), CFG, 4, ["q_proj"], 8, seed=9)  # a valid adapter, elsewhere
    root = os.path.dirname(paths["qv4"])
    os.symlink(outside, os.path.join(root, "link-out"))
    for path in (outside, "/etc", "../", "../outside", "link-out", "qv4/../../", "a\x00b"):
        r = _load(server, path)
        assert r.status_code == 400 and "inside the server's --lora-dir" in r.json()["error"]["message"], path
    assert "x" not in {m["id"] for m in httpx.get(server.url + "/v1/models", headers=KEY).json()["data"]}


def _bad_adapter(root: str, name: str, config: str | None = None, tensors: dict | None = None) -> str:
    """An adapter folder under --lora-dir: the tiny qv4 adapter with its config or tensors replaced."""
    from safetensors.numpy import save_file

    folder = write_adapter(os.path.join(root, name), CFG, 4, ["q_proj", "v_proj"], 8, seed=3)
    if config is not None:
        with open(os.path.join(folder, "adapter_config.json"), "w") as f:
            f.write(config)
    if tensors is not None:
        save_file(tensors, os.path.join(folder, "adapter_model.safetensors"))
    return name


@pytest.mark.parametrize(
    "config,match",
    [
        ("{not json", "not readable JSON"),
        ("[1, 2]", "JSON object"),
        (json.dumps({"r": "8", "lora_alpha": 8}), "'r' must be a positive integer"),
        (json.dumps({"r": 0}), "'r' must be a positive integer"),
        ('{"r": 4, "lora_alpha": NaN}', "finite"),
        ('{"r": 4, "lora_alpha": Infinity}', "finite"),
        (json.dumps({"r": 4, "lora_alpha": "8"}), "finite"),
        (json.dumps({"r": 4, "lora_alpha": 8, "use_rslora": "yes"}), "use_rslora"),
    ],
)
def test_a_malformed_config_is_a_400(setup, config, match):
    server, _, paths = setup
    name = _bad_adapter(os.path.dirname(paths["qv4"]), f"bad-{abs(hash(config))}", config=config)
    r = _load(server, name)
    assert r.status_code == 400 and match in r.json()["error"]["message"], r.text


def test_a_wrong_tensor_name_or_shape_is_a_400(setup):
    import numpy as np

    server, _, paths = setup
    root = os.path.dirname(paths["qv4"])
    wrong = _bad_adapter(root, "wrong-name", tensors={"model.embed_tokens.weight": np.zeros((4, 4), np.float32)})
    r = _load(server, wrong)
    assert r.status_code == 400 and "is not a LoRA A/B" in r.json()["error"]["message"]
    p = "base_model.model.model.layers.0.self_attn.q_proj."
    shapes = {p + "lora_A.weight": np.zeros((4, 3), np.float32), p + "lora_B.weight": np.zeros((5, 4), np.float32)}
    r = _load(server, _bad_adapter(root, "wrong-shape", tensors=shapes))
    assert r.status_code == 400 and "this model needs A" in r.json()["error"]["message"]


def test_runtime_updating_is_off_by_default():
    """In process (no model needed): the routes refuse before anything is read."""
    from starlette.testclient import TestClient

    from rawpage.engine_args import EngineArgs
    from rawpage.server.app import build_app
    from rawpage.server.args import ServerConfig

    c = TestClient(build_app(EngineArgs(), ServerConfig(allowed_hosts=["testserver"])))
    for path in ("/v1/load_lora_adapter", "/v1/unload_lora_adapter"):
        r = c.post(path, json={"lora_name": "x", "lora_path": "/etc"})
        assert r.status_code == 403 and "--allow-runtime-lora-updating" in r.json()["error"]["message"]
    with pytest.raises(ValueError, match="needs --lora-dir"):
        ServerConfig(allow_runtime_lora_updating=True)


def test_vllms_environment_switch_turns_runtime_updating_on(monkeypatch, tmp_path):
    import argparse

    from rawpage.server.args import ServerConfig, add_server_args

    parser = argparse.ArgumentParser()
    add_server_args(parser)
    monkeypatch.setenv("VLLM_ALLOW_RUNTIME_LORA_UPDATING", "True")
    config = ServerConfig.from_cli_args(parser.parse_args(["--lora-dir", str(tmp_path)]))
    assert config.allow_runtime_lora_updating and config.lora_dir == str(tmp_path)
    with pytest.raises(ValueError, match="needs --lora-dir"):
        ServerConfig.from_cli_args(parser.parse_args([]))
    monkeypatch.delenv("VLLM_ALLOW_RUNTIME_LORA_UPDATING")
    assert not ServerConfig.from_cli_args(parser.parse_args([])).allow_runtime_lora_updating
    assert not ServerConfig.from_cli_args(parser.parse_args([])).server_dev_mode
    monkeypatch.setenv("VLLM_SERVER_DEV_MODE", "1")  # vLLM's switch for /reset_prefix_cache
    assert ServerConfig.from_cli_args(parser.parse_args([])).server_dev_mode


_junk = (
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=False, allow_infinity=False)  # (JSON has neither)
    | st.text(max_size=30)
    | st.lists(st.integers(), max_size=3)
)
_paths = st.sampled_from(
    ["", ".", "..", "/", "/etc/passwd", "empty", "qv4/..", "../base", "nope", "a\x00b", "~"]
) | st.text(max_size=40)
_bodies = st.fixed_dictionaries(
    {},
    optional={
        "lora_name": st.text(max_size=200) | _junk,
        "lora_path": _paths | _junk,
        "lora_int_id": _junk,
        "extra": _junk,
    },
)


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(body=_bodies | _junk)
def test_fuzzed_load_bodies_never_500(setup, body):
    server, _, _ = setup
    r = httpx.post(server.url + "/v1/load_lora_adapter", json=body, headers=KEY, timeout=60)
    assert r.status_code in (400, 404), (body, r.status_code, r.text)
    assert set(r.json()["error"]) == {"message", "type", "param", "code"}
