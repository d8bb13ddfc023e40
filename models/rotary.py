"""Rotary tables for every family: one (max_pos, D) [cos | sin] table per RoPE base.

This is the one place that turns a config's RoPE recipe into numbers: the inverse
frequencies (D/2,) and the attention factor that scales cos and sin. Every backend
(NumPy, native CPU, CUDA and sim) rotates q and k with the table made here.

Most models have one table. Gemma 3 has two: its sliding layers rotate with a
small base (10k) and its global layers with a large one (1M, often linearly
scaled). The recipes past the pretraining length (rope_scaling):
- linear: every position divided by `factor`;
- llama3: long wavelengths slowed by `factor`, short ones kept, a smooth band between;
- yarn: the same idea with a linear ramp between beta_fast and beta_slow rotations,
  and cos/sin scaled by 0.1 ln(factor) + 1 (the "mscale");
- dynamic (NTK-aware): a larger base; made for the longest context, as vLLM does,
  since a paged cache keeps keys rotated once;
- longrope (Phi-3): per-frequency "short" factors up to the pretraining length and
  "long" ones past it, and an attention factor.
"""

from __future__ import annotations

import logging
import math
from typing import Any

import numpy as np

from rawpage.config import ModelConfig, rope_type
from rawpage.ops.layer_ops import cos_sin_cache

logger = logging.getLogger("rawpage")


def rope_table(
    cfg: ModelConfig,
    theta: float | None = None,
    rope_scaling: dict[str, Any] | None = None,
    freq_factors: np.ndarray | None = None,
) -> np.ndarray:
    """(max_pos, D) float32 [cos | sin] rows. theta and rope_scaling default to the config's."""
    rs = cfg.rope_scaling if theta is None else rope_scaling
    if rope_type(rs) == "longrope":
        return _longrope_table(cfg, rs)
    inv_freq, attention_factor = rope_frequencies(cfg, freq_factors, theta, rope_scaling)
    if rope_type(rs) not in (None, "default"):
        logger.info(
            "RoPE scaling %s for %d positions (attention factor %.4g)",
            rs,
            cfg.max_position_embeddings,
            attention_factor,
        )
    table = cos_sin_cache(inv_freq, cfg.max_position_embeddings)
    return table if attention_factor == 1.0 else (table * np.float32(attention_factor))


def rope_frequencies(
    cfg: ModelConfig,
    freq_factors: np.ndarray | None = None,
    theta: float | None = None,
    rope_scaling: dict[str, Any] | None = None,
) -> tuple[np.ndarray, float]:
    """(inv_freq (D/2,) float64, attention factor) for one table. theta and rope_scaling
    default to the config's (Gemma 3's sliding layers pass their own).

    GGUF files store Llama 3's scaling already applied as per-frequency divisors
    (`rope_freqs.weight`); HF configs give the recipe, which we apply here.
    """
    d = cfg.head_dim
    if theta is None:
        theta, rope_scaling = cfg.rope_theta, cfg.rope_scaling
    rs = rope_scaling or {}
    kind = rope_type(rs)
    if kind == "dynamic":  # NTK-aware: the base grows for the longest context (vLLM's static form)
        factor, original = rs["factor"], rs["original_max_position_embeddings"]
        longest = original * factor
        theta = theta * ((factor * longest / original) - (factor - 1)) ** (d / (d - 2))
    inv_freq = 1.0 / (theta ** (np.arange(0, d, 2, dtype=np.float64) / d))
    if freq_factors is not None:
        return inv_freq / freq_factors.astype(np.float64), 1.0
    if kind == "linear":  # positions divided by `factor`
        return inv_freq / rs["factor"], 1.0
    if kind == "llama3":
        return _llama3(inv_freq, rs), 1.0
    if kind == "yarn":
        return _yarn(inv_freq, rs, theta, d)
    return inv_freq, 1.0


def _llama3(inv_freq: np.ndarray, rs: dict[str, Any]) -> np.ndarray:
    """Llama 3.1: long wavelengths are slowed by `factor`, short ones kept, and the band
    in between interpolated smoothly."""
    factor = rs["factor"]
    low, high = rs.get("low_freq_factor", 1.0), rs.get("high_freq_factor", 4.0)
    old_len = rs.get("original_max_position_embeddings", 8192)
    wavelen = 2 * math.pi / inv_freq
    smooth = (old_len / wavelen - low) / (high - low)
    scaled = np.where(wavelen > old_len / low, inv_freq / factor, inv_freq)
    mid = (wavelen <= old_len / low) & (wavelen >= old_len / high)
    return np.where(mid, (1 - smooth) * inv_freq / factor + smooth * inv_freq, scaled)


def _yarn(inv_freq: np.ndarray, rs: dict[str, Any], theta: float, d: int) -> tuple[np.ndarray, float]:
    """YaRN (Peng et al. 2023): frequencies that turn fewer than beta_slow times over the
    original length are interpolated (divided by `factor`), those that turn more than
    beta_fast times are kept, and a linear ramp joins them. cos and sin are scaled by
    the attention factor: `attention_factor` if given (transformers), else
    0.1 ln(factor) + 1 (or its mscale / mscale_all_dim ratio), times vLLM's and
    llama.cpp's `attn_factor`."""
    factor, original = rs["factor"], rs["original_max_position_embeddings"]
    beta_fast, beta_slow = rs.get("beta_fast") or 32.0, rs.get("beta_slow") or 1.0

    def correction_dim(rotations: float) -> float:  # the lane whose frequency turns `rotations` times
        return d * math.log(original / (rotations * 2 * math.pi)) / (2 * math.log(theta))

    low, high = correction_dim(beta_fast), correction_dim(beta_slow)
    if rs.get("truncate", True):
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, d - 1)
    ramp = np.clip((np.arange(d // 2, dtype=np.float64) - low) / max(high - low, 0.001), 0.0, 1.0)
    keep = (1.0 - ramp) * rs.get("extrapolation_factor", 1.0)  # 1: the original frequency, 0: interpolated
    inv_freq = inv_freq / factor * (1.0 - keep) + inv_freq * keep
    attention_factor = rs.get("attention_factor")
    if attention_factor is None:
        mscale, mscale_all_dim = rs.get("mscale"), rs.get("mscale_all_dim")
        if mscale and mscale_all_dim:
            attention_factor = _yarn_mscale(factor, mscale) / _yarn_mscale(factor, mscale_all_dim)
        else:
            attention_factor = _yarn_mscale(factor)
    return inv_freq, float(attention_factor) * rs.get("attn_factor", 1.0)


def _yarn_mscale(factor: float, mscale: float = 1.0) -> float:
    return 1.0 if factor <= 1 else 0.1 * mscale * math.log(factor) + 1.0


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


def mrope_cos_sin(table: np.ndarray, positions: np.ndarray, section: list[int]) -> np.ndarray:
    """Qwen2-VL's M-RoPE as a per-token table: (T, D) [cos | sin] rows, where frequency pair
    j turns by the t, h or w position (positions (3, T)) as mrope_section assigns it: the
    first section[0] pairs by t, the next section[1] by h, the rest by w. Rotating token i
    with row i of this table (positions 0 .. T-1) is transformers' apply_multimodal_rotary_pos_emb."""
    half = table.shape[1] // 2
    which = np.repeat(np.arange(3), section)  # (D/2,) the position each pair takes
    rows = positions[which].T  # (T, D/2)
    cols = np.arange(half)
    return np.concatenate([table[rows, cols], table[rows, half + cols]], axis=1)
