"""Image input: the tiny Gemma 3 vision-language model (tests/tiny_vlm.py) against
transformers' outputs recorded by tools/make_golden_vlm.py, through the model alone (on
the cpu and on sim, which runs the cuda backend's kernels and launch code: the encoder's
and the image rows' attention) and through the engine (chunked prefill around images,
the prefix cache, the encoder cache; the offline API on sim too), and every limit on
what an image may be.
"""

import base64
import io
import json
import os
import re

import numpy as np
import pytest

from rawpage import LLM, SamplingParams
from rawpage.backends import get_backend
from rawpage.backends.cpu import CPUBackend
from rawpage.errors import InvalidRequestError
from rawpage.loader import load_checkpoint
from rawpage.models.registry import build_model
from rawpage.multimodal.image_input import image_input
from rawpage.native.library import native_kernels
from tests.model_harness import SingleSequence, check_two_ranks_match_one, image_rows, two_rank_llm
from tests.tiny_families import weights_digest
from tests.tiny_vlm import IMAGE, seeded_image, vlm_config, vlm_tensors, write_vlm

PIL = pytest.importorskip("PIL")  # rawpage[vision]

GOLDEN = os.path.join(os.path.dirname(__file__), "data", "golden_gemma3_vlm.json")
with open(GOLDEN) as f:
    DATA = json.load(f)
TOL = 1e-3  # the text families' tolerance (tests/test_families.py)


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return write_vlm(str(tmp_path_factory.mktemp("vlm") / "gemma3-vlm"))


@pytest.fixture(scope="module", params=["cpu", "sim"])
def model(folder, request):
    ckpt = load_checkpoint(folder)
    # --dtype float32: the cpu's vision tower in float32 too (bfloat16 is the next test's)
    return build_model(ckpt.config, get_backend(request.param, "float32"), ckpt.tensors)


def images():
    return [seeded_image(*spec) for spec in DATA["images"]]


def check_logits(logits: np.ndarray) -> None:
    top_ids, top = np.array(DATA["top_ids"]), np.array(DATA["top_logits"])
    diff = np.abs(np.take_along_axis(logits, top_ids, axis=1) - top).max()
    assert diff < TOL, f"max |logit difference| {diff:.2e} at transformers' top-10"
    clear = top[:, 0] - top[:, 1] > 1e-2
    np.testing.assert_array_equal(logits.argmax(1)[clear], top_ids[clear, 0])


def test_weights_are_the_recorded_ones():
    assert weights_digest(vlm_tensors(vlm_config())) == DATA["weights"]


def test_preprocessing_and_encoder_match_transformers(model):
    vc = model.config.vision
    for im, pixels, emb in zip(images(), DATA["pixel_values"], DATA["image_embeddings"]):
        inp = image_input(im, vc)
        np.testing.assert_allclose(inp.pixels.ravel(), pixels, atol=2e-5)  # recorded to 5 decimals
        np.testing.assert_allclose(model.encode_image(inp.pixels).ravel(), emb, atol=1e-4)


def feed_with_images(model, bidirectional: bool = True) -> np.ndarray:
    """The golden prompt with its two images in one chunk, through a scattered 4-token-block
    table: logits at every position. bidirectional: each image's 4 tokens attend to each
    other both ways, as transformers' token_type_ids mask has them (else causally)."""
    mm = image_rows(model, DATA["ids"], images(), IMAGE, bidirectional)
    return SingleSequence(model, block_size=4).feed(DATA["ids"], all_logits=True, mm=mm)


def test_logits_match_transformers_with_bidirectional_image_attention(model):
    check_logits(feed_with_images(model))
    # causal attention over the images (what a plain text kernel computes) is measurably off
    wrong = feed_with_images(model, bidirectional=False)
    top_ids = np.array(DATA["top_ids"])
    assert np.abs(np.take_along_axis(wrong, top_ids, axis=1) - np.array(DATA["top_logits"])).max() > 10 * TOL


def bf16_backend(name: str):
    if name == "sim":
        return get_backend("sim", "bfloat16")
    lib = native_kernels()
    if lib is None:
        pytest.skip("no C compiler: the CPU kernels did not build")
    # the tower on bf16_gemm.c: vdpbf16ps where the CPU has it, else the same chains in C
    return CPUBackend(lib, bf16_tower=True)


@pytest.mark.parametrize("backend", ["sim", "cpu"])
def test_bfloat16_stays_near_transformers(folder, backend):
    """cuda's usual dtype, and the cpu's vision tower where it has AVX512-BF16: the encoder's
    kernels in bfloat16 (8 significant bits: about 0.5% of each value; on sim the language
    model's too), the float32 golden data loosely."""
    ckpt = load_checkpoint(folder)
    model = build_model(ckpt.config, bf16_backend(backend), ckpt.tensors)
    vc = model.config.vision
    for im, emb in zip(images(), DATA["image_embeddings"]):
        np.testing.assert_allclose(model.encode_image(image_input(im, vc).pixels).ravel(), emb, atol=0.05)
    logits, top_ids, top = feed_with_images(model), np.array(DATA["top_ids"]), np.array(DATA["top_logits"])
    assert np.abs(np.take_along_axis(logits, top_ids, axis=1) - top).max() < 0.1
    clear = top[:, 0] - top[:, 1] > 0.1
    np.testing.assert_array_equal(logits.argmax(1)[clear], top_ids[clear, 0])


@pytest.fixture(scope="module")
def llm(folder):
    # 8-token chunks: the scheduler must not end a chunk inside an image
    return LLM(folder, block_size=8, max_num_batched_tokens=8, max_num_seqs=4, limit_mm_per_prompt={"image": 2})


def generate(llm, prompt, n=8):
    (out,) = llm.generate(prompt, SamplingParams(temperature=0, max_tokens=n), use_tqdm=False)
    return out


def test_engine_greedy_matches_transformers_in_small_chunks(llm):
    out = generate(llm, {"prompt_token_ids": DATA["ids"], "multi_modal_data": {"image": images()}})
    assert list(out.outputs[0].token_ids) == DATA["greedy"]


@pytest.fixture(scope="module")
def llm_tp2(folder):
    """The `llm` engine's settings at --tensor-parallel-size 2 (one spawned worker)."""
    yield from two_rank_llm(folder, block_size=8, max_num_batched_tokens=8, max_num_seqs=4)


@pytest.mark.timeout(120)
def test_two_ranks_give_one_ranks_tokens_and_logprobs_with_images(llm, llm_tp2):
    """Rank 0 encodes the images; their soft tokens reach the worker inside the step's
    batch, so rank 1's embedding step (and its attention within each image) is rank 0's."""
    prompt = {"prompt_token_ids": DATA["ids"], "multi_modal_data": {"image": images()}}
    check_two_ranks_match_one(llm, llm_tp2, prompt, DATA["greedy"])


def test_prefix_cache_hits_same_image_and_misses_another(llm):
    llm.reset_prefix_cache()
    ims = images()
    first = generate(llm, {"prompt_token_ids": DATA["ids"], "multi_modal_data": {"image": ims}})
    cache = llm.engine.runner.encoder_cache
    misses = cache.misses
    again = generate(llm, {"prompt_token_ids": DATA["ids"], "multi_modal_data": {"image": ims}})
    assert again.num_cached_tokens == 24 and again.outputs[0].token_ids == first.outputs[0].token_ids
    # the same tokens with the images swapped: the first block already holds an image token
    other = generate(llm, {"prompt_token_ids": DATA["ids"], "multi_modal_data": {"image": [ims[1], ims[0]]}})
    assert other.num_cached_tokens == 0
    assert cache.misses == misses  # both images' embeddings were cached by content: no encoder run
    text_only = DATA["ids"][:6]  # a prefix without images shares its block with the image prompts
    assert generate(llm, {"prompt_token_ids": text_only + [5, 6, 7]}, 1).num_cached_tokens == 0


def assert_same_output(a, b) -> None:
    """Greedy tokens equal; each step's top logprobs the same ids, their values within 1e-5
    (a batch's other rows change the CPU's float sums in the last bits, with or without images)."""
    assert list(a.token_ids) == list(b.token_ids)
    for x, y in zip(a.logprobs, b.logprobs, strict=True):
        assert x.keys() == y.keys()
        np.testing.assert_allclose([y[t].logprob for t in x], [x[t].logprob for t in x], atol=1e-5, rtol=0)


def test_batch_invariance_with_images_in_the_batch(llm, monkeypatch):
    """Each request alone and in one batch with requests with and without images gives the
    same tokens and logprobs, though the batch chunks its prefills elsewhere: 8-token steps
    end a chunk where an image starts (whole images only), alone and in the batch."""
    ims = [seeded_image(i, 30 + 7 * i, 28) for i in range(3)]
    prompts = [
        {"prompt": "Look:<start_of_image>What is it?", "multi_modal_data": {"image": ims[0]}},  # image at 8..11
        "Numbers 1 2 3 and words",
        {"prompt": "<start_of_image>and<start_of_image>compare", "multi_modal_data": {"image": ims[1:]}},
        {"prompt": "A longer piece of text before it: <start_of_image>", "multi_modal_data": {"image": ims[2]}},
    ]
    chunks: dict[str, list[tuple[int, int]]] = {}  # request id -> its steps' (first token, tokens)
    execute = llm.engine.runner.execute

    def recorded(scheduled, logits_rows):
        for seq, n in scheduled:
            chunks.setdefault(seq.request.request_id, []).append((seq.num_computed_tokens, n))
        return execute(scheduled, logits_rows)

    def image_cuts(out) -> set[int]:  # where a chunk of the request ended at the start of one of its images
        starts = {i for i, t in enumerate(out.prompt_token_ids) if t == IMAGE and out.prompt_token_ids[i - 1] != IMAGE}
        return {a + n for a, n in chunks[out.request_id]} & starts

    monkeypatch.setattr(llm.engine.runner, "execute", recorded)
    p = SamplingParams(temperature=0, max_tokens=6, logprobs=5)
    alone = []
    for prompt in prompts:
        llm.reset_prefix_cache()  # every prefill computed, none read from another run's blocks
        alone += llm.generate(prompt, p, use_tqdm=False)
    llm.reset_prefix_cache()
    together = llm.generate(prompts, p, use_tqdm=False)
    for a, b in zip(alone, together, strict=True):
        assert_same_output(a.outputs[0], b.outputs[0])
    assert image_cuts(alone[0]) == image_cuts(together[0]) == {8}
    assert image_cuts(together[2]) - image_cuts(alone[2])  # the batch cut it before an image where alone it did not
    assert sum(IMAGE in o.prompt_token_ids for o in together) == 3


def test_text_prompt_placeholders_expand_like_the_processor(llm):
    """A text prompt's <start_of_image> becomes \\n\\n, the image's tokens, \\n\\n (Gemma3Processor)."""
    tok = llm.get_tokenizer()
    out = generate(llm, {"prompt": "Look:<start_of_image>What?", "multi_modal_data": {"image": images()[0]}}, 1)
    expected = tok.encode("Look:\n\n<start_of_image>" + "<image_soft_token>" * 4 + "<end_of_image>\n\nWhat?")
    assert list(out.prompt_token_ids) == expected


def test_generate_with_several_pil_images_places_each_in_order(llm):
    """vLLM's {"prompt": ..., "multi_modal_data": {"image": [img1, img2]}}: each <start_of_image>
    takes the next image (PIL images of any mode and size: RGB, grayscale, RGBA), and gives
    what the same ids with the same images give; the images swapped give another answer."""
    gray = seeded_image(7, 50, 20).convert("L")
    rgba = seeded_image(8, 16, 40).convert("RGBA")
    ims = [gray, rgba]
    p = SamplingParams(temperature=0, max_tokens=4, logprobs=3)

    def run(prompt):
        (out,) = llm.generate(prompt, p, use_tqdm=False)
        return out

    llm.reset_prefix_cache()
    text = run({"prompt": "First:<start_of_image>then<start_of_image>which?", "multi_modal_data": {"image": ims}})
    ids = list(text.prompt_token_ids)
    runs = [i for i, t in enumerate(ids) if t == IMAGE and ids[i - 1] != IMAGE]
    assert len(runs) == 2 and ids.count(IMAGE) == 8
    llm.reset_prefix_cache()
    assert_same_output(text.outputs[0], run({"prompt_token_ids": ids, "multi_modal_data": {"image": ims}}).outputs[0])
    llm.reset_prefix_cache()
    swapped = run({"prompt_token_ids": ids, "multi_modal_data": {"image": ims[::-1]}})
    assert swapped.outputs[0].logprobs[0] != text.outputs[0].logprobs[0]


@pytest.mark.parametrize(
    "prompt,n,message",
    [
        ("<start_of_image>and<start_of_image>", 1, "the prompt has 2 <start_of_image> placeholder(s) for 1 image(s)"),
        ("just <start_of_image>", 2, "the prompt has 1 <start_of_image> placeholder(s) for 2 image(s)"),
        ([5, 397, 6, 397], 1, "the prompt has 2 image token run(s) for 1 image(s)"),  # ids with bare placeholders
        ([5, 397, *[IMAGE] * 4, 399], 2, "the prompt has 1 image token run(s) for 2 image(s)"),  # ids expanded
        ([5, 397, *[IMAGE] * 3, 399], 1, "each image is 4 image tokens"),  # a run cut short
    ],
)
def test_placeholders_and_images_must_match_in_number(llm, prompt, n, message):
    """As vLLM refuses a prompt whose placeholders do not match its images ("Expected there to
    be N prompt updates corresponding to M image items"): a ValueError naming both counts."""
    key = "prompt" if isinstance(prompt, str) else "prompt_token_ids"
    with pytest.raises(ValueError, match=re.escape(message)) as e:  # InvalidRequestError: a 400 in the servers
        generate(llm, {key: prompt, "multi_modal_data": {"image": images()[:1] * n}}, 1)
    assert isinstance(e.value, InvalidRequestError) and not llm.engine.has_unfinished_requests()


def chat_with_an_image(llm):
    buf = io.BytesIO()
    images()[0].save(buf, "PNG")
    url = "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode()
    msg = [
        {"role": "user", "content": [{"type": "image_url", "image_url": {"url": url}}, {"type": "text", "text": "Hi"}]}
    ]
    (out,) = llm.chat(msg, SamplingParams(temperature=0, max_tokens=4), use_tqdm=False)
    assert list(out.prompt_token_ids).count(IMAGE) == 4 and len(out.outputs[0].token_ids) == 4
    return list(out.outputs[0].token_ids)


def test_chat_with_an_image_part(llm):
    chat_with_an_image(llm)


def test_offline_api_with_images_on_sim(folder, llm):
    """--device sim: the cuda backend's encoder, image-row attention and launch code, on the
    CPU. The golden greedy tokens in 8-token chunks, and the same chat reply as on the cpu."""
    sim = LLM(folder, device="sim", block_size=8, max_num_batched_tokens=8, max_num_seqs=4)
    out = generate(sim, {"prompt_token_ids": DATA["ids"], "multi_modal_data": {"image": images()}})
    assert list(out.outputs[0].token_ids) == DATA["greedy"]
    assert chat_with_an_image(sim) == chat_with_an_image(llm)


def test_image_limits_in_the_engine(llm, tmp_path):
    ims = images()
    with pytest.raises(InvalidRequestError, match="limit-mm-per-prompt"):
        generate(llm, {"prompt": "<start_of_image>" * 3, "multi_modal_data": {"image": ims + ims[:1]}})
    with pytest.raises(InvalidRequestError, match="placeholder"):
        generate(llm, {"prompt": "no placeholder", "multi_modal_data": {"image": ims[0]}})
    with pytest.raises(InvalidRequestError, match="PIL"):
        generate(llm, {"prompt": "<start_of_image>", "multi_modal_data": {"image": b"not an image object"}})


def test_text_only_requests_to_a_vision_model(llm):
    out = generate(llm, "Hello there", 4)
    assert len(out.outputs[0].token_ids) == 4 and IMAGE not in out.prompt_token_ids


def test_a_chunk_never_ends_inside_an_image_and_images_fit_the_encoder_budget():
    from types import SimpleNamespace

    from rawpage.multimodal.image_input import ImageInput
    from rawpage.scheduler import Scheduler

    sched = Scheduler.__new__(Scheduler)  # _image_chunk reads the sequence and the encoder budget only
    sched.encoder_budget = 100
    image = ImageInput("00", np.zeros(1), offset=10, length=4)  # tokens 10..13
    seq = SimpleNamespace(request=SimpleNamespace(images=(image,)))
    assert sched._image_chunk(seq, 0, 8) == 8  # ends before the image
    assert sched._image_chunk(seq, 0, 12) == 10  # would end inside: stops at its start
    assert sched._image_chunk(seq, 0, 14) == 14  # the whole image
    assert sched._image_chunk(seq, 10, 2) == 0  # its start, but not all of it: wait for budget
    assert sched._image_chunk(seq, 12, 1) == 0  # a prefix hit inside it: the rest in one step
    assert sched._image_chunk(seq, 12, 2) == 2  # (no encoder budget: the chunk does not start it)
    assert sched.encoder_budget == 100 - 4  # one chunk started the image
    sched.encoder_budget = 3  # the step's encoder budget is spent: the chunk stops before the image
    assert sched._image_chunk(seq, 0, 14) == 10 and sched.encoder_budget == 3


def test_block_names_carry_the_image_digest():
    from rawpage.block_hash import block_digest

    ids = [5, IMAGE, IMAGE, 6]
    assert block_digest(b"p", ids, ["aa" * 32]) != block_digest(b"p", ids, ["bb" * 32])
    assert block_digest(b"p", ids) != block_digest(b"p", ids, ["aa" * 32])
    assert block_digest(b"p", ids, ()) == block_digest(b"p", ids)  # text-only names unchanged


def png_bytes(im) -> bytes:
    buf = io.BytesIO()
    im.save(buf, "PNG")
    return buf.getvalue()


def test_open_image_limits(monkeypatch):
    from rawpage.multimodal import image_input as ii

    im = seeded_image(1, 40, 30)
    assert ii.open_image(png_bytes(im)).size == (40, 30)
    monkeypatch.setattr(ii, "MAX_IMAGE_PIXELS", 40 * 30 - 1)
    with pytest.raises(ii.ImageError, match="pixels"):
        ii.open_image(png_bytes(im))
    monkeypatch.setattr(ii, "MAX_IMAGE_BYTES", 100)
    with pytest.raises(ii.ImageError, match="over the limit"):
        ii.open_image(png_bytes(im))
    monkeypatch.undo()
    buf = io.BytesIO()
    im.save(buf, "TIFF")
    with pytest.raises(ii.ImageError, match="not a decodable"):
        ii.open_image(buf.getvalue())
    with pytest.raises(ii.ImageError, match="SVG"):
        ii.open_image(b"  <svg xmlns='http://www.w3.org/2000/svg'></svg>")
    with pytest.raises(ii.ImageError, match="decoded"):
        ii.open_image(png_bytes(im)[:200])  # a valid header over a truncated body
    from rawpage.multimodal.vision_config import ImageProcessorConfig

    rgba = PIL.Image.new("RGBA", (8, 8), (0, 0, 0, 0))  # transparent: white, as transformers composites it
    np.testing.assert_allclose(ii.preprocess(rgba, ImageProcessorConfig(4, 4)), 1.0)


def test_limit_mm_per_prompt_flag_is_vllms_json():
    import argparse

    from rawpage.engine_args import _mm_limits

    assert _mm_limits('{"image": 3}') == {"image": 3}
    for bad in ("3", '{"video": 1}', '{"image": -1}', "{"):
        with pytest.raises(argparse.ArgumentTypeError):
            _mm_limits(bad)


def test_images_need_a_vision_model(model):
    from types import SimpleNamespace

    from rawpage.multimodal.image_input import ImageError
    from rawpage.multimodal.prompt_images import PromptImages

    args = SimpleNamespace(
        batched_tokens=lambda d: 64, limit_mm_per_prompt=None, allowed_local_media_path=None, allowed_media_domains=[]
    )
    with pytest.raises(ImageError, match="'tiny' does not take images"):
        PromptImages(None, None, "tiny", args).require_vision()
    for device in ("cpu", "sim", "cuda"):
        images = PromptImages(model.config.vision, None, "vlm", args, device=device)
        assert images.accepted and images.require_vision() is model.config.vision


@pytest.fixture
def http_images():
    """A local HTTP server: /cat.png, a redirect, and a body over the byte limit."""
    import http.server
    import threading

    body = png_bytes(seeded_image(3, 20, 20))

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            if self.path == "/moved":
                self.send_response(302)
                self.send_header("Location", "/cat.png")
                self.end_headers()
                return
            self.send_response(200)
            self.end_headers()
            self.wfile.write(body if self.path == "/cat.png" else b"\0" * 4096)

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://localhost:{server.server_address[1]}", body
    server.shutdown()


def test_http_image_urls(http_images, monkeypatch):
    from rawpage.multimodal import image_input as ii
    from rawpage.multimodal import media_fetch

    base, body = http_images
    assert media_fetch.host_allowed("cdn.example.com", ("example.com",))
    assert not media_fetch.host_allowed("evilexample.com", ("example.com",))
    with pytest.raises(ii.ImageError, match="--allowed-media-domains"):
        media_fetch.fetch_image(base + "/cat.png", ())
    with pytest.raises(ii.ImageError, match="not in --allowed-media-domains"):
        media_fetch.fetch_image(base + "/cat.png", ("example.com",))
    # allowed by name, but localhost is not a public address: never fetched
    with pytest.raises(ii.ImageError, match="non-public"):
        media_fetch.fetch_image(base + "/cat.png", ("localhost",))
    # the fetch itself, to the address that was checked (the check let through for this test)
    monkeypatch.setattr(media_fetch, "public_address", lambda host, port: "127.0.0.1")
    assert media_fetch.fetch_image(base + "/cat.png", ("localhost",)) == body
    with pytest.raises(ii.ImageError, match="HTTP 302"):
        media_fetch.fetch_image(base + "/moved", ("localhost",))
    monkeypatch.setattr(media_fetch, "MAX_IMAGE_BYTES", 1000)
    with pytest.raises(ii.ImageError, match="over 1000 bytes"):
        media_fetch.fetch_image(base + "/big", ("localhost",))


def test_gemma_refuses_mm_processor_kwargs_it_does_not_take(llm):
    """Gemma 3's processor has no min/max_pixels: such kwargs are refused, naming them, never
    accepted and ignored; do_pan_and_scan false is what rawpage does, so it is taken."""
    prompt = {"prompt": "<start_of_image>Hi", "multi_modal_data": {"image": images()[0]}}
    for kwargs, message in (
        ({"max_pixels": 1024, "min_pixels": 4}, "max_pixels, min_pixels not supported for Gemma 3"),
        ({"do_pan_and_scan": True}, "do_pan_and_scan is not supported"),
    ):
        with pytest.raises(InvalidRequestError, match=message):
            generate(llm, {**prompt, "mm_processor_kwargs": kwargs}, 1)
    plain = generate(llm, prompt, 2)
    same = generate(llm, {**prompt, "mm_processor_kwargs": {"do_pan_and_scan": False}}, 2)
    assert same.outputs[0].token_ids == plain.outputs[0].token_ids


def test_an_empty_image_list_with_a_placeholder_is_refused(llm):
    with pytest.raises(InvalidRequestError, match=re.escape("1 <start_of_image> placeholder(s) for 0 image(s)")):
        generate(llm, {"prompt": "<start_of_image>Hi", "multi_modal_data": {"image": []}}, 1)
    with pytest.raises(InvalidRequestError, match=re.escape("1 image token run(s) for 0 image(s)")):
        generate(llm, {"prompt_token_ids": [5, 397, 6], "multi_modal_data": {"image": []}}, 1)
