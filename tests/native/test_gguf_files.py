"""Whole GGUF files as llama-quantize mixes their formats, through the real writer,
loader and engine: tiny Llama and Qwen2 models in Q4_K_M, Q3_K_M and IQ4_XS.

The tests cannot build llama.cpp, so the files are written here: every matrix is random
blocks of its format with sane scales (valid weights of that format), in the mix
llama.cpp's llama_tensor_get_type gives each tensor (roughly: attn_v and ffn_down take
more bits in the first and last layers; the tied token_embd is Q6_K; a matrix whose
rows are no multiple of 256 falls back to Q5_0 / Q8_0 / IQ4_NL, as in Qwen2.5-0.5B).

Teacher-forced against the float32 NumPy path on the same weights (dequantized at
load), over 288 positions: the int8 rounding of the activations (llama.cpp's scheme, and
ours) moves the logits by about 1% of their range, so random models, whose top tokens
are often near-ties, flip some of them. Held: top-1 agreement of at least 97% wherever
the float32 path's top two are more than 2% of the logits' range apart, and a relative
rms logit difference under 3%; the raw agreement and the largest logit difference are
printed (pytest -s) and recorded.
"""

from __future__ import annotations

import logging

import numpy as np
import pytest

from rawpage import LLM, SamplingParams
from rawpage.backends import get_backend
from rawpage.loader import load_checkpoint
from rawpage.models.registry import build_model
from rawpage.quantization.weight import QuantizedWeight, RowStack
from tests.kernels.test_gguf_model_sim import packed_weight
from tests.model_harness import SingleSequence
from tests.tiny_models import random_tensors, tiny_config, train_tokenizer, write_gguf

MIN_TOP1_AGREEMENT = 0.97

# mix -> (most matrices, attn_v and ffn_down in the "more bits" layers, elsewhere); the
# tied token_embd is Q6_K in all three
MIXES = {
    "Q4_K_M": ("Q4_K", "Q6_K", "Q4_K"),
    "Q3_K_M": ("Q3_K", "Q5_K", "Q4_K"),
    "IQ4_XS": ("IQ4_XS", "IQ4_XS", "IQ4_XS"),
}
# llama.cpp's type for a matrix whose rows are no multiple of 256
FALLBACK = {"Q4_K": "Q5_0", "Q5_K": "Q5_1", "Q6_K": "Q8_0", "Q3_K": "IQ4_NL", "IQ4_XS": "IQ4_NL"}
# Llama: every matrix 256 wide; Qwen2 (q/k/v biases): an MLP of 896, so ffn_down falls back
FAMILIES = {
    "llama": dict(hidden_size=256, intermediate_size=512, num_attention_heads=4, num_key_value_heads=2, head_dim=64),
    "qwen2": dict(hidden_size=256, intermediate_size=896, num_attention_heads=4, num_key_value_heads=2, head_dim=64),
}
LAYERS = 3


def gguf_type(mix: str, gname: str, layer: int | None, K: int) -> str:
    most, more, other = MIXES[mix]
    if gname == "token_embd.weight":
        qtype = "Q6_K"
    elif gname.endswith(("attn_v.weight", "ffn_down.weight")):
        qtype = more if layer in (0, LAYERS - 1) else other
    else:
        qtype = most
    return FALLBACK[qtype] if K % 256 else qtype


@pytest.fixture(scope="module")
def tok():
    return train_tokenizer()


def write_mixed(path: str, arch: str, mix: str, tok) -> str:
    cfg = tiny_config(arch, num_hidden_layers=LAYERS, tie_word_embeddings=True, **FAMILIES[arch])
    tensors = random_tensors(cfg)
    rng = np.random.default_rng(len(mix) + len(arch))
    names = {"model.embed_tokens.weight": ("token_embd.weight", None)}
    for name in tensors:
        if name.startswith("model.layers.") and name.endswith("proj.weight"):
            i, rest = name[len("model.layers.") :].split(".", 1)
            short = {"q": "attn_q", "k": "attn_k", "v": "attn_v", "o": "attn_output"}
            proj = rest.split(".")[1].removesuffix("_proj")
            names[name] = (f"blk.{i}.{short.get(proj, 'ffn_' + proj)}.weight", int(i))
    raw = {}
    for name, (gname, layer) in names.items():
        N, K = tensors[name].shape
        qtype = gguf_type(mix, gname, layer, K)
        raw[gname] = (packed_weight(rng, qtype, N, K).data, qtype)
    raw["token_embd.weight"] = (peaked(rng, raw["token_embd.weight"][0]), "Q6_K")
    return write_gguf(path, cfg, tensors, tok, raw=raw)


def peaked(rng: np.random.Generator, blocks: np.ndarray) -> np.ndarray:
    """Q6_K embedding rows (the tied LM head) of unequal sizes, so that the logits are
    peaked as a trained model's are (a few tokens far likelier than the rest), not the
    near-ties of equal random rows, where any rounding flips the top token."""
    rows = blocks.reshape(len(blocks), -1, 210).copy()
    d = rows[:, :, 208:210].copy().view(np.float16).astype(np.float32)  # (V, blocks, 1)
    d *= rng.lognormal(0.0, 1.0, (len(rows), 1, 1)).astype(np.float32)
    rows[:, :, 208:210] = d.astype(np.float16).view(np.uint8)
    return rows.reshape(len(blocks), -1)


CASES = [(arch, mix) for arch in FAMILIES for mix in MIXES]


@pytest.mark.parametrize("arch,mix", CASES)
def test_a_mixed_file_runs_in_its_blocks_and_agrees_with_float32(tmp_path, tok, arch, mix, record_property):
    ckpt = load_checkpoint(write_mixed(str(tmp_path / f"{arch}-{mix}.gguf"), arch, mix, tok))
    native = build_model(ckpt.config, get_backend("cpu", cpu_kernels="native"), ckpt.tensors)
    exact = build_model(ckpt.config, get_backend("cpu", cpu_kernels="numpy"), ckpt.tensors)
    layers = dict(native.linear_weights())
    assert all(isinstance(w, QuantizedWeight | RowStack) for w in layers.values()), "a layer left dense"
    assert native.lm_head is native.embed and native.embed.qtype == "Q6_K"  # tied: held once, in its blocks
    if mix == "Q4_K_M":  # q|k Q4_K beside v Q6_K: one fused layer, each part in its format
        assert [p.qtype for p in layers["layers.0.qkv"].parts] == ["Q4_K", "Q4_K", "Q6_K"]
    if arch == "qwen2" and mix != "IQ4_XS":
        assert layers["layers.0.down"].qtype == FALLBACK[MIXES[mix][1]]
    rng = np.random.default_rng(0)
    sequences = [rng.integers(3, ckpt.config.vocab_size, 96).tolist() for _ in range(3)]
    got = np.concatenate([SingleSequence(native).feed(ids, all_logits=True) for ids in sequences])
    want = np.concatenate([SingleSequence(exact).feed(ids, all_logits=True) for ids in sequences])
    same = got.argmax(1) == want.argmax(1)
    top = np.sort(want, axis=1)
    clear = top[:, -1] - top[:, -2] > 0.02 * (top[:, -1] - top[:, 0])
    rms = float(np.sqrt(((got - want) ** 2).mean() / (want**2).mean()))
    worst, agreement, clear_agreement = float(np.abs(got - want).max()), float(same.mean()), float(same[clear].mean())
    for name, value in (("top1", agreement), ("top1_clear", clear_agreement), ("max_diff", worst), ("rms", rms)):
        record_property(name, value)
    print(
        f"{arch} {mix}: top-1 agreement {agreement:.3f} ({clear_agreement:.3f} of {clear.sum()} clear positions), "
        f"largest logit difference {worst:.3g} (logits span {float((top[:, -1] - top[:, 0]).mean()):.3g}), rms {rms:.2%}"
    )
    assert clear_agreement >= MIN_TOP1_AGREEMENT and rms < 0.03, (clear_agreement, rms)


def test_decode_replays_on_a_q4_k_m_file(tmp_path, tok, caplog):
    """No layer leaves the kernels, so decode steps replay their recordings: the same
    greedy tokens as eager steps, and no line saying steps run eagerly."""
    path = write_mixed(str(tmp_path / "llama-Q4_K_M.gguf"), "llama", "Q4_K_M", tok)
    params = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)
    prompts = ["The capital of France is", "One, two,"]
    with caplog.at_level(logging.INFO, logger="rawpage"):
        replayed = LLM(path, max_model_len=128, kv_cache_memory="16MiB", device="cpu").generate(prompts, params)
    assert "decode steps run eagerly" not in caplog.text and "dense float32" not in caplog.text
    eager = LLM(path, max_model_len=128, kv_cache_memory="16MiB", device="cpu", enforce_eager=True)
    for a, b in zip(replayed, eager.generate(prompts, params)):
        assert a.outputs[0].token_ids == b.outputs[0].token_ids
