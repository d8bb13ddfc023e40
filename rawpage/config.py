"""Model configuration: one dataclass for every Llama-family checkpoint we load.

A Hugging Face `config.json` and a GGUF file's metadata both become a
`ModelConfig`; nothing past the loader looks at either format again.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from rawpage.errors import UnsupportedModelError

# Hugging Face `architectures` entries that our Llama forward pass computes exactly.
SUPPORTED_ARCHITECTURES = {
    "LlamaForCausalLM": "llama",
    "MistralForCausalLM": "llama",  # same math as Llama when sliding_window is off
    "Qwen2ForCausalLM": "qwen2",
}


@dataclass
class ModelConfig:
    architecture: str  # "llama" or "qwen2"
    hidden_size: int  # dim
    num_layers: int
    num_heads: int  # H
    num_kv_heads: int  # Hkv; H % Hkv == 0 (GQA)
    head_dim: int  # D
    intermediate_size: int  # feed-forward hidden size
    vocab_size: int
    rms_norm_eps: float = 1e-5
    rope_theta: float = 10000.0
    rope_scaling: dict[str, Any] | None = None  # Llama 3: {"rope_type": "llama3", ...}
    max_position_embeddings: int = 4096
    tie_word_embeddings: bool = False
    attention_bias: bool = False  # Qwen2: q/k/v projections carry a bias
    bos_token_id: int | None = None
    eos_token_ids: list[int] = field(default_factory=list)
    torch_dtype: str = "float32"  # dtype of the checkpoint, for `--dtype auto`
    name: str = ""

    @property
    def q_size(self) -> int:
        return self.num_heads * self.head_dim

    @property
    def kv_size(self) -> int:
        return self.num_kv_heads * self.head_dim

    @classmethod
    def from_hf(cls, cfg: dict[str, Any], name: str = "") -> ModelConfig:
        archs = cfg.get("architectures") or [cfg.get("model_type", "<missing>")]
        arch = SUPPORTED_ARCHITECTURES.get(archs[0])
        if arch is None:
            raise UnsupportedModelError(
                f"unsupported architecture {archs[0]!r}; rawpage runs {', '.join(sorted(SUPPORTED_ARCHITECTURES))}"
            )
        if cfg.get("sliding_window") and cfg.get("use_sliding_window", arch == "llama"):
            if cfg["sliding_window"] < cfg.get("max_position_embeddings", 0):
                raise UnsupportedModelError("sliding-window attention is not supported")
        heads = cfg["num_attention_heads"]
        eos = cfg.get("eos_token_id")
        return cls(
            architecture=arch,
            hidden_size=cfg["hidden_size"],
            num_layers=cfg["num_hidden_layers"],
            num_heads=heads,
            num_kv_heads=cfg.get("num_key_value_heads") or heads,
            head_dim=cfg.get("head_dim") or cfg["hidden_size"] // heads,
            intermediate_size=cfg["intermediate_size"],
            vocab_size=cfg["vocab_size"],
            rms_norm_eps=cfg.get("rms_norm_eps", 1e-6),
            rope_theta=cfg.get("rope_theta", 10000.0),
            rope_scaling=cfg.get("rope_scaling"),
            max_position_embeddings=cfg.get("max_position_embeddings", 4096),
            tie_word_embeddings=cfg.get("tie_word_embeddings", False),
            attention_bias=arch == "qwen2" or cfg.get("attention_bias", False),
            bos_token_id=cfg.get("bos_token_id"),
            eos_token_ids=[eos] if isinstance(eos, int) else list(eos or []),
            torch_dtype=str(cfg.get("torch_dtype") or cfg.get("dtype") or "float32"),
            name=name,
        )

    def validate(self) -> None:
        if self.num_heads % self.num_kv_heads:
            raise UnsupportedModelError(
                f"num_heads={self.num_heads} is not a multiple of num_kv_heads={self.num_kv_heads}"
            )
        if self.head_dim % 2:
            raise UnsupportedModelError(f"head_dim={self.head_dim} must be even for rotary")
        rope_type = (self.rope_scaling or {}).get("rope_type", (self.rope_scaling or {}).get("type"))
        if rope_type not in (None, "default", "llama3"):
            raise UnsupportedModelError(f"unsupported rope_scaling type {rope_type!r}")


def rope_inv_freq(cfg: ModelConfig, freq_factors: np.ndarray | None = None) -> np.ndarray:
    """Rotary inverse frequencies (D/2,), with Llama 3's long-context scaling.

    GGUF files store Llama 3's scaling already applied as per-frequency divisors
    (`rope_freqs.weight`); HF configs give the recipe, which we apply here.
    """
    d = cfg.head_dim
    inv_freq = 1.0 / (cfg.rope_theta ** (np.arange(0, d, 2, dtype=np.float64) / d))
    if freq_factors is not None:
        return inv_freq / freq_factors.astype(np.float64)
    rs = cfg.rope_scaling or {}
    if rs.get("rope_type", rs.get("type")) == "llama3":
        # Llama 3.1: long wavelengths are slowed by `factor`, short ones kept, and
        # the band in between interpolated smoothly.
        factor = rs["factor"]
        low, high = rs.get("low_freq_factor", 1.0), rs.get("high_freq_factor", 4.0)
        old_len = rs.get("original_max_position_embeddings", 8192)
        wavelen = 2 * math.pi / inv_freq
        smooth = (old_len / wavelen - low) / (high - low)
        scaled = np.where(wavelen > old_len / low, inv_freq / factor, inv_freq)
        mid = (wavelen <= old_len / low) & (wavelen >= old_len / high)
        inv_freq = np.where(mid, (1 - smooth) * inv_freq / factor + smooth * inv_freq, scaled)
    return inv_freq
