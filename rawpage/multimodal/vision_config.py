"""What a vision-language checkpoint adds to its ModelConfig: the vision tower's
shape, how its output becomes language-model tokens, and the image processor's
recipe (preprocessor_config.json). Gemma 3 (SigLIP + average-pool projector) today.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from rawpage.errors import UnsupportedModelError


@dataclass(frozen=True)
class ImageProcessorConfig:
    """preprocessor_config.json: resize to (height, width), x * rescale_factor, then (x - mean) / std."""

    height: int
    width: int
    resample: int = 2  # PIL's code: 2 = bilinear (Gemma 3), 3 = bicubic
    rescale_factor: float = 1 / 255
    image_mean: tuple[float, float, float] = (0.5, 0.5, 0.5)
    image_std: tuple[float, float, float] = (0.5, 0.5, 0.5)

    @classmethod
    def from_hf(cls, pre: dict[str, Any], image_size: int) -> ImageProcessorConfig:
        if pre.get("do_pan_and_scan"):
            raise UnsupportedModelError("preprocessor_config.json: do_pan_and_scan is not supported")
        size = pre.get("size") or {}
        mean = pre.get("image_mean", [0.5] * 3) if pre.get("do_normalize", True) else [0.0] * 3
        std = pre.get("image_std", [0.5] * 3) if pre.get("do_normalize", True) else [1.0] * 3
        return cls(
            height=int(size.get("height", image_size)),
            width=int(size.get("width", image_size)),
            resample=int(pre.get("resample", 2)),
            rescale_factor=float(pre.get("rescale_factor", 1 / 255)) if pre.get("do_rescale", True) else 1.0,
            image_mean=tuple(float(x) for x in mean),
            image_std=tuple(float(x) for x in std),
        )


@dataclass(frozen=True)
class VisionConfig:
    """A SigLIP tower (Gemma 3's vision_config) and the Gemma 3 projector's numbers."""

    hidden_size: int  # Dv
    intermediate_size: int
    num_layers: int
    num_heads: int
    image_size: int  # the tower's input is image_size x image_size pixels
    patch_size: int  # P: one token per P x P patch
    layer_norm_eps: float
    tokens_per_image: int  # N: after average pooling, each image is N soft tokens
    boi_token_id: int  # <start_of_image>: the chat template's placeholder, expanded
    image_token_id: int  # <image_soft_token>: the N positions that take the embeddings
    eoi_token_id: int  # <end_of_image>
    processor: ImageProcessorConfig

    @property
    def patches_per_side(self) -> int:
        return self.image_size // self.patch_size

    @classmethod
    def from_hf(cls, cfg: dict[str, Any], pre: dict[str, Any]) -> VisionConfig:
        """cfg: a Gemma3ForConditionalGeneration config.json; pre: its preprocessor_config.json."""
        v = cfg.get("vision_config") or {}
        if v.get("model_type", "siglip_vision_model") != "siglip_vision_model" or v.get("vision_use_head"):
            raise UnsupportedModelError(f"unsupported vision tower {v.get('model_type')!r} (rawpage runs SigLIP)")
        act = v.get("hidden_act", "gelu_pytorch_tanh")
        if act != "gelu_pytorch_tanh":
            raise UnsupportedModelError(f"unsupported vision activation {act!r}")
        image_size, patch = int(v.get("image_size", 224)), int(v.get("patch_size", 16))  # SiglipVisionConfig's
        tokens = int(cfg.get("mm_tokens_per_image", 256))
        side, per_side = image_size // patch, round(tokens**0.5)
        if per_side * per_side != tokens or side % per_side:
            raise UnsupportedModelError(f"mm_tokens_per_image={tokens} does not pool a {side}x{side} patch grid")
        return cls(
            hidden_size=int(v.get("hidden_size", 768)),
            intermediate_size=int(v.get("intermediate_size", 3072)),
            num_layers=int(v.get("num_hidden_layers", 12)),
            num_heads=int(v.get("num_attention_heads", 12)),
            image_size=image_size,
            patch_size=patch,
            layer_norm_eps=float(v.get("layer_norm_eps", 1e-6)),
            tokens_per_image=tokens,
            boi_token_id=int(cfg.get("boi_token_index", 255_999)),
            image_token_id=int(cfg.get("image_token_index", cfg.get("image_token_id", 262_144))),
            eoi_token_id=int(cfg.get("eoi_token_index", 256_000)),
            processor=ImageProcessorConfig.from_hf(pre, image_size),
        )
