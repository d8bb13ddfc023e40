"""Qwen2.5-VL as GGUF + mmproj (llama-server's --mmproj): the tiny model of
tests/tiny_qwen_vl.py converted as convert_hf_to_gguf.py converts it (a qwen2vl text GGUF
with its M-RoPE sections, a qwen2.5vl_merger clip GGUF), held to the same transformers
outputs as the folder (tests/data/golden_qwen25vl.json)."""

from dataclasses import asdict

import numpy as np
import pytest

from rawpage.backends import get_backend
from rawpage.errors import UnsupportedModelError
from rawpage.loader import load_checkpoint
from rawpage.models.registry import build_model
from rawpage.multimodal.image_input import image_input
from tests.test_vision_qwen import DATA, check_greedy, feed_with_images, images
from tests.tiny_qwen_vl import write_qwen_vl_gguf

pytest.importorskip("PIL")
pytest.importorskip("gguf")


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    return write_qwen_vl_gguf(str(tmp_path_factory.mktemp("qvl-gguf")))


@pytest.fixture(scope="module")
def ckpt(files):
    return load_checkpoint(files[0], mmproj=files[1])


def test_the_mmproj_gives_the_folders_vision_config(ckpt, tmp_path):
    from tests.tiny_qwen_vl import write_qwen_vl

    hf = load_checkpoint(write_qwen_vl(str(tmp_path / "hf"))).config
    assert ckpt.config.mrope_section == hf.mrope_section == [2, 3, 3]
    got, want = asdict(ckpt.config.vision), asdict(hf.vision)  # floats from the GGUF's float32 values
    got_proc, want_proc = got.pop("processor"), want.pop("processor")
    assert got.pop("layer_norm_eps") == pytest.approx(want.pop("layer_norm_eps")) and got == want
    assert {k: pytest.approx(v) for k, v in got_proc.items()} == want_proc


@pytest.mark.parametrize("kernels", ["native", "numpy"])
def test_gguf_and_mmproj_match_transformers(ckpt, kernels):
    model = build_model(ckpt.config, get_backend("cpu", cpu_kernels=kernels), ckpt.tensors)
    for im, emb in zip(images(), DATA["image_embeddings"]):
        inp = image_input(im, model.config.vision)
        np.testing.assert_allclose(model.encode_image(inp.pixels, inp.grid).ravel(), emb, atol=1e-4)
    top_ids, top = np.array(DATA["top_ids"]), np.array(DATA["top_logits"])
    logits = feed_with_images(model)
    assert np.abs(np.take_along_axis(logits, top_ids, axis=1) - top).max() < 1e-3


def test_engine_over_gguf_and_mmproj(files):
    from rawpage import LLM, SamplingParams

    llm = LLM(files[0], mmproj=files[1], block_size=8, max_num_batched_tokens=24, limit_mm_per_prompt={"image": 2})
    prompt = {"prompt_token_ids": DATA["ids"], "multi_modal_data": {"image": images()}}
    (out,) = llm.generate(prompt, SamplingParams(temperature=0, max_tokens=8, logprobs=5), use_tqdm=False)
    check_greedy(out)


def test_a_qwen_mmproj_needs_a_qwen2vl_model(files, tmp_path):
    from tests.tiny_vlm import write_vlm_gguf

    gemma, _ = write_vlm_gguf(str(tmp_path / "gemma"))
    with pytest.raises(UnsupportedModelError, match="qwen2.5vl_merger projector"):
        load_checkpoint(gemma, mmproj=files[1])
