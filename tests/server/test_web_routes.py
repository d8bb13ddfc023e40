"""The page's routes and the engine event stream's access rules, in process (no model is
loaded: the app's lifespan does not run, so the engine never starts)."""

import argparse

import pytest
from starlette.testclient import TestClient

from rawpage.engine_args import EngineArgs
from rawpage.server.app import build_app
from rawpage.server.args import ServerConfig, add_server_args
from rawpage.server.web import PAGE_FILES


def client(**config) -> TestClient:
    # TestClient sends 'Host: testserver'; the server answers only to the names it is told.
    config.setdefault("allowed_hosts", ["testserver"])
    return TestClient(build_app(EngineArgs(), ServerConfig(**config)))


def test_the_page_and_its_files_are_served_with_a_strict_policy():
    c = client(api_keys=["k"])  # the page holds no data: no key needed for it
    page = c.get("/")
    assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
    assert "script-src 'self'" in page.headers["content-security-policy"]
    assert 'data-testid="block-grid"' in page.text
    for name, media_type in PAGE_FILES.items():
        r = c.get(f"/web/{name}")
        assert r.status_code == 200 and r.headers["content-type"].startswith(media_type), name
    assert c.get("/web/info").json() == {"api_key_required": True}
    assert client().get("/web/info").json() == {"api_key_required": False}


@pytest.mark.parametrize("path", ["/web/__init__.py", "/web/..%2Fserver%2Fapp.py", "/web/", "/web/nope.js"])
def test_only_the_page_files_are_served(path):
    assert client().get(path).status_code == 404


def test_no_web_turns_the_page_off():
    parser = argparse.ArgumentParser()
    add_server_args(parser)
    config = ServerConfig.from_cli_args(parser.parse_args(["--no-web"]))
    assert config.web is False and ServerConfig.from_cli_args(parser.parse_args([])).web is True
    c = client(web=False)
    assert c.get("/").status_code == 404 and c.get("/web/app.js").status_code == 404


def test_the_event_stream_needs_the_key():
    c = client(api_keys=["k"])
    assert c.get("/v1/engine/events").status_code == 401
    assert c.get("/v1/engine/events", headers={"Authorization": "Bearer wrong"}).status_code == 401
    r = c.get("/v1/engine/events", headers={"Authorization": "Bearer k"})
    assert r.status_code == 503  # authorised; the model is not loaded in this test


# --- issue 29, item 6: Host, Origin and Content-Type, with or without --api-key -------------------


def test_a_body_must_be_json():
    c = client()
    r = c.post("/tokenize", content=b'{"prompt": "hi"}', headers={"content-type": "text/plain"})
    assert r.status_code == 415 and r.json()["error"]["code"] == "unsupported_media_type"
    r = c.post("/tokenize", content=b'{"prompt": "hi"}', headers={"content-type": "application/x-www-form-urlencoded"})
    assert r.status_code == 415
    r = c.post("/tokenize", content=b'{"prompt": "hi"}', headers={"content-type": "Application/JSON; charset=utf-8"})
    assert r.status_code == 503  # accepted; the model is not loaded in this test


def test_only_the_bound_host_names_are_served():
    assert TestClient(build_app(EngineArgs(), ServerConfig())).get("/health").status_code == 421  # Host: testserver
    c = client(host="10.0.0.5", allowed_hosts=["testserver", "llm.internal"])
    for host in ("127.0.0.1:8000", "localhost", "[::1]:8000", "10.0.0.5", "llm.internal:80", "LLM.Internal."):
        assert c.get("/health", headers={"Host": host}).status_code == 503, host
    for host in ("evil.example", "127.0.0.1.evil.example:8000", "[::2]"):
        r = c.get("/health", headers={"Host": host})
        assert r.status_code == 421 and "--allowed-hosts" in r.json()["error"]["message"], host
    assert client(allowed_hosts=["*"]).get("/health", headers={"Host": "any.example"}).status_code == 503


def test_a_bind_to_every_interface_serves_any_host_and_says_so(caplog):
    with caplog.at_level("WARNING", logger="rawpage.server"):
        c = TestClient(build_app(EngineArgs(), ServerConfig(host="0.0.0.0")))
    assert c.get("/health", headers={"Host": "my-box.lan"}).status_code == 503
    assert any("--allowed-hosts" in r.message for r in caplog.records)


def test_a_foreign_page_cannot_post():
    c = client(allowed_origins=["https://ok.example"])
    body = {"prompt": "hi"}
    r = c.post("/tokenize", json=body, headers={"Origin": "https://evil.example"})
    assert r.status_code == 403 and r.json()["error"]["type"] == "permission_error"
    assert c.post("/tokenize", json=body, headers={"Origin": "null"}).status_code == 403
    assert c.post("/tokenize", json=body, headers={"Origin": "https://ok.example"}).status_code == 503
    assert c.post("/tokenize", json=body, headers={"Origin": "http://testserver"}).status_code == 503  # the page
    assert c.post("/tokenize", json=body).status_code == 503  # curl, the SDKs: no Origin
    assert c.get("/health", headers={"Origin": "https://evil.example"}).status_code == 503  # reads: CORS decides
    assert (
        client(allowed_origins=["*"]).post("/tokenize", json=body, headers={"Origin": "https://x.example"}).status_code
        == 503
    )
