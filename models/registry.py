"""Which class computes which family. ModelConfig.architecture holds the family
(rawpage/config.py maps Hugging Face `architectures` and GGUF names to it)."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping

import numpy as np

from rawpage.backends.base import Backend
from rawpage.config import ModelConfig
from rawpage.errors import UnsupportedModelError
from rawpage.models.decoder import DecoderModel
from rawpage.models.gemma import Gemma2Model, Gemma3Model, Gemma3VisionModel
from rawpage.models.llama import LlamaModel
from rawpage.models.mistral import MistralModel
from rawpage.models.mixtral import MixtralModel
from rawpage.models.phi3 import Phi3Model
from rawpage.models.qwen2_vl import Qwen25VLModel
from rawpage.models.qwen3 import Qwen3Model
from rawpage.models.qwen3_moe import Qwen3MoeModel
from rawpage.models.sharding import TensorParallel, apply_tensor_parallel, check_shardable
from rawpage.models.weight_source import Model, WeightSource

MODEL_CLASSES: dict[str, type[DecoderModel]] = {
    "llama": LlamaModel,
    "qwen2": LlamaModel,
    "mistral": MistralModel,
    "qwen3": Qwen3Model,
    "gemma2": Gemma2Model,
    "gemma3": Gemma3Model,
    "phi3": Phi3Model,
    "mixtral": MixtralModel,
    "qwen3_moe": Qwen3MoeModel,
}

# A vision-language checkpoint's family (config.vision set) -> the class that adds its image encoder.
VISION_MODEL_CLASSES: dict[str, type[DecoderModel]] = {"gemma3": Gemma3VisionModel, "qwen2": Qwen25VLModel}


def build_model(
    config: ModelConfig,
    backend: Backend,
    tensors: Mapping[str, np.ndarray] | WeightSource,
    tp: TensorParallel | None = None,
) -> Model:
    """The model of config.architecture, its weights loaded onto the backend; under tensor
    parallelism rank tp.layout.rank's shard of it, wrapped with the collectives."""
    cls = (VISION_MODEL_CLASSES if config.vision is not None else MODEL_CLASSES).get(config.architecture)
    if cls is None:
        raise UnsupportedModelError(
            f"no model class for architecture {config.architecture!r}; rawpage runs {', '.join(MODEL_CLASSES)}"
        )
    if tp is None:
        return cls(config, backend, tensors)
    check_shardable(config, tp.layout.size, tp.layout.exact)
    local = tp.layout.local_config()
    if config.vision is not None and tp.layout.rank > 0:
        # The image encoder runs once, whole, on rank 0: the driver, whose runner builds each
        # step's batch with its images' soft tokens (model_runner.build_batch) and sends it to
        # every worker (distributed/executor.py). A small encoder split would cost collectives
        # per layer for little; replicated, its weights would sit on P ranks for one use.
        cls, local = MODEL_CLASSES[config.architecture], dataclasses.replace(local, vision=None)
    model = cls(local, backend, tp.weights(tensors))
    apply_tensor_parallel(model, tp)
    return model


def supports_cuda_graphs(config: ModelConfig) -> bool:
    """MoE routing reads the router's output on the host, which a CUDA graph cannot replay."""
    return not config.num_experts
