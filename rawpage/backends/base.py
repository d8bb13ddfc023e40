"""The interface every backend implements. Shapes use T (tokens in the batch),
B (sequences), H / Hkv (query / KV heads), D (head dim), NB (blocks), BS (block size)."""

from __future__ import annotations

from typing import Any

import numpy as np

Array = Any  # numpy.ndarray on cpu and sim, cupy.ndarray on cuda


class Backend:
    name: str
    dtype: np.dtype  # activation and weight dtype

    # --- arrays -----------------------------------------------------------
    def asarray(self, x: np.ndarray, dtype: Any = None) -> Array:
        """Host array -> device array (weights in self.dtype unless dtype given)."""
        raise NotImplementedError

    def to_numpy(self, x: Array) -> np.ndarray:
        raise NotImplementedError

    def zeros(self, shape: tuple[int, ...], dtype: Any = None) -> Array:
        raise NotImplementedError

    # --- ops (see rawpage/ops/* for the math) -------------------------------
    def embedding(self, ids: Array, table: Array) -> Array:
        """ids: (T,) -> (T, dim)."""
        raise NotImplementedError

    def matmul(self, x: Array, w: Array, bias: Array | None = None) -> Array:
        """x: (T, in), w: (out, in) as stored by Linear layers -> x @ w.T (+ bias): (T, out)."""
        raise NotImplementedError

    def rms_norm(self, x: Array, weight: Array, eps: float) -> Array:
        raise NotImplementedError

    def fused_add_rms_norm(self, x: Array, residual: Array, weight: Array, eps: float) -> tuple[Array, Array]:
        """Returns (rms_norm(x + residual), x + residual). May reuse x and residual's memory."""
        raise NotImplementedError

    def rope(self, positions: Array, q: Array, k: Array, cos_sin: Array, is_neox: bool) -> None:
        """q: (T, H, D), k: (T, Hkv, D), in place."""
        raise NotImplementedError

    def write_kv(self, k: Array, v: Array, k_cache: Array, v_cache: Array, slot_mapping: Array) -> None:
        raise NotImplementedError

    def paged_attention(
        self,
        q: Array,
        k_cache: Array,
        v_cache: Array,
        block_tables: Array,
        seq_lens: Array,
        query_start_loc: Array,
        scale: float,
        meta: Any = None,
    ) -> Array:
        """(T, H, D) -> (T, H, D). `meta` carries host-side facts about the batch
        (max query length, which sequences decode) so kernels can pick a launch."""
        raise NotImplementedError

    def silu_and_mul(self, x: Array) -> Array:
        raise NotImplementedError

    def swap_blocks(self, src: Array, dst: Array, block_mapping: np.ndarray) -> None:
        """Copy whole blocks between the device pool and the CPU swap pool (NumPy), either way:
        dst[m[:, 1]] = src[m[:, 0]]."""
        raise NotImplementedError

    def copy_blocks(self, k_caches: list[Array], v_caches: list[Array], block_mapping: np.ndarray) -> None:
        raise NotImplementedError
