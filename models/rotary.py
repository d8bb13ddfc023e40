"""Rotary tables for every family: one (max_pos, D) [cos | sin] table per RoPE base.

Most models have one table. Gemma 3 has two: its sliding layers rotate with a
small base (10k) and its global layers with a large one (1M, often linearly
scaled). Phi-3's LongRoPE divides each frequency by its own factor, "short"
factors up to the pretraining length and "long" ones past it, and scales cos
and sin by an attention factor.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from rawpage.config import ModelConfig, rope_inv_freq
from rawpage.ops.layer_ops import cos_sin_cache


def rope_table(
    cfg: ModelConfig,
    theta: float | None = None,
    rope_scaling: dict[str, Any] | None = None,
    freq_factors: np.ndarray | None = None,
) -> np.ndarray:
    """(max_pos, D) float32 [cos | sin] rows. theta and rope_scaling default to the config's."""
    rs = cfg.rope_scaling if theta is None else rope_scaling
    if (rs or {}).get("rope_type") == "longrope":
        return _longrope_table(cfg, rs)
    return cos_sin_cache(rope_inv_freq(cfg, freq_factors, theta, rope_scaling), cfg.max_position_embeddings)


def _longrope_table(cfg: ModelConfig, rs: dict[str, Any]) -> np.ndarray:
    """Position p < original length uses the short factors, later positions the long
    ones. transformers switches the whole sequence to the long factors once it is
    longer than the original length; a paged cache keeps the keys it already
    rotated, so here (as in vLLM) the choice is per position."""
    d = cfg.head_dim
    original = int(rs["original_max_position_embeddings"])
    factor = rs.get("factor") or cfg.max_position_embeddings / original
    attention_factor = rs.get("attention_factor")
    if attention_factor is None:
        attention_factor = 1.0 if factor <= 1.0 else math.sqrt(1 + math.log(factor) / math.log(original))
    base = 1.0 / (cfg.rope_theta ** (np.arange(0, d, 2, dtype=np.float64) / d))  # (D/2,)
    short = cos_sin_cache(base / np.asarray(rs["short_factor"], np.float64), cfg.max_position_embeddings)
    long = cos_sin_cache(base / np.asarray(rs["long_factor"], np.float64), cfg.max_position_embeddings)
    table = np.where(np.arange(cfg.max_position_embeddings)[:, None] < original, short, long)
    return (table * attention_factor).astype(np.float32)
