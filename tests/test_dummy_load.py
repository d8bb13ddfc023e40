"""--load-format dummy: a bare config.json becomes a runnable model with deterministic
random weights of the config's shapes, and a placeholder tokenizer."""

import json

import numpy as np
import pytest

from rawpage.backends import get_backend
from rawpage.errors import ModelLoadError
from rawpage.loader import load_checkpoint
from rawpage.models.llama import LlamaModel
from tests.tiny_models import tiny_config


@pytest.fixture
def config_file(tmp_path):
    cfg = tiny_config(hidden_size=64, intermediate_size=96, num_hidden_layers=2, vocab_size=300, torch_dtype="bfloat16")
    path = tmp_path / "shapes" / "config.json"
    path.parent.mkdir()
    path.write_text(json.dumps(cfg))
    return str(path)


def weights(model):
    """Every weight, as loaded (every backend keeps Linear weights (out, in))."""
    out = {"embed": model.embed, "norm": model.norm, "lm_head": model.lm_head}
    for i, layer in enumerate(model.layers):
        out.update({f"{i}.{k}": v for k, v in vars(layer).items() if hasattr(v, "shape")})  # (not the window)
    return {k: model.backend.to_numpy(v) for k, v in out.items()}


def test_shapes_scales_and_determinism(config_file):
    ckpt = load_checkpoint(config_file, load_format="dummy")
    c = ckpt.config
    assert (c.hidden_size, c.num_layers, c.vocab_size, c.torch_dtype) == (64, 2, 300, "bfloat16")
    a = weights(LlamaModel(c, get_backend("sim"), ckpt.tensors))
    b = weights(LlamaModel(c, get_backend("sim"), load_checkpoint(config_file, load_format="dummy").tensors))
    other = weights(LlamaModel(c, get_backend("sim"), load_checkpoint(config_file, "dummy", seed=1).tensors))
    assert a.keys() == b.keys()
    for k in a:
        np.testing.assert_array_equal(a[k], b[k])  # same seed, same model
        assert not np.array_equal(a[k], other[k])
    assert a["0.qkv"].shape == ((c.num_heads + 2 * c.num_kv_heads) * c.head_dim, 64)
    assert a["0.gate_up"].shape == (2 * 96, 64)
    assert abs(a["0.qkv"].std() - 1 / np.sqrt(64)) < 0.01  # variance 1 / fan_in
    assert abs(a["0.down"].std() - 1 / np.sqrt(96)) < 0.01
    assert np.all(np.abs(a["norm"] - 1) <= 0.1)
    assert not np.array_equal(a["lm_head"], a["embed"]), "untied config: its own LM head"


def test_a_folder_with_only_a_config_loads_too_and_tied_heads_are_tied(config_file, tmp_path):
    cfg = json.loads(open(config_file).read())
    cfg["tie_word_embeddings"] = True
    (tmp_path / "tied").mkdir()
    (tmp_path / "tied" / "config.json").write_text(json.dumps(cfg))
    ckpt = load_checkpoint(str(tmp_path / "tied"), load_format="dummy")
    model = LlamaModel(ckpt.config, get_backend("sim"), ckpt.tensors)
    assert model.lm_head is model.embed
    cpu = LlamaModel(ckpt.config, get_backend("cpu"), ckpt.tensors)  # cpu keeps (out, in): the very table
    assert cpu.lm_head is cpu.embed


def test_placeholder_tokenizer_round_trips_ids(config_file):
    tok = load_checkpoint(config_file, load_format="dummy").tokenizer
    assert tok.encode("<t5> <t17> <t299>", add_special_tokens=False) == [5, 17, 299]
    assert tok.decode([5, 17]) == "<t5> <t17>"


def test_engine_runs_a_dummy_model_and_is_reproducible(config_file):
    from rawpage import LLM, SamplingParams

    params = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True)
    runs = [LLM(config_file, load_format="dummy").generate("<t1> <t2> <t3>", params, use_tqdm=False) for _ in "ab"]
    assert runs[0][0].outputs[0].token_ids == runs[1][0].outputs[0].token_ids
    assert len(runs[0][0].outputs[0].token_ids) == 8
    assert runs[0][0].outputs[0].text.split()[0].startswith("<t")


def test_sim_bfloat16_dummy_weights_are_the_float32_ones_rounded(config_file):
    """Each weight is drawn in float32 from its own seed, then stored in the dtype."""
    from rawpage.dtypes import bf16_from_f32

    ckpt = load_checkpoint(config_file, load_format="dummy")
    f32 = LlamaModel(ckpt.config, get_backend("sim", "float32"), ckpt.tensors)
    bf16 = LlamaModel(ckpt.config, get_backend("sim", "bfloat16"), ckpt.tensors)
    np.testing.assert_array_equal(bf16.layers[1].gate_up, bf16_from_f32(f32.layers[1].gate_up))


def test_bad_dummy_paths_say_what_is_needed(tmp_path):
    with pytest.raises(ModelLoadError, match="config.json"):
        load_checkpoint(str(tmp_path), load_format="dummy")
    with pytest.raises(ModelLoadError, match="--model"):
        load_checkpoint(None, load_format="dummy")
