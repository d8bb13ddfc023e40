"""Float checkpoints on the native CPU backend: `--quantization q8_0` (quantized to Q8_0
blocks at load) and bf16 weights kept bf16, each against the float32 NumPy path."""

from __future__ import annotations

import os

import numpy as np
import pytest

from rawpage.backends import get_backend
from rawpage.loader import load_checkpoint
from rawpage.models.llama import LlamaModel
from rawpage.quantization.select import apply_quantization_flag
from rawpage.quantization.weight import QuantizedWeight
from tests.model_harness import SingleSequence
from tests.tiny_models import (
    TINY_LLAMA,
    random_tensors,
    tiny_config,
    train_tokenizer,
    write_bf16_safetensors,
    write_hf_folder,
)

# max |logit - float32 logit| / max |float32 logit| on the tiny random Llama, 40 tokens
# teacher-forced. Q8_0 weights with int8 activations: measured 0.045 (the same Q8_0
# weights dense on NumPy: 0.031; random tiny models amplify rounding more than trained ones).
Q8_0_TOLERANCE = 0.08
# bf16 weights read exactly: float32 rounding only (the kernels sum in another order)
BF16_TOLERANCE = 1e-5


def teacher_forced(model: LlamaModel, ids: list[int]) -> np.ndarray:
    return SingleSequence(model).feed(ids, all_logits=True)  # (len(ids), V)


def assert_close(got: np.ndarray, want: np.ndarray, tolerance: float) -> None:
    """Relative logit error under `tolerance`, and the same top token wherever the float
    path's top two are further apart than twice the error."""
    diff = np.abs(got - want).max(axis=1)
    assert diff.max() / np.abs(want).max() < tolerance, f"relative error {diff.max() / np.abs(want).max():.4f}"
    top2 = np.sort(want, axis=1)[:, -2:]
    clear = top2[:, 1] - top2[:, 0] > 2 * diff
    assert clear.mean() > 0.3  # (q8_0 on the tiny model: 19 of 40 rows clear)
    np.testing.assert_array_equal(got.argmax(1)[clear], want.argmax(1)[clear])


@pytest.fixture(scope="module")
def float_model(tiny_model_dir):
    ckpt = load_checkpoint(tiny_model_dir)
    return LlamaModel(ckpt.config, get_backend("cpu", cpu_kernels="numpy"), ckpt.tensors)


@pytest.fixture(scope="module")
def prompt(tiny_model_dir):
    return [int(t) for t in np.random.default_rng(0).integers(0, load_checkpoint(tiny_model_dir).config.vocab_size, 40)]


def test_quantization_q8_0_stays_packed_on_native(tiny_model_dir, float_model, prompt):
    ckpt = load_checkpoint(tiny_model_dir)
    model = LlamaModel(
        ckpt.config, get_backend("cpu", cpu_kernels="native"), apply_quantization_flag(ckpt.tensors, "q8_0")
    )
    layer = model.layers[0]
    for w in (layer.qkv, layer.o_proj, layer.gate_up, layer.down, model.embed, model.lm_head):
        assert isinstance(w, QuantizedWeight) and (w.kind, w.qtype) == ("gguf", "Q8_0")
    # 34 bytes per 32 weights against 4 bytes a weight (the norms stay float32)
    assert model.num_bytes() < 0.27 * float_model.num_bytes()
    assert_close(teacher_forced(model, prompt), teacher_forced(float_model, prompt), Q8_0_TOLERANCE)


@pytest.fixture(scope="module")
def bf16_model_dir(tmp_path_factory):
    """tiny_model_dir's Llama stored as bfloat16 (tiny_models.write_bf16_safetensors)."""
    cfg = tiny_config(**TINY_LLAMA, torch_dtype="bfloat16")
    folder = write_hf_folder(str(tmp_path_factory.mktemp("bf16") / "hf"), cfg, {}, train_tokenizer())
    os.remove(os.path.join(folder, "model-00001-of-00001.safetensors"))
    write_bf16_safetensors(os.path.join(folder, "model.safetensors"), random_tensors(cfg, seed=1))
    return folder


def test_bf16_checkpoint_keeps_bf16_weights_on_native(bf16_model_dir):
    """The weights stay 2 bytes each and are read exactly (widened in the kernel, float32
    activations): the logits are the float32 path's on the same weights to float32
    rounding (measured 1.4e-6 relative), not to bf16's."""
    ckpt = load_checkpoint(bf16_model_dir)
    native = LlamaModel(ckpt.config, get_backend("cpu", cpu_kernels="native"), ckpt.tensors)
    numpy = LlamaModel(ckpt.config, get_backend("cpu", cpu_kernels="numpy"), ckpt.tensors)  # widened at load
    layer = native.layers[0]
    for w in (layer.qkv, layer.o_proj, layer.gate_up, layer.down, native.embed, native.lm_head):
        assert isinstance(w, QuantizedWeight) and w.kind == "bf16" and w.data.dtype == np.uint16
    assert isinstance(numpy.layers[0].qkv, np.ndarray) and numpy.layers[0].qkv.dtype == np.float32
    assert native.num_bytes() < 0.51 * numpy.num_bytes()  # (the norms stay float32)
    ids = [int(t) for t in np.random.default_rng(0).integers(0, ckpt.config.vocab_size, 40)]
    got, want = teacher_forced(native, ids), teacher_forced(numpy, ids)
    assert np.abs(got - want).max() / np.abs(want).max() < BF16_TOLERANCE
    np.testing.assert_array_equal(got.argmax(1), want.argmax(1))


def test_quantization_none_widens_bf16_to_float32(bf16_model_dir):
    ckpt = load_checkpoint(bf16_model_dir)
    model = LlamaModel(
        ckpt.config, get_backend("cpu", cpu_kernels="native"), apply_quantization_flag(ckpt.tensors, "none")
    )
    assert isinstance(model.layers[0].qkv, np.ndarray) and model.layers[0].qkv.dtype == np.float32


def test_quantization_q8_0_takes_a_bf16_checkpoint_as_float(bf16_model_dir):
    ckpt = load_checkpoint(bf16_model_dir)
    model = LlamaModel(
        ckpt.config, get_backend("cpu", cpu_kernels="native"), apply_quantization_flag(ckpt.tensors, "q8_0")
    )
    assert (model.layers[0].qkv.kind, model.layers[0].qkv.qtype, model.embed.qtype) == ("gguf", "Q8_0", "Q8_0")
