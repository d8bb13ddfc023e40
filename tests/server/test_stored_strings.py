"""Issue 44: every string a request sends that the server keeps (the Responses store) or
repeats back has a documented limit (request.STRING_LIMITS, OpenAI's `metadata` bounds),
and a longer one is a 400 in the API's own shape, naming the field."""

import httpx
import pytest

from rawpage.server.request import STRING_LIMITS
from tests.server.test_errors import assert_error

CHAT, CMPL, RESP, MSGS = "/v1/chat/completions", "/v1/completions", "/v1/responses", "/v1/messages"
ASK = [{"role": "user", "content": "hi"}]


def _bodies(path: str) -> dict:
    return {
        CHAT: {"messages": ASK, "max_tokens": 1},
        CMPL: {"prompt": "hi", "max_tokens": 1},
        RESP: {"input": "hi", "max_output_tokens": 1},
        MSGS: {"messages": ASK, "max_tokens": 1},
    }[path]


@pytest.mark.parametrize(
    "path,field",
    [(p, f) for p in (CHAT, CMPL, RESP) for f in ("user", "safety_identifier")] + [(RESP, "instructions")],
)
def test_a_string_one_over_its_limit_is_a_400_and_at_it_passes(server, path, field):
    limit = STRING_LIMITS[field]
    at = httpx.post(server.url + path, json={**_bodies(path), field: "u" * limit}, timeout=120)
    if field == "instructions":  # 256 Ki characters pass this check, then are too long for the context
        assert at.status_code == 400 and f"the limit is {limit}" not in at.text, at.text
    else:
        assert at.status_code == 200, at.text
    over = httpx.post(server.url + path, json={**_bodies(path), field: "u" * (limit + 1)}, timeout=60)
    assert_error(over, 400, field, f"the limit is {limit}")


def test_the_responses_object_echoes_user_within_its_limit(server):
    r = httpx.post(server.url + RESP, json={**_bodies(RESP), "user": "u" * 256}, timeout=60)
    assert r.json()["user"] == "u" * 256


@pytest.mark.parametrize(
    "metadata,param",
    [
        ({f"k{i}": "v" for i in range(17)}, "metadata"),  # OpenAI: 16 pairs
        ({"k" * 65: "v"}, "metadata." + "k" * 64),  # keys of 64 characters
        ({"k": "v" * 513}, "metadata.k"),  # values of 512
        ({"k": 5}, "metadata.k"),
    ],
)
def test_responses_metadata_has_openais_limits(server, metadata, param):
    assert_error(httpx.post(server.url + RESP, json={**_bodies(RESP), "metadata": metadata}), 400, param)
    fits = {f"{'k' * 62}{i:02}": "v" * 512 for i in range(16)}
    r = httpx.post(server.url + RESP, json={**_bodies(RESP), "metadata": fits}, timeout=60)
    assert r.status_code == 200 and r.json()["metadata"] == fits


def test_messages_metadata_user_id_has_anthropics_limit_in_anthropics_shape(server):
    ok = httpx.post(server.url + MSGS, json={**_bodies(MSGS), "metadata": {"user_id": "u" * 256}}, timeout=60)
    assert ok.status_code == 200, ok.text
    r = httpx.post(server.url + MSGS, json={**_bodies(MSGS), "metadata": {"user_id": "u" * 257}}, timeout=60)
    assert r.status_code == 400
    body = r.json()
    assert body["type"] == "error" and body["error"]["type"] == "invalid_request_error"
    assert "metadata.user_id" in body["error"]["message"] and "256" in body["error"]["message"]


def test_an_unknown_model_name_is_not_echoed_whole(server):
    r = httpx.post(server.url + CMPL, json={**_bodies(CMPL), "model": "m" * 100_000}, timeout=60)
    assert r.status_code == 404 and len(r.text) < 2000
