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
