"""The backend that runs our CUDA kernels, on whichever array module it is given.

`sim` gives it NumPy arrays and kernels compiled for the CPU; `cuda` gives it
CuPy arrays and kernels compiled by NVRTC. Every op goes through the launch
code in rawpage/ops, so the grid and block computation, argument packing and
dtype dispatch that run on the GPU are the ones the simulator tests.

GEMMs and the embedding gather are not our kernels: here they are array-module
calls with float32 accumulation (NumPy BLAS under sim; the cuda backend
overrides matmul to reach cuBLAS directly).

Activations, weights and KV caches are stored in `dtype`: float32, float16, or
bfloat16 as uint16 bits (see rawpage/dtypes.py). With --kv-cache-dtype fp8 the
KV caches are uint8 e4m3 codes instead: write_kv and paged_attention see the
dtype of the cache they are given and go to the FP8 kernels, with the scales
set by set_kv_scales().
"""

from __future__ import annotations

from typing import Any

import numpy as np

from rawpage.backends.base import Array, Backend
from rawpage.dtypes import (
    BFLOAT16,
    bf16_from_f32,
    bf16_to_f32,
    dtype_name,
    from_float32,
    storage_dtype,
    to_float32,
)
from rawpage.ops.attention_metadata import AttentionMetadata, AttentionOptions
from rawpage.ops.cache_ops import launch_copy_blocks
from rawpage.ops.fp8_linear import launch_fp8_linear
from rawpage.ops.gguf_linear import launch_gguf_linear
from rawpage.ops.int4_linear import launch_int4_linear
from rawpage.ops.kv_cache_fp8 import launch_write_kv_fp8
from rawpage.ops.launch import KernelLoader
from rawpage.ops.layer_ops import (
    launch_activation,
    launch_fused_add_layer_norm,
    launch_fused_add_rms_norm,
    launch_rms_norm,
    launch_rope,
    launch_silu_and_mul,
    launch_write_kv,
)
from rawpage.ops.lora import LoRALinear, launch_lora_expand, launch_lora_shrink
from rawpage.ops.moe_grouped_gemm import launch_grouped_gemm
from rawpage.ops.paged_attention import launch_encoder_attention, launch_paged_attention
from rawpage.quantization.gguf import GGUF_BLOCKS
from rawpage.quantization.weight import QuantizedWeight, RowStack, dequantize


class KernelBackend(Backend):
    keeps_quantized = frozenset({"gguf", "int4", "fp8"})
    # The FP8 GEMM for FP8 weights in prefill (ops/fp8_linear.py Fp8Gemm): cuBLASLt on
    # sm_89 / sm_90 (set by the cuda backend); None dequantizes and runs matmul.
    fp8_gemm = None

    def __init__(self, xp: Any, loader: KernelLoader, dtype: str = "float32") -> None:
        self.xp, self.loader = xp, loader
        self.dtype = storage_dtype(dtype)
        self.dtype_name = dtype_name(self.dtype)

    # --- arrays -----------------------------------------------------------
    def asarray(self, x: np.ndarray, dtype: Any = None) -> Array:
        """Host array -> device array in `dtype` (default: the backend's dtype).
        float data headed for bfloat16 is rounded to nearest even."""
        target = self.dtype if dtype is None else np.dtype(dtype)
        host = np.asarray(x)
        if target == BFLOAT16 and host.dtype != BFLOAT16:
            host = bf16_from_f32(host)
        return self.xp.ascontiguousarray(self.xp.asarray(host, dtype=target))

    def to_numpy(self, x: Array) -> np.ndarray:
        """Device array -> NumPy; bfloat16 comes back as float32 (NumPy has no bfloat16)."""
        host = x if isinstance(x, np.ndarray) else x.get()
        return bf16_to_f32(host) if host.dtype == BFLOAT16 else host

    def zeros(self, shape: tuple[int, ...], dtype: Any = None) -> Array:
        return self.xp.zeros(shape, dtype=self.dtype if dtype is None else dtype)

    # --- ops not written as our kernels -------------------------------------
    def embedding(self, ids: Array, table: Array) -> Array:
        return table[ids]

    def matmul(self, x: Array, w: Array, bias: Array | None = None) -> Array:
        y = to_float32(x) @ to_float32(w).T  # (T, out), float32 accumulation
        if bias is not None:
            y += to_float32(bias)
        return from_float32(y, self.dtype)

    # --- Linear layers: dense to the GEMM, quantized to our kernels --------------
    def prepare_linear(self, w: Array | QuantizedWeight) -> Array | QuantizedWeight:
        """Dense weights stay (out, in). GGUF blocks we have kernels for, int4 and fp8 are
        uploaded as packed (a RowStack part by part); any other quantized weight is
        dequantized to the model dtype."""
        if isinstance(w, RowStack):
            parts = [self.prepare_linear(p) for p in w.parts]
            return (
                RowStack(parts) if all(isinstance(p, QuantizedWeight) for p in parts) else self.asarray(dequantize(w))
            )
        if isinstance(w, QuantizedWeight):
            if w.kind in ("int4", "fp8") or (w.kind == "gguf" and w.qtype in GGUF_BLOCKS):
                return w.map_arrays(self.xp.asarray)
            return self.asarray(dequantize(w))
        return w

    def linear(self, x: Array, w: Array | QuantizedWeight, bias: Array | None = None) -> Array:
        if isinstance(w, RowStack):  # each part's columns, then side by side
            cols = np.cumsum([0] + [p.shape[0] for p in w.parts])
            parts = [self.linear(x, p, None if bias is None else bias[a:b]) for p, a, b in zip(w.parts, cols, cols[1:])]
            return self.xp.concatenate(parts, axis=1)
        if isinstance(w, QuantizedWeight) and w.kind == "gguf":
            return launch_gguf_linear(self.xp, self.loader, x, w.data, w.qtype, w.shape, bias, self.matmul)
        if isinstance(w, QuantizedWeight) and w.kind == "int4":
            return launch_int4_linear(self.xp, self.loader, x, w, bias, self.matmul)
        if isinstance(w, QuantizedWeight) and w.kind == "fp8":
            return launch_fp8_linear(self.xp, self.loader, x, w, bias, self.matmul, self.fp8_gemm)
        return super().linear(x, w, bias)

    # --- MoE experts: one grouped GEMM over all experts (cuda/moe_grouped_gemm.cu) ---------
    def stack_experts(self, ws: list[Array | QuantizedWeight]) -> Array | None:
        """Dense experts stacked (E, out, in); quantized ones keep their per-expert kernels."""
        if any(isinstance(w, QuantizedWeight) for w in ws):
            return None
        return self.xp.ascontiguousarray(self.xp.stack(ws))

    def grouped_linear(
        self, x: Array, ws: list[Array | QuantizedWeight], stacked: Array | None, offsets: np.ndarray
    ) -> Array:
        if stacked is None:
            return super().grouped_linear(x, ws, stacked, offsets)
        return launch_grouped_gemm(self.xp, self.loader, x, stacked, offsets)

    def add_lora(self, y: Array, x: Array, w: LoRALinear) -> None:
        """Segmented shrink then expand (cuda/lora.cu), one launch each whatever the mix
        of adapters, reading the slots from the device: a decode graph captures them."""
        lb = w.batch
        if lb.seg_slots is None:  # a forward pass without adapter metadata (the memory profile)
            return
        v = launch_lora_shrink(self.xp, self.loader, x, w.slots.a, lb.seg_starts, lb.seg_slots)  # (T, R) float32
        launch_lora_expand(self.xp, self.loader, y, v, w.slots.b, lb.seg_starts, lb.seg_slots)

    # --- our kernels ----------------------------------------------------------
    def rms_norm(self, x: Array, weight: Array, eps: float) -> Array:
        return launch_rms_norm(self.xp, self.loader, x, weight, eps)

    def fused_add_rms_norm(self, x: Array, residual: Array, weight: Array, eps: float) -> tuple[Array, Array]:
        return launch_fused_add_rms_norm(self.xp, self.loader, x, residual, weight, eps)

    def rope(self, positions: Array, q: Array, k: Array, cos_sin: Array, is_neox: bool) -> None:
        launch_rope(self.xp, self.loader, positions, q, k, cos_sin, is_neox)

    def set_kv_scales(self, kv_scales: np.ndarray) -> None:
        """(k_scale, v_scale) of an FP8 KV cache, kept on the device (a captured graph
        reads the array, so later values would reach it too)."""
        self.kv_scales = self.xp.asarray(np.asarray(kv_scales, np.float32))

    def write_kv(self, k: Array, v: Array, k_cache: Array, v_cache: Array, slot_mapping: Array) -> None:
        if k_cache.dtype == np.uint8:
            launch_write_kv_fp8(self.xp, self.loader, k, v, k_cache, v_cache, slot_mapping, self.fp8_scales())
            return
        launch_write_kv(self.xp, self.loader, k, v, k_cache, v_cache, slot_mapping)

    def paged_attention(
        self, q: Array, k_cache: Array, v_cache: Array, meta: AttentionMetadata, opts: AttentionOptions
    ) -> Array:
        kv_scales = self.fp8_scales() if k_cache.dtype == np.uint8 else None
        return launch_paged_attention(self.xp, self.loader, q, k_cache, v_cache, meta, opts, kv_scales=kv_scales)

    def silu_and_mul(self, x: Array) -> Array:
        return launch_silu_and_mul(self.xp, self.loader, x)

    def gelu_tanh_and_mul(self, x: Array) -> Array:
        return launch_activation(self.xp, self.loader, x, "gelu_tanh_and_mul")

    def gelu_tanh(self, x: Array) -> Array:
        return launch_activation(self.xp, self.loader, x, "gelu_tanh")

    def fused_add_layer_norm(
        self, x: Array, residual: Array, weight: Array, bias: Array, eps: float
    ) -> tuple[Array, Array]:
        return launch_fused_add_layer_norm(self.xp, self.loader, x, residual, weight, bias, eps)

    def gelu_erf(self, x: Array) -> Array:
        return launch_activation(self.xp, self.loader, x, "gelu_erf")

    def encoder_attention(
        self, q: Array, k: Array, v: Array, scale: float, cu_seqlens: np.ndarray | None = None
    ) -> Array:
        return launch_encoder_attention(self.xp, self.loader, q, k, v, scale, cu_seqlens)

    def copy_blocks(self, k_caches: list[Array], v_caches: list[Array], block_mapping: np.ndarray) -> None:
        launch_copy_blocks(self.xp, self.loader, k_caches, v_caches, block_mapping)

    def swap_blocks(self, src: Array, dst: Array, block_mapping: np.ndarray) -> None:
        """Whole blocks between the device pool and the host swap pool, either way."""
        m = np.asarray(block_mapping)
        if isinstance(dst, np.ndarray):  # device -> host (a no-op conversion under sim)
            blocks = src[self.xp.asarray(m[:, 0])]
            dst[m[:, 1]] = blocks if self.xp is np else self.xp.asnumpy(blocks)
        else:  # host -> device
            dst[self.xp.asarray(m[:, 1])] = self.xp.asarray(src[m[:, 0]])
