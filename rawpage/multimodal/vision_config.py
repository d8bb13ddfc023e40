"""What a vision-language checkpoint adds to its ModelConfig: the vision tower's
shape, how its output becomes language-model tokens, and the image processor's
recipe (preprocessor_config.json). Two families:

- "gemma3": a SigLIP tower on a fixed image_size square, average-pooled into a fixed
  N = tokens_per_image soft tokens (models/siglip.py);
- "qwen2_5_vl": Qwen2.5-VL's ViT on a size of the image's own (smart_resize: a multiple
  of patch_size * spatial_merge_size within min/max_pixels), window attention, and a
  2 x 2 patch merger: N = grid_h * grid_w / 4 tokens, different for each image size
  (models/qwen_vit.py); the language model places them with M-RoPE.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from rawpage.errors import UnsupportedModelError

OPENAI_CLIP_MEAN = (0.48145466, 0.4578275, 0.40821073)
OPENAI_CLIP_STD = (0.26862954, 0.26130258, 0.27577711)


@dataclass(frozen=True)
class ImageProcessorConfig:
    """preprocessor_config.json: resize to (height, width), x * rescale_factor, then (x - mean) / std.
    min_pixels > 0: Qwen2-VL's processor, which resizes each image to a size of its own (target_size)."""

    height: int
    width: int
    resample: int = 2  # PIL's code: 2 = bilinear (Gemma 3), 3 = bicubic (Qwen2.5-VL)
    rescale_factor: float = 1 / 255
    image_mean: tuple[float, float, float] = (0.5, 0.5, 0.5)
    image_std: tuple[float, float, float] = (0.5, 0.5, 0.5)
    min_pixels: int = 0  # Qwen2-VL: the resized image's area is kept within [min_pixels, max_pixels]
    max_pixels: int = 0
    factor: int = 1  # Qwen2-VL: both sides a multiple of patch_size * merge_size

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

    @classmethod
    def from_qwen2_vl(cls, pre: dict[str, Any], patch_size: int, merge_size: int) -> ImageProcessorConfig:
        """Qwen2VLImageProcessor's preprocessor_config.json: min_pixels / max_pixels (or
        size.shortest_edge / longest_edge, which they override), bicubic, CLIP's mean and std."""
        if pre.get("do_resize") is False:  # the ViT needs sides in multiples of patch_size * merge_size
            raise UnsupportedModelError("preprocessor_config.json: do_resize false is not supported for Qwen2.5-VL")
        size = pre.get("size") or {}
        norm = pre.get("do_normalize", True)
        return cls(
            height=0,
            width=0,
            resample=int(pre.get("resample", 3)),
            rescale_factor=float(pre.get("rescale_factor", 1 / 255)) if pre.get("do_rescale", True) else 1.0,
            image_mean=tuple(float(x) for x in pre.get("image_mean", OPENAI_CLIP_MEAN)) if norm else (0.0,) * 3,
            image_std=tuple(float(x) for x in pre.get("image_std", OPENAI_CLIP_STD)) if norm else (1.0,) * 3,
            min_pixels=int(pre.get("min_pixels") or size.get("shortest_edge") or 56 * 56),
            max_pixels=int(pre.get("max_pixels") or size.get("longest_edge") or 28 * 28 * 1280),
            factor=int(pre.get("patch_size", patch_size)) * int(pre.get("merge_size", merge_size)),
        )

    def target_size(self, width: int, height: int) -> tuple[int, int]:
        """(width, height) the image is resized to: the fixed size, or Qwen2-VL's smart_resize
        (sides rounded to multiples of factor, then scaled into [min_pixels, max_pixels])."""
        if not self.min_pixels:
            return self.width, self.height
        f = self.factor  # (image_input.preprocess refuses aspect ratios over 200 first, as the processor does)
        h, w = round(height / f) * f, round(width / f) * f  # Python's round, as the processor's
        if h * w > self.max_pixels:
            beta = math.sqrt(height * width / self.max_pixels)
            h, w = max(f, math.floor(height / beta / f) * f), max(f, math.floor(width / beta / f) * f)
        elif h * w < self.min_pixels:
            beta = math.sqrt(self.min_pixels / (height * width))
            h, w = math.ceil(height * beta / f) * f, math.ceil(width * beta / f) * f
        return w, h


@dataclass(frozen=True)
class VisionConfig:
    """A vision tower (the checkpoint's vision_config) and how its output meets the text."""

    hidden_size: int  # Dv
    intermediate_size: int
    num_layers: int
    num_heads: int
    image_size: int  # Gemma 3: the tower's input is image_size x image_size pixels (Qwen: 0, per image)
    patch_size: int  # P: one token per P x P patch
    layer_norm_eps: float
    tokens_per_image: int  # Gemma 3: N soft tokens each image (Qwen: 0, N depends on the image)
    boi_token_id: int  # <start_of_image> / <|vision_start|>
    image_token_id: int  # <image_soft_token> / <|image_pad|>: the N positions that take the embeddings
    eoi_token_id: int  # <end_of_image> / <|vision_end|>
    processor: ImageProcessorConfig
    family: str = "gemma3"  # or "qwen2_5_vl"
    spatial_merge_size: int = 1  # Qwen: m x m patches merged into one token
    temporal_patch_size: int = 1  # Qwen: frames a patch spans (an image is repeated to fill them)
    window_size: int = 0  # Qwen: window attention over window_size pixels a side
    fullatt_block_indexes: tuple[int, ...] = ()  # Qwen: the blocks that attend over the whole image
    out_hidden_size: int = 0  # Qwen: the merger's output size (the text model's dim)
    hidden_act: str = "gelu_pytorch_tanh"

    @property
    def patches_per_side(self) -> int:
        return self.image_size // self.patch_size

    @property
    def bidirectional(self) -> bool:
        """Whether an image's tokens attend to each other both ways in the language model
        (Gemma 3), or causally like text (Qwen2.5-VL)."""
        return self.family == "gemma3"

    @classmethod
    def from_hf(cls, cfg: dict[str, Any], pre: dict[str, Any]) -> VisionConfig:
        """cfg: a Gemma3ForConditionalGeneration (or Qwen2_5_VL...) config.json; pre: its preprocessor_config.json."""
        if (cfg.get("architectures") or [None])[0] == "Qwen2_5_VLForConditionalGeneration":
            return cls.from_qwen2_5_vl(cfg, pre)
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

    @classmethod
    def from_qwen2_5_vl(cls, cfg: dict[str, Any], pre: dict[str, Any]) -> VisionConfig:
        """A Qwen2_5_VLForConditionalGeneration config.json (Qwen2_5_VLVisionConfig's defaults)."""
        v = cfg.get("vision_config") or {}
        act = v.get("hidden_act", "silu")
        if act != "silu":
            raise UnsupportedModelError(f"unsupported Qwen2.5-VL vision activation {act!r} (rawpage runs silu)")
        if int(v.get("in_channels", v.get("in_chans", 3))) != 3:
            raise UnsupportedModelError("a Qwen2.5-VL vision tower on other than 3 channels is not supported")
        patch, merge = int(v.get("patch_size", 14)), int(v.get("spatial_merge_size", 2))
        return cls(
            hidden_size=int(v.get("hidden_size", 1280)),
            intermediate_size=int(v.get("intermediate_size", 3420)),
            num_layers=int(v.get("depth", 32)),
            num_heads=int(v.get("num_heads", 16)),
            image_size=0,
            patch_size=patch,
            layer_norm_eps=1e-6,  # Qwen2.5-VL's vision RMSNorms are built with eps 1e-6
            tokens_per_image=0,
            boi_token_id=int(cfg.get("vision_start_token_id", 151_652)),
            image_token_id=int(cfg.get("image_token_id", 151_655)),
            eoi_token_id=int(cfg.get("vision_end_token_id", 151_653)),
            processor=ImageProcessorConfig.from_qwen2_vl(pre, patch, merge),
            family="qwen2_5_vl",
            spatial_merge_size=merge,
            temporal_patch_size=int(v.get("temporal_patch_size", 2)),
            window_size=int(v.get("window_size", 112)),
            fullatt_block_indexes=tuple(int(i) for i in v.get("fullatt_block_indexes", (7, 15, 23, 31))),
            out_hidden_size=int(v.get("out_hidden_size", 3584)),
            hidden_act=act,
        )
