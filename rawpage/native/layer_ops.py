"""The small ops of a decoder layer on the CPU kernels (layer_ops.c): RMSNorm with
and without the residual add, RoPE, SiLU/GELU-tanh gating, the K/V write into
the paged cache, and a dense embedding table's rows. Each has the contract of its NumPy reference in rawpage/ops.

Activations are float32. A (T, n) input whose rows are contiguous but spaced wider
(a column slice of the fused qkv output, a row slice) is read in place through its
row stride; any other layout (a Fortran-order matmul output of more than one row)
is copied to C order first.
"""

from __future__ import annotations

import numpy as np

from rawpage.native.attention import KV_DTYPES
from rawpage.native.library import NativeLibrary, addr, empty, float_rows, int32_rows


def _weight(w: np.ndarray) -> np.ndarray:
    return w if w.dtype == np.float32 and w.flags.c_contiguous else np.ascontiguousarray(w, dtype=np.float32)


def rms_norm(lib: NativeLibrary, x: np.ndarray, weight: np.ndarray, eps: float, nthreads: int) -> np.ndarray:
    """x: (T, dim), weight: (dim,) -> (T, dim) float32, a new array."""
    x, stride = float_rows(x)
    T, n = x.shape
    out = empty((T, n))
    if T:
        lib.call(
            "rp_rms_norm",
            out=addr(out),
            x=addr(x),
            x_stride=stride,
            weight=addr(_weight(weight)),
            T=T,
            n=n,
            eps=eps,
            nthreads=nthreads,
        )
    return out


def _writable_rows(x: np.ndarray) -> bool:
    return x.dtype == np.float32 and x.flags.c_contiguous and x.flags.writeable


def fused_add_rms_norm(
    lib: NativeLibrary, x: np.ndarray, residual: np.ndarray, weight: np.ndarray, eps: float, nthreads: int
) -> tuple[np.ndarray, np.ndarray]:
    """x, residual: (T, dim) -> (rms_norm(x + residual), x + residual), float32. Like the
    other backends, it reuses the inputs' memory: the sum goes into residual and the
    normed rows into x when those are C-contiguous float32 (else into new arrays)."""
    return fused_add_norm(lib, "rp_fused_add_rms_norm", x, residual, eps, nthreads, weight=weight)


def fused_add_norm(
    lib: NativeLibrary, kernel: str, x: np.ndarray, residual: np.ndarray, eps: float, nthreads: int, **vectors
) -> tuple[np.ndarray, np.ndarray]:
    """A residual add + norm kernel (RMSNorm's, vision_ops.c's layer norm) on x and residual,
    reusing their memory as fused_add_rms_norm says; vectors: its weight (and bias), each (dim,)."""
    x, x_stride = float_rows(x)
    residual, r_stride = float_rows(residual)
    T, n = x.shape
    normed = x if _writable_rows(x) else empty((T, n))
    summed = residual if _writable_rows(residual) else empty((T, n))
    if T:
        lib.call(
            kernel,
            normed=addr(normed),
            sum=addr(summed),
            x=addr(x),
            x_stride=x_stride,
            residual=addr(residual),
            residual_stride=r_stride,
            **{name: addr(_weight(v)) for name, v in vectors.items()},
            T=T,
            n=n,
            eps=eps,
            nthreads=nthreads,
        )
    return normed, summed


def rope(
    lib: NativeLibrary,
    positions: np.ndarray,
    q: np.ndarray,
    k: np.ndarray,
    cos_sin: np.ndarray,
    is_neox: bool,
    nthreads: int,
) -> None:
    """positions: (T,), q: (T, H, D), k: (T, Hkv, D), cos_sin: (max_pos, D) float32 =
    [cos | sin] per position. In place. q and k may be views into the fused qkv output
    (rows of (H + 2 Hkv) D): read and written through their row stride. Any other
    layout is rotated in a copy and written back."""
    T, H, D = q.shape
    Hkv = k.shape[1]
    if cos_sin.shape[1] != D or D % 2:
        raise ValueError(f"cos_sin {cos_sin.shape} does not fit heads of {D} (rotary over the whole head)")
    if T == 0:
        return
    q_work, q_stride = float_rows(q)
    k_work, k_stride = float_rows(k)
    cos_sin = _weight(cos_sin)
    lib.call(
        "rp_rope",
        positions=addr(int32_rows(positions)),
        q=addr(q_work),
        q_stride=q_stride,
        k=addr(k_work),
        k_stride=k_stride,
        cos_sin=addr(cos_sin),
        T=T,
        H=H,
        Hkv=Hkv,
        D=D,
        is_neox=int(is_neox),
        nthreads=nthreads,
    )
    if q_work is not q:
        q[...] = q_work
    if k_work is not k:
        k[...] = k_work


def _gated(lib: NativeLibrary, name: str, x: np.ndarray, nthreads: int) -> np.ndarray:
    x, stride = float_rows(x)
    T, I = x.shape[0], x.shape[1] // 2
    out = empty((T, I))
    if T:
        lib.call(name, out=addr(out), x=addr(x), x_stride=stride, T=T, I=I, nthreads=nthreads)
    return out


def silu_and_mul(lib: NativeLibrary, x: np.ndarray, nthreads: int) -> np.ndarray:
    """x: (T, 2I) holding [gate | up] -> silu(gate) * up, (T, I) float32."""
    return _gated(lib, "rp_silu_and_mul", x, nthreads)


def gelu_tanh_and_mul(lib: NativeLibrary, x: np.ndarray, nthreads: int) -> np.ndarray:
    """x: (T, 2I) holding [gate | up] -> gelu_tanh(gate) * up, (T, I) float32."""
    return _gated(lib, "rp_gelu_tanh_and_mul", x, nthreads)


def write_kv(
    lib: NativeLibrary,
    k: np.ndarray,
    v: np.ndarray,
    k_cache: np.ndarray,
    v_cache: np.ndarray,
    slot_mapping: np.ndarray,
    nthreads: int,
) -> None:
    """k, v: (T, Hkv, D) (views into qkv are fine); k_cache, v_cache: (NB, BS, Hkv, D)
    float32 or float16, C-contiguous (float16 rounds to nearest even on store);
    slot_mapping: (T,), -1 = skip. In place."""
    kv_dtype = KV_DTYPES.get(k_cache.dtype)
    if kv_dtype is None or v_cache.dtype != k_cache.dtype:
        raise TypeError(f"write_kv stores into float32 or float16 caches, got {k_cache.dtype}/{v_cache.dtype}")
    if k_cache.shape[2:] != k.shape[1:] or v_cache.shape != k_cache.shape or v.shape != k.shape:
        raise ValueError(f"K/V rows {k.shape[1:]} do not fit the cache {k_cache.shape}")
    if not (k_cache.flags.c_contiguous and v_cache.flags.c_contiguous):
        raise ValueError("the KV caches must be C-contiguous (NB, BS, Hkv, D) arrays")
    T = len(k)
    if T == 0:
        return
    k, k_stride = float_rows(k)
    v, v_stride = float_rows(v)
    lib.call(
        "rp_write_kv",
        k=addr(k),
        k_stride=k_stride,
        v=addr(v),
        v_stride=v_stride,
        k_cache=addr(k_cache),
        v_cache=addr(v_cache),
        kv_dtype=kv_dtype,
        slot_mapping=addr(int32_rows(slot_mapping)),
        T=T,
        row=k.shape[1] * k.shape[2],
        nthreads=nthreads,
    )


def embedding_rows(lib: NativeLibrary, table: np.ndarray, ids: np.ndarray, nthreads: int) -> np.ndarray:
    """table (V, n) float32 C-contiguous, ids (T,) -> table[ids] (T, n) float32."""
    ids = int32_rows(np.asarray(ids).reshape(-1))  # the batch's own int32 token ids, read in place
    if ids.size and (ids.min() < 0 or ids.max() >= len(table)):
        raise ValueError(f"token ids must be in 0 .. {len(table) - 1}; got {ids.min()} .. {ids.max()}")
    out = empty((ids.size, table.shape[1]))
    if ids.size:
        lib.call(
            "rp_embedding_rows",
            out=addr(out),
            table=addr(_weight(table)),
            ids=addr(ids),
            T=ids.size,
            n=out.shape[1],
            nthreads=nthreads,
        )
    return out
