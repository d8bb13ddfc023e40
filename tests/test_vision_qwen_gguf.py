"""Qwen2.5-VL as GGUF + mmproj (llama-server's --mmproj): the tiny model of
tests/tiny_qwen_vl.py converted as convert_hf_to_gguf.py converts it (a qwen2vl text GGUF
with its M-RoPE sections, a qwen2.5vl_merger clip GGUF holding exactly the converter's keys).

The converter keeps neither the config's window_size nor the preprocessor's min/max_pixels,
so a converted file runs as clip.cpp runs it: 112-pixel windows and 8..4096 tokens an image.
It is held to the folder as clip.cpp sees it (the same folder, window_size 112), served
with the folder's min/max_pixels through --mm-processor-kwargs, as a user would (llama-server's
--image-min-tokens / --image-max-tokens); the folder is held to transformers in
tests/test_vision_qwen.py."""

import dataclasses
import json
import os

import numpy as np
import pytest

from rawpage.backends import get_backend
from rawpage.errors import UnsupportedModelError
from rawpage.loader import load_checkpoint
from rawpage.loader.gguf_reader import read_gguf
from rawpage.models.registry import build_model
from rawpage.multimodal.image_input import image_input
from rawpage.multimodal.processor_kwargs import with_processor_kwargs
from tests.test_vision_qwen import DATA, feed_with_images, images
from tests.tiny_qwen_vl import MMPROJ_KEYS, PREPROCESSOR, write_qwen_vl, write_qwen_vl_gguf
from tests.tiny_vlm import seeded_image

pytest.importorskip("PIL")
pytest.importorskip("gguf")

SERVED = {"min_pixels": PREPROCESSOR["min_pixels"], "max_pixels": PREPROCESSOR["max_pixels"]}


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    return write_qwen_vl_gguf(str(tmp_path_factory.mktemp("qvl-gguf")))


@pytest.fixture(scope="module")
def ckpt(files):
    return load_checkpoint(files[0], mmproj=files[1])


@pytest.fixture(scope="module")
def folder112(tmp_path_factory):
    """The tiny folder as clip.cpp sees it: 112-pixel windows."""
    folder = write_qwen_vl(str(tmp_path_factory.mktemp("qvl-112") / "qwen25-vl"))
    path = os.path.join(folder, "config.json")
    with open(path) as f:
        cfg = json.load(f)
    cfg["vision_config"]["window_size"] = 112
    with open(path, "w") as f:
        json.dump(cfg, f)
    return folder


def test_the_mmproj_holds_the_converters_keys(files):
    meta = read_gguf(files[1])[0]
    assert {k for k in meta if not k.startswith("general.")} == MMPROJ_KEYS
    assert read_gguf(files[0])[0]["qwen2vl.rope.dimension_sections"] == [2, 3, 3, 0]


def test_the_mmproj_gives_the_folders_vision_config_and_clip_cpps_defaults(ckpt, folder112):
    hf = load_checkpoint(folder112).config
    assert ckpt.config.mrope_section == hf.mrope_section == [2, 3, 3]
    got, want = dataclasses.asdict(ckpt.config.vision), dataclasses.asdict(hf.vision)
    got_proc, want_proc = got.pop("processor"), want.pop("processor")
    assert got.pop("layer_norm_eps") == pytest.approx(want.pop("layer_norm_eps")) and got == want
    assert got.pop("window_size") == 112 and got["fullatt_block_indexes"] == (1, 3)
    assert (got_proc.pop("min_pixels"), got_proc.pop("max_pixels")) == (8 * 8 * 8, 4096 * 8 * 8)  # 8-pixel tokens
    assert {k: pytest.approx(v) for k, v in got_proc.items()} == {
        k: v for k, v in want_proc.items() if k not in ("min_pixels", "max_pixels")
    }


@pytest.mark.parametrize("kernels", ["native", "numpy"])
def test_gguf_and_mmproj_match_the_folder(ckpt, folder112, kernels):
    backend = get_backend("cpu", cpu_kernels=kernels)
    hf_ckpt = load_checkpoint(folder112)
    hf = build_model(hf_ckpt.config, backend, hf_ckpt.tensors)
    vision = with_processor_kwargs(ckpt.config.vision, SERVED, "--mm-processor-kwargs")
    gg = build_model(dataclasses.replace(ckpt.config, vision=vision), backend, ckpt.tensors)
    # the golden images, and one of 120 x 104 pixels that 112-pixel windows cut (15 x 13 tokens)
    large = with_processor_kwargs(vision, {"max_pixels": 16384}, "t")
    for im, vc in [*((im, vision) for im in images()), (seeded_image(9, 120, 104), large)]:
        inp = image_input(im, vc)
        np.testing.assert_allclose(
            gg.encode_image(inp.pixels, inp.grid), hf.encode_image(inp.pixels, inp.grid), atol=1e-5
        )
    assert inp.grid == (1, 26, 30)
    np.testing.assert_allclose(feed_with_images(gg), feed_with_images(hf), atol=1e-4)


def test_engine_over_gguf_and_mmproj(files, folder112):
    from rawpage import LLM, SamplingParams

    # One cache dtype for both: auto gives the GGUF a float16 cache and the float32 folder a float32 one.
    kw = dict(block_size=8, max_num_batched_tokens=24, limit_mm_per_prompt={"image": 2}, kv_cache_dtype="float16")
    prompt = {"prompt_token_ids": DATA["ids"], "multi_modal_data": {"image": images()}}
    params = SamplingParams(temperature=0, max_tokens=8, logprobs=3)
    (gg,) = LLM(files[0], mmproj=files[1], mm_processor_kwargs=SERVED, **kw).generate(prompt, params, use_tqdm=False)
    (hf,) = LLM(folder112, **kw).generate(prompt, params, use_tqdm=False)
    assert gg.outputs[0].token_ids == hf.outputs[0].token_ids
    for a, b in zip(gg.outputs[0].logprobs, hf.outputs[0].logprobs):
        assert a.keys() == b.keys() and all(abs(a[t].logprob - b[t].logprob) < 1e-4 for t in a)


def test_a_qwen_mmproj_needs_a_qwen2vl_model(files, tmp_path):
    from tests.tiny_vlm import write_vlm_gguf

    gemma, _ = write_vlm_gguf(str(tmp_path / "gemma"))
    with pytest.raises(UnsupportedModelError, match="qwen2.5vl_merger projector"):
        load_checkpoint(gemma, mmproj=files[1])
