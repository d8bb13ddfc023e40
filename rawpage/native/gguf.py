"""GGUF weights on the CPU, kept in their blocks (gguf_matmul.c).

    gguf_matmul(lib, x, data, qtype, (N, K), nthreads, bias)  y (T, N) = x (T, K) W^T (+ bias)
    gguf_rows(lib, data, qtype, (N, K), ids, nthreads)         W[ids] (T, K), dequantized

W is (N, row_bytes) uint8, each row whole blocks exactly as in the .gguf file. The
activation is rounded to int8 per 32-value chunk as in rawpage/ops/gguf_mmvq.py
quantize_q8_ref (the simulator's MMVQ kernel), so both agree to float rounding;
gguf_mmvq_ref is the reference of gguf_matmul, gguf_dequantize_ref of gguf_rows.
"""

from __future__ import annotations

import ctypes
import threading

import numpy as np

from rawpage.native.library import (
    NativeLibrary,
    addr,
    contiguous_rows,
    empty,
    int32_rows,
    keep,
    ptr,
    weight_address,
)
from rawpage.quantization.gguf import GGUF_BLOCKS

# GGML's type ids (gguf.GGMLQuantizationType), as gguf_matmul.c takes them.
_GGML_TYPE = {"Q4_0": 2, "Q4_1": 3, "Q8_0": 8, "Q4_K": 12, "Q5_K": 13, "Q6_K": 14}

NATIVE_GGUF = frozenset(_GGML_TYPE)  # the qtypes gguf_matmul handles


def _check(data: np.ndarray, qtype: str, shape: tuple[int, int]) -> tuple[int, int]:
    """The weight's (N, K), checked against its blocks; a clear error otherwise."""
    if qtype not in NATIVE_GGUF:
        raise ValueError(f"GGUF type {qtype} has no native CPU kernel (supported: {', '.join(sorted(NATIVE_GGUF))})")
    block, size = GGUF_BLOCKS[qtype]
    N, K = shape
    if K <= 0 or K % block:
        raise ValueError(f"{qtype} weight {shape}: K = {K} must be a positive multiple of the {block}-value block")
    if tuple(data.shape) != (N, K // block * size) or data.dtype != np.uint8 or not data.flags.c_contiguous:
        raise ValueError(
            f"{qtype} weight {shape}: want C-contiguous ({N}, {K // block * size}) uint8 blocks, "
            f"got {tuple(data.shape)} {data.dtype}"
        )
    return N, K


def gguf_matmul(
    lib: NativeLibrary,
    x: np.ndarray,
    data: np.ndarray,
    qtype: str,
    shape: tuple[int, int],
    nthreads: int,
    bias: np.ndarray | None = None,
) -> np.ndarray:
    """x (T, K) float32 (any layout; made C-contiguous), data (N, row_bytes) uint8 blocks -> (T, N) float32 C-contiguous."""
    N, K = _check(data, qtype, shape)
    x = contiguous_rows(x)
    if x.ndim != 2 or x.shape[1] != K:
        raise ValueError(f"x has shape {x.shape}, the {qtype} weight {shape} wants (T, {K})")
    T = x.shape[0]
    y = empty((T, N))
    if T == 0 or N == 0:
        return y
    if bias is not None:
        bias = np.ascontiguousarray(bias, dtype=np.float32)  # a weight: the same array each step
        if bias.shape != (N,):
            raise ValueError(f"bias has shape {bias.shape}, want ({N},)")
    rc = lib.call(
        "rp_gguf_matmul",
        qtype=_GGML_TYPE[qtype],
        y=addr(y),
        x=addr(x),
        w=weight_address(data),
        bias=ptr(bias),
        T=T,
        N=N,
        K=K,
        scratch=_scratch_address(T, K),
        nthreads=nthreads,
    )
    if rc != 0:
        raise ValueError(f"rp_gguf_matmul refused {qtype} {shape} (code {rc})")
    return y


# The scratch is one buffer per calling thread, grown as needed (library.py's
# library.addr says why addresses are worth caching).
_scratch_buffers = threading.local()


def _scratch_address(T: int, K: int) -> int:
    """The address of this thread's scratch for T x K (see _scratch)."""
    need = T * K + 2 * T * (K // 32) * 4
    buf = getattr(_scratch_buffers, "buf", None)
    if buf is None or len(buf) < need:
        _scratch_buffers.buf = buf = (ctypes.c_char * max(need, 1 << 16))()
        _scratch_buffers.address = ctypes.addressof(buf)
    keep(buf)  # a recorded call's scratch must outlive a later, larger one
    return _scratch_buffers.address


def _scratch(T: int, K: int) -> np.ndarray:
    """The kernel's scratch: xq (T, K) int8, dx (T, K / 32) float32 and s = dx sum xq
    (T, K / 32) float32, back to back (1.25 bytes per value of x)."""
    return np.empty(T * K + 2 * T * (K // 32) * 4, dtype=np.uint8)


def quantize_q8(lib: NativeLibrary, x: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The kernel's own activation rounding, for the tests: x (T, K) float32, K % 32 == 0
    -> (xq (T, K) int8, dx (T, K / 32), s (T, K / 32)); must equal quantize_q8_ref."""
    x = np.ascontiguousarray(x, dtype=np.float32)
    T, K = x.shape
    if K % 32:
        raise ValueError(f"activation quantization works on 32-value chunks; K = {K} is not a multiple of 32")
    scratch = _scratch(T, K)
    lib.fn.rp_gguf_quantize_q8(x.ctypes.data, scratch.ctypes.data, T, K)
    xq = scratch[: T * K].view(np.int8).reshape(T, K)
    dx, s = scratch[T * K :].view(np.float32).reshape(2, T, K // 32)
    return xq, dx, s


def gguf_rows(
    lib: NativeLibrary, data: np.ndarray, qtype: str, shape: tuple[int, int], ids: np.ndarray, nthreads: int
) -> np.ndarray:
    """ids (T,) -> the dequantized rows (T, K) float32."""
    N, K = _check(data, qtype, shape)
    ids = int32_rows(np.asarray(ids).reshape(-1))  # token ids: the batch's own int32 array, read in place
    if ids.size and (ids.min() < 0 or ids.max() >= N):
        raise ValueError(f"row ids must be in 0 .. {N - 1}; got {ids.min()} .. {ids.max()}")
    out = empty((ids.size, K))
    if ids.size:
        rc = lib.call(
            "rp_gguf_rows",
            qtype=_GGML_TYPE[qtype],
            out=addr(out),
            w=weight_address(data),
            ids=addr(ids),
            T=ids.size,
            N=N,
            K=K,
            nthreads=nthreads,
        )
        if rc != 0:
            raise ValueError(f"rp_gguf_rows refused {qtype} {shape} (code {rc})")
    return out
