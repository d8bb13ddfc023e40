"""A decoder layer's small kernels: RMSNorm, RoPE, the gated activation and the KV write;
and the vision encoders' LayerNorm and GELUs.

Each section: the math, its NumPy reference, and the launch (grid, block, arguments) of
its kernel in cuda/ (rms_norm.cu, rope.cu, activation.cu, write_kv.cu); the same ops in C
for the CPU are rawpage/native/layer_ops.py."""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from rawpage.ops.launch import (
    KernelLoader,
    ceil_div,
    data_ptr,
    dtype_suffix,
    int32_array,
    require_aligned,
    same_dtype,
    threads_for,
    token_stride,
)

# ======================================================================================
# RMSNorm (cuda/rms_norm.cu), optionally fused with the residual add (Llama's pre-norm blocks).
#
# rms_norm(x)            = x / sqrt(mean(x^2) + eps) * w
# fused_add_rms_norm     : residual = x + residual; x = rms_norm(residual)


def rms_norm_ref(x: np.ndarray, weight: np.ndarray, eps: float) -> np.ndarray:
    """x: (T, dim), weight: (dim,) -> (T, dim), computed in float32."""
    xf = x.astype(np.float32, copy=False)
    inv_rms = 1.0 / np.sqrt(np.einsum("td,td->t", xf, xf)[:, None] / xf.shape[-1] + eps)  # (T, 1)
    out = xf * inv_rms
    out *= weight.astype(np.float32, copy=False)
    return out.astype(x.dtype, copy=False)


def fused_add_rms_norm_ref(
    x: np.ndarray, residual: np.ndarray, weight: np.ndarray, eps: float
) -> tuple[np.ndarray, np.ndarray]:
    """x, residual: (T, dim) -> (normed, new residual = x + residual)."""
    residual = (x.astype(np.float32, copy=False) + residual.astype(np.float32, copy=False)).astype(x.dtype, copy=False)
    return rms_norm_ref(residual, weight, eps), residual


# LayerNorm (same file), fused with the residual add: the vision encoder's norms.
#
# fused_add_layer_norm   : residual = x + residual; x = (residual - mean) / sqrt(var + eps) * w + b


def fused_add_layer_norm_ref(
    x: np.ndarray, residual: np.ndarray, weight: np.ndarray, bias: np.ndarray, eps: float
) -> tuple[np.ndarray, np.ndarray]:
    """x, residual: (T, dim); weight, bias: (dim,) -> (normed, new residual = x + residual)."""
    residual = (x.astype(np.float32, copy=False) + residual.astype(np.float32, copy=False)).astype(x.dtype, copy=False)
    r = residual.astype(np.float32, copy=False)
    mu = r.mean(axis=-1, keepdims=True)  # (T, 1)
    var = np.square(r - mu).mean(axis=-1, keepdims=True)
    normed = (r - mu) / np.sqrt(var + np.float32(eps)) * weight.astype(np.float32) + bias.astype(np.float32)
    return normed.astype(x.dtype, copy=False), residual


# --- launch (cuda/rms_norm.cu) -------------------------------------------------------
# Grid: min(T, resident blocks); each block walks rows T strided by the grid and
# keeps its slice of the weight in registers. Block: one thread per 16-byte
# chunk of a row (512 threads at dim 4096 in 16-bit), up to 1024; past that each
# thread holds N = 2 chunks (rows that are not 16-byte aligned go element by
# element, up to 8 a thread). The row stays in registers between its read and
# its write, so each byte moves once.

CHUNKS_PER_THREAD = {True: (1, 2), False: (1, 2, 4, 8)}  # as compiled, by vectorized
LAYER_NORM_16BIT_VECTOR_CHUNKS = (1,)  # fused_add_layer_norm's (its bias in registers too)
THREADS_PER_SM = 2048  # resident threads per SM on sm_80 and sm_90


def norm_launch(loader: KernelLoader, kernel: str, x: Any, *arrays: Any) -> tuple[Any, tuple[int], tuple[int]]:
    """(kernel function, grid, block) for a norm over the rows of contiguous x (T, dim)
    that also reads or writes `arrays` (the weight, the bias, the residual) in chunks."""
    T, dim = x.shape
    vec = 16 // x.itemsize
    if dim % vec or any(data_ptr(a) % 16 for a in (x, *arrays)):
        vec = 1  # rows not in 16-byte chunks: element by element
    chunks = dim // vec
    per_thread = CHUNKS_PER_THREAD[vec > 1]
    if kernel == "fused_add_layer_norm" and vec > 1 and x.itemsize == 2:
        per_thread = LAYER_NORM_16BIT_VECTOR_CHUNKS
    n = next((n for n in per_thread if chunks <= n * 1024), None)
    if n is None:
        longest = per_thread[-1] * 1024 * vec
        raise ValueError(f"{kernel} supports rows of up to {longest} elements of {x.dtype}, got {dim}")
    threads = threads_for(ceil_div(chunks, n))
    resident = int(getattr(loader, "sm_count", 132)) * max(1, THREADS_PER_SM // threads)
    fn = loader.get_function("rms_norm.cu", f"{kernel}_{dtype_suffix(x)}_v{vec}_n{n}")
    return fn, (min(T, resident),), (threads,)


def launch_rms_norm(xp: Any, loader: KernelLoader, x: Any, weight: Any, eps: float) -> Any:
    """x: (T, dim), weight: (dim,) -> (T, dim)."""
    same_dtype(x, weight)
    x = xp.ascontiguousarray(x)
    out = xp.empty_like(x)
    T, dim = x.shape
    if T:
        kernel, grid, block = norm_launch(loader, "rms_norm", x, out, weight)
        kernel(grid, block, (out, x, weight, np.float32(eps), np.int32(dim), np.int32(T)))
    return out


def launch_fused_add_rms_norm(
    xp: Any, loader: KernelLoader, x: Any, residual: Any, weight: Any, eps: float
) -> tuple[Any, Any]:
    """x, residual: (T, dim) -> (rms_norm(x + residual), x + residual), in x's and
    residual's memory when they are contiguous."""
    same_dtype(x, residual, weight)
    x, residual = xp.ascontiguousarray(x), xp.ascontiguousarray(residual)
    T, dim = x.shape
    if T:
        kernel, grid, block = norm_launch(loader, "fused_add_rms_norm", x, residual, weight)
        kernel(grid, block, (x, residual, weight, np.float32(eps), np.int32(dim), np.int32(T)))
    return x, residual


def launch_fused_add_layer_norm(
    xp: Any, loader: KernelLoader, x: Any, residual: Any, weight: Any, bias: Any, eps: float
) -> tuple[Any, Any]:
    """x, residual: (T, dim) -> (layer_norm(x + residual), x + residual), in x's and
    residual's memory when they are contiguous. Launched as fused_add_rms_norm."""
    same_dtype(x, residual, weight, bias)
    x, residual = xp.ascontiguousarray(x), xp.ascontiguousarray(residual)
    T, dim = x.shape
    if T:
        kernel, grid, block = norm_launch(loader, "fused_add_layer_norm", x, residual, weight, bias)
        kernel(grid, block, (x, residual, weight, bias, np.float32(eps), np.int32(dim), np.int32(T)))
    return x, residual


# ======================================================================================
# Rotary position embedding (RoPE, cuda/rope.cu), applied to q and k in place.
#
# For each head vector x of size D and position p, pairs of lanes (a, b) are
# rotated by the angle p * inv_freq[j]:
#     a' = a cos - b sin,   b' = b cos + a sin
# NeoX style pairs lane j with j + D/2 (Hugging Face's Llama); GPT-J style pairs
# lanes 2j and 2j + 1 (llama.cpp's native layout).


def cos_sin_cache(inv_freq: np.ndarray, max_position: int) -> np.ndarray:
    """(max_position, D) float32: row p is [cos(p f_0..f_{D/2-1}) | sin(...)]."""
    angles = np.outer(np.arange(max_position, dtype=np.float64), inv_freq)
    return np.concatenate([np.cos(angles), np.sin(angles)], axis=1).astype(np.float32)


def rope_ref(positions: np.ndarray, q: np.ndarray, k: np.ndarray, cos_sin: np.ndarray, is_neox: bool = True) -> None:
    """positions: (T,), q: (T, H, D), k: (T, Hkv, D), cos_sin: (max_pos, D). In place."""
    half = cos_sin.shape[1] // 2
    cos = cos_sin[positions, :half][:, None, :]  # (T, 1, D/2)
    sin = cos_sin[positions, half:][:, None, :]
    for x in (q, k):
        if is_neox:
            a, b = x[..., :half], x[..., half:]
        else:
            a, b = x[..., 0::2], x[..., 1::2]
        a32, b32 = a.astype(np.float32), b.astype(np.float32)
        a[...] = a32 * cos - b32 * sin
        b[...] = b32 * cos + a32 * sin


# --- launch (cuda/rope.cu) -----------------------------------------------------------
# Grid: flat over (token, group of 8 heads, 16-byte chunk of a head vector), 128
# threads a block. A thread reads its chunk's cos/sin once and rotates that
# chunk of each of the group's heads, as 16-byte vectors.

ROPE_THREADS = 128
ROPE_HEAD_GROUP = 8  # heads that share one read of a chunk's cos/sin, as compiled


def _vector_width(q: Any, k: Any, cos_sin: Any, is_neox: bool) -> tuple[bool, int]:
    """(16-byte loads?, rotation pairs one thread takes per head). Vector loads need
    16-byte aligned rows and a head size that splits into whole vectors."""
    D = q.shape[-1]
    pairs = 16 // q.itemsize if is_neox else 16 // q.itemsize // 2
    aligned = all(data_ptr(a) % 16 == 0 for a in (q, k, cos_sin)) and all(
        (token_stride(a) * a.itemsize) % 16 == 0 for a in (q, k)
    )
    if aligned and (D // 2) % pairs == 0 and (D * 4) % 16 == 0:
        return True, pairs
    return False, 2 if is_neox else 1


def launch_rope(
    xp: Any,
    loader: KernelLoader,
    positions: Any,
    q: Any,
    k: Any,
    cos_sin: Any,
    is_neox: bool = True,
) -> None:
    """positions: (T,) int32, q: (T, H, D), k: (T, Hkv, D), cos_sin: (max_pos, D) float32.
    In place; q and k may be views into a wider buffer (the fused qkv output)."""
    same_dtype(q, k)
    T, H, D = q.shape
    Hkv = k.shape[1]
    if cos_sin.dtype != np.float32 or cos_sin.shape[1] != D:
        raise ValueError(f"cos_sin must be float32 (max_pos, {D}), got {cos_sin.dtype} {cos_sin.shape}")
    if D % 4:
        raise ValueError(f"rope needs a head size that is a multiple of 4, got {D}")
    if T == 0:
        return
    # Rows must be contiguous; otherwise rotate a contiguous copy and write it back.
    q_work = q if token_stride(q) is not None else xp.ascontiguousarray(q)
    k_work = k if token_stride(k) is not None else xp.ascontiguousarray(k)
    cos_sin = xp.ascontiguousarray(xp.asarray(cos_sin))
    vector, pairs = _vector_width(q_work, k_work, cos_sin, is_neox)
    style = "neox" if is_neox else "gptj"
    kernel = loader.get_function("rope.cu", f"rope_{dtype_suffix(q)}_{style}{'' if vector else '_scalar'}")
    threads = T * ceil_div(H + Hkv, ROPE_HEAD_GROUP) * (D // 2 // pairs)
    args = (
        int32_array(xp, positions),
        q_work,
        k_work,
        cos_sin,
        np.int32(D),
        np.int32(H),
        np.int32(Hkv),
        np.int32(token_stride(q_work)),
        np.int32(token_stride(k_work)),
        np.int32(T),
    )
    kernel((ceil_div(threads, ROPE_THREADS),), (ROPE_THREADS,), args)
    if q_work is not q:
        q[...] = q_work
    if k_work is not k:
        k[...] = k_work


# ======================================================================================
# MLP activations (cuda/activation.cu); the gated ones on [gate | up]:
# SwiGLU  silu_and_mul(x)      = silu(g) * u,  silu(g) = g * sigmoid(g)
# GeGLU   gelu_tanh_and_mul(x) = gelu(g) * u,  gelu's tanh approximation (Gemma)
#         gelu_tanh(x)         = gelu(x)       (SigLIP's MLP, ungated)
#         gelu_erf(x)          = x Phi(x) = x/2 (1 + erf(x / sqrt(2)))   exact GELU, torch's
#                                nn.GELU() (Qwen2.5-VL's patch merger), ungated


def silu_and_mul_ref(x: np.ndarray) -> np.ndarray:
    """x: (T, 2I) holding [gate | up] -> (T, I)."""
    d = x.shape[-1] // 2
    g = x[..., :d].astype(np.float32)  # a copy, in float32
    u = x[..., d:]
    # silu(g) * u = g / (1 + exp(-g)) * u, in place on one buffer (this op is hot on the CPU path).
    # exp(-g) -> inf for very negative g gives silu = -0, which is right.
    with np.errstate(over="ignore"):
        s = np.negative(g)
        np.exp(s, out=s)
        s += 1.0
        np.divide(g, s, out=s)
        s *= u
    return s.astype(x.dtype, copy=False)


def gelu_tanh_ref(x: np.ndarray) -> np.ndarray:
    """x: (T, I) -> (T, I) in float32. gelu(g) ~= g/2 * (1 + tanh(sqrt(2/pi) * (g + 0.044715 g^3)))"""
    g = x.astype(np.float32)
    inner = np.float32(np.sqrt(2.0 / np.pi)) * (g + np.float32(0.044715) * g * g * g)
    return 0.5 * g * (1.0 + np.tanh(inner))


def gelu_erf_ref(x: np.ndarray) -> np.ndarray:
    """x: (T, I) -> x Phi(x): (T, I) float32. NumPy has no erf: Abramowitz and Stegun 7.1.26
    (absolute error under 1.5e-7; the kernels call erff)."""
    g = x.astype(np.float32)
    z = np.abs(g) / np.float32(math.sqrt(2.0))
    t = 1.0 / (1.0 + 0.3275911 * z)
    poly = t * (0.254829592 + t * (-0.284496736 + t * (1.421413741 + t * (-1.453152027 + t * 1.061405429))))
    erf = np.sign(g) * (1.0 - poly * np.exp(-z * z))
    return (0.5 * g * (1.0 + erf)).astype(np.float32)


def gelu_tanh_and_mul_ref(x: np.ndarray) -> np.ndarray:
    """x: (T, 2I) holding [gate | up] -> (T, I)."""
    d = x.shape[-1] // 2
    return (gelu_tanh_ref(x[..., :d]) * x[..., d:]).astype(x.dtype, copy=False)


# --- launch (cuda/activation.cu) -----------------------------------------------------
# Grid: flat over the output's 16-byte chunks, capped at the blocks the GPU holds
# at once (threads then stride by the grid). Block: 256 threads, one chunk each.

SILU_THREADS = 256
SILU_BLOCKS_PER_SM = 8  # 2048 resident threads per SM on sm_80 and sm_90


def launch_activation(xp: Any, loader: KernelLoader, x: Any, name: str = "silu_and_mul") -> Any:
    """name: silu_and_mul or gelu_tanh_and_mul, x (T, 2I) holding [gate | up] -> (T, I);
    gelu_tanh or gelu_erf, x (T, I) -> (T, I)."""
    x = xp.ascontiguousarray(x)
    T, d = x.shape[0], x.shape[1] // 2 if name.endswith("_and_mul") else x.shape[1]
    out = xp.empty((T, d), dtype=x.dtype)
    if T:
        vec = 16 // x.itemsize
        if d % vec or data_ptr(x) % 16 or data_ptr(out) % 16:
            vec = 1
        kernel = loader.get_function("activation.cu", f"{name}_{dtype_suffix(x)}_v{vec}")
        blocks = min(ceil_div(T * d // vec, SILU_THREADS), int(getattr(loader, "sm_count", 132)) * SILU_BLOCKS_PER_SM)
        kernel((blocks,), (SILU_THREADS,), (out, x, np.int32(d), np.int32(T)))
    return out


def launch_silu_and_mul(xp: Any, loader: KernelLoader, x: Any) -> Any:
    """x: (T, 2I) holding [gate | up] -> (T, I)."""
    return launch_activation(xp, loader, x, "silu_and_mul")


# ======================================================================================
# Scatter this step's new K and V rows into the paged KV cache (cuda/write_kv.cu).
#
# slot_mapping[t] = block_id * BS + offset is where token t's K/V live; -1 means
# "do not store" (padding tokens).


def write_kv_ref(
    k: np.ndarray, v: np.ndarray, k_cache: np.ndarray, v_cache: np.ndarray, slot_mapping: np.ndarray
) -> None:
    """k, v: (T, Hkv, D); k_cache, v_cache: (NB, BS, Hkv, D); slot_mapping: (T,) int. In place."""
    nb, bs = k_cache.shape[:2]
    keep = slot_mapping >= 0
    slots = slot_mapping[keep]
    k_cache.reshape(nb * bs, *k_cache.shape[2:])[slots] = k[keep]
    v_cache.reshape(nb * bs, *v_cache.shape[2:])[slots] = v[keep]


# --- launch (cuda/write_kv.cu) -------------------------------------------------------
# Grid: one block per token. Block: threads striding over the token's K/V row
# (Hkv * D elements) in 16-byte chunks; the kernel moves bytes, so it has no
# dtype variants.


def launch_write_kv(
    xp: Any, loader: KernelLoader, k: Any, v: Any, k_cache: Any, v_cache: Any, slot_mapping: Any
) -> None:
    """k, v: (T, Hkv, D), rows contiguous (views into qkv are fine);
    k_cache, v_cache: (NB, BS, Hkv, D); slot_mapping: (T,) int, -1 = skip. In place."""
    same_dtype(k, v, k_cache, v_cache)
    T = k.shape[0]
    row_bytes = k.shape[1] * k.shape[2] * k.itemsize
    if T == 0:
        return
    if row_bytes % 16 or k_cache.shape[2:] != k.shape[1:]:
        raise ValueError(f"K/V rows {k.shape[1:]} do not fit the cache {k_cache.shape}")
    k = k if token_stride(k) is not None else xp.ascontiguousarray(k)
    v = v if token_stride(v) is not None else xp.ascontiguousarray(v)
    k_stride, v_stride = token_stride(k) * k.itemsize, token_stride(v) * v.itemsize
    require_aligned("k", k, k_stride)
    require_aligned("v", v, v_stride)
    require_aligned("k_cache", k_cache)
    require_aligned("v_cache", v_cache)
    chunks = row_bytes // 16
    kernel = loader.get_function("write_kv.cu", "write_kv")
    args = (
        k,
        v,
        k_cache,
        v_cache,
        int32_array(xp, slot_mapping),
        np.int32(chunks),
        np.int32(k_stride // 16),
        np.int32(v_stride // 16),
    )
    kernel((T,), (threads_for(chunks, 256),), args)
