"""AWQ and GPTQ 4-bit checkpoints, and the one int4 layout both become at load.

The internal layout (kind "int4"), chosen for a kernel that walks a weight row
32 values at a time (cuda/int4_linear.cu):

    data   (N, K/8) uint32   nibble i of word j of row n = q[n, 8j + i], 0..15
    scales (N, K/G) float16  s[n, g]
    zeros  (N, K/G) float16  z[n, g], an integer 0..15
    W[n, c] = s[n, c // G] * (q[n, c] - z[n, c // G])      G = group size (K for "-1")
    perm   (K,) int32 or None: with GPTQ act-order the columns are stored sorted by
           group, column c being the checkpoint's input perm[c]; then
           y = x[:, perm] @ W.T, and each group is again G adjacent columns.

The checkpoint layouts (AutoGPTQ / AutoAWQ, the formats vLLM reads):

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
from rawpage.quantization.weight import QuantizedWeight

AWQ_ORDER = np.array([0, 2, 4, 6, 1, 3, 5, 7])  # nibble i holds column 8j + AWQ_ORDER[i]
SHIFTS = np.arange(8, dtype=np.uint32) * 4


def unpack_nibbles(words: np.ndarray, axis: int) -> np.ndarray:
    """int32 words -> their 8 nibbles, low first, spread along `axis` (8x longer)."""
    w = words.view(np.uint32)
    nib = np.expand_dims(w, axis + 1) >> np.expand_dims(SHIFTS, tuple(i for i in range(w.ndim) if i != axis))
    nib = nib & 15  # (..., n, 8, ...) along axis
    shape = list(w.shape)
    shape[axis] *= 8
    return nib.reshape(shape).astype(np.uint8)


def pack_nibbles(q: np.ndarray, axis: int) -> np.ndarray:
    """Inverse of unpack_nibbles: values 0..15, 8 per int32 along `axis`, low nibble first."""
    q = np.moveaxis(q.astype(np.uint32), axis, -1)
    q = q.reshape(*q.shape[:-1], -1, 8)
    words = (q << SHIFTS).sum(axis=-1, dtype=np.uint32)
    return np.moveaxis(words, -1, axis).view(np.int32)


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


def int4_dequantize_ref(w: QuantizedWeight) -> np.ndarray:
    """kind "int4" -> float32 (N, K) in the checkpoint's column order."""
    q = unpack_nibbles(np.asarray(w.data).view(np.int32), axis=1).astype(np.float32)
    g = np.arange(w.shape[1]) // w.group_size
    dense = np.asarray(w.scales, np.float32)[:, g] * (q - np.asarray(w.zeros, np.float32)[:, g])
    if w.perm is not None:
        out = np.empty_like(dense)
        out[:, np.asarray(w.perm)] = dense
        return out
    return dense


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
    readers |= {p + ".weight": (lambda p=p: int4_dequantize_ref(convert(p))) for p in packed}
    return TensorSource(readers, {p + ".weight": (lambda p=p: convert(p)) for p in packed})
