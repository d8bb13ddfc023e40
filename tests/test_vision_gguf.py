"""Gemma 3 images from a GGUF and its mmproj file, as llama-server loads them
(`--mmproj`): the tiny vision-language model of tests/tiny_vlm.py converted as
llama.cpp's convert_hf_to_gguf.py does, held to the same transformers outputs as the
Hugging Face folder (tests/data/golden_gemma3_vlm.json), and every mismatch refused.

A GGUF cannot say query_pre_attn_scalar (llama.cpp scales Gemma's scores by
head_dim**-0.5); the tiny model's is 24, not its head_dim 16, so the comparisons with
transformers lay it over the GGUF with --hf-overrides, as a user would.
"""

import os
import subprocess
import sys

import numpy as np
import pytest

from rawpage import LLM, SamplingParams
from rawpage.backends import get_backend
from rawpage.errors import InvalidRequestError, ModelLoadError, UnsupportedModelError
from rawpage.loader import load_checkpoint
from rawpage.models.registry import build_model
from rawpage.multimodal.image_input import image_input
from tests.test_vision import DATA, check_logits, feed_with_images, images
from tests.tiny_families import family_config, hub_tensors
from tests.tiny_models import train_tokenizer, write_gguf
from tests.tiny_vlm import BOI, EOI, IMAGE, write_vlm, write_vlm_gguf

pytest.importorskip("PIL")  # rawpage[vision]
SCALE = {"query_pre_attn_scalar": 24}  # the tiny model's (see above)


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    return write_vlm_gguf(str(tmp_path_factory.mktemp("vlm-gguf")))


@pytest.fixture(scope="module")
def model(files):
    ckpt = load_checkpoint(files[0], overrides=SCALE, mmproj=files[1])
    return build_model(ckpt.config, get_backend("cpu", "float32"), ckpt.tensors)


def test_mmproj_metadata_gives_the_vision_config(files, tmp_path):
    vc = load_checkpoint(files[0], mmproj=files[1]).config.vision
    hf = load_checkpoint(write_vlm(str(tmp_path / "hf"))).config.vision
    assert (vc.boi_token_id, vc.image_token_id, vc.eoi_token_id) == (BOI, IMAGE, EOI)  # Gemma 3's token strings
    assert vc.tokens_per_image == 4  # 4 x 4 patches pooled 2 x 2: clip.vision.projector.scale_factor
    assert vc.processor == hf.processor
    assert vc == hf.__class__(**{**vars(hf), "layer_norm_eps": vc.layer_norm_eps}) and np.isclose(
        vc.layer_norm_eps, hf.layer_norm_eps
    )  # the file keeps the epsilon as float32


def test_gguf_and_mmproj_logits_match_transformers(model):
    vc = model.config.vision
    for im, emb in zip(images(), DATA["image_embeddings"]):
        np.testing.assert_allclose(model.encode_image(image_input(im, vc).pixels).ravel(), emb, atol=1e-4)
    check_logits(feed_with_images(model))


def test_f16_mmproj_stays_close(tmp_path):
    """The converter's default --outtype f16 (matrices F16, embeddings F32): within F16's rounding."""
    m, p = write_vlm_gguf(str(tmp_path), mmproj_type="F16")
    ckpt = load_checkpoint(m, overrides=SCALE, mmproj=p)
    f16 = build_model(ckpt.config, get_backend("cpu", "float32"), ckpt.tensors)
    emb = f16.encode_image(image_input(images()[0], ckpt.config.vision).pixels).ravel()
    err = np.abs(emb - DATA["image_embeddings"][0]).max()
    assert 1e-5 < err < 5e-3, err  # F16 weights really were read (measured 1.1e-3), and read right


def test_engine_serves_the_gguf_with_its_mmproj(files):
    llm = LLM(files[0], mmproj=files[1], hf_overrides=SCALE, block_size=8, max_num_batched_tokens=8)
    params = SamplingParams(temperature=0, max_tokens=8)
    (out,) = llm.generate({"prompt_token_ids": DATA["ids"], "multi_modal_data": {"image": images()}}, params)
    assert list(out.outputs[0].token_ids) == DATA["greedy"]
    # a text prompt's <start_of_image> is one control token of the GGUF's vocabulary, expanded
    (out,) = llm.generate({"prompt": "Look:<start_of_image>", "multi_modal_data": {"image": images()[0]}}, params)
    assert list(out.prompt_token_ids).count(IMAGE) == 4 and EOI in out.prompt_token_ids


def test_a_gemma3_gguf_without_mmproj_says_to_pass_one(files):
    llm = LLM(files[0], served_model_name="gemma-3-tiny", max_num_batched_tokens=16)
    prompt = {"prompt": "<start_of_image>", "multi_modal_data": {"image": images()[0]}}
    with pytest.raises(InvalidRequestError, match=r"'gemma-3-tiny' does not take images \(a gemma3 GGUF .*--mmproj"):
        llm.generate(prompt, SamplingParams(max_tokens=1))


def test_mismatched_mmproj_files_are_refused_at_load(files, tmp_path):
    model, mmproj = files
    _, other = write_vlm_gguf(str(tmp_path / "qwen"), projector="qwen2vl")
    with pytest.raises(UnsupportedModelError, match="projector type 'qwen2vl' is not supported"):
        load_checkpoint(model, mmproj=other)
    _, wide = write_vlm_gguf(str(tmp_path / "wide"), text_dim=96)
    with pytest.raises(ModelLoadError, match="projects images to 96 dimensions.*embedding length 64"):
        load_checkpoint(model, mmproj=wide)
    with pytest.raises(ModelLoadError, match="not a multimodal projector"):
        load_checkpoint(model, mmproj=model)  # the text GGUF given as its own mmproj
    cfg = family_config("qwen3")
    text = write_gguf(str(tmp_path / "qwen3.gguf"), cfg, hub_tensors(cfg), train_tokenizer())
    with pytest.raises(UnsupportedModelError, match="a gemma3 projector, but .*qwen3.gguf is a qwen3 model without"):
        load_checkpoint(text, mmproj=mmproj)
    with pytest.raises(ModelLoadError, match="--mmproj goes with a GGUF model"):
        load_checkpoint(write_vlm(str(tmp_path / "hf")), mmproj=mmproj)
    with pytest.raises(ModelLoadError, match="no such file"):
        load_checkpoint(model, mmproj=str(tmp_path / "missing.gguf"))


def test_serve_with_a_wrong_mmproj_exits_with_one_line(files, tmp_path):
    _, other = write_vlm_gguf(str(tmp_path), projector="qwen2vl")
    cmd = [sys.executable, "-m", "rawpage.cli", "serve", files[0], "--mmproj", other, "--port", "0"]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=120, env=dict(os.environ, HF_HUB_OFFLINE="1"))
    errors = [line for line in out.stderr.splitlines() if " ERROR " in line]
    assert out.returncode == 2 and len(errors) == 1 and "projector type 'qwen2vl'" in errors[0], out.stderr
