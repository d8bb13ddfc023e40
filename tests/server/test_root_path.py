"""Issue 42: --root-path as vLLM serves it (root_path.py): the routes answer under the
prefix and without it, the prefix is never applied twice, and the API key guards both."""

from starlette.testclient import TestClient

from rawpage.engine_args import EngineArgs
from rawpage.server.app import build_app
from rawpage.server.args import ServerConfig
from rawpage.server.root_path import normalize_root_path, route_path


def client(root_path: str) -> TestClient:
    # The lifespan does not run: the engine is not loaded, so a route that passes auth says 503.
    config = ServerConfig(root_path=root_path, api_keys=["abc-123"], allowed_hosts=["testserver"])
    return TestClient(build_app(EngineArgs(), config))


def test_both_spellings_reach_the_route_and_the_key_guards_both():
    c = client("/llm")
    good, bad = {"Authorization": "Bearer abc-123"}, {"Authorization": "Bearer abc"}
    for path in ("/v1/completions", "/llm/v1/completions"):
        assert c.post(path, json={"prompt": "hi"}, headers=bad).status_code == 401, path
        assert c.post(path, json={"prompt": "hi"}).status_code == 401, path
        assert c.post(path, json={"prompt": "hi"}, headers=good).status_code == 503, path  # routed, not loaded
    for path in ("/health", "/llm/health"):
        assert c.get(path).status_code == 503, path  # no key needed; loading
    for path in ("/llm/llm/v1/completions", "/llmx/v1/completions"):  # the prefix is applied once
        r = c.post(path, json={"prompt": "hi"}, headers=good)
        assert r.status_code == 404 and "error" in r.json(), path


def test_the_prefix_is_normalized():
    for given in ("llm", "/llm", "/llm/", " llm/ "):
        assert normalize_root_path(given) == "/llm"
    assert normalize_root_path("/") == normalize_root_path("") == ""
    assert client("llm/").get("/llm/health").status_code == 503


def test_route_path():
    scope = {"path": "/llm/v1/models", "root_path": "/llm"}
    assert route_path(scope) == "/v1/models"
    assert route_path({**scope, "path": "/v1/models"}) == "/v1/models"
    assert route_path({**scope, "path": "/llmx/v1"}) == "/llmx/v1"
    assert route_path({"path": "/v1/models"}) == "/v1/models"
