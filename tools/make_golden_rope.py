"""Record transformers' rotary embeddings (cos and sin, attention factor applied) for
each RoPE scaling recipe, at positions past the original context, for
tests/test_rope_scaling.py to check models/rotary.py against without torch.

    python tools/make_golden_rope.py       # needs torch and transformers; writes tests/data/golden_rope.json
"""

from __future__ import annotations

import argparse
import json
import os

# (name, config.json's RoPE keys, positions): head_dim 32 unless given. Each config is a
# Llama (or Qwen2) config.json as the Hub spells it.
CASES = [
    (
        "yarn_qwen25",  # Qwen2.5's 128k recipe, shrunk: max_position_embeddings is the original length
        {
            "rope_theta": 1000000.0,
            "max_position_embeddings": 256,
            "rope_scaling": {"type": "yarn", "factor": 4.0, "original_max_position_embeddings": 256},
        },
        [0, 1, 100, 255, 256, 700, 1023],
    ),
    (
        "yarn_betas_mscale",  # custom betas, DeepSeek-style mscale / mscale_all_dim
        {
            "rope_theta": 10000.0,
            "max_position_embeddings": 512,
            "rope_scaling": {
                "rope_type": "yarn",
                "factor": 8.0,
                "original_max_position_embeddings": 64,
                "beta_fast": 16,
                "beta_slow": 2,
                "mscale": 1.0,
                "mscale_all_dim": 0.5,
            },
        },
        [0, 5, 63, 64, 300, 511],
    ),
    (
        "yarn_attention_factor",  # an explicit attention factor, truncate off (gpt-oss)
        {
            "rope_theta": 150000.0,
            "max_position_embeddings": 512,
            "rope_scaling": {
                "rope_type": "yarn",
                "factor": 4.0,
                "original_max_position_embeddings": 128,
                "attention_factor": 1.2,
                "truncate": False,
            },
        },
        [0, 127, 128, 511],
    ),
    (
        "dynamic",  # NTK-aware, at the longest context (factor x max_position_embeddings)
        {"rope_theta": 10000.0, "max_position_embeddings": 256, "rope_scaling": {"type": "dynamic", "factor": 2.0}},
        [0, 1, 255, 256, 511],
    ),
    (
        "llama3",  # Llama 3.1's recipe with a short original length, so positions pass it
        {
            "rope_theta": 500000.0,
            "max_position_embeddings": 2048,
            "rope_scaling": {
                "rope_type": "llama3",
                "factor": 8.0,
                "low_freq_factor": 1.0,
                "high_freq_factor": 4.0,
                "original_max_position_embeddings": 128,
            },
        },
        [0, 1, 127, 128, 1000, 2047],
    ),
    (
        "linear",
        {"rope_theta": 10000.0, "max_position_embeddings": 512, "rope_scaling": {"type": "linear", "factor": 4.0}},
        [0, 3, 511],
    ),
]


def config_json(rope: dict) -> dict:
    return {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_size": 128,
        "intermediate_size": 256,
        "num_hidden_layers": 1,
        "num_attention_heads": 4,
        "num_key_value_heads": 4,
        "head_dim": 32,
        "vocab_size": 100,
        **rope,
    }


def record(name: str, rope: dict, positions: list[int]) -> dict:
    import torch
    from transformers import LlamaConfig
    from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding

    cfg = config_json(rope)
    emb = LlamaRotaryEmbedding(LlamaConfig(**{k: v for k, v in cfg.items() if k != "architectures"}))
    longest = max(positions) + 1  # one forward over every position up to the last: dynamic sees this length
    ids = torch.arange(longest)[None, :]
    x = torch.zeros(1, longest, 32, dtype=torch.float32)
    with torch.no_grad():
        cos, sin = emb(x, ids)
    half = cos.shape[-1] // 2
    return {
        "name": name,
        "config": cfg,
        "positions": positions,
        "cos": cos[0, positions, :half].tolist(),  # (P, D/2): NeoX duplicates each half
        "sin": sin[0, positions, :half].tolist(),
    }


def main() -> None:
    import torch
    import transformers

    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument(
        "--out", default=os.path.join(os.path.dirname(__file__), "..", "tests", "data", "golden_rope.json")
    )
    out = parser.parse_args().out
    data = {
        "made_with": f"transformers {transformers.__version__}, torch {torch.__version__}",
        "cases": [record(*case) for case in CASES],
    }
    with open(out, "w") as f:
        json.dump(data, f)
    print(f"wrote {out}: {len(CASES)} cases")


if __name__ == "__main__":
    main()
