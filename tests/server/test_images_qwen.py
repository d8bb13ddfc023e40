"""Images through a running `rawpage serve` of the tiny Qwen2.5-VL (tests/tiny_qwen_vl.py):
the stock openai client's chat image_url parts (data URLs) of two sizes, whose soft-token
counts differ, answered as transformers answers the same prompt (tests/data/golden_qwen25vl.json),
and the prefix cache over an image."""

import base64
import io
import json
import os

import httpx
import pytest

from tests.server.harness import ServerProcess
from tests.tiny_qwen_vl import write_qwen_vl
from tests.tiny_vlm import seeded_image

openai = pytest.importorskip("openai")
pytest.importorskip("PIL")

MODEL = "qwen25-vl"
with open(os.path.join(os.path.dirname(__file__), "..", "data", "golden_qwen25vl.json")) as f:
    DATA = json.load(f)


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    folder = write_qwen_vl(str(tmp_path_factory.mktemp("qvl") / MODEL))
    kwargs = ("--mm-processor-kwargs", '{"max_pixels": 1600}')  # the folder's own value: the same tokens
    s = ServerProcess("--model", folder, "--block-size", "8", "--enable-prompt-tokens-details", *kwargs)
    yield s
    assert s.stop() == 0, s.output()


def data_url(spec) -> str:
    buf = io.BytesIO()
    seeded_image(*spec).save(buf, "PNG")
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode()


def test_chat_with_two_images_of_different_sizes(server):
    client = openai.OpenAI(base_url=server.url + "/v1", api_key="unused")
    parts = [{"type": "image_url", "image_url": {"url": data_url(spec)}} for spec in DATA["images"]]
    messages = [{"role": "user", "content": [*parts, {"type": "text", "text": "Compare them."}]}]
    kw = dict(model=MODEL, messages=messages, max_tokens=4, temperature=0, logprobs=True)
    first = client.chat.completions.create(**kw)
    text_only = client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "Compare them."}], max_tokens=1
    )
    # each image adds <|vision_start|>, its own 20 or 12 <|image_pad|>, <|vision_end|>
    assert first.usage.prompt_tokens == text_only.usage.prompt_tokens + (20 + 2) + (12 + 2)
    assert first.usage.completion_tokens == 4
    again = client.chat.completions.create(**kw)
    assert again.usage.prompt_tokens_details.cached_tokens >= 40
    assert again.choices[0].message.content == first.choices[0].message.content
    assert [t.logprob for t in again.choices[0].logprobs.content] == pytest.approx(
        [t.logprob for t in first.choices[0].logprobs.content], abs=1e-4
    )


def test_a_bad_image_is_a_400(server):
    client = openai.OpenAI(base_url=server.url + "/v1", api_key="unused")
    buf = io.BytesIO()
    seeded_image(1, 1000, 4).save(buf, "PNG")  # an aspect ratio Qwen2-VL's processor refuses
    url = "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode()
    messages = [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": url}}]}]
    with pytest.raises(openai.BadRequestError, match="aspect ratio"):
        client.chat.completions.create(model=MODEL, messages=messages, max_tokens=1)


def test_responses_and_anthropic_images_take_their_own_token_counts(server):
    """The first image (20 soft tokens) and the second (12) through Responses' input_image
    and Anthropic's base64 image block: each prompt grows by its image's own count."""
    anthropic = pytest.importorskip("anthropic")
    client = openai.OpenAI(base_url=server.url + "/v1", api_key="unused")
    counts = []
    for spec in DATA["images"]:
        content = [{"type": "input_image", "image_url": data_url(spec)}, {"type": "input_text", "text": "Hi"}]
        r = client.responses.create(model=MODEL, input=[{"role": "user", "content": content}], max_output_tokens=2)
        counts.append(r.usage.input_tokens)
    assert counts[0] - counts[1] == 20 - 12
    c = anthropic.Anthropic(base_url=server.url, api_key="unused")
    counts = []
    for spec in DATA["images"]:
        data = data_url(spec).split(",", 1)[1]
        image = {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": data}}
        m = c.messages.create(
            model=MODEL, max_tokens=2, messages=[{"role": "user", "content": [image, {"type": "text", "text": "Hi"}]}]
        )
        counts.append(m.usage.input_tokens)
    assert counts[0] - counts[1] == 20 - 12


def test_request_mm_processor_kwargs_resize_its_images(server):
    """vLLM's chat field (openai's extra_body): max_pixels 1024 makes the 20-token image 12 tokens."""
    client = openai.OpenAI(base_url=server.url + "/v1", api_key="unused")
    parts = [{"type": "image_url", "image_url": {"url": data_url(DATA["images"][0])}}, {"type": "text", "text": "Hi"}]
    kw = dict(model=MODEL, messages=[{"role": "user", "content": parts}], max_tokens=1)
    plain = client.chat.completions.create(**kw)
    small = client.chat.completions.create(**kw, extra_body={"mm_processor_kwargs": {"max_pixels": 1024}})
    assert plain.usage.prompt_tokens - small.usage.prompt_tokens == 20 - 12
    counts = []
    for extra in ({}, {"mm_processor_kwargs": {"max_pixels": 1024}}):  # vLLM's /tokenize takes them too
        r = httpx.post(server.url + "/tokenize", json={"model": MODEL, "messages": kw["messages"], **extra}, timeout=60)
        counts.append(r.json()["count"])
    assert counts[0] - counts[1] == 20 - 12
    with pytest.raises(openai.BadRequestError, match="video_fps not supported for Qwen2.5-VL"):
        client.chat.completions.create(**kw, extra_body={"mm_processor_kwargs": {"video_fps": 1}})
