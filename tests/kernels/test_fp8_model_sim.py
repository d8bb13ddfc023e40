"""FP8 weights through a whole model: `--quantization fp8` on a float checkpoint and
a vLLM-style FP8 checkpoint, sim (packed e4m3, our kernels) against cpu (dequantized)."""

import numpy as np
import pytest

from rawpage.backends import get_backend
from rawpage.errors import UnsupportedModelError
from rawpage.loader import load_checkpoint
from rawpage.models.llama import LlamaModel
from rawpage.quantization.fp8 import quantize_fp8
from rawpage.quantization.select import apply_quantization_flag
from rawpage.quantization.weight import QuantizedWeight
from tests.kernels.test_model_sim import Runner, schedule
from tests.tiny_models import random_tensors, tiny_config, train_tokenizer, write_hf_folder


def compare(config, tensors):
    sim_model = LlamaModel(config, get_backend("sim"), tensors)
    assert isinstance(sim_model.layers[0].gate_up, QuantizedWeight) and sim_model.layers[0].gate_up.kind == "fp8"
    cpu, sim = Runner(LlamaModel(config, get_backend("cpu", cpu_kernels="numpy"), tensors)), Runner(sim_model)
    for i, chunks in enumerate(schedule(np.random.default_rng(1), config.vocab_size)):
        want, got = cpu.step(chunks), sim.step(chunks)
        err = np.abs(got - want).max() / np.abs(want).max()
        assert err < 1e-5, f"step {i}: relative error {err:.2e}"
        np.testing.assert_array_equal(got.argmax(-1), want.argmax(-1))


def test_quantization_flag_fp8_sim_matches_cpu(tmp_path):
    cfg = tiny_config()
    ckpt = load_checkpoint(write_hf_folder(str(tmp_path), cfg, random_tensors(cfg), train_tokenizer()))
    tensors = apply_quantization_flag(ckpt.tensors, "fp8")
    compare(ckpt.config, tensors)
    with pytest.raises(UnsupportedModelError, match="already"):
        apply_quantization_flag(tensors, "fp8")


@pytest.mark.parametrize("per_channel", [True, False])
def test_fp8_checkpoint_sim_matches_cpu(tmp_path, per_channel):
    cfg = tiny_config()
    tensors = {}
    for name, t in random_tensors(cfg).items():
        if name.endswith("_proj.weight"):
            bits, scales = quantize_fp8(t, per_channel)
            tensors[name] = bits  # written as U8; real files say F8_E4M3, read as the same uint8 bits
            tensors[name + "_scale"] = scales[:, None] if per_channel else scales[:1].reshape(())
            tensors[name.replace(".weight", ".input_scale")] = np.ones((), np.float32)
        else:
            tensors[name] = t
    cfg["quantization_config"] = {"quant_method": "fp8", "activation_scheme": "static"}
    ckpt = load_checkpoint(write_hf_folder(str(tmp_path), cfg, tensors, train_tokenizer()))
    compare(ckpt.config, ckpt.tensors)
