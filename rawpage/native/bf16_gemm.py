"""bf16_gemm.c from Python: a vision tower's linear layers and attention in bfloat16.

    pack(lib, w, nthreads)                        Bf16Panels of W (N, K) float32, packed once at load
    gemm(lib, x, panels, nthreads, bias)          y (T, N) = bf16(x) bf16(W)^T (+ bias), float32
    encoder_attention(lib, q, k, v, scale, nthreads, cu_seqlens)
                                                  (N, H, D): softmax(bf16(scale q) bf16(k)^T) rounded
                                                  to bf16, times bf16(v)

The CPU backend runs a vision tower on these where the CPU has AVX512-BF16 (bf16_dot()):
twice float32's multiply rate and half its weight bytes, with every product exact and
float32 sums; the tower is trained in bfloat16. References: rawpage/ops/bf16_linear.py
bf16_gemm_ref, rawpage/ops/paged_attention.py encoder_attention_bf16_ref.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from rawpage.native.isa import cpu_flags, selected_path
from rawpage.native.library import NativeLibrary, addr, empty, float_rows, weight_address


def bf16_dot() -> bool:
    """Whether the kernels take the vdpbf16ps path: AVX512-BF16 on the avx512vnni path."""
    return selected_path() == "avx512vnni" and "avx512_bf16" in cpu_flags()


@dataclass(frozen=True)
class Bf16Panels:
    """A linear layer's W (N, K) as bf16 panels (bf16_gemm.c's layout): (ceil(N/16), ceil(K/2), 16, 2) uint16."""

    panels: np.ndarray
    shape: tuple[int, int]  # (N, K): (out, in)

    @property
    def nbytes(self) -> int:
        return int(self.panels.nbytes)


def pack(lib: NativeLibrary, w: np.ndarray, nthreads: int) -> Bf16Panels:
    """W (N, K) float32 (any strides) -> its panels, each value rounded to bf16."""
    w = np.asarray(w, np.float32)
    N, K = w.shape
    panels = np.empty(((N + 15) // 16, (K + 1) // 2, 16, 2), np.uint16)
    sn, sk = (s // 4 for s in w.strides)
    lib.call("rp_bf16_pack", panels=addr(panels), w=w.ctypes.data, sn=sn, sk=sk, N=N, K=K, nthreads=nthreads)
    return Bf16Panels(panels, (N, K))


def gemm(lib: NativeLibrary, x: np.ndarray, w: Bf16Panels, nthreads: int, bias: np.ndarray | None = None) -> np.ndarray:
    """x (T, K) float32, rows contiguous -> (T, N) float32: x rounded to bf16 (one pass, into
    the kernel's tiles), then the GEMM."""
    N, K = w.shape
    x, stride = float_rows(x)
    if x.ndim != 2 or x.shape[1] != K:
        raise ValueError(f"bf16 gemm: x {x.shape} and weight {w.shape} do not make a product")
    if bias is not None:
        bias = np.ascontiguousarray(bias, np.float32)
        if bias.shape != (N,):
            raise ValueError(f"bias has shape {bias.shape}, want ({N},)")
    T = len(x)
    y = empty((T, N))
    if T and N:
        rc = lib.call(
            "rp_bf16_gemm",
            y=addr(y),
            y_stride=N,
            x=addr(x),
            x_stride=stride,
            panels=weight_address(w.panels),
            bias=None if bias is None else addr(bias),
            T=T,
            N=N,
            K=K,
            nthreads=nthreads,
        )
        if rc != 0:
            raise MemoryError("bf16 gemm: x's tiles could not be allocated")
    return y


def encoder_attention(
    lib: NativeLibrary,
    q: np.ndarray,
    k: np.ndarray,
    v: np.ndarray,
    scale: float,
    nthreads: int,
    cu_seqlens: np.ndarray | None = None,
) -> np.ndarray:
    """q, k, v (N, H, D) float32 -> (N, H, D) float32; cu_seqlens as encoder_attention_ref's
    (None: one sequence). q, k, v may be views of one fused qkv output (rows widely spaced)."""
    N, H, D = q.shape
    if k.shape != q.shape or v.shape != q.shape:
        raise ValueError(f"encoder attention: q {q.shape}, k {k.shape}, v {v.shape} differ")
    same_layout = len({(a.strides, a.dtype) for a in (q, k, v)}) == 1  # views of one fused qkv, say
    if not same_layout or q.dtype != np.float32 or q.strides[2] != 4:
        q, k, v = (np.ascontiguousarray(a, np.float32) for a in (q, k, v))
    row_stride, head_stride = q.strides[0] // 4, q.strides[1] // 4
    bounds = np.asarray([0, N] if cu_seqlens is None else cu_seqlens, np.int64)
    if bounds[0] != 0 or bounds[-1] != N or (np.diff(bounds) < 0).any():
        raise ValueError(f"cu_seqlens must rise from 0 to {N}; got {bounds.tolist()}")
    out = empty((N, H, D))
    if N and H and D:
        rc = lib.call(
            "rp_bf16_encoder_attention",
            out=addr(out),
            q=q.ctypes.data,
            k=k.ctypes.data,
            v=v.ctypes.data,
            row_stride=row_stride,
            head_stride=head_stride,
            bounds=addr(bounds),
            nseq=len(bounds) - 1,
            H=H,
            D=D,
            scale=float(scale),
            nthreads=nthreads,
        )
        if rc != 0:
            raise MemoryError("encoder attention: its scratch could not be allocated")
    return out
