"""The CPU backend: float32 activations on the host, each op dispatched in a line or two
to our C kernels (rawpage/native) where the library is loaded and the kernel reads the
input, else to its NumPy reference in rawpage/ops.

With the library (--cpu-kernels native, or auto wherever a C compiler works):

    linear       GGUF weights in every format of the table, repacked once at load into
                 panels of 16 rows (the file's bytes in another order), the activations
                 quantized to int8 per 32 values once per matmul, integer dot products
                 of 16 rows x 4 values per instruction, for decode and prefill alike
                 (native/gguf_matmul.c). Each token's rounding is its own, so a sequence
                 computes the same whatever its batch. Dense weights (float checkpoints)
                 go to BLAS as on NumPy.
                 bf16 and f16 weights (a bf16 safetensors checkpoint, a GGUF's BF16 and
                 F16 tensors) kept as stored, widened exactly inside the kernel, float32
                 activations (native/half_matmul.c): the float32 model's results from
                 half its bytes
    logits       a GGUF LM head with the activations rounded twice (15 bits: the
                 remainder of the int8 rounding rounded again), since its rounding
                 lands in the logits
    embedding    a packed (or bf16) table's rows widened as they are looked up, so a
                 tied embedding / LM head is held once, in its stored format
    attention    read in place through the block table, online softmax, each K/V row
                 once per GQA group (native/paged_attention.c), float32 or float16 KV
    small ops    residual add + RMSNorm, RoPE, SiLU/GELU x mul, the K/V write
                 (native/layer_ops.c)
    NumPy        what has no kernel: an FP8 (uint8) KV cache's write and attention,
                 LoRA's small GEMMs, MoE routing, dense float32 weights (BLAS)

Without it (--cpu-kernels numpy, or auto where no compiler works) every op is its
reference, quantized weights are dequantized at load and the GEMMs are OpenBLAS's:
the readable float32 path the kernels are tested against, not a tuned one.

Each kernel splits its rows over the C thread pool (native/pool.c); how many threads
a pass uses, there and in BLAS, is decided in one place, CpuThreads (cpu_threads.py).

Graphs: with the kernels, a decode step of up to GRAPH_MAX_BATCH sequences replays a
recording of its forward pass, every kernel call of it made again from C in one call
(capture_graph, NativeGraph; native/graph.c): the CPU's CUDA graphs, with the same
bookkeeping (rawpage/decode_graphs.py). A forward pass that needs work outside the
kernels (dense weights in BLAS, LoRA, an FP8 cache) cannot be recorded and runs eagerly.
"""

from __future__ import annotations

import logging
import mmap
from collections.abc import Callable
from dataclasses import replace
from typing import Any

import numpy as np

from rawpage._blas_env import spin_is_short
from rawpage.backends.base import Backend, Graph, GraphNotCaptured
from rawpage.backends.cpu_malloc import keep_freed_memory, release_freed_memory
from rawpage.backends.cpu_threads import CpuThreads
from rawpage.native import attention, bf16_gemm, layer_ops, vision_ops
from rawpage.native.bf16_gemm import Bf16Panels
from rawpage.native.gguf import NATIVE_GGUF, gguf_matmul, gguf_rows, repack
from rawpage.native.half import half_matmul, half_rows
from rawpage.native.library import Arena, NativeLibrary, NotCapturable, capturing, empty, recording
from rawpage.ops.cache_ops import copy_blocks_ref, swap_blocks_ref
from rawpage.ops.kv_cache_fp8 import paged_attention_fp8_ref, write_kv_fp8_ref
from rawpage.ops.layer_ops import (
    fused_add_layer_norm_ref,
    fused_add_rms_norm_ref,
    gelu_erf_ref,
    gelu_tanh_and_mul_ref,
    gelu_tanh_ref,
    rms_norm_ref,
    rope_ref,
    silu_and_mul_ref,
    write_kv_ref,
)
from rawpage.ops.paged_attention import encoder_attention_ref, image_rows_ref, paged_attention_ref
from rawpage.quantization.weight import QuantizedWeight, RowStack, dequantize

logger = logging.getLogger("rawpage")

# Arrays this large (the KV pool's layers, the swap space) are mapped zero pages.
_LAZY_ZEROS_BYTES = 16 << 20

# The largest decode batch replayed from a recording. Replaying saves the ~300 kernel
# calls' Python and ctypes: measured on the default model (tools/profile_step.py, quiet
# 2-core VM), 14% of a batch-1 step (5.4 against 6.3 ms), 11% at batch 8 (18.4 against
# 20.7), 3-5% at batch 32 (docs/benchmarks.md), so the buckets stop where most of the
# saving does: 1, 2, 4 and 8. (Their temporaries are not what stops them: the recordings
# share one arena, and a temporary's bytes are reused once it dies, library.Arena; the
# 1B and 3B shapes' four recordings hold 2 MiB.)
GRAPH_MAX_BATCH = 8


class NativeGraph(Graph):
    """A forward pass recorded as its kernel calls (native/library.py Recording) and
    replayed in one C call. NumPy work inside fn would not be replayed: the ops that
    would do some raise NotCapturable while recording, and DecodeGraphs checks each
    recording against a fresh run of fn on other inputs (needs_check)."""

    needs_check = True

    def __init__(self, backend: CPUBackend, fn: Callable[[], np.ndarray]) -> None:
        self.fn, self.backend = fn, backend
        with recording(backend.lib, backend.arena) as self.recording:
            self.output = fn()  # (rows, dim), written by the last recorded call

    def replay(self) -> np.ndarray:
        self.recording.replay(self.backend.threads.set_for(len(self.output)))
        return self.output


class CPUBackend(Backend):
    name = "cpu"

    def __init__(
        self, lib: NativeLibrary | None = None, cpu_threads: int | None = None, bf16_tower: bool | None = None
    ) -> None:
        self.lib = lib  # the C kernels, or None: every op on its NumPy reference
        self.dtype = np.dtype(np.float32)
        self.threads = CpuThreads(cpu_threads)
        # The kernels read GGUF blocks and bf16 as stored, and a packed embedding by rows.
        self.keeps_quantized = frozenset({"gguf", "bf16", "f16"}) if lib else frozenset()
        self.reads_packed_embedding = lib is not None
        self.arena = Arena()  # the recordings' temporaries, shared (library.Arena)
        self.repacked = [0, 0]  # bytes of GGUF blocks repacked into panels, and of the panels
        # bf16_tower: vision towers in bfloat16 on native/bf16_gemm.c; None (auto): where the
        # CPU multiplies bf16 at twice float32's rate (AVX512-BF16's vdpbf16ps). get_backend
        # passes False for --dtype float32: towers in float32 then, their GEMMs in BLAS.
        self.bf16_tower = lib is not None and (bf16_gemm.bf16_dot() if bf16_tower is None else bf16_tower)
        keep_freed_memory()  # each layer's temporaries reuse the last layer's pages (cpu_malloc.py)
        self.eager_since_idle = False  # an eager pass ran since idle() last gave its temporaries back
        logger.info("%s", self.threads.describe())
        if lib is not None:
            logger.info(
                "CPU kernels: native, %s path; GGUF %s kept quantized, bf16 weights kept bf16; vision towers in %s",
                lib.path,
                ", ".join(sorted(NATIVE_GGUF)),
                "bfloat16 (vdpbf16ps)" if self.bf16_tower else "float32",
            )
            if self.threads.usable > 1 and not spin_is_short():
                logger.info(
                    "OpenBLAS's idle workers spin long after each GEMM (NumPy was imported before "
                    "rawpage, or OPENBLAS_THREAD_TIMEOUT is above 20): dense float weights' GEMMs then "
                    "hold cores the kernels' threads need (rawpage/_blas_env.py)"
                )

    graph_max_batch = GRAPH_MAX_BATCH

    @property
    def supports_graphs(self) -> bool:
        """Forward passes are recorded (NativeGraph) where the kernels are loaded."""
        return self.lib is not None

    @property
    def kernel_threads(self) -> int:
        """The next kernel's threads (CpuThreads decides: at each pass's embedding, then
        again during the pass as the other processes' load changes)."""
        return self.threads.during_pass()

    # --- arrays -----------------------------------------------------------------------
    def asarray(self, x: np.ndarray, dtype: Any = None) -> np.ndarray:
        return np.ascontiguousarray(x, dtype=dtype or self.dtype)

    def to_numpy(self, x: np.ndarray) -> np.ndarray:
        return x

    def zeros(self, shape: tuple[int, ...], dtype: Any = None) -> np.ndarray:
        dtype = np.dtype(self.dtype if dtype is None else dtype)
        nbytes = int(np.prod(shape)) * dtype.itemsize
        if nbytes >= _LAZY_ZEROS_BYTES:
            # An anonymous mapping: the kernel hands out zeroed pages as they are first
            # written, so the KV pool holds only the blocks in use. (np.zeros would take
            # a block this size from the heap, where cpu_malloc.py keeps them, and calloc
            # writes every page at once: 2 GiB resident for the default pool.)
            return np.frombuffer(mmap.mmap(-1, nbytes), dtype=dtype).reshape(shape)
        return np.zeros(shape, dtype=dtype)

    # --- graphs -----------------------------------------------------------------------
    def capture_graph(self, fn: Callable[[], np.ndarray]) -> Graph:
        if self.lib is None:  # the NumPy path: a Graph that runs fn again (the tests' bookkeeping)
            return super().capture_graph(fn)
        try:
            graph = NativeGraph(self, fn)
        except NotCapturable as e:
            raise GraphNotCaptured(str(e)) from e
        return graph

    def graph_memory_bytes(self) -> int:
        return self.arena.nbytes

    def idle(self) -> None:
        """Measure the load; after an eager pass, give back what the heap kept of it (cpu_malloc.py)."""
        self.threads.observe()  # so that the next request's first pass finds a recent figure
        if self.eager_since_idle:  # the heap keeps a prefill's temporaries while busy (cpu_malloc.py)
            self.eager_since_idle = False
            release_freed_memory()

    def _host_work(self, what: str) -> None:
        """Before work outside the kernels: refused while a graph is recorded."""
        if capturing():
            raise NotCapturable(f"{what} runs outside the native kernels")

    # --- weights ----------------------------------------------------------------------
    def embedding(self, ids: np.ndarray, table: np.ndarray | QuantizedWeight) -> np.ndarray:
        """ids: (T,) -> (T, dim). The first op of every forward pass, so the thread count for
        this pass (T rows) is set here. A packed table only reaches here with the kernels."""
        self.threads.set_for(len(ids))
        self.eager_since_idle = True  # (a replayed decode's temporaries live in the arena instead)
        if not isinstance(table, QuantizedWeight):
            if self.lib is not None and table.dtype == np.float32 and table.flags.c_contiguous:
                return layer_ops.embedding_rows(self.lib, table, ids, self.kernel_threads)
            self._host_work("a NumPy embedding lookup")
            return table[ids]
        if table.kind in ("bf16", "f16"):
            return half_rows(self.lib, table.data, ids, self.kernel_threads, f16=table.kind == "f16")
        return gguf_rows(self.lib, table.data, table.qtype, table.shape, ids, self.kernel_threads)

    def prepare_linear(self, w: np.ndarray | QuantizedWeight | RowStack) -> np.ndarray | QuantizedWeight | RowStack:
        if isinstance(w, RowStack) and all(self._kernel_reads(p) and p.kind == "gguf" for p in w.parts):
            return RowStack([self.prepare_linear(p) for p in w.parts])  # each part into its columns (linear)
        if isinstance(w, QuantizedWeight) and self._kernel_reads(w) and w.kind == "gguf":
            panels = repack(self.lib, np.asarray(w.data), w.qtype, w.shape, self.threads.usable)
            self.repacked = [self.repacked[0] + w.data.nbytes, self.repacked[1] + panels.nbytes]
            return replace(w, data=panels, layout="panels")
        if isinstance(w, QuantizedWeight) and self._kernel_reads(w):
            return w.map_arrays(np.ascontiguousarray)  # as stored: (out, in) uint16 bf16 / f16
        if isinstance(w, QuantizedWeight | RowStack):  # any other format: dequantized at load
            w = dequantize(w)
        # Kept (out, in), as checkpoints store it: a tied LM head is the embedding table
        # itself, with no transposed copy. See matmul for why this layout.
        return np.ascontiguousarray(w)

    def prepare_encoder_linear(self, w: np.ndarray) -> Any:
        if self.bf16_tower:  # rounded to bf16 once, in the GEMM's panels: 2 bytes a weight
            return bf16_gemm.pack(self.lib, w, self.threads.usable)
        return self.prepare_linear(w)

    def weights_loaded(self, linear_weights: list[tuple[str, Any]]) -> None:
        """One line naming every Linear layer held dense while the kernels are loaded: those
        run as float32 GEMMs in BLAS, read 4 bytes a weight, and keep decode steps from
        being replayed (a BLAS call cannot be recorded)."""
        dense = [(n, w) for n, w in linear_weights if isinstance(w, np.ndarray)]
        if self.lib is None or not dense:
            return
        more = f" and {len(dense) - 4} more" if len(dense) > 4 else ""
        logger.info(
            "%d Linear layers are dense float32 (stored as F32, or in a form the CPU kernels do not read): %s%s. "
            "They run in BLAS at 4 bytes a weight, and decode steps run eagerly. Fix: a checkpoint that stores "
            "them quantized or as F16/BF16 (llama-quantize), or --quantization q8_0",
            len(dense),
            ", ".join(f"{n} {tuple(w.shape)}" for n, w in dense[:4]),
            more,
        )

    def weights_note(self) -> str:
        blocks, panels = self.repacked
        if not blocks:
            return ""
        return (
            f" (of it GGUF blocks repacked into 16-row panels for the CPU kernels: {panels / 2**30:.3f} GiB "
            f"from {blocks / 2**30:.3f} GiB in the file, {100 * (panels / blocks - 1):+.1f}%)"
        )

    def _kernel_reads(self, w: QuantizedWeight) -> bool:
        return self.lib is not None and (w.kind in ("bf16", "f16") or (w.kind == "gguf" and w.qtype in NATIVE_GGUF))

    def linear(self, x: np.ndarray, w: Any, bias: np.ndarray | None = None) -> np.ndarray:
        if isinstance(w, RowStack):  # a fused layer whose parts differ in format: each writes its columns
            y, col = empty((len(x), w.shape[0])), 0
            for p in w.parts:
                part_bias = None if bias is None else bias[col : col + p.shape[0]]
                gguf_matmul(
                    self.lib,
                    x,
                    p.data,
                    p.qtype,
                    p.shape,
                    self.kernel_threads,
                    part_bias,
                    out=y[:, col : col + p.shape[0]],
                )
                col += p.shape[0]
            return y
        if isinstance(w, Bf16Panels):  # a vision tower's, on AVX512-BF16
            return bf16_gemm.gemm(self.lib, x, w, self.kernel_threads, bias)
        if isinstance(w, QuantizedWeight) and w.kind in ("bf16", "f16"):
            return half_matmul(self.lib, x, w.data, self.kernel_threads, bias, f16=w.kind == "f16")
        if isinstance(w, QuantizedWeight):  # GGUF blocks prepare_linear kept
            return gguf_matmul(self.lib, x, w.data, w.qtype, w.shape, self.kernel_threads, bias)
        self._host_work("a dense (BLAS) or LoRA linear layer")
        return super().linear(x, w, bias)  # dense: matmul; LoRA: the base weight, then the delta

    def logits(self, x: np.ndarray, lm_head: Any) -> np.ndarray:
        """A GGUF LM head with x rounded twice (parts=2, native/gguf_matmul.c says why);
        other heads as any linear layer."""
        if isinstance(lm_head, QuantizedWeight) and lm_head.kind == "gguf":
            return gguf_matmul(self.lib, x, lm_head.data, lm_head.qtype, lm_head.shape, self.kernel_threads, parts=2)
        return self.linear(x, lm_head)

    def matmul(self, x: np.ndarray, w: np.ndarray, bias: np.ndarray | None = None) -> np.ndarray:
        self._host_work("a dense (BLAS) matmul")
        # y = (W · xᵀ)ᵀ, W (out, in) C-contiguous: OpenBLAS walks W's rows once. For a few
        # rows (speculative verification, small batches) this is 1.3-1.5x faster than
        # x @ Wᵀ with W stored (in, out), whose packing dominates at M = 2..64 (measured,
        # docs/benchmarks.md); at M = 1 both are one GEMV. y is a Fortran-order view.
        y = (w @ x.T).T
        if bias is not None:
            y += bias
        return y

    # --- the small ops ----------------------------------------------------------------
    def rms_norm(self, x, weight, eps):
        if self.lib is None:
            return rms_norm_ref(x, weight, eps)
        return layer_ops.rms_norm(self.lib, x, weight, eps, self.kernel_threads)

    def fused_add_rms_norm(self, x, residual, weight, eps):
        if self.lib is None:
            return fused_add_rms_norm_ref(x, residual, weight, eps)
        return layer_ops.fused_add_rms_norm(self.lib, x, residual, weight, eps, self.kernel_threads)

    def rope(self, positions, q, k, cos_sin, is_neox):
        if self.lib is None:
            return rope_ref(positions, q, k, cos_sin, is_neox)
        layer_ops.rope(self.lib, positions, q, k, cos_sin, is_neox, self.kernel_threads)

    def silu_and_mul(self, x):
        if self.lib is None:
            return silu_and_mul_ref(x)
        return layer_ops.silu_and_mul(self.lib, x, self.kernel_threads)

    def gelu_tanh_and_mul(self, x):
        if self.lib is None:
            return gelu_tanh_and_mul_ref(x)
        return layer_ops.gelu_tanh_and_mul(self.lib, x, self.kernel_threads)

    # --- the KV cache -----------------------------------------------------------------
    def write_kv(self, k, v, k_cache, v_cache, slot_mapping):
        if k_cache.dtype == np.uint8:  # FP8 KV: no kernel
            self._host_work("an FP8 KV cache")
            return write_kv_fp8_ref(k, v, k_cache, v_cache, slot_mapping, self.fp8_scales())
        if self.lib is None:
            return write_kv_ref(k, v, k_cache, v_cache, slot_mapping)
        layer_ops.write_kv(self.lib, k, v, k_cache, v_cache, slot_mapping, self.kernel_threads)

    def paged_attention(self, q, k_cache, v_cache, meta, opts):
        if k_cache.dtype == np.uint8:  # FP8 KV: no kernel
            return paged_attention_fp8_ref(q, k_cache, v_cache, self.fp8_scales(), meta, opts)
        if self.lib is None:
            return paged_attention_ref(q, k_cache, v_cache, meta, opts)
        out = attention.paged_attention(self.lib, q, k_cache, v_cache, meta, opts, self.kernel_threads)
        if meta.key_end is not None:  # the C kernel is causal: sequences with image rows again, in NumPy
            self._host_work("attention over image rows")
            image_rows_ref(out, q, k_cache, v_cache, meta, opts)
        return out

    # --- the vision encoder's: its GEMMs through linear; the ops between them C kernels
    # (native/vision_ops.c) where loaded, else their NumPy references -------------------
    def begin_encoder(self, rows):
        self.threads.set_for(rows)

    def fused_add_layer_norm(self, x, residual, weight, bias, eps):
        if self.lib is None:
            return fused_add_layer_norm_ref(x, residual, weight, bias, eps)
        return vision_ops.fused_add_layer_norm(self.lib, x, residual, weight, bias, eps, self.kernel_threads)

    def gelu_tanh(self, x):
        if self.lib is None:
            return gelu_tanh_ref(x)
        return vision_ops.gelu_tanh(self.lib, x, self.kernel_threads)

    def gelu_erf(self, x):
        if self.lib is None:
            return gelu_erf_ref(x)
        return vision_ops.gelu_erf(self.lib, x, self.kernel_threads)

    def encoder_attention(self, q, k, v, scale, cu_seqlens=None):
        """bf16_tower: the bf16 kernel (encoder_attention_bf16_ref). Else a sequence, one head
        and a block of queries at a time: BLAS for q k^T and p v, the row softmax a C kernel
        where loaded (encoder_attention_ref)."""
        if self.bf16_tower:
            return bf16_gemm.encoder_attention(self.lib, q, k, v, scale, self.kernel_threads, cu_seqlens)
        if self.lib is None:
            return encoder_attention_ref(q, k, v, scale, cu_seqlens=cu_seqlens)
        softmax = lambda s: vision_ops.softmax_rows(self.lib, s, self.kernel_threads)  # noqa: E731
        return encoder_attention_ref(q, k, v, scale, softmax, cu_seqlens)

    def copy_blocks(self, k_caches, v_caches, block_mapping):
        copy_blocks_ref(k_caches, v_caches, block_mapping)

    def swap_blocks(self, src, dst, block_mapping):
        swap_blocks_ref(src, dst, block_mapping)
