"""The CPU backend on its C kernels end to end: which kernels run, the default model's logits
against the float32 NumPy path, and the simulator's MMVQ kernel against ours."""

from __future__ import annotations

import logging
import os

import numpy as np
import pytest

from rawpage.backends import get_backend
from rawpage.backends.cpu import CPUBackend
from rawpage.models.llama import LlamaModel
from rawpage.native.gguf import gguf_matmul, repack
from rawpage.native.library import native_kernels
from rawpage.ops import gguf_linear
from rawpage.quantization.gguf import GGUF_BLOCKS
from rawpage.quantization.weight import QuantizedWeight
from tests.kernels.test_gguf_model_sim import DECODE_TOLERANCE, packed_weight, quantized_tiny_llama
from tests.kernels.test_model_sim import Runner
from tests.model_harness import SingleSequence

# The native kernels against the float32 NumPy path on the default model (teacher-forced,
# the 8 prompts below, 81 positions; every layer on the int8 kernel, the LM head with its
# activations rounded to 15 bits): measured top-1 agreement 79/81 and a largest logit
# difference of 1.85 (logits span about 30; 2026-12-03).
MAX_LOGIT_DIFF, MIN_TOP1_AGREEMENT = 2.5, 0.97
PROMPTS = [
    "The capital of France is",
    "def fibonacci(n):",
    "Water boils at",
    "1, 2, 3, 4,",
    "Once upon a time",
    "The quick brown fox jumps over the lazy dog. The quick brown fox",
    "<|im_start|>user\nWhat is 2 + 2?<|im_end|>\n<|im_start|>assistant\n",
    "import numpy as np\nx = np.arange(10)\nprint(x.sum())",
]


def test_cpu_kernels_flag_picks_the_kernels(caplog):
    with caplog.at_level(logging.INFO, logger="rawpage"):
        numpy_path = get_backend("cpu", cpu_kernels="numpy")
        assert "CPU kernels: numpy" in caplog.text
        native = get_backend("cpu", cpu_kernels="native")
    assert type(numpy_path) is type(native) is CPUBackend
    assert numpy_path.lib is None and not numpy_path.keeps_quantized and not numpy_path.reads_packed_embedding
    assert (
        native.lib is not None and native.keeps_quantized == {"gguf", "bf16", "f16"} and native.reads_packed_embedding
    )
    assert "CPU kernels: native" in caplog.text
    assert get_backend("cpu").lib is not None  # auto: native where it builds


def test_without_a_compiler_auto_runs_numpy_and_native_is_an_error(no_compiler, caplog):
    with caplog.at_level(logging.WARNING, logger="rawpage"):
        assert get_backend("cpu").lib is None
    assert "running the NumPy path" in caplog.text
    with pytest.raises(ValueError, match="--cpu-kernels native: the CPU kernels did not build"):
        get_backend("cpu", cpu_kernels="native")


def test_default_model_stays_in_its_gguf_blocks(native_default_model, default_checkpoint):
    m = native_default_model
    assert isinstance(m.embed, QuantizedWeight) and m.embed.qtype == "Q8_0"
    assert m.lm_head is m.embed  # tied: held once, as stored
    assert m.layers[0].qkv.qtype == "Q4_1" and m.layers[0].gate_up.qtype == "Q4_1"
    assert m.num_bytes() <= os.path.getsize(default_checkpoint.path)


def test_default_model_logits_against_the_numpy_path(native_default_model, default_model, default_checkpoint):
    """Teacher-forced, 8 prompts: the native kernels (int8 activations against Q4_1/Q8_0
    blocks) against the float32 NumPy path on the same blocks dequantized. Held: top-1
    agreement wherever NumPy's top two are apart by more than the error, and the
    largest logit difference (measured 0.0; see docs/benchmarks.md)."""
    worst, agree, total = 0.0, 0, 0
    for prompt in PROMPTS:
        ids = default_checkpoint.tokenizer.encode(prompt)
        want = SingleSequence(default_model).feed(ids, all_logits=True)
        got = SingleSequence(native_default_model).feed(ids, all_logits=True)
        diff = np.abs(got - want).max(axis=1)
        worst = max(worst, float(diff.max()))
        top2 = np.sort(want, axis=1)[:, -2:]
        clear = top2[:, 1] - top2[:, 0] > 2 * diff
        np.testing.assert_array_equal(got.argmax(1)[clear], want.argmax(1)[clear])
        agree += int((got.argmax(1) == want.argmax(1)).sum())
        total += len(ids)
    assert worst < MAX_LOGIT_DIFF, f"largest logit difference {worst:.3f}"
    assert agree / total >= MIN_TOP1_AGREEMENT, f"top-1 agreement {agree}/{total}"


@pytest.mark.parametrize("qtype", sorted(GGUF_BLOCKS))
def test_native_gguf_agrees_with_the_simulators_mmvq(qtype, monkeypatch):
    """Both quantize activations as llama.cpp does (int8 per 32 values, the same
    rounding), so on the same activations they agree to float rounding: this holds
    the GPU's decode kernel (cuda/gguf_mmvq.cu, run by the simulator) and the CPU's
    against each other."""
    monkeypatch.setattr(gguf_linear, "DECODE_KERNEL", "mmvq")
    rng = np.random.default_rng(len(qtype))
    w = packed_weight(rng, qtype, 96, 512)
    sim = get_backend("sim")
    w_sim = sim.prepare_linear(w)
    for T in (1, 3, 8):  # up to the simulator's GEMV token limit
        x = (rng.standard_normal((T, 512)) * 2).astype(np.float32)
        want = sim.to_numpy(sim.linear(sim.asarray(x), w_sim))
        got = gguf_matmul(native_kernels(), x, repack(native_kernels(), w.data, qtype, w.shape, 2), qtype, w.shape, 2)
        np.testing.assert_allclose(got, want, rtol=0, atol=2e-6 * np.abs(want).max())


@pytest.mark.parametrize("qtype", ["Q4_1", "Q4_K"])
def test_tiny_gguf_model_on_native_and_sim_decodes_alike(qtype, monkeypatch):
    """Through a whole tiny model the two agree up to what int8 rounding amplifies (an
    activation a float-rounding away from a rounding boundary lands one step apart):
    each within the simulator's tolerance of the float32 path, the same greedy tokens."""
    monkeypatch.setattr(gguf_linear, "DECODE_KERNEL", "mmvq")
    config, tensors = quantized_tiny_llama(qtype)
    native = Runner(LlamaModel(config, get_backend("cpu", cpu_kernels="native"), tensors))
    sim = Runner(LlamaModel(config, get_backend("sim"), tensors))
    exact = Runner(LlamaModel(config, get_backend("cpu", cpu_kernels="numpy"), tensors))
    rng = np.random.default_rng(3)
    chunks = {i: [int(t)] for i, t in enumerate(rng.integers(0, config.vocab_size, 3))}
    for step in range(4):  # decode steps: T = 3 rows, under the simulator's GEMV limit
        want, got, ref = sim.step(chunks), native.step(chunks), exact.step(chunks)
        scale = np.abs(ref).max()
        assert np.abs(got - ref).max() / scale < DECODE_TOLERANCE["mmvq"], f"step {step}"
        assert np.abs(want - ref).max() / scale < DECODE_TOLERANCE["mmvq"], f"step {step}"
        top2 = np.sort(ref, axis=-1)[:, -2:]
        clear = top2[:, 1] - top2[:, 0] > 2 * max(np.abs(got - ref).max(), np.abs(want - ref).max())
        np.testing.assert_array_equal(got.argmax(-1)[clear], want.argmax(-1)[clear])
        chunks = {i: [int(t)] for i, t in enumerate(ref.argmax(-1))}
