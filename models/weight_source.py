"""What a model needs from its weights, and what the engine needs from a model, so that
models/ never imports the loader and the engine never imports a family.

A checkpoint's tensors come as a Mapping of float32 arrays under Hugging Face
names; CheckpointWeights wraps them to check shapes and to hand out the packed
blocks a backend keeps. Anything else that can produce weights (the loader's
DummyWeights, random weights drawn on the device) implements WeightSource instead.
"""

from __future__ import annotations

import sys
from collections.abc import Iterable, Mapping
from typing import Protocol, runtime_checkable

import numpy as np

from rawpage.backends.base import Array, Backend
from rawpage.config import ModelConfig
from rawpage.errors import ModelLoadError
from rawpage.forward_batch import ForwardBatch
from rawpage.quantization.weight import QuantizedWeight, RowStack, concat_rows

Part = tuple[str, tuple[int, ...]]  # (Hugging Face tensor name, shape)


@runtime_checkable
class WeightSource(Protocol):
    def has(self, name: str) -> bool:
        """Does the checkpoint have this tensor (optional ones: lm_head, rope_freqs, biases)?"""
        ...

    def load(self, backend: Backend, parts: list[Part]) -> Array:
        """The named tensors with these shapes, concatenated along dim 0, on the backend."""
        ...


class Model(Protocol):
    """A loaded model as the engine, the runner and the memory plan use it (models/decoder.py)."""

    config: ModelConfig  # under tensor parallelism, this rank's heads and FFN columns

    def forward(self, batch: ForwardBatch, kv_caches: list[tuple[Array, Array]]) -> Array:
        """The final hidden states of the rows in batch.logits_indices: (N, dim)."""
        ...

    def compute_logits(self, hidden: Array) -> Array | None:
        """(N, dim) -> (N, V) float32 logits (None on the ranks other than 0)."""
        ...

    def num_bytes(self) -> int:
        """Bytes held by the weights."""
        ...


class CheckpointWeights:
    """Fetches tensors by name from a checkpoint, checking each exists and has the shape
    the config implies, and uploads each weight to the backend as soon as it is built."""

    def __init__(self, tensors: Mapping[str, np.ndarray]) -> None:
        self.tensors = tensors

    def has(self, name: str) -> bool:
        return name in self.tensors

    def cut(self, name: str, full: np.ndarray) -> np.ndarray:
        """What this process holds of a tensor: all of it (models/sharding.py: a rank's slice)."""
        return full

    def cut_packed(self, name: str, full: QuantizedWeight) -> QuantizedWeight | None:
        return full  # None: it cannot stay packed (a slice that would split a block)

    def get(self, name: str, shape: tuple[int, ...]) -> np.ndarray:
        if name not in self.tensors:
            raise ModelLoadError(f"checkpoint has no tensor {name!r}")
        t = self.cut(name, self.tensors[name])
        if tuple(t.shape) != shape:
            raise ModelLoadError(f"tensor {name!r} has shape {tuple(t.shape)}, but the config implies {shape}")
        return t

    def quantized(self, backend: Backend, parts: list[Part]) -> QuantizedWeight | RowStack | None:
        """The named Linear weights fused as packed, if the checkpoint packs every one of
        them in a kind the backend keeps quantized (GGUF blocks of different formats as
        a RowStack); else None (load them dense)."""
        source = getattr(self.tensors, "quantized", None)
        if source is None or not backend.keeps_quantized:
            return None
        packed = [self.cut_packed(name, w) if (w := source(name)) is not None else None for name, _ in parts]
        if any(p is None or p.kind not in backend.keeps_quantized for p in packed):
            return None
        for p, (name, shape) in zip(packed, parts):
            if p.shape != shape:
                raise ModelLoadError(f"tensor {name!r} has shape {p.shape}, but the config implies {shape}")
        return concat_rows(packed)

    def load(self, backend: Backend, parts: list[Part]) -> Array:
        arrays = [self.get(name, shape) for name, shape in parts]
        return backend.asarray(arrays[0] if len(arrays) == 1 else np.concatenate(arrays))


class TowerWeights:
    """A vision tower's weights by name: float32 on the host, then as the backend holds them."""

    def __init__(self, backend: Backend, tensors: Mapping[str, np.ndarray] | WeightSource) -> None:
        self.backend = backend
        self.source = tensors if isinstance(tensors, WeightSource) else CheckpointWeights(tensors)

    def host(self, name: str, *shape: int) -> np.ndarray:
        return np.asarray(self.backend.to_numpy(self.source.load(self.backend, [(name, shape)])), np.float32)

    def vector(self, name: str, *shape: int) -> Array:
        return self.backend.asarray(self.host(name, *shape))

    def linear(self, w: np.ndarray) -> Array:
        return self.backend.prepare_encoder_linear(self.backend.asarray(w))


def progress(items: range, desc: str) -> Iterable[int]:
    """A progress bar over the layers when stderr is a terminal, else none (and no tqdm import:
    it brings importlib.metadata, email and zipfile, ~40 modules a server never uses)."""
    if not sys.stderr.isatty():
        return items
    try:
        from tqdm import tqdm
    except ImportError:  # a bare GPU image: no bar
        return items
    return tqdm(items, desc=desc, unit="layer", leave=False)
