"""A lazy name -> float32 array mapping, shared by the safetensors and GGUF loaders.

Checkpoints are read tensor by tensor on demand so that a loader never holds a
second full copy of the model: the model builder asks for a tensor, converts or
fuses it, and drops the float32 temporary.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping

import numpy as np

from rawpage.quantization.weight import QuantizedWeight

LINEAR_WEIGHT_SUFFIXES = ("_proj.weight", "lm_head.weight", "embed_tokens.weight")


def is_linear_weight(name: str) -> bool:
    """Linear weights, and the embedding (read packed by rows, or as a tied LM head)."""
    return name.endswith(LINEAR_WEIGHT_SUFFIXES)


class TensorSource(Mapping[str, np.ndarray]):
    """Maps Hugging Face tensor names (`model.layers.0.self_attn.q_proj.weight`, ...)
    to float32 arrays, computed when first asked for."""

    def __init__(
        self,
        readers: dict[str, Callable[[], np.ndarray]],
        quantized: dict[str, Callable[[], QuantizedWeight]] | None = None,
        kinds: dict[str, str] | None = None,
    ) -> None:
        """kinds: each packed tensor's QuantizedWeight kind, where a source packs more
        than one (a GGUF: blocks, and 16-bit float tensors as "f16" / "bf16"); else one
        kind for all, found by reading the first."""
        self._readers = readers
        self._quantized = quantized or {}
        self._kinds = kinds

    def merged(self, other: TensorSource) -> TensorSource:
        """This source and another's tensors (names must not overlap): a GGUF and its mmproj."""
        kinds = (
            None if self._kinds is None and other._kinds is None else {**(self._kinds or {}), **(other._kinds or {})}
        )
        return TensorSource({**self._readers, **other._readers}, {**self._quantized, **other._quantized}, kinds)

    def quantized(self, name: str) -> QuantizedWeight | None:
        """The tensor as the checkpoint packs it, if it is a quantized Linear weight
        (a backend may keep it so: Backend.keeps_quantized); else None."""
        reader = self._quantized.get(name)
        return reader() if reader else None

    def quantized_names(self) -> list[str]:
        return list(self._quantized)

    def packed_kind(self, name: str) -> str | None:
        """The kind quantized(name) has, without reading it where the source knows."""
        if self._kinds is not None:
            return self._kinds.get(name)
        w = self.quantized(name)
        return w.kind if w is not None else None

    def packed_kinds(self) -> set[str]:
        """The kinds of the packed tensors (one source packs one kind, but a GGUF)."""
        if self._kinds is not None:
            return set(self._kinds.values())
        names = self.quantized_names()[:1]
        return {k for k in map(self.packed_kind, names) if k is not None}

    def raw(self, name: str) -> np.ndarray:
        """The tensor as its reader returns it (int32 packed weights stay int32)."""
        return self._readers[name]()

    def __getitem__(self, name: str) -> np.ndarray:
        return np.ascontiguousarray(self._readers[name](), dtype=np.float32)

    def __contains__(self, name: object) -> bool:
        return name in self._readers  # (Mapping's would read the tensor to find out)

    def __iter__(self) -> Iterator[str]:
        return iter(self._readers)

    def __len__(self) -> int:
        return len(self._readers)
