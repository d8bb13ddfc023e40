"""Multi-LoRA through a real `rawpage serve` (issue 21): adapters as model names,
listed in /v1/models with the base model as parent; loading and unloading at run
time while requests run; an unknown adapter is a 404 in OpenAI's shape; three
adapters in use under --max-loras 2 take turns (eviction) and stay exact. Issue 44:
a runtime adapter is its loader's (other keys neither see, use, unload nor replace
it); nothing a load's answer says maps the disk; vLLM's environment switch alone
loads from any folder, as vLLM does."""

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
OTHER = {"Authorization": "Bearer other"}  # a second tenant
ADMIN = {"Authorization": "Bearer boss"}
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
    args = ["--model", model, "--served-model-name", "tiny", "--api-key", "sesame,other", "--enable-lora"]
    args += ["--admin-api-key", "boss"]
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


def _complete(server, model: str, max_tokens: int = 24, headers: dict = KEY) -> httpx.Response:
    body = {"model": model, "prompt": PROMPT, "max_tokens": max_tokens, "temperature": 0, "ignore_eos": True}
    return httpx.post(server.url + "/v1/completions", json=body, headers=headers, timeout=120)


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
    assert r.status_code == 404 and "adapter_config.json" in r.json()["error"]["message"]
    assert empty not in r.text  # the client's own path, not where --lora-dir lies
    r = _post(server, "/v1/load_lora_adapter", {"lora_name": "all8", "lora_path": paths["all8"]})
    assert r.status_code == 400 and "has already been loaded" in r.json()["error"]["message"]  # vLLM's words


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
    for path in (outside, "/etc", "../", "../outside", "qv4/../../"):
        r = _load(server, path)
        assert r.status_code == 400 and "inside the server's --lora-dir" in r.json()["error"]["message"], path
    assert _load(server, "a\x00b").status_code == 400
    assert "x" not in {m["id"] for m in httpx.get(server.url + "/v1/models", headers=KEY).json()["data"]}


def test_what_lies_in_the_lora_dir_cannot_be_probed(setup, tmp_path):
    """Issue 44: nothing there, a file, an empty folder, a folder without weights, and a
    link leading out of --lora-dir all get one answer (the path it names is the client's)."""
    server, _, paths = setup
    root = os.path.dirname(paths["qv4"])
    outside = write_adapter(str(tmp_path / "outside"), CFG, 4, ["q_proj"], 8, seed=9)  # valid, elsewhere
    os.symlink(outside, os.path.join(root, "link-away"))
    with open(os.path.join(root, "a-file"), "w") as f:
        f.write("x")
    os.makedirs(os.path.join(root, "no-weights"), exist_ok=True)
    with open(os.path.join(root, "no-weights", "adapter_config.json"), "w") as f:
        json.dump({"r": 4, "lora_alpha": 8}, f)
    os.makedirs(os.path.join(root, "an-empty-dir"), exist_ok=True)
    answers = set()
    for path in ("nothing-here", "a-file", "an-empty-dir", "no-weights", "link-away", "a-file/deeper"):
        r = _load(server, path)
        err = r.json()["error"]
        answers.add((r.status_code, err["type"], err["code"], err["param"], err["message"].replace(path, "P")))
    assert len(answers) == 1, answers
    assert answers.pop()[:3] == (404, "not_found_error", "lora_adapter_not_found")


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
def test_a_malformed_config_is_a_500_as_in_vllm(setup, config, match):
    """An adapter that is there but cannot be served is the server's files' fault: a 500
    with the reason, as vLLM answers (its test_dynamic_lora_invalid_files)."""
    server, _, paths = setup
    name = _bad_adapter(os.path.dirname(paths["qv4"]), f"bad-{abs(hash(config))}", config=config)
    r = _load(server, name)
    assert r.status_code == 500 and match in r.json()["error"]["message"], r.text
    assert r.json()["error"]["type"] == "internal_server_error"


def test_a_wrong_tensor_name_or_shape_is_a_500(setup):
    import numpy as np

    server, _, paths = setup
    root = os.path.dirname(paths["qv4"])
    wrong = _bad_adapter(root, "wrong-name", tensors={"model.embed_tokens.weight": np.zeros((4, 4), np.float32)})
    r = _load(server, wrong)
    assert r.status_code == 500 and "is not a LoRA A/B" in r.json()["error"]["message"]
    p = "base_model.model.model.layers.0.self_attn.q_proj."
    shapes = {p + "lora_A.weight": np.zeros((4, 3), np.float32), p + "lora_B.weight": np.zeros((5, 4), np.float32)}
    r = _load(server, _bad_adapter(root, "wrong-shape", tensors=shapes))
    assert r.status_code == 500 and "this model needs A" in r.json()["error"]["message"]


def _ids(server, headers: dict) -> set[str]:
    return {m["id"] for m in httpx.get(server.url + "/v1/models", headers=headers).json()["data"]}


def test_a_tenants_runtime_adapter_is_its_own(setup, offline):
    """Issue 44 item 1, the audit's reproduction: A loads an adapter; B can neither see,
    use, unload nor replace it (to B it does not exist, and its name is not B's to take);
    A replaces its own in place; the admin key sees and unloads it."""
    server, _, _ = setup
    load, unload = "/v1/load_lora_adapter", "/v1/unload_lora_adapter"
    assert _post(server, load, {"lora_name": "tenantA-sql", "lora_path": "qv4"}).status_code == 200
    assert "tenantA-sql" in _ids(server, KEY) and "tenantA-sql" in _ids(server, ADMIN)
    assert "tenantA-sql" not in _ids(server, OTHER) and "all8" in _ids(server, OTHER)  # startup ones: shared
    r = _complete(server, "tenantA-sql", headers=OTHER)
    assert r.status_code == 404 and r.json()["error"]["code"] == "model_not_found"
    assert httpx.get(server.url + "/v1/models/tenantA-sql", headers=OTHER).status_code == 404
    r = _post(server, unload, {"lora_name": "tenantA-sql"}, OTHER)
    assert r.status_code == 404 and "tenantA-sql" not in r.json()["error"]["message"].split("loaded:")[1]
    for inplace in (False, True):  # B cannot put its own adapter under A's name
        r = _post(server, load, {"lora_name": "tenantA-sql", "lora_path": "mlp16", "load_inplace": inplace}, OTHER)
        assert r.status_code == 400 and r.json()["error"]["code"] == "lora_name_taken", r.text
    assert _complete(server, "tenantA-sql").json()["choices"][0]["text"] == offline["qv4"]
    # A replaces its own in place (vLLM's load_inplace); B's own adapter stays B's
    r = _post(server, load, {"lora_name": "tenantA-sql", "lora_path": "mlp16", "load_inplace": True})
    assert r.status_code == 200, r.text
    assert _complete(server, "tenantA-sql").json()["choices"][0]["text"] == offline["mlp16"]
    assert _post(server, load, {"lora_name": "b-own", "lora_path": "qv4"}, OTHER).status_code == 200
    assert "b-own" not in _ids(server, KEY) and _complete(server, "b-own").status_code == 404
    # shared adapters: only the admin key changes them
    r = _post(server, unload, {"lora_name": "all8"}, OTHER)
    assert r.status_code == 403 and r.json()["error"]["code"] == "admin_key_required"
    r = _post(server, load, {"lora_name": "all8", "lora_path": "qv4", "load_inplace": True}, KEY)
    assert r.status_code == 403
    # the admin key unloads anyone's
    assert _post(server, unload, {"lora_name": "tenantA-sql"}, ADMIN).status_code == 200
    assert _post(server, unload, {"lora_name": "b-own"}, ADMIN).status_code == 200
    assert _complete(server, "tenantA-sql").status_code == 404


def test_the_admin_keys_loads_are_shared_and_admin_only_updating():
    """What the admin key loads, every key uses; --admin-only-lora-updating keeps loads and
    unloads to it (in process: the route refuses before anything is read)."""
    from starlette.testclient import TestClient

    from rawpage.engine_args import EngineArgs
    from rawpage.server.app import build_app
    from rawpage.server.args import ServerConfig

    common = dict(allowed_hosts=["testserver"], api_keys=["k"], allow_runtime_lora_updating=True, lora_dir="/tmp")
    config = ServerConfig(admin_api_key="adm", admin_only_lora_updating=True, **common)
    c = TestClient(build_app(EngineArgs(), config))
    for path in ("/v1/load_lora_adapter", "/v1/unload_lora_adapter"):
        r = c.post(path, json={"lora_name": "x", "lora_path": "x"}, headers={"Authorization": "Bearer k"})
        assert r.status_code == 403 and r.json()["error"]["code"] == "admin_key_required", r.text
        r = c.post(path, json={"lora_name": "x", "lora_path": "x"}, headers={"Authorization": "Bearer adm"})
        assert r.status_code == 503  # past the gate: the model has not loaded in this client
    with pytest.raises(ValueError, match="needs --admin-api-key"):
        ServerConfig(admin_only_lora_updating=True, **common)


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
    from rawpage.server.lora_routes import describe_load_policy

    parser = argparse.ArgumentParser()
    add_server_args(parser)
    monkeypatch.setenv("VLLM_ALLOW_RUNTIME_LORA_UPDATING", "True")
    config = ServerConfig.from_cli_args(parser.parse_args(["--lora-dir", str(tmp_path)]))
    assert config.allow_runtime_lora_updating and config.lora_dir == str(tmp_path)
    assert not config.runtime_lora_anywhere and "only inside --lora-dir" in describe_load_policy(config)
    # vLLM's switch alone (issue 42): loads read any folder, as vLLM's do, and the log says so
    config = ServerConfig.from_cli_args(parser.parse_args([]))
    assert config.allow_runtime_lora_updating and config.runtime_lora_anywhere
    assert "any folder" in describe_load_policy(config)
    monkeypatch.setenv("VLLM_SERVER_DEV_MODE", "1")  # the other switch does not undo it
    assert ServerConfig.from_cli_args(parser.parse_args([])).runtime_lora_anywhere
    monkeypatch.delenv("VLLM_SERVER_DEV_MODE")
    with pytest.raises(ValueError, match="needs --lora-dir"):  # rawpage's own flag keeps needing it
        ServerConfig(allow_runtime_lora_updating=True)
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


def test_vllms_switch_alone_serves_vllms_way(setup, monkeypatch, tmp_path):
    """Issue 42: VLLM_ALLOW_RUNTIME_LORA_UPDATING=True with no --lora-dir starts (it exited
    with 2), warns that loads read any folder, and answers as vLLM's LoRA tests expect:
    an absolute path anywhere loads, a missing one is a 404, unparsable files a 500."""
    _, model, paths = setup
    monkeypatch.setenv("VLLM_ALLOW_RUNTIME_LORA_UPDATING", "True")
    server = ServerProcess("--model", model, "--served-model-name", "tiny", "--enable-lora", "--max-lora-rank", "16")
    try:
        assert "may read any folder this server can read" in server.output()
        r = _post(server, "/v1/load_lora_adapter", {"lora_name": "q", "lora_path": str(paths["qv4"])}, None)
        assert r.status_code == 200 and "success" in r.text.lower()
        assert _complete(server, "q", headers={}).status_code == 200
        r = _post(server, "/v1/load_lora_adapter", {"lora_name": "nf", "lora_path": "/not/an/adapter"}, None)
        assert r.status_code == 404
        invalid = tmp_path / "invalid_files"
        invalid.mkdir()
        (invalid / "adapter_config.json").write_text("this is not json")
        r = _post(server, "/v1/load_lora_adapter", {"lora_name": "bad", "lora_path": str(invalid)}, None)
        assert r.status_code == 500 and "not readable JSON" in r.text
    finally:
        assert server.stop() == 0, server.output()
