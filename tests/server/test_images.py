"""Images through a running `rawpage serve` of the tiny Gemma 3 vision-language model
(tests/tiny_vlm.py): the stock openai client (chat image_url parts, Responses
input_image) and anthropic client (base64 image blocks), the prefix cache over an
image, and every refusal of a bad image as a 400 in the API's own shape.
"""

import base64
import io
import struct
import zlib

import httpx
import pytest

from tests.server.harness import ServerProcess
from tests.tiny_vlm import seeded_image, write_vlm

openai = pytest.importorskip("openai")
pytest.importorskip("PIL")

MODEL = "gemma3-vlm"


@pytest.fixture(scope="module")
def media(tmp_path_factory):
    return tmp_path_factory.mktemp("media")


@pytest.fixture(scope="module")
def vlm_server(tmp_path_factory, media):
    folder = write_vlm(str(tmp_path_factory.mktemp("vlm") / MODEL))
    flags = f"--block-size 8 --allowed-local-media-path {media} --enable-prompt-tokens-details".split()
    flags += ["--allowed-media-domains", "localhost", "example.com"]
    s = ServerProcess("--model", folder, "--limit-mm-per-prompt", '{"image": 2}', *flags)
    yield s
    assert s.stop() == 0, s.output()


def png(seed: int = 5, size: tuple[int, int] = (45, 37)) -> bytes:
    buf = io.BytesIO()
    seeded_image(seed, *size).save(buf, "PNG")
    return buf.getvalue()


def data_url(data: bytes, media_type: str = "image/png") -> str:
    return f"data:{media_type};base64," + base64.b64encode(data).decode()


def bomb_png(width: int = 100_000, height: int = 100_000) -> bytes:
    """A PNG whose header claims width x height pixels over a few bytes of data."""

    def chunk(kind: bytes, body: bytes) -> bytes:
        return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body))

    ihdr = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IDAT", zlib.compress(b"\0" * 64)) + chunk(b"IEND", b"")


def ask(*urls: str, text: str = "What is this?") -> list[dict]:
    parts = [{"type": "image_url", "image_url": {"url": u}} for u in urls]
    return [{"role": "user", "content": [*parts, {"type": "text", "text": text}]}]


@pytest.fixture(scope="module")
def client(vlm_server):
    return openai.OpenAI(base_url=vlm_server.url + "/v1", api_key="unused")


def test_openai_chat_with_an_image_and_the_prefix_cache(client):
    kw = dict(model=MODEL, max_tokens=4, temperature=0)
    first = client.chat.completions.create(messages=ask(data_url(png())), **kw)
    text_only = client.chat.completions.create(messages=[{"role": "user", "content": "What is this?"}], **kw)
    # the image adds \n\n <start_of_image>, 4 soft tokens, <end_of_image> \n\n
    assert first.usage.prompt_tokens >= text_only.usage.prompt_tokens + 6
    again = client.chat.completions.create(messages=ask(data_url(png())), **kw)
    assert again.usage.prompt_tokens_details.cached_tokens > 0
    assert again.choices[0].message.content == first.choices[0].message.content
    other = client.chat.completions.create(messages=ask(data_url(png(seed=6))), **kw)
    assert other.usage.prompt_tokens_details.cached_tokens < again.usage.prompt_tokens_details.cached_tokens


def test_responses_input_image(client):
    content = [{"type": "input_text", "text": "Describe"}, {"type": "input_image", "image_url": data_url(png())}]
    r = client.responses.create(model=MODEL, input=[{"role": "user", "content": content}], max_output_tokens=4)
    assert r.output_text is not None and r.usage.input_tokens > 6  # incomplete at max_output_tokens


def test_anthropic_image_block(vlm_server):
    anthropic = pytest.importorskip("anthropic")
    c = anthropic.Anthropic(base_url=vlm_server.url, api_key="unused")
    image = {
        "type": "image",
        "source": {"type": "base64", "media_type": "image/png", "data": base64.b64encode(png()).decode()},
    }
    m = c.messages.create(
        model=MODEL, max_tokens=4, messages=[{"role": "user", "content": [image, {"type": "text", "text": "Hi"}]}]
    )
    assert m.usage.input_tokens > 6
    bad = {**image, "source": {**image["source"], "data": "@@@"}}
    with pytest.raises(anthropic.BadRequestError) as e:
        c.messages.create(model=MODEL, max_tokens=4, messages=[{"role": "user", "content": [bad]}])
    assert "base64" in str(e.value)


def test_a_local_file_under_the_allowed_path(client, media, tmp_path):
    (media / "cat.png").write_bytes(png())
    r = client.chat.completions.create(model=MODEL, messages=ask(f"file://{media}/cat.png"), max_tokens=2)
    assert r.usage.prompt_tokens > 6
    (tmp_path / "secret.png").write_bytes(png())
    with pytest.raises(openai.BadRequestError, match="allowed-local-media-path"):
        client.chat.completions.create(model=MODEL, messages=ask(f"file://{tmp_path}/secret.png"), max_tokens=2)
    with pytest.raises(openai.BadRequestError, match="allowed-local-media-path"):
        client.chat.completions.create(model=MODEL, messages=ask(f"file://{media}/../secret.png"), max_tokens=2)


@pytest.mark.parametrize(
    "urls, says",
    [
        ([data_url(b"definitely not an image")], "not a decodable"),
        (["data:image/png;base64,@@@"], "base64"),
        ([data_url(b'<svg xmlns="http://www.w3.org/2000/svg"/>', "image/svg+xml")], "SVG"),
        ([data_url(b'<?xml version="1.0"?><svg/>')], "SVG"),
        ([data_url(bomb_png())], "pixels"),
        ([data_url(b"BM" + b"\0" * 64, "image/bmp")], "not a decodable"),
        (["https://example.org/cat.png"], "not in --allowed-media-domains"),
        (["http://localhost:1/cat.png"], "non-public address"),  # an allowed domain, a private address
        (["ftp://example.com/cat.png"], "scheme"),
        ([data_url(png())] * 3, "limit-mm-per-prompt"),
    ],
)
def test_bad_images_are_400s_in_openai_shape(vlm_server, urls, says):
    body = {"model": MODEL, "messages": ask(*urls), "max_tokens": 2}
    r = httpx.post(vlm_server.url + "/v1/chat/completions", json=body, timeout=60)
    assert r.status_code == 400, r.text
    assert r.json()["error"]["type"] == "invalid_request_error", r.text
    assert says in r.json()["error"]["message"], r.text


def test_mm_processor_kwargs_gemma_does_not_take_are_a_400_naming_them(vlm_server):
    body = {"model": MODEL, "messages": ask(data_url(png())), "max_tokens": 2, "mm_processor_kwargs": {"max_pixels": 9}}
    r = httpx.post(vlm_server.url + "/v1/chat/completions", json=body, timeout=60)
    assert r.status_code == 400 and r.json()["error"]["type"] == "invalid_request_error", r.text
    assert "max_pixels not supported for Gemma 3" in r.json()["error"]["message"], r.text


def test_bad_image_is_a_400_in_anthropic_shape(vlm_server):
    block = {
        "type": "image",
        "source": {"type": "base64", "media_type": "image/png", "data": base64.b64encode(bomb_png()).decode()},
    }
    body = {"model": MODEL, "max_tokens": 2, "messages": [{"role": "user", "content": [block]}]}
    r = httpx.post(vlm_server.url + "/v1/messages", json=body, timeout=60)
    assert r.status_code == 400 and r.json()["type"] == "error", r.text
    assert r.json()["error"]["type"] == "invalid_request_error" and "pixels" in r.json()["error"]["message"]


def test_a_text_model_refuses_images_naming_itself(plain_server, vlm_server):
    body = {"model": "x", "messages": ask(data_url(png())), "max_tokens": 2}
    models = httpx.get(plain_server.url + "/v1/models").json()["data"]
    # the model card's `vision` (the web page shows its Image button by it)
    assert models[0]["vision"] is False
    assert httpx.get(vlm_server.url + "/v1/models").json()["data"][0]["vision"] is True
    body["model"] = models[0]["id"]
    r = httpx.post(plain_server.url + "/v1/chat/completions", json=body, timeout=60)
    assert r.status_code == 400 and "does not take images" in r.json()["error"]["message"], r.text
    assert models[0]["id"] in r.json()["error"]["message"]


def test_echo_and_continue_final_message_with_an_image(vlm_server):
    body = {"model": MODEL, "messages": ask(data_url(png()), text="Once upon"), "max_tokens": 2}
    body |= {"echo": True, "add_generation_prompt": False, "continue_final_message": True}
    r = httpx.post(vlm_server.url + "/v1/chat/completions", json=body, timeout=60)
    assert r.status_code == 200, r.text
    assert r.json()["choices"][0]["message"]["content"].startswith("Once upon")


def test_a_gguf_with_and_without_its_mmproj(tmp_path):
    """`rawpage serve model.gguf --mmproj mmproj.gguf`, as llama-server takes them: images
    work; the same GGUF served without it refuses an image with a 400 that says so."""
    from tests.tiny_vlm import write_vlm_gguf

    model, mmproj = write_vlm_gguf(str(tmp_path))
    s = ServerProcess(model, "--mmproj", mmproj, "--served-model-name", "g3", "--block-size", "8")
    try:
        out = openai.OpenAI(base_url=s.url + "/v1", api_key="x").chat.completions.create(
            model="g3", messages=ask(data_url(png())), max_tokens=3, temperature=0
        )
        assert out.usage.completion_tokens == 3 and out.usage.prompt_tokens > 10
    finally:
        assert s.stop() == 0, s.output()
    s = ServerProcess(model, "--served-model-name", "g3")
    try:
        block = {
            "type": "image",
            "source": {"type": "base64", "media_type": "image/png", "data": base64.b64encode(png()).decode()},
        }
        body = {"model": "g3", "max_tokens": 2, "messages": [{"role": "user", "content": [block]}]}
        r = httpx.post(s.url + "/v1/messages", json=body, timeout=60)
        assert r.status_code == 400 and r.json()["error"]["type"] == "invalid_request_error", r.text
        assert "'g3' does not take images (a gemma3 GGUF" in r.json()["error"]["message"]
        assert "--mmproj" in r.json()["error"]["message"]
    finally:
        assert s.stop() == 0, s.output()
