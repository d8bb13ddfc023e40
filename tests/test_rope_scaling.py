"""RoPE scaling past the pretraining length (models/rotary.py): each recipe against
transformers' own rotary embeddings (recorded once by tools/make_golden_rope.py, so
no torch here), YaRN from GGUF metadata, and the flags that override a config."""

from __future__ import annotations

import argparse
import json
import logging
import os

import numpy as np
import pytest

from rawpage.backends import get_backend
from rawpage.config import ModelConfig
from rawpage.engine_args import EngineArgs
from rawpage.errors import UnsupportedModelError
from rawpage.loader import load_checkpoint
from rawpage.models.llama import LlamaModel
from rawpage.models.rotary import rope_table
from tests.model_harness import SingleSequence
from tests.tiny_models import random_tensors, tiny_config, train_tokenizer, write_gguf, write_hf_folder


@pytest.fixture(scope="module")
def tok():
    return train_tokenizer()


def logits_of(path: str, prompt: list[int]) -> np.ndarray:
    """The last position's logits after a prefill chunk and decode steps."""
    ckpt = load_checkpoint(path)
    seq = SingleSequence(LlamaModel(ckpt.config, get_backend("cpu"), ckpt.tensors), block_size=16)
    seq.feed(prompt[:-4])
    return np.stack([seq.feed([t]) for t in prompt[-4:]])


GOLDEN = json.load(open(os.path.join(os.path.dirname(__file__), "data", "golden_rope.json")))


@pytest.mark.parametrize("case", GOLDEN["cases"], ids=lambda c: c["name"])
def test_each_recipe_matches_transformers_past_the_original_length(case):
    cfg = ModelConfig.from_hf(case["config"])
    cfg.validate()
    table = rope_table(cfg)  # (max_pos, D) [cos | sin], the attention factor applied
    pos, half = case["positions"], cfg.head_dim // 2
    assert max(pos) < len(table)  # the table reaches the longest position the recipe serves
    # transformers rotates in float32: its angle p * inv_freq is off by ~p * 6e-8 rad
    np.testing.assert_allclose(table[pos, :half], np.array(case["cos"]), atol=1e-4)
    np.testing.assert_allclose(table[pos, half:], np.array(case["sin"]), atol=1e-4)
    plain = rope_table(ModelConfig.from_hf({**case["config"], "rope_scaling": None}))
    assert np.abs(plain[pos[-1] % len(plain)] - table[pos[-1]]).max() > 1e-2  # the recipe really changes it


def test_yarn_and_dynamic_reach_factor_times_the_original_context(caplog):
    qwen = ModelConfig.from_hf(
        tiny_config("qwen2", max_position_embeddings=32768, rope_scaling={"type": "yarn", "factor": 4.0})
    )
    assert qwen.max_position_embeddings == 131072  # Qwen2.5's 128k, as vLLM derives it
    assert qwen.rope_scaling["original_max_position_embeddings"] == 32768
    with caplog.at_level(logging.INFO, "rawpage"):
        rope_table(qwen)
    assert "RoPE scaling {'type': 'yarn', 'factor': 4.0, 'rope_type': 'yarn'" in caplog.text
    assert "for 131072 positions (attention factor 1.139)" in caplog.text
    dyn = ModelConfig.from_hf(tiny_config(rope_scaling={"rope_type": "dynamic", "factor": 2.0}))
    assert dyn.max_position_embeddings == 512


def test_an_unknown_recipe_or_a_missing_factor_is_refused():
    with pytest.raises(UnsupportedModelError, match="unsupported rope_scaling type 'ntk-by-parts'.*yarn, dynamic"):
        ModelConfig.from_hf(tiny_config(rope_scaling={"type": "ntk-by-parts", "factor": 2.0})).validate()
    with pytest.raises(UnsupportedModelError, match="needs a 'factor'"):
        ModelConfig.from_hf(tiny_config(rope_scaling={"type": "yarn"})).validate()


YARN = {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 64}


def _gguf_with_yarn(path, cfg, tensors, tok, beta_fast=None):
    """A GGUF with llama.cpp's YaRN keys, as convert_hf_to_gguf writes them for Qwen2.5."""
    import gguf

    def add(w):
        w.add_rope_scaling_type(gguf.RopeScalingType.YARN)
        w.add_rope_scaling_factor(4.0)
        w.add_rope_scaling_orig_ctx_len(64)
        if beta_fast is not None:
            w.add_rope_scaling_yarn_beta_fast(beta_fast)

    return write_gguf(path, cfg, tensors, tok, extra_metadata=add)


def test_gguf_yarn_metadata_is_applied_as_the_hf_config_is(tmp_path, tok):
    cfg = tiny_config("qwen2", max_position_embeddings=64)
    tensors = random_tensors(cfg)
    gg = _gguf_with_yarn(str(tmp_path / "y.gguf"), cfg, tensors, tok)
    config = load_checkpoint(gg).config
    assert config.rope_scaling == YARN and config.max_position_embeddings == 256
    hf = write_hf_folder(str(tmp_path / "hf"), {**cfg, "rope_scaling": YARN}, tensors, tok)
    long_prompt = list(range(3, 200))  # past the original 64 positions
    np.testing.assert_allclose(logits_of(gg, long_prompt), logits_of(hf, long_prompt), rtol=1e-4, atol=1e-4)
    plain = write_gguf(str(tmp_path / "plain.gguf"), cfg, tensors, tok)
    assert np.abs(logits_of(plain, long_prompt[:60]) - logits_of(gg, long_prompt[:60])).max() > 1e-3


def test_gguf_yarn_betas_are_read(tmp_path, tok):
    cfg = tiny_config("qwen2", max_position_embeddings=64)
    path = _gguf_with_yarn(str(tmp_path / "b.gguf"), cfg, random_tensors(cfg), tok, beta_fast=8.0)
    assert load_checkpoint(path).config.rope_scaling["beta_fast"] == 8.0


def test_rope_scaling_and_hf_overrides_flags(tmp_path, tok):
    cfg = tiny_config(max_position_embeddings=64)
    tensors = random_tensors(cfg)
    hf = write_hf_folder(str(tmp_path / "hf"), cfg, tensors, tok)
    gg = write_gguf(str(tmp_path / "m.gguf"), cfg, tensors, tok)
    args = EngineArgs(model=hf, rope_scaling=json.dumps(YARN), hf_overrides='{"rope_theta": 20000.0}')
    for path in (hf, gg):  # a config.json and GGUF metadata take the same overrides
        c = load_checkpoint(path, overrides=args.config_overrides()).config
        assert (c.rope_scaling, c.max_position_embeddings, c.rope_theta) == (YARN, 256, 20000.0)
    with pytest.raises(UnsupportedModelError, match="on a GGUF, not num_hidden_layers"):
        load_checkpoint(gg, overrides={"num_hidden_layers": 1})
    assert load_checkpoint(hf, overrides={"num_hidden_layers": 1}).config.num_layers == 1
    parser = argparse.ArgumentParser()
    EngineArgs.add_cli_args(parser)
    cli = EngineArgs.from_cli_args(parser.parse_args(["--rope-scaling", json.dumps(YARN), "--rope-theta", "2e4"]))
    assert cli.config_overrides() == {"rope_scaling": YARN, "rope_theta": 20000.0}
    with pytest.raises(ValueError, match="--rope-scaling is not valid JSON"):
        EngineArgs(rope_scaling="{yarn")
    with pytest.raises(ValueError, match="--hf-overrides must be a JSON object"):
        EngineArgs(hf_overrides="[1]")


def test_transformers5_rope_parameters_take_the_override():
    raw = tiny_config(rope_parameters={"rope_type": "default", "rope_theta": 10000.0})
    raw.pop("rope_theta")
    c = ModelConfig.from_hf(raw, overrides={"rope_scaling": dict(YARN)})
    assert c.rope_scaling == YARN and c.rope_theta == 10000.0
