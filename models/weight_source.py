"""What a model needs from its weights, so that models/ never imports the loader.

A checkpoint's tensors come as a Mapping of float32 arrays under Hugging Face
names (the model wraps them to check shapes). Anything else that can produce
weights (the loader's DummyWeights, random weights drawn on the device) implements
this protocol instead.
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable

from rawpage.backends.base import Array, Backend


@runtime_checkable
class WeightSource(Protocol):
    def has(self, name: str) -> bool:
        """Does the checkpoint have this tensor (optional ones: lm_head, rope_freqs, biases)?"""
        ...

    def load(self, backend: Backend, parts: list[tuple[str, tuple[int, ...]]]) -> Array:
        """The named tensors with these shapes, concatenated along dim 0, on the backend."""
        ...
