"""Hugging Face folders whose config.json has a quantization_config: their packed tensors
converted at load to QuantizedWeight (quantization/weight.py), kind "fp8" or "int4".

The int4 checkpoint layouts (AutoGPTQ / AutoAWQ, the formats vLLM reads), which become
the one int4 layout of quantization/int4.py:

    GPTQ  qweight (K/8, N) int32: packed along K, nibble j of qweight[i, n] = q[8i + j, n]
          qzeros  (ngroups, N/8) int32: packed along N, stores z - 1 ("v1" format)
          scales  (ngroups, N) float16;  g_idx (K,) int32: the group of each input
    AWQ   qweight (K, N/8) int32: packed along N in the interleaved order
          [0, 2, 4, 6, 1, 3, 5, 7]: nibble i of qweight[k, j] = q[k, 8j + ORDER[i]]
          qzeros  (ngroups, N/8) int32, the same packing, z as is
          scales  (ngroups, N) float16
    both  W[n, k] = scales[g, n] * (q[k, n] - z[g, n]) with g the group of input k
"""

from __future__ import annotations

from typing import Any

import numpy as np

from rawpage.errors import ModelLoadError, UnsupportedModelError
from rawpage.loader.tensors import TensorSource
from rawpage.quantization.int4 import AWQ_ORDER, pack_nibbles, unpack_nibbles
from rawpage.quantization.weight import QuantizedWeight, dequantize


def checkpoint_tensors(tensors: TensorSource, qconfig: dict[str, Any] | None, path: str) -> TensorSource:
    """A Hugging Face folder's tensors as its quantization_config says they are packed."""
    if not qconfig:
        return tensors
    if qconfig.get("quant_method") == "fp8":
        return fp8_checkpoint_tensors(tensors, path)
    return int4_tensor_source(tensors, qconfig, path)


def fp8_checkpoint_tensors(tensors: TensorSource, path: str) -> TensorSource:
    """vLLM / llm-compressor FP8 checkpoints: `X.weight` F8_E4M3 (N, K) and
    `X.weight_scale` float32, one per tensor (a scalar) or per channel (N, 1).
    `X.input_scale` (static activation scales) is not needed by weight-only paths."""
    packed = [name[: -len("_scale")] for name in tensors if name.endswith(".weight_scale")]

    def convert(name: str) -> QuantizedWeight:
        bits = np.array(tensors.raw(name)).view(np.uint8)  # a copy: aligned for 16-byte loads, unlike the mapping
        if bits.ndim != 2:
            raise UnsupportedModelError(f"{path}: FP8 tensor {name!r} has shape {bits.shape}; want (out, in)")
        scale = np.asarray(tensors.raw(name + "_scale"), np.float32).reshape(-1)
        scales = np.broadcast_to(scale, (bits.shape[0],)).copy()
        return QuantizedWeight("fp8", (bits.shape[0], bits.shape[1]), bits, scales=scales)

    skip = {n + "_scale" for n in packed} | {n[: -len("weight")] + "input_scale" for n in packed}
    readers = {n: (lambda n=n: tensors.raw(n)) for n in tensors if n not in skip}
    readers |= {n: (lambda n=n: dequantize(convert(n))) for n in packed}
    return TensorSource(readers, {n: (lambda n=n: convert(n)) for n in packed})


def internal_int4(q: np.ndarray, scales: np.ndarray, zeros: np.ndarray, perm: np.ndarray | None) -> QuantizedWeight:
    """q (N, K) values in kernel column order, scales/zeros (N, ngroups) -> kind "int4"."""
    N, K = q.shape
    return QuantizedWeight(
        "int4",
        (N, K),
        np.ascontiguousarray(pack_nibbles(q, axis=1).view(np.uint32)),
        scales=np.ascontiguousarray(scales, np.float16),
        zeros=np.ascontiguousarray(zeros, np.float16),
        perm=None if perm is None else np.ascontiguousarray(perm, np.int32),
        group_size=K // scales.shape[1],
    )


def gptq_to_int4(
    qweight: np.ndarray, qzeros: np.ndarray, scales: np.ndarray, g_idx: np.ndarray | None, group_size: int
) -> QuantizedWeight:
    q = unpack_nibbles(qweight, axis=0)  # (K, N)
    K, N = q.shape
    G = K if group_size == -1 else group_size
    z = unpack_nibbles(qzeros, axis=1)[:, :N].astype(np.int32) + 1  # (ngroups, N), v1 stores z - 1
    perm = None
    if g_idx is not None and not np.array_equal(g_idx, np.arange(K) // G):  # act-order
        perm = np.argsort(g_idx, kind="stable")
        if not np.array_equal(g_idx[perm], np.arange(K) // G):
            raise ModelLoadError(f"GPTQ g_idx does not put {G} inputs in each group; cannot reorder it")
        q = q[perm]
    return internal_int4(q.T, scales.T, (z & 15).T, perm)


def awq_to_int4(qweight: np.ndarray, qzeros: np.ndarray, scales: np.ndarray) -> QuantizedWeight:
    inverse = np.argsort(AWQ_ORDER)  # nibble holding column 8j + c

    def unpack(words: np.ndarray) -> np.ndarray:
        nib = unpack_nibbles(words, axis=1).reshape(words.shape[0], -1, 8)
        return nib[:, :, inverse].reshape(words.shape[0], -1)

    return internal_int4(unpack(qweight).T, scales.T, unpack(qzeros).T, None)


def int4_tensor_source(tensors: TensorSource, qconfig: dict[str, Any], path: str) -> TensorSource:
    """A folder's tensors with each packed Linear (`X.qweight`, `X.qzeros`, `X.scales`,
    GPTQ's `X.g_idx`) offered as `X.weight`: packed (converted to int4) for backends
    that keep it, dequantized to float32 for the others."""
    method, bits = qconfig.get("quant_method"), qconfig.get("bits", 4)
    if method not in ("awq", "gptq") or bits != 4:
        raise UnsupportedModelError(
            f"{path}: quantization_config {method!r} with {bits} bits is not supported "
            "(rawpage reads 4-bit awq and gptq, and fp8)"
        )
    if method == "awq" and str(qconfig.get("version", "gemm")).lower() != "gemm":
        raise UnsupportedModelError(f"{path}: AWQ version {qconfig['version']!r}; rawpage reads the GEMM packing")
    if method == "gptq" and qconfig.get("checkpoint_format", "gptq") != "gptq":
        raise UnsupportedModelError(
            f"{path}: GPTQ checkpoint_format {qconfig['checkpoint_format']!r}; "
            "rawpage reads the original ('gptq', zeros stored minus one)"
        )
    group_size = int(qconfig.get("group_size", 128))
    packed = {name[: -len(".qweight")] for name in tensors if name.endswith(".qweight")}
    parts = {p + s for p in packed for s in (".qweight", ".qzeros", ".scales", ".g_idx", ".bias")}

    def convert(prefix: str) -> QuantizedWeight:
        t = {s: tensors.raw(prefix + s) for s in (".qweight", ".qzeros", ".scales", ".g_idx") if prefix + s in tensors}
        if method == "awq":
            return awq_to_int4(t[".qweight"], t[".qzeros"], t[".scales"])
        return gptq_to_int4(t[".qweight"], t[".qzeros"], t[".scales"], t.get(".g_idx"), group_size)

    readers = {name: (lambda name=name: tensors.raw(name)) for name in tensors if name not in parts}
    readers |= {p + ".bias": (lambda p=p: tensors.raw(p + ".bias")) for p in packed if p + ".bias" in tensors}
    readers |= {p + ".weight": (lambda p=p: dequantize(convert(p))) for p in packed}
    return TensorSource(readers, {p + ".weight": (lambda p=p: convert(p)) for p in packed})
