"""Gemma 2 and Gemma 3 (text). How they differ from Llama:

- RMSNorm scales by (1 + w), not w (folded into w at load);
- the embedding is multiplied by sqrt(dim), and the LM head is tied to it;
- four norms a layer: input, after attention, before and after the MLP;
- GeGLU: gelu (tanh approximation) gates the MLP instead of silu;
- scores are scaled by query_pre_attn_scalar**-0.5 instead of D**-0.5;
- layers alternate sliding-window and global attention (Gemma 2: every other
  layer; Gemma 3: five local to one global, each kind with its own RoPE base);
- Gemma 2 soft-caps attention scores and the final logits: c * tanh(x / c);
- Gemma 3 normalizes each head of q and k, as Qwen3 does (with the 1 + w scale).

Gemma3ForConditionalGeneration is the Gemma 3 decoder plus an image encoder
(models/siglip.py): an image's N soft tokens replace the (scaled) embeddings of its
<image_soft_token> rows, unscaled, and attend to each other both ways
(models/decoder.py puts them in; ForwardBatch.attn.key_end, which every backend's paged
attention takes, lets them see their whole image). The encoder runs where the step's batch
is built (the model runner's EncoderCache); under tensor parallelism that is rank 0 alone
(models/registry.py).
"""

from collections.abc import Mapping

import numpy as np

from rawpage.backends.base import Backend
from rawpage.config import ModelConfig
from rawpage.models.decoder import DecoderModel
from rawpage.models.siglip import Gemma3VisionEncoder
from rawpage.models.weight_source import WeightSource


class Gemma2Model(DecoderModel):
    norm_weight_offset = 1.0
    sandwich_norms = True  # post_attention_layernorm, pre_/post_feedforward_layernorm
    scale_embedding = True


class Gemma3Model(Gemma2Model):
    qk_norm = True


class Gemma3VisionModel(Gemma3Model):
    """Gemma 3 with images (config.vision set: a Gemma3ForConditionalGeneration checkpoint)."""

    def __init__(self, config: ModelConfig, backend: Backend, tensors: Mapping[str, np.ndarray] | WeightSource) -> None:
        super().__init__(config, backend, tensors)
        self.vision = Gemma3VisionEncoder(config.vision, config.hidden_size, backend, tensors)

    def encode_image(self, pixels: np.ndarray, grid: tuple[int, int, int] = (1, 1, 1)) -> np.ndarray:
        """pixels (3, S, S) -> soft tokens (N, dim) float32, on the host. (Every Gemma 3 image
        is one S x S square: the grid, which a Qwen2.5-VL image's size sets, is always (1, 1, 1).)"""
        return self.vision.encode(pixels)

    def num_bytes(self) -> int:
        return super().num_bytes() + self.vision.num_bytes()
