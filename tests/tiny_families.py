"""Tiny random models of each family, as Hugging Face folders laid out as on the Hub.

Each family is a config.json (the Hub's spelling: rope_theta, rope_scaling,
per-expert tensors) and weights drawn from a seed with NumPy, under the names
the Hub's checkpoints use. Written without rawpage's code, so that loading them
tests rawpage's loader and model against transformers (tools/make_golden_families.py
records transformers' logits of these very folders into tests/data/golden_families.json).
Sliding windows are 16-32 tokens, so that the recorded prompts cross them.
"""

from __future__ import annotations

import os
import zlib

import numpy as np

from tests.tiny_models import tiny_config, train_tokenizer, write_hf_folder

# Llama's tiny config (tests/tiny_models.py), with what the families override on top.
_COMMON = tiny_config(rms_norm_eps=1e-6, pad_token_id=0)

FAMILIES: dict[str, dict] = {
    "qwen3": {
        "architectures": ["Qwen3ForCausalLM"],
        "model_type": "qwen3",
        "rope_theta": 1000000.0,
        "tie_word_embeddings": True,
        "use_sliding_window": False,
        "sliding_window": None,
    },
    "mistral": {"architectures": ["MistralForCausalLM"], "model_type": "mistral", "sliding_window": 16},
    "gemma2": {
        "architectures": ["Gemma2ForCausalLM"],
        "model_type": "gemma2",
        "hidden_activation": "gelu_pytorch_tanh",
        "query_pre_attn_scalar": 24,
        "sliding_window": 16,
        "attn_logit_softcapping": 1.5,
        "final_logit_softcapping": 4.0,
        "tie_word_embeddings": True,
    },
    "gemma3": {
        "architectures": ["Gemma3ForCausalLM"],
        "model_type": "gemma3_text",
        "hidden_activation": "gelu_pytorch_tanh",
        "num_hidden_layers": 3,
        "sliding_window_pattern": 3,
        "query_pre_attn_scalar": 24,
        "sliding_window": 16,
        "rope_theta": 1000000.0,
        "rope_local_base_freq": 10000.0,
        "rope_scaling": {"rope_type": "linear", "factor": 8.0},
        "final_logit_softcapping": None,
        "attn_logit_softcapping": None,
        "tie_word_embeddings": True,
    },
    "phi3": {
        "architectures": ["Phi3ForCausalLM"],
        "model_type": "phi3",
        "sliding_window": 24,
        "max_position_embeddings": 512,
        "original_max_position_embeddings": 128,
        "rope_scaling": {
            "type": "longrope",
            "short_factor": [1.0, 1.1, 1.3, 1.6, 2.0, 2.5, 3.1, 3.8],
            "long_factor": [1.0, 1.5, 2.5, 4.0, 6.0, 9.0, 13.0, 18.0],
        },
    },
    "mixtral": {
        "architectures": ["MixtralForCausalLM"],
        "model_type": "mixtral",
        "num_local_experts": 8,
        "num_experts_per_tok": 2,
        "intermediate_size": 48,
        "sliding_window": None,
    },
    "qwen3_moe": {
        "architectures": ["Qwen3MoeForCausalLM"],
        "model_type": "qwen3_moe",
        "num_experts": 8,
        "num_experts_per_tok": 2,
        "moe_intermediate_size": 32,
        "norm_topk_prob": False,
        "mlp_only_layers": [1],
        "decoder_sparse_step": 1,
        "use_sliding_window": False,
        "sliding_window": None,
    },
}


def family_config(family: str) -> dict:
    return {**_COMMON, **FAMILIES[family]}


def hub_tensors(cfg: dict, seed: int = 0) -> dict[str, np.ndarray]:
    """Hub-named float32 weights. Each tensor is drawn from (seed, name), so the set is
    the same on every machine. Matrices N(0, 1/fan_in); norm weights near 1 (near 0
    for Gemma, whose norms scale by 1 + w)."""
    mt = cfg["model_type"]
    dim, V, L = cfg["hidden_size"], cfg["vocab_size"], cfg["num_hidden_layers"]
    D = cfg["head_dim"]
    q, kv = cfg["num_attention_heads"] * D, cfg["num_key_value_heads"] * D
    gemma = mt.startswith("gemma")
    t: dict[str, tuple[int, ...]] = {"model.embed_tokens.weight": (V, dim), "model.norm.weight": (dim,)}
    if not cfg["tie_word_embeddings"]:
        t["lm_head.weight"] = (V, dim)
    for i in range(L):
        p = f"model.layers.{i}."
        t[p + "input_layernorm.weight"] = (dim,)
        t[p + "post_attention_layernorm.weight"] = (dim,)
        if gemma:
            t[p + "pre_feedforward_layernorm.weight"] = (dim,)
            t[p + "post_feedforward_layernorm.weight"] = (dim,)
        if mt in ("qwen3", "qwen3_moe", "gemma3_text"):
            t[p + "self_attn.q_norm.weight"] = (D,)
            t[p + "self_attn.k_norm.weight"] = (D,)
        if mt == "phi3":
            t[p + "self_attn.qkv_proj.weight"] = (q + 2 * kv, dim)
        else:
            t.update(
                {
                    p + "self_attn.q_proj.weight": (q, dim),
                    p + "self_attn.k_proj.weight": (kv, dim),
                    p + "self_attn.v_proj.weight": (kv, dim),
                }
            )
        t[p + "self_attn.o_proj.weight"] = (dim, q)
        t.update(_mlp_shapes(cfg, i, p))
    out = {}
    for name, shape in sorted(t.items()):
        rng = np.random.default_rng([seed, zlib.crc32(name.encode())])
        x = rng.standard_normal(shape)
        if len(shape) == 2:
            x = x / np.sqrt(shape[1])
        elif "norm" in name:
            x = 0.1 * x + (0.0 if gemma else 1.0)
        out[name] = x.astype(np.float32)
    return out


def _mlp_shapes(cfg: dict, i: int, p: str) -> dict[str, tuple[int, ...]]:
    mt, dim = cfg["model_type"], cfg["hidden_size"]
    if mt == "mixtral":  # (router, experts, expert size, names of gate / up / down)
        moe = (p + "block_sparse_moe.", cfg["num_local_experts"], cfg["intermediate_size"], ("w1", "w3", "w2"))
    elif mt == "qwen3_moe" and i not in cfg["mlp_only_layers"]:
        moe = (p + "mlp.", cfg["num_experts"], cfg["moe_intermediate_size"], ("gate_proj", "up_proj", "down_proj"))
    else:
        inter = cfg["intermediate_size"]
        if mt == "phi3":
            return {p + "mlp.gate_up_proj.weight": (2 * inter, dim), p + "mlp.down_proj.weight": (dim, inter)}
        return {
            p + "mlp.gate_proj.weight": (inter, dim),
            p + "mlp.up_proj.weight": (inter, dim),
            p + "mlp.down_proj.weight": (dim, inter),
        }
    m, E, inter, (gate, up, down) = moe
    t = {m + "gate.weight": (E, dim)}
    for e in range(E):
        x = m + f"experts.{e}."
        t.update(
            {x + gate + ".weight": (inter, dim), x + up + ".weight": (inter, dim), x + down + ".weight": (dim, inter)}
        )
    return t


def write_family(folder: str, family: str, seed: int = 0, tok=None) -> str:
    """The family's tiny model as a Hugging Face folder (config, safetensors, tokenizer)."""
    cfg = family_config(family)
    write_hf_folder(folder, cfg, hub_tensors(cfg, seed), tok or train_tokenizer())
    os.replace(os.path.join(folder, "model-00001-of-00001.safetensors"), os.path.join(folder, "model.safetensors"))
    return folder


def weights_digest(tensors: dict[str, np.ndarray]) -> str:
    """A short fingerprint of the weights: the golden file records it, so that a change
    in how NumPy draws them shows up as that, not as a parity failure."""
    h = 0
    for name in sorted(tensors):
        h = zlib.crc32(name.encode() + np.ascontiguousarray(tensors[name]).tobytes(), h)
    return f"{h:08x}"
