"""Qwen2.5-VL (Qwen2_5_VLForConditionalGeneration): the Qwen2 decoder (Llama with q, k, v
biases) plus the image encoder of models/qwen_vit.py. How it differs from Gemma 3's images:

- an image's N = h * w / 4 soft tokens depend on its size (the processor resizes it to
  multiples of 28 pixels, not to a fixed square);
- its tokens attend causally, as text does;
- M-RoPE: each token rotates by three positions (t, h, w), each over its section of the
  frequencies (rawpage/multimodal/mrope.py makes the positions, models/rotary.py the
  per-token table, DecoderModel.rotate applies it, so that a tensor-parallel worker's
  plain Qwen2 model, which holds no encoder, rotates as rank 0 does). Text tokens have
  t = h = w, so a step without image rows rotates with the plain table at
  batch.positions (already shifted past the images).
"""

from collections.abc import Mapping

import numpy as np

from rawpage.backends.base import Backend
from rawpage.config import ModelConfig
from rawpage.models.llama import LlamaModel
from rawpage.models.qwen_vit import Qwen25VisionEncoder
from rawpage.models.weight_source import WeightSource


class Qwen25VLModel(LlamaModel):
    """Qwen2 with images (config.vision set: a Qwen2_5_VLForConditionalGeneration checkpoint)."""

    def __init__(self, config: ModelConfig, backend: Backend, tensors: Mapping[str, np.ndarray] | WeightSource) -> None:
        super().__init__(config, backend, tensors)
        self.vision = Qwen25VisionEncoder(config.vision, config.hidden_size, backend, tensors)

    def encode_image(self, pixels: np.ndarray, grid: tuple[int, int, int]) -> np.ndarray:
        """pixels (S, 3 Tp P P): the patches of an image of grid (1, h, w) -> soft tokens (N, dim) float32, on the host."""
        return self.vision.encode(pixels, grid)

    def num_bytes(self) -> int:
        return super().num_bytes() + self.vision.num_bytes()
