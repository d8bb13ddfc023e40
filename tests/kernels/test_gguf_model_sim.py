"""GGUF weights kept quantized through a whole model: sim (packed blocks, our
kernels) against cpu (dequantized at load), on a tiny random Llama in every
block format and on the default SmolLM2 GGUF."""

import numpy as np
import pytest

from rawpage.backends import get_backend
from rawpage.loader.tensors import TensorSource
from rawpage.models.llama import LlamaModel
from rawpage.ops import gguf_linear
from rawpage.quantization.gguf import GGUF_BLOCKS, gguf_dequantize_ref
from rawpage.quantization.weight import QuantizedWeight
from tests.kernels.test_gguf_linear import _F16_FIELDS, random_blocks
from tests.kernels.test_model_sim import Runner, schedule, tiny_llama


def packed_weight(rng: np.random.Generator, qtype: str, N: int, K: int) -> QuantizedWeight:
    """Random blocks whose float16 scales are rescaled so that the weight has
    standard deviation 1/sqrt(K), as a trained layer roughly does."""
    data = random_blocks(rng, qtype, N, K)
    factor = 1 / np.sqrt(K) / gguf_dequantize_ref(data, qtype, (N, K)).std()
    blocks = data.reshape(N, K // GGUF_BLOCKS[qtype][0], -1)
    for off in _F16_FIELDS[qtype]:
        scale = blocks[:, :, off : off + 2].copy().view(np.float16) * np.float16(factor)
        blocks[:, :, off : off + 2] = scale.astype(np.float16).view(np.uint8)
    return QuantizedWeight("gguf", (N, K), blocks.reshape(N, -1), qtype)


def quantized_tiny_llama(qtype: str) -> tuple:
    """tiny_llama's config and norms, with every Linear weight packed in `qtype`."""
    config, dense = tiny_llama(dim=256, H=4, Hkv=2, D=64, inter=256)
    rng = np.random.default_rng(len(qtype))
    packed = {
        name: packed_weight(rng, qtype, *t.shape)
        for name, t in dense.items()
        if t.ndim == 2 and name != "model.embed_tokens.weight"
    }
    readers = {name: (lambda t=t: t) for name, t in dense.items() if name not in packed}
    readers |= {name: (lambda w=w: gguf_dequantize_ref(w.data, w.qtype, w.shape)) for name, w in packed.items()}
    return config, TensorSource(readers, {name: (lambda w=w: w) for name, w in packed.items()})


# Decode kernels and how close they come to cpu's float32 product: the float GEMV is
# exact up to summation order; the integer one rounds activations to int8 per 32.
DECODE_TOLERANCE = {"float": 1e-5, "mmvq": 3e-2}


@pytest.mark.parametrize("decode_kernel", list(DECODE_TOLERANCE))
@pytest.mark.parametrize("qtype", list(GGUF_BLOCKS))
def test_tiny_llama_kept_quantized_matches_cpu(qtype, decode_kernel, monkeypatch):
    monkeypatch.setattr(gguf_linear, "DECODE_KERNEL", decode_kernel)
    config, tensors = quantized_tiny_llama(qtype)
    cpu = Runner(LlamaModel(config, get_backend("cpu", cpu_kernels="numpy"), tensors))
    sim_model = LlamaModel(config, get_backend("sim"), tensors)
    assert isinstance(sim_model.layers[0].qkv, QuantizedWeight)  # q|k|v fused as packed rows
    assert sim_model.layers[0].qkv.shape == ((4 + 2 * 2) * 64, 256)
    sim = Runner(sim_model)
    for i, chunks in enumerate(schedule(np.random.default_rng(1), config.vocab_size)):
        want, got = cpu.step(chunks), sim.step(chunks)  # prefill steps take the scratch path, decode the GEMV
        err = np.abs(got - want).max() / np.abs(want).max()
        assert err < DECODE_TOLERANCE[decode_kernel], f"step {i}: relative error {err:.2e}"
        # The same greedy token wherever cpu's top two are further apart than the error
        # (a random tiny model has near-ties that int8 activations may flip).
        top2 = np.sort(want, axis=-1)[:, -2:]
        clear = top2[:, 1] - top2[:, 0] > 2 * np.abs(got - want).max()
        np.testing.assert_array_equal(got.argmax(-1)[clear], want.argmax(-1)[clear])


PROMPTS = ["The capital of France is", "def fibonacci(n):", "Water boils at", "1, 2, 3, 4,", "Once upon a time"]


@pytest.mark.slow
# The default decode kernel only: the float GEMV is covered by the tiny models above,
# and each run of the real model under sim costs minutes on two cores.
@pytest.mark.parametrize("decode_kernel", ["mmvq"])
def test_default_gguf_kept_quantized_greedy_matches_cpu(decode_kernel, monkeypatch):
    """SmolLM2-135M Q4_1 (token_embd Q8_0, tied LM head): 5 prompts in one batch, the
    same greedy tokens on sim with packed weights as on cpu with dequantized ones."""
    from rawpage.loader import load_checkpoint

    monkeypatch.setattr(gguf_linear, "DECODE_KERNEL", decode_kernel)

    try:
        ckpt = load_checkpoint()
    except Exception as e:  # the default model is an optional install
        pytest.skip(str(e))
    sim_model = LlamaModel(ckpt.config, get_backend("sim"), ckpt.tensors)
    assert sim_model.layers[0].gate_up.qtype == "Q4_1" and sim_model.lm_head.qtype == "Q8_0"
    cpu, sim = Runner(LlamaModel(ckpt.config, get_backend("cpu", cpu_kernels="numpy"), ckpt.tensors)), Runner(sim_model)
    chunks = {i: ckpt.tokenizer.encode(p) for i, p in enumerate(PROMPTS)}
    cpu_tokens, sim_tokens = [], []
    for _ in range(4):  # one batched prefill (scratch + GEMM), then decode steps of 5 rows (GEMV)
        cpu_logits, sim_logits = cpu.step(chunks), sim.step(chunks)
        err = np.abs(sim_logits - cpu_logits).max() / np.abs(cpu_logits).max()
        assert err < {"float": 1e-4, "mmvq": DECODE_TOLERANCE["mmvq"]}[decode_kernel]
        cpu_tokens.append(cpu_logits.argmax(-1).tolist())
        sim_tokens.append(sim_logits.argmax(-1).tolist())
        chunks = {i: [t] for i, t in enumerate(cpu_tokens[-1])}
    assert sim_tokens == cpu_tokens
