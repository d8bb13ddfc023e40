"""Tiny random LoRA adapters in PEFT's on-disk format, written with NumPy and
safetensors (not with peft, so that loading them in peft checks our reading of
the format), and the merged-weight reference W + scale·B·A."""

from __future__ import annotations

import json
import math
import os

import numpy as np

MODULES = {"q_proj": "self_attn", "k_proj": "self_attn", "v_proj": "self_attn", "o_proj": "self_attn"}
MODULES.update({"gate_proj": "mlp", "up_proj": "mlp", "down_proj": "mlp"})


def projection_shapes(cfg: dict) -> dict[str, tuple[int, int]]:
    """(out, in) of each projection, as the checkpoint stores it."""
    dim, inter = cfg["hidden_size"], cfg["intermediate_size"]
    q, kv = cfg["num_attention_heads"] * cfg["head_dim"], cfg["num_key_value_heads"] * cfg["head_dim"]
    return {
        "q_proj": (q, dim),
        "k_proj": (kv, dim),
        "v_proj": (kv, dim),
        "o_proj": (dim, q),
        "gate_proj": (inter, dim),
        "up_proj": (inter, dim),
        "down_proj": (dim, inter),
    }


def write_adapter(
    folder: str, cfg: dict, rank: int, targets: list[str], alpha: float, seed: int, rslora: bool = False
) -> str:
    """A PEFT LoRA folder for the tiny model `cfg`, random A and B (B nonzero, unlike a
    fresh PEFT adapter, so that the adapter changes the logits)."""
    from safetensors.numpy import save_file

    rng = np.random.default_rng(seed)
    shapes, tensors = projection_shapes(cfg), {}
    for i in range(cfg["num_hidden_layers"]):
        for m in targets:
            out, n_in = shapes[m]
            p = f"base_model.model.model.layers.{i}.{MODULES[m]}.{m}."
            tensors[p + "lora_A.weight"] = (rng.standard_normal((rank, n_in)) / np.sqrt(n_in)).astype(np.float32)
            tensors[p + "lora_B.weight"] = (0.5 * rng.standard_normal((out, rank)) / np.sqrt(rank)).astype(np.float32)
    os.makedirs(folder, exist_ok=True)
    save_file(tensors, os.path.join(folder, "adapter_model.safetensors"))
    config = {
        "peft_type": "LORA",
        "task_type": "CAUSAL_LM",
        "base_model_name_or_path": None,
        "r": rank,
        "lora_alpha": alpha,
        "lora_dropout": 0.0,
        "target_modules": targets,
        "bias": "none",
        "use_rslora": rslora,
        "fan_in_fan_out": False,
        "inference_mode": True,
    }
    with open(os.path.join(folder, "adapter_config.json"), "w") as f:
        json.dump(config, f)
    return folder


def merged_tensors(base: dict[str, np.ndarray], adapter_dir: str) -> dict[str, np.ndarray]:
    """The base model's tensors with the adapter merged in: W + scale·B·A."""
    from safetensors.numpy import load_file

    with open(os.path.join(adapter_dir, "adapter_config.json")) as f:
        c = json.load(f)
    scale = c["lora_alpha"] / (math.sqrt(c["r"]) if c["use_rslora"] else c["r"])
    lora = load_file(os.path.join(adapter_dir, "adapter_model.safetensors"))
    merged = dict(base)
    for key, a in lora.items():
        if key.endswith("lora_A.weight"):
            b = lora[key.replace("lora_A", "lora_B")]
            name = key.removeprefix("base_model.model.").replace(".lora_A.weight", ".weight")
            merged[name] = (base[name] + scale * (b @ a)).astype(np.float32)
    return merged
