"""Which quantized form a checkpoint's Linear weights take: the one place that reads
config.json's quantization_config and the --quantization flag.

    --quantization auto  what the checkpoint packs: GGUF blocks, AWQ / GPTQ int4, FP8
    --quantization fp8   quantize a float checkpoint's Linear weights to FP8 e4m3 at
                         load, one scale per output row
    --quantization q8_0  quantize a float checkpoint's Linear weights, embedding and LM
                         head to GGUF Q8_0 blocks at load (llama.cpp's quantize step;
                         quantization/q8_0.py), 1.06 bytes a weight; a GGUF keeps the
                         tensors it already stores in blocks and quantizes its float ones
    --quantization none  dequantize everything at load (the pre-quantization path)

A backend then keeps the packed form where it has kernels for it
(Backend.keeps_quantized) and dequantizes it at load where it has not (cpu on
NumPy). A bf16 safetensors checkpoint offers its Linear weights as kind "bf16"
(hf_folder.py), and a GGUF its F16 / BF16 tensors as "f16" / "bf16": that is their
stored form, not a quantization, so fp8 and q8_0 take them as float weights.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from rawpage.errors import UnsupportedModelError
from rawpage.loader.tensors import TensorSource, is_linear_weight
from rawpage.quantization.fp8 import quantize_fp8
from rawpage.quantization.q8_0 import Q8_0_BLOCK, quantize_q8_0
from rawpage.quantization.weight import QuantizedWeight, dequantize

QUANTIZATION_CHOICES = ("auto", "fp8", "q8_0", "none")
# vLLM's names for what a checkpoint already packs: they mean auto, checked against the checkpoint.
CHECKPOINT_METHODS = {"gguf": "gguf", "awq": "int4", "gptq": "int4"}


QUANTIZATION_FLAG_CHOICES = (*QUANTIZATION_CHOICES, *CHECKPOINT_METHODS)


def apply_quantization_flag(tensors: Any, method: str | None) -> Any:
    """--quantization applied to a loaded checkpoint's tensors (see the module docstring)."""
    if method in CHECKPOINT_METHODS and isinstance(tensors, TensorSource):
        kinds = tensors.packed_kinds()
        if CHECKPOINT_METHODS[method] not in kinds:
            raise UnsupportedModelError(
                f"--quantization {method}: this checkpoint is not {method}-quantized "
                f"({', '.join(sorted(kinds)) or 'no quantized weights'}); leave it at auto"
            )
        return tensors
    if method in (None, "auto") or not isinstance(tensors, TensorSource):
        return tensors  # (random dummy weights are drawn on the device, dense)
    if method == "none":
        return TensorSource({name: (lambda name=name: tensors.raw(name)) for name in tensors})
    if method == "fp8":
        _refuse_packed(tensors, method)
        linear = [name for name in tensors if is_linear_weight(name) and name != "model.embed_tokens.weight"]
        readers = {name: (lambda name=name: tensors.raw(name)) for name in tensors}
        # dense readers see the FP8-rounded weights too, so that cpu runs the same model
        readers |= {name: (lambda name=name: dequantize(_to_fp8(tensors[name]))) for name in linear}
        return TensorSource(
            readers, {name: (lambda name=name: _to_fp8(tensors[name])) for name in tensors if is_linear_weight(name)}
        )
    if method == "q8_0":
        return _q8_0_tensors(tensors)
    raise ValueError(f"unknown --quantization {method!r}; choose {', '.join(QUANTIZATION_FLAG_CHOICES)}")


_FLOAT_KINDS = (None, "bf16", "f16")  # stored floats, not a quantization


def _packed_kind(tensors: TensorSource) -> str | None:
    """The kind of the checkpoint's quantized weights (a GGUF may also hold float
    tensors: its blocks count), or None."""
    kinds = tensors.packed_kinds()
    return next((k for k in sorted(kinds) if k not in _FLOAT_KINDS), next(iter(kinds), None))


def _refuse_packed(tensors: TensorSource, method: str) -> None:
    kind = _packed_kind(tensors)
    if kind not in _FLOAT_KINDS and not (method == "q8_0" and kind == "gguf"):
        raise UnsupportedModelError(
            f"--quantization {method} quantizes a float checkpoint; this one is already "
            f"quantized ({kind}); leave --quantization at auto"
        )


def _q8_0_tensors(tensors: TensorSource) -> TensorSource:
    """--quantization q8_0: every float Linear weight (embedding and LM head included)
    as Q8_0 blocks. A GGUF's tensors already in blocks stay as they are; the dense
    readers see the Q8_0-rounded values, so that every backend runs the same model."""
    _refuse_packed(tensors, "q8_0")
    kept = {n for n in tensors.quantized_names() if tensors.packed_kind(n) == "gguf"}
    names = [name for name in tensors if is_linear_weight(name) and name not in kept]
    readers = {name: (lambda name=name: tensors.raw(name)) for name in tensors}
    readers |= {name: (lambda name=name: _q8_0_rounded(tensors[name])) for name in names}
    quantized = {name: (lambda name=name: tensors.quantized(name)) for name in kept}
    quantized |= {name: (lambda name=name: _to_q8_0(tensors[name])) for name in names}
    return TensorSource(readers, quantized)


def _to_q8_0(w: np.ndarray) -> QuantizedWeight | None:
    """w (N, K) -> its Q8_0 blocks; None (stays dense) where K is not whole blocks."""
    if w.ndim != 2 or w.shape[1] % Q8_0_BLOCK:
        return None
    return QuantizedWeight("gguf", (w.shape[0], w.shape[1]), quantize_q8_0(w), "Q8_0")


def _q8_0_rounded(w: np.ndarray) -> np.ndarray:
    q = _to_q8_0(w)
    return w if q is None else dequantize(q)


def _to_fp8(w: np.ndarray) -> QuantizedWeight:
    bits, scales = quantize_fp8(w, per_channel=True)
    return QuantizedWeight("fp8", (w.shape[0], w.shape[1]), bits, scales=scales)
