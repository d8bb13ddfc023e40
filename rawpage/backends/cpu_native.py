"""The CPU backend on our own C kernels (rawpage/native): what a forward pass runs on
the CPU wherever a C compiler works (--cpu-kernels auto or native).

    linear       GGUF blocks kept as stored, the activations quantized to int8 per 32
                 values once per matmul, integer dot products per block, for decode and
                 prefill alike (native/gguf_matmul.c; at 8-512 rows 2-13x faster than
                 dequantized tiles into BLAS, docs/benchmarks.md). Each row's rounding
                 is its own, so a sequence computes the same whatever its batch. Dense
                 weights (float checkpoints, other formats) go to BLAS as on NumPy.
                 bf16 weights (a bf16 safetensors checkpoint) kept as stored, widened
                 exactly inside the kernel, float32 activations (native/bf16_matmul.c):
                 the float32 model's results from half its bytes
    logits       a Q8_0 LM head with float activations (native/gguf_lm_head.c)
    embedding    a packed (or bf16) table's rows widened as they are looked up, so a
                 tied embedding / LM head is held once, in its stored format
    attention    read in place through the block table, online softmax, each K/V row
                 once per GQA group (native/paged_attention.c), float32 or float16 KV
    small ops    residual add + RMSNorm, RoPE, SiLU/GELU x mul, the K/V write
                 (native/layer_ops.c)

Each kernel splits its rows over the C thread pool (native/pool.c); how many threads
a pass uses is still decided in one place, CpuThreads (cpu_threads.py). What has no
kernel here (an FP8 KV cache, LoRA's small GEMMs, MoE routing) runs on the NumPy
backend this class extends, so every model that runs on --cpu-kernels numpy runs here.
"""

from __future__ import annotations

import logging
from typing import Any

import numpy as np

from rawpage.backends.cpu import CPUBackend
from rawpage.dtypes import bf16_to_f32
from rawpage.native import attention, layer_ops
from rawpage.native.bf16 import bf16_matmul
from rawpage.native.gguf import NATIVE_GGUF, gguf_matmul, gguf_rows
from rawpage.native.library import NativeLibrary
from rawpage.native.lm_head import lm_head_q8_0
from rawpage.ops.lora import LoRALinear
from rawpage.quantization.weight import QuantizedWeight

logger = logging.getLogger("rawpage")


class NativeCPUBackend(CPUBackend):
    keeps_quantized = frozenset({"gguf", "bf16"})
    reads_packed_embedding = True

    def __init__(self, lib: NativeLibrary, cpu_threads: int | None = None) -> None:
        super().__init__(cpu_threads)
        self.lib = lib
        logger.info(
            "CPU kernels: native, %s path; GGUF %s kept quantized, bf16 weights kept bf16",
            lib.path,
            ", ".join(sorted(NATIVE_GGUF)),
        )

    @property
    def kernel_threads(self) -> int:
        """This pass's threads (CpuThreads decides; set at each pass's embedding)."""
        return self.threads.current or 1

    # --- weights --------------------------------------------------------------------
    def prepare_linear(self, w: np.ndarray | QuantizedWeight) -> np.ndarray | QuantizedWeight:
        if isinstance(w, QuantizedWeight) and (w.kind == "bf16" or (w.kind == "gguf" and w.qtype in NATIVE_GGUF)):
            return w.map_arrays(np.ascontiguousarray)  # as stored: (out, row_bytes) uint8 blocks, (out, in) uint16 bf16
        return super().prepare_linear(w)  # dequantized at load

    def linear(self, x: np.ndarray, w: Any, bias: np.ndarray | None = None) -> np.ndarray:
        if isinstance(w, QuantizedWeight) and w.kind == "bf16":
            return bf16_matmul(self.lib, x, w.data, self.kernel_threads, bias)
        if isinstance(w, QuantizedWeight):
            return gguf_matmul(self.lib, x, w.data, w.qtype, w.shape, self.kernel_threads, bias)
        if isinstance(w, LoRALinear):
            return super().linear(x, w, bias)  # base weight through self.linear, then the delta
        return self.matmul(x, w, bias)

    def logits(self, x: np.ndarray, lm_head: Any) -> np.ndarray:
        """A Q8_0 LM head (SmolLM2's tied embedding) read with float activations
        (native/gguf_lm_head.c says why); other heads as any linear layer."""
        if isinstance(lm_head, QuantizedWeight) and lm_head.qtype == "Q8_0":
            return lm_head_q8_0(self.lib, x, lm_head.data, lm_head.shape, self.kernel_threads)
        return self.linear(x, lm_head)

    def embedding(self, ids: np.ndarray, table: np.ndarray | QuantizedWeight) -> np.ndarray:
        if not isinstance(table, QuantizedWeight):
            return super().embedding(ids, table)
        self.threads.set_for(len(ids))
        if table.kind == "bf16":
            return bf16_to_f32(table.data[ids])  # (T, dim): exact
        return gguf_rows(self.lib, table.data, table.qtype, table.shape, ids, self.kernel_threads)

    # --- the small ops ----------------------------------------------------------------
    def rms_norm(self, x, weight, eps):
        return layer_ops.rms_norm(self.lib, x, weight, eps, self.kernel_threads)

    def fused_add_rms_norm(self, x, residual, weight, eps):
        return layer_ops.fused_add_rms_norm(self.lib, x, residual, weight, eps, self.kernel_threads)

    def rope(self, positions, q, k, cos_sin, is_neox):
        layer_ops.rope(self.lib, positions, q, k, cos_sin, is_neox, self.kernel_threads)

    def silu_and_mul(self, x):
        return layer_ops.silu_and_mul(self.lib, x, self.kernel_threads)

    def gelu_tanh_and_mul(self, x):
        return layer_ops.gelu_tanh_and_mul(self.lib, x, self.kernel_threads)

    def write_kv(self, k, v, k_cache, v_cache, slot_mapping):
        if k_cache.dtype == np.uint8:  # FP8 KV: the NumPy path
            return super().write_kv(k, v, k_cache, v_cache, slot_mapping)
        layer_ops.write_kv(self.lib, k, v, k_cache, v_cache, slot_mapping, self.kernel_threads)

    def paged_attention(self, q, k_cache, v_cache, meta, opts):
        if k_cache.dtype == np.uint8:  # FP8 KV: the NumPy path
            return super().paged_attention(q, k_cache, v_cache, meta, opts)
        return attention.paged_attention(self.lib, q, k_cache, v_cache, meta, opts, self.kernel_threads)
