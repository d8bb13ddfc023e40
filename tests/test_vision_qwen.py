"""Qwen2.5-VL on the CPU: the tiny model of tests/tiny_qwen_vl.py against transformers'
outputs recorded by tools/make_golden_vlm.py --family qwen2_5_vl. Two images of
different sizes (20 and 12 soft tokens), so that the processor's smart_resize, the
ViT's windows and the language model's M-RoPE positions (and the shift they leave for
the text after each image, and for decode) are all on the line, through the model
alone and through the engine (chunked prefill, the prefix cache, the encoder cache).
"""

import base64
import io
import json
import os

import numpy as np
import pytest

from rawpage import LLM, SamplingParams
from rawpage.backends import get_backend
from rawpage.backends.cpu import CPUBackend
from rawpage.errors import InvalidRequestError
from rawpage.loader import load_checkpoint
from rawpage.models.registry import build_model
from rawpage.multimodal.image_input import image_input
from rawpage.multimodal.mm_batch import MultimodalBatch
from rawpage.multimodal.mrope import mrope_positions
from rawpage.native.library import native_kernels
from tests.model_harness import SingleSequence, check_two_ranks_match_one, two_rank_llm
from tests.tiny_families import weights_digest
from tests.tiny_qwen_vl import IMAGE_PAD, VISION_END, VISION_START, qwen_vl_config, qwen_vl_tensors, write_qwen_vl
from tests.tiny_vlm import seeded_image

PIL = pytest.importorskip("PIL")  # rawpage[vision]

GOLDEN = os.path.join(os.path.dirname(__file__), "data", "golden_qwen25vl.json")
with open(GOLDEN) as f:
    DATA = json.load(f)
TOL = 1e-3  # the text families' tolerance (tests/test_families.py)
PLACEHOLDER = "<|vision_start|><|image_pad|><|vision_end|>"


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return write_qwen_vl(str(tmp_path_factory.mktemp("qvl") / "qwen25-vl"))


@pytest.fixture(scope="module", params=["native", "numpy"])
def model(folder, request):
    ckpt = load_checkpoint(folder)
    # --dtype float32: the vision tower in float32 too (bfloat16 is test_encoder_in_bf16_on_cpu's)
    return build_model(ckpt.config, get_backend("cpu", "float32", cpu_kernels=request.param), ckpt.tensors)


def images():
    return [seeded_image(*spec) for spec in DATA["images"]]


def placed_inputs(vc):
    """The golden prompt's two images, placed on their runs of <|image_pad|>."""
    from rawpage.multimodal.placeholders import place_images

    return place_images(DATA["ids"], tuple(image_input(im, vc) for im in images()), vc)


def test_weights_are_the_recorded_ones():
    assert weights_digest(qwen_vl_tensors(qwen_vl_config())) == DATA["weights"]


def test_preprocessing_and_encoder_match_transformers(model):
    vc = model.config.vision
    for im, grid, pixels, emb in zip(images(), DATA["grid_thw"], DATA["pixel_values"], DATA["image_embeddings"]):
        inp = image_input(im, vc)
        assert list(inp.grid) == grid and inp.length == grid[1] * grid[2] // 4
        np.testing.assert_allclose(inp.pixels.ravel(), pixels, atol=2e-5)  # recorded to 5 decimals
        np.testing.assert_allclose(model.encode_image(inp.pixels, inp.grid).ravel(), emb, atol=1e-4)


def test_attention_in_blocks_of_queries_for_large_images(model, monkeypatch):
    from rawpage.ops import paged_attention

    # 3 queries at a time: a 16-row window's, and the whole image's 80 rows, in blocks with a
    # short last one, as a whole 896-pixel image's 4096 rows are split by 4096-row blocks
    monkeypatch.setattr(paged_attention, "ENCODER_ATTENTION_ROWS", 3)
    inp = image_input(images()[0], model.config.vision)
    np.testing.assert_allclose(model.encode_image(inp.pixels, inp.grid).ravel(), DATA["image_embeddings"][0], atol=1e-4)


@pytest.mark.parametrize("dtype,atol", [("float32", 1e-4), ("bfloat16", 0.05)])
def test_encoder_on_sim_matches_transformers(folder, dtype, atol):
    """--device sim: the ViT and merger through the cuda backend's kernels (RMSNorm, RoPE,
    the windows' attention in one launch a layer, SiLU, the exact GELU), their sources run
    on the CPU. bfloat16 rounds every activation to 8 bits: a loose bound, but one that a
    wrong window, rotation or GELU is far outside (the embeddings are of order 1)."""
    ckpt = load_checkpoint(folder)
    model = build_model(ckpt.config, get_backend("sim", dtype=dtype), ckpt.tensors)
    for im, emb in zip(images(), DATA["image_embeddings"]):
        inp = image_input(im, model.config.vision)
        np.testing.assert_allclose(model.encode_image(inp.pixels, inp.grid).ravel(), emb, atol=atol)


def test_encoder_in_bf16_on_cpu_matches_transformers(folder):
    """The CPU's bfloat16 tower (native/bf16_gemm.c: the windows' attention by cu_seqlens,
    every linear layer), the same bound as sim's bfloat16."""
    lib = native_kernels()
    if lib is None:
        pytest.skip("no C compiler: the CPU kernels did not build")
    ckpt = load_checkpoint(folder)
    model = build_model(ckpt.config, CPUBackend(lib, bf16_tower=True), ckpt.tensors)
    for im, emb in zip(images(), DATA["image_embeddings"]):
        inp = image_input(im, model.config.vision)
        np.testing.assert_allclose(model.encode_image(inp.pixels, inp.grid).ravel(), emb, atol=0.05)


def test_mrope_positions_are_get_rope_index(model):
    placed = placed_inputs(model.config.vision)
    n = len(DATA["ids"])
    expected = np.array(DATA["rope_positions"])
    np.testing.assert_array_equal(mrope_positions(0, n, placed, 2), expected)
    # a chunk in the middle, and a decode token after the prompt: p + the images' shift
    np.testing.assert_array_equal(mrope_positions(10, 25, placed, 2), expected[:, 10:35])
    assert (mrope_positions(n + 3, 1, placed, 2) == n + 3 + DATA["rope_delta"]).all()


def feed_with_images(model, mrope: bool = True) -> np.ndarray:
    """The golden prompt and its two images in one chunk, through a scattered 4-token-block
    table: logits at every position (mrope False: plain 1D positions, which is wrong)."""
    ids, vc = DATA["ids"], model.config.vision
    placed = placed_inputs(vc)
    rows = np.concatenate([np.arange(im.offset, im.offset + im.length) for im in placed])
    embeds = np.concatenate([model.encode_image(im.pixels, im.grid) for im in placed])
    positions = mrope_positions(0, len(ids), placed, 2) if mrope else None
    mm = MultimodalBatch(rows, embeds, None, positions)
    return SingleSequence(model, block_size=4).feed(ids, all_logits=True, mm=mm)


def test_logits_match_transformers_with_mrope(model):
    top_ids, top = np.array(DATA["top_ids"]), np.array(DATA["top_logits"])
    logits = feed_with_images(model)
    diff = np.abs(np.take_along_axis(logits, top_ids, axis=1) - top).max()
    assert diff < TOL, f"max |logit difference| {diff:.2e} at transformers' top-10"
    clear = top[:, 0] - top[:, 1] > 1e-2
    np.testing.assert_array_equal(logits.argmax(1)[clear], top_ids[clear, 0])
    # 1D positions over the images (a text model's rotary) are measurably off
    wrong = feed_with_images(model, mrope=False)
    assert np.abs(np.take_along_axis(wrong, top_ids, axis=1) - top).max() > 10 * TOL


@pytest.fixture(scope="module")
def llm(folder):
    # 24-token chunks: the 20-token image must start a chunk; 8-token blocks for the prefix
    # cache; float32: the vision tower too, for transformers' log-probabilities to 2e-3
    return LLM(
        folder,
        dtype="float32",
        block_size=8,
        max_num_batched_tokens=24,
        max_num_seqs=4,
        limit_mm_per_prompt={"image": 2},
    )


def generate(llm, prompt, n=8, logprobs=None):
    params = SamplingParams(temperature=0, max_tokens=n, logprobs=logprobs)
    (out,) = llm.generate(prompt, params, use_tqdm=False)
    return out


def check_greedy(out) -> None:
    """The greedy tokens and each step's top-5 log-probabilities, as transformers had them
    (decode positions continue from the prompt's last M-RoPE position)."""
    assert list(out.outputs[0].token_ids) == DATA["greedy"]
    for step, (ids, lps) in zip(out.outputs[0].logprobs, DATA["greedy_logprobs"]):
        got = [step[i].logprob for i in ids[:3] if i in step]
        assert len(got) >= 1
        np.testing.assert_allclose(got, lps[: len(got)], atol=2e-3)


def test_engine_greedy_matches_transformers_in_chunks(llm):
    out = generate(llm, {"prompt_token_ids": DATA["ids"], "multi_modal_data": {"image": images()}}, logprobs=5)
    check_greedy(out)


def test_engine_on_sim_matches_transformers(folder):
    """--device sim: the ViT and the language model's M-RoPE rotation and attention on the
    cuda backend's kernels (their sources run on the CPU)."""
    sim = LLM(folder, device="sim", block_size=8, max_num_batched_tokens=24, max_num_seqs=4)
    check_greedy(generate(sim, {"prompt_token_ids": DATA["ids"], "multi_modal_data": {"image": images()}}, logprobs=5))


@pytest.fixture(scope="module")
def llm_tp2(folder):
    """The `llm` engine's settings at --tensor-parallel-size 2 (one spawned worker)."""
    yield from two_rank_llm(folder, dtype="float32", block_size=8, max_num_batched_tokens=24, max_num_seqs=4)


@pytest.mark.timeout(120)
def test_two_ranks_decode_as_one_rank_with_images(llm, llm_tp2):
    """Rank 0 encodes the images and computes the M-RoPE positions; both ride in each step's
    batch, so the worker's prefill chunks and its decode steps (each at its place plus the
    images' shift) are rank 0's: one rank's greedy tokens and log-probabilities."""
    prompt = {"prompt_token_ids": DATA["ids"], "multi_modal_data": {"image": images()}}
    check_two_ranks_match_one(llm, llm_tp2, prompt, DATA["greedy"])


def test_prefix_cache_hits_same_images_and_misses_others(llm):
    llm.reset_prefix_cache()
    ims = images()
    prompt = {"prompt_token_ids": DATA["ids"], "multi_modal_data": {"image": ims}}
    generate(llm, prompt, 1)
    misses = llm.engine.runner.encoder_cache.misses
    again = generate(llm, prompt, logprobs=5)
    assert again.num_cached_tokens == 40  # five full 8-token blocks of 48
    check_greedy(again)  # K/V of the cached blocks and the positions after them are the same
    assert llm.engine.runner.encoder_cache.misses == misses
    # the first image's tokens start in block 0: another first image shares no block
    other = [seeded_image(7, *DATA["images"][0][1:]), ims[1]]
    assert (
        generate(llm, {"prompt_token_ids": DATA["ids"], "multi_modal_data": {"image": other}}, 1).num_cached_tokens == 0
    )


def test_placeholders_expand_to_each_images_own_length(llm):
    tok = llm.get_tokenizer()
    text = f"Look:{PLACEHOLDER} and {PLACEHOLDER}?"
    out = generate(llm, {"prompt": text, "multi_modal_data": {"image": images()}}, 1)
    ids = list(out.prompt_token_ids)
    collapsed = [t for i, t in enumerate(ids) if t != IMAGE_PAD or ids[i - 1] != IMAGE_PAD]
    assert collapsed == tok.encode(text)  # the processor's expansion, on the text before tokenizing
    starts = [i for i, t in enumerate(ids) if t == VISION_START]
    assert [ids[s + 1 : s + 1 + ids[s:].index(VISION_END) - 1].count(IMAGE_PAD) for s in starts] == [20, 12]
    # ids with one <|image_pad|> per image expand the same way
    bare = generate(llm, {"prompt_token_ids": tok.encode(text), "multi_modal_data": {"image": images()}}, 1)
    assert list(bare.prompt_token_ids) == ids


def test_chat_with_image_parts_and_text_only(llm):
    def url(im):
        buf = io.BytesIO()
        im.save(buf, "PNG")
        return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode()

    parts = [{"type": "image_url", "image_url": {"url": url(im)}} for im in images()]
    msg = [{"role": "user", "content": [*parts, {"type": "text", "text": "Hi"}]}]
    (out,) = llm.chat(msg, SamplingParams(temperature=0, max_tokens=4), use_tqdm=False)
    assert list(out.prompt_token_ids).count(IMAGE_PAD) == 32 and len(out.outputs[0].token_ids) == 4
    text = generate(llm, "Hello there", 4)
    assert len(text.outputs[0].token_ids) == 4 and IMAGE_PAD not in text.prompt_token_ids


def test_image_limits(llm):
    ims = images()
    with pytest.raises(InvalidRequestError, match="placeholder"):
        generate(llm, {"prompt": "no placeholder", "multi_modal_data": {"image": ims[0]}})
    with pytest.raises(InvalidRequestError, match="aspect ratio"):
        generate(llm, {"prompt": PLACEHOLDER, "multi_modal_data": {"image": PIL.Image.new("RGB", (1000, 4))}})
    with pytest.raises(InvalidRequestError, match="image token run"):  # ids whose run fits neither image
        ids = [5, VISION_START, *[IMAGE_PAD] * 7, VISION_END]
        generate(llm, {"prompt_token_ids": ids, "multi_modal_data": {"image": ims[0]}})


def test_digest_tells_apart_transposed_sizes_of_one_colour(model):
    vc = model.config.vision
    wide, tall = (image_input(PIL.Image.new("RGB", size, (90, 20, 200)), vc) for size in ((64, 32), (32, 64)))
    assert wide.pixels.tobytes() == tall.pixels.tobytes() and wide.grid != tall.grid
    assert wide.digest != tall.digest


def test_batch_with_images_and_text_matches_each_alone(llm):
    """Sequences with and without images in one batch: each gets its own M-RoPE positions."""
    params = SamplingParams(temperature=0, max_tokens=8, logprobs=5)
    image_prompt = {"prompt_token_ids": DATA["ids"], "multi_modal_data": {"image": images()}}
    text_prompt = {"prompt_token_ids": DATA["ids"][:5] + [9, 10, 11]}
    alone = llm.generate([text_prompt], params, use_tqdm=False)[0]
    llm.reset_prefix_cache()
    both = llm.generate([text_prompt, image_prompt, text_prompt], params, use_tqdm=False)
    check_greedy(both[1])
    for out in (both[0], both[2]):
        assert out.outputs[0].token_ids == alone.outputs[0].token_ids


def test_transformers_5_layout_and_names(folder, tmp_path):
    """A config saved by transformers 5 (text_config, rope_parameters) and weights under
    model.language_model.* / model.visual.* load as the Hub's layout does."""
    import shutil

    from safetensors.numpy import load_file, save_file

    from rawpage.config import ModelConfig

    cfg = qwen_vl_config()
    text = {k: v for k, v in cfg.items() if k not in ("vision_config", "rope_scaling", "architectures")}
    text["rope_parameters"] = {"rope_type": "default", "mrope_section": [2, 3, 3], "rope_theta": 10000.0}
    new = {k: cfg[k] for k in ("architectures", "model_type", "vision_config", "image_token_id")}
    new.update(text_config=text, vision_start_token_id=VISION_START, vision_end_token_id=VISION_END)
    c = ModelConfig.from_hf(new)
    assert (c.architecture, c.mrope_section, c.rope_scaling, c.attention_bias) == ("qwen2", [2, 3, 3], None, True)
    out = tmp_path / "t5"
    shutil.copytree(folder, out)
    with open(out / "config.json", "w") as f:
        json.dump(new, f)
    renamed = {
        ("model.visual." + n[len("visual.") :])
        if n.startswith("visual.")
        else n.replace("model.", "model.language_model.", 1): t
        for n, t in load_file(str(out / "model.safetensors")).items()
    }
    save_file(renamed, str(out / "model.safetensors"))
    ckpt = load_checkpoint(str(out))
    model = build_model(ckpt.config, get_backend("cpu", "float32"), ckpt.tensors)
    inp = image_input(images()[1], model.config.vision)
    np.testing.assert_allclose(model.encode_image(inp.pixels, inp.grid).ravel(), DATA["image_embeddings"][1], atol=1e-4)
    top_ids, top = np.array(DATA["top_ids"]), np.array(DATA["top_logits"])
    assert np.abs(np.take_along_axis(feed_with_images(model), top_ids, axis=1) - top).max() < TOL


def pads(out) -> int:
    return list(out.prompt_token_ids).count(IMAGE_PAD)


def test_mm_processor_kwargs_change_the_resize_and_the_prefix_cache_keys(llm):
    """vLLM's mm_processor_kwargs: min_pixels / max_pixels over preprocessor_config.json's,
    per prompt dict and per LLM.chat; another resize is other pixels and tokens, never a cache hit."""
    llm.reset_prefix_cache()
    im = images()[0]  # 45 x 37: 20 tokens within the folder's max_pixels 1600
    prompt = {"prompt": f"{PLACEHOLDER}Hi", "multi_modal_data": {"image": im}}
    assert pads(generate(llm, prompt, 1)) == 20
    small = {**prompt, "mm_processor_kwargs": {"max_pixels": 1024}}  # smart_resize: 32 x 24, a 6 x 8 patch grid
    out = generate(llm, small, 1)
    assert pads(out) == 12 and out.num_cached_tokens == 0
    assert generate(llm, small, 1).num_cached_tokens == 8  # the same resize again hits
    same = {**prompt, "mm_processor_kwargs": {"min_pixels": 256, "max_pixels": 1600}}  # the folder's own values
    assert pads(generate(llm, same, 1)) == 20
    vc = llm.engine.images.vision
    from rawpage.multimodal.processor_kwargs import with_processor_kwargs

    digests = {image_input(im, with_processor_kwargs(vc, kw, "t")).digest for kw in ({}, {"max_pixels": 1024})}
    assert len(digests) == 2
    msg = [{"role": "user", "content": [{"type": "image_pil", "image_pil": im}, {"type": "text", "text": "Hi"}]}]
    (chat,) = llm.chat(msg, SamplingParams(max_tokens=1), use_tqdm=False, mm_processor_kwargs={"max_pixels": 1024})
    assert pads(chat) == 12


@pytest.mark.parametrize(
    "kwargs,message",
    [
        ({"max_pixels": 1024, "fps": 2}, "fps not supported for Qwen2.5-VL"),
        ({"min_pixels": 2000, "max_pixels": 1000}, "min_pixels 2000 is over max_pixels 1000"),
        ({"max_pixels": "1024"}, "max_pixels must be an integer"),
        ({"min_pixels": 100_000, "max_pixels": 200_000}, "more than --max-num-batched-tokens 24"),  # before resizing
    ],
)
def test_bad_mm_processor_kwargs_are_refused(llm, kwargs, message):
    prompt = {"prompt": PLACEHOLDER, "multi_modal_data": {"image": images()[0]}, "mm_processor_kwargs": kwargs}
    with pytest.raises(InvalidRequestError, match=message):
        generate(llm, prompt, 1)


def test_mm_processor_kwargs_are_checked_with_no_image(llm):
    """A prompt (or LLM.chat) without images still has its mm_processor_kwargs checked: a
    key the processor does not take is refused, never passed over in silence."""
    with pytest.raises(InvalidRequestError, match="fps not supported"):
        generate(llm, {"prompt": "hi", "mm_processor_kwargs": {"fps": 2}}, 1)
    with pytest.raises(ValueError, match="fps not supported"):
        llm.chat([{"role": "user", "content": "hi"}], use_tqdm=False, mm_processor_kwargs={"fps": 2})
    assert generate(llm, {"prompt": "hi", "mm_processor_kwargs": {"max_pixels": 1024}}, 1).outputs[0].token_ids


def test_served_mm_processor_kwargs():
    from types import SimpleNamespace

    from rawpage.multimodal.prompt_images import PromptImages

    vc = load_checkpoint(write_qwen_vl_tmp()).config.vision
    args = SimpleNamespace(
        batched_tokens=lambda d: 64,
        limit_mm_per_prompt=None,
        allowed_local_media_path=None,
        allowed_media_domains=[],
        mm_processor_kwargs={"max_pixels": 1024},
    )
    served = PromptImages(vc, None, "qvl", args)
    assert served.vision.processor.max_pixels == 1024 and served.inputs(images()[:1])[0].length == 12
    assert served.inputs(images()[:1], {"max_pixels": 1600})[0].length == 20  # a request's over the server's
    args.mm_processor_kwargs = {"do_pan_and_scan": True}
    with pytest.raises(ValueError, match="--mm-processor-kwargs: do_pan_and_scan not supported for Qwen2.5-VL"):
        PromptImages(vc, None, "qvl", args)
    with pytest.raises(ValueError, match="'text' does not take images"):
        PromptImages(None, None, "text", args)


def write_qwen_vl_tmp() -> str:
    import tempfile

    return write_qwen_vl(tempfile.mkdtemp(prefix="qvl-kw-"))


def test_numpy_arrays_are_images(llm):
    """vLLM's other image form: an (H, W, 3) uint8 array, the same image as its PIL one."""
    ims = images()
    arrays = [np.asarray(im) for im in ims]
    a = generate(llm, {"prompt_token_ids": DATA["ids"], "multi_modal_data": {"image": arrays}}, logprobs=5)
    check_greedy(a)
    rgba = np.dstack([arrays[0], np.full(arrays[0].shape[:2], 255, np.uint8)])
    vc = llm.engine.images.vision
    assert image_input(rgba, vc).digest == image_input(ims[0], vc).digest
    for bad in (arrays[0].astype(np.float32), arrays[0][..., :2]):
        with pytest.raises(InvalidRequestError, match="uint8 of shape"):
            generate(llm, {"prompt": PLACEHOLDER, "multi_modal_data": {"image": bad}}, 1)


@pytest.mark.parametrize("key", ["prompt", "prompt_token_ids"])
def test_no_images_for_a_placeholder_is_refused(llm, key):
    text = f"Look:{PLACEHOLDER}"
    prompt = text if key == "prompt" else llm.get_tokenizer().encode(text)
    with pytest.raises(InvalidRequestError, match="has 1 .* for 0 image"):
        generate(llm, {key: prompt, "multi_modal_data": {"image": []}}, 1)
    assert not llm.engine.has_unfinished_requests()
    assert pads(generate(llm, {key: "Hi" if key == "prompt" else [5, 6], "multi_modal_data": {"image": []}}, 1)) == 0
