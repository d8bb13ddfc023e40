"""The interface every backend implements. Shapes use T (tokens in the batch),
B (sequences), H / Hkv (query / KV heads), D (head dim), NB (blocks), BS (block size)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from rawpage.dtypes import from_float32
from rawpage.ops.attention_metadata import AttentionMetadata, AttentionOptions
from rawpage.ops.lora import LoRALinear, add_lora_grouped
from rawpage.quantization.weight import QuantizedWeight, RowStack, dequantize

Array = Any  # numpy.ndarray on cpu and sim, cupy.ndarray on cuda


class Graph:
    """A recorded forward pass that can run again on the same buffers: `replay()` returns
    the output array. Here (sim, and cpu without its kernels) it simply calls the function
    again; the cuda backend records a CUDA graph (rawpage/backends/cuda_graph_capture.py),
    the cpu backend its kernel calls (backends/cpu.py NativeGraph). Either way, a replay
    reads whatever its input buffers hold at that moment."""

    # Whether a replay can miss work the pass did outside the recorded calls (NumPy on
    # the CPU), so that DecodeGraphs checks it against a fresh run before using it.
    needs_check = False

    def __init__(self, fn: Callable[[], Array]) -> None:
        self.fn = fn
        self.output = fn()  # the "capture": the same first run the cuda backend warms up with

    def replay(self) -> Array:
        self.output = self.fn()
        return self.output


class GraphNotCaptured(RuntimeError):
    """This forward pass cannot be replayed from a recording (the message says why): the
    engine runs its steps eagerly."""


class Backend:
    name: str
    dtype: np.dtype  # activation and weight dtype
    # Whether capture_graph() records real graphs (cuda; cpu with its kernels). Where it
    # does not (sim), the engine runs eagerly; tests can still drive the graph bookkeeping
    # through Graph.
    supports_graphs: bool = False
    # The largest decode batch worth a graph (None: up to --max-num-seqs).
    graph_max_batch: int | None = None
    # The device's memory, for sizing the KV cache by profiling (memory.DeviceMemory);
    # None where the KV cache has a fixed budget (cpu, sim).
    memory: Any = None
    # QuantizedWeight kinds whose kernels this backend has: such weights stay packed on
    # the device and linear() reads them as stored. Others are dequantized at load.
    keeps_quantized: frozenset[str] = frozenset()
    # Whether embedding() reads a packed table (a QuantizedWeight) by its rows, so that a
    # quantized embedding, and the LM head tied to it, stay packed (the CPU backend on its kernels).
    reads_packed_embedding: bool = False

    # --- arrays -----------------------------------------------------------
    def asarray(self, x: np.ndarray, dtype: Any = None) -> Array:
        """Host array -> device array (weights in self.dtype unless dtype given)."""
        raise NotImplementedError

    def to_numpy(self, x: Array) -> np.ndarray:
        raise NotImplementedError

    def zeros(self, shape: tuple[int, ...], dtype: Any = None) -> Array:
        raise NotImplementedError

    def copy_from_host(self, dst: Array, src: np.ndarray) -> None:
        """dst[...] = src for a device array dst and a host array of the same shape and dtype,
        in stream order; src may be reused as soon as this returns."""
        dst[...] = src

    def uniform(self, shape: tuple[int, ...], bound: float, seed: int, offset: float = 0.0) -> Array:
        """offset + U(-bound, bound) in self.dtype, deterministic in `seed` (dummy weights).
        Generated where the array will live: here on the host, on the GPU by cuda."""
        x = np.random.default_rng(seed).uniform(-bound, bound, shape).astype(np.float32) + np.float32(offset)
        return from_float32(x, self.dtype)

    def capture_graph(self, fn: Callable[[], Array]) -> Graph:
        """Record fn (a forward pass over fixed input buffers) for replay; GraphNotCaptured
        if it cannot be."""
        return Graph(fn)

    def graph_memory_bytes(self) -> int:
        """Device memory the captured graphs' temporaries hold (outside the memory plan)."""
        return 0

    def synchronize(self) -> None:
        """Wait for all queued device work (a no-op on the host)."""

    def idle(self) -> None:
        """Nothing to run (the server every IDLE_TICK_S, LLM.generate at its end): see CPUBackend."""

    # --- ops (see rawpage/ops/* for the math) -------------------------------
    def embedding(self, ids: Array, table: Array) -> Array:
        """ids: (T,) -> (T, dim). table: (V, dim), or packed where reads_packed_embedding."""
        raise NotImplementedError

    def prepare_linear(self, w: Array | QuantizedWeight) -> Array | QuantizedWeight:
        """A Linear layer's weight, (out, in) as checkpoints store it, in the layout this
        backend's matmul reads fastest. Called once per weight at load time. A host
        QuantizedWeight of a kind not in keeps_quantized is dequantized here."""
        if isinstance(w, QuantizedWeight | RowStack):
            return self.asarray(dequantize(w))
        return w

    def prepare_encoder_linear(self, w: Array) -> Any:
        """A vision tower's Linear weight: prepare_linear's, or the CPU's bf16 panels (cpu.py)."""
        return self.prepare_linear(w)

    def weights_note(self) -> str:
        """What the memory plan's weights line adds about how this backend holds them."""
        return ""

    def weights_loaded(self, linear_weights: list[tuple[str, Array | QuantizedWeight]]) -> None:
        """Once the model's weights are loaded, each Linear weight by name: log what this
        backend wants known about their forms (cpu.py: the layers left dense)."""

    def linear(self, x: Array, w: Array | QuantizedWeight, bias: Array | None = None) -> Array:
        """The one seam every Linear layer of every model goes through: x (T, in) ->
        x @ W.T (+ bias): (T, out), for w from prepare_linear. The backend picks the
        kernel from the weight's kind (dense here; quantized kinds in subclasses). A
        LoRALinear (--enable-lora) is its base weight's linear plus the adapters' delta."""
        if isinstance(w, LoRALinear):
            y = self.linear(x, w.base, bias)
            self.add_lora(y, x, w)
            return y
        if isinstance(w, QuantizedWeight):
            raise NotImplementedError(f"the {self.name} backend has no kernel for {w.kind} weights")
        return self.matmul(x, w, bias)

    def logits(self, x: Array, lm_head: Array | QuantizedWeight) -> Array:
        """The LM head: x (N, dim) -> (N, V) float32 logits, for lm_head from prepare_linear.
        A seam of its own, because its rounding lands in the logits directly: a backend
        may keep its activations exact where other layers round them (cpu.py's Q8_0 head)."""
        return self.linear(x, lm_head)

    def add_lora(self, y: Array, x: Array, w: LoRALinear) -> None:
        """y (T, out) += (x·A[s]ᵀ)·B[s] in place, s = the adapter slot of each token's
        sequence (rawpage/ops/lora.py). Here: tokens grouped by adapter, two GEMMs each."""
        add_lora_grouped(y, x, w.slots, w.batch.token_groups())

    def matmul(self, x: Array, w: Array, bias: Array | None = None) -> Array:
        """x: (T, in), w: a Linear weight from prepare_linear -> x @ W.T (+ bias): (T, out)."""
        raise NotImplementedError

    def stack_experts(self, ws: list[Array | QuantizedWeight]) -> Array | None:
        """The E weights of an MoE projection, from prepare_linear, as one (E, out, in)
        array for grouped_linear, or None where this backend runs experts one by one."""
        return None

    def grouped_linear(
        self, x: Array, ws: list[Array | QuantizedWeight], stacked: Array | None, offsets: np.ndarray
    ) -> Array:
        """MoE experts: x (M, in), rows sorted by expert, expert e owning rows
        offsets[e] .. offsets[e+1) (host (E + 1,)) -> (M, out), each group times its
        own weight. Here: one linear() per expert that has rows; idle experts cost nothing."""
        out = None
        for e in np.flatnonzero(np.diff(offsets)):
            a, b = int(offsets[e]), int(offsets[e + 1])
            y = self.linear(x[a:b], ws[e])
            if out is None:
                out = self.zeros((x.shape[0], y.shape[1]), y.dtype)
            out[a:b] = y
        return out if out is not None else self.zeros((x.shape[0], 0))

    def rms_norm(self, x: Array, weight: Array, eps: float) -> Array:
        raise NotImplementedError

    def fused_add_rms_norm(self, x: Array, residual: Array, weight: Array, eps: float) -> tuple[Array, Array]:
        """Returns (rms_norm(x + residual), x + residual). May reuse x and residual's memory."""
        raise NotImplementedError

    def rope(self, positions: Array, q: Array, k: Array, cos_sin: Array, is_neox: bool) -> None:
        """q: (T, H, D), k: (T, Hkv, D), in place."""
        raise NotImplementedError

    # (k_scale, v_scale) of an FP8 KV cache (--kv-cache-dtype fp8; see
    # rawpage/ops/kv_cache_fp8.py), in this backend's array module once set.
    kv_scales: Array | None = None
    # The KV cache's element type where it is not the model's (--kv-cache-dtype float16
    # on the CPU); None: the model dtype, or uint8 with kv_scales.
    kv_cache_dtype: Any = None

    def set_kv_scales(self, kv_scales: np.ndarray) -> None:
        self.kv_scales = np.asarray(kv_scales, np.float32)

    def fp8_scales(self) -> Array:
        if self.kv_scales is None:
            raise RuntimeError("an FP8 (uint8) KV cache needs its scales: call set_kv_scales() first")
        return self.kv_scales

    def write_kv(self, k: Array, v: Array, k_cache: Array, v_cache: Array, slot_mapping: Array) -> None:
        """k, v: (T, Hkv, D) into the caches' slots (slot_mapping (T,), -1 = none). A
        uint8 cache is FP8 e4m3: the backend converts on store with fp8_scales()."""
        raise NotImplementedError

    def paged_attention(
        self, q: Array, k_cache: Array, v_cache: Array, meta: AttentionMetadata, opts: AttentionOptions
    ) -> Array:
        """q: (T, H, D), caches: (NB, BS, Hkv, D) -> (T, H, D). meta: the step's batch,
        the same for every layer (ForwardBatch.attn); opts: this layer's scale, sliding
        window and soft cap (rawpage/ops/attention_metadata.py)."""
        raise NotImplementedError

    def silu_and_mul(self, x: Array) -> Array:
        raise NotImplementedError

    def gelu_tanh_and_mul(self, x: Array) -> Array:
        """GeGLU's gate (Gemma): (T, 2I) holding [gate | up] -> gelu_tanh(gate) * up: (T, I)."""
        raise NotImplementedError

    # --- the vision encoder's ops (models/siglip.py, models/qwen_vit.py) ------------
    def begin_encoder(self, rows: int) -> None:
        """Before an image's encoder pass over `rows` patches, which starts with no embedding
        lookup (where the CPU backend sets a decoder pass's threads): sets its threads."""

    def fused_add_layer_norm(
        self, x: Array, residual: Array, weight: Array, bias: Array, eps: float
    ) -> tuple[Array, Array]:
        """x, residual (T, dim) -> (layer_norm(x + residual) * weight + bias, x + residual).
        May reuse x and residual's memory."""
        raise NotImplementedError

    def gelu_tanh(self, x: Array) -> Array:
        """(T, I) -> gelu (tanh approximation) of each element: (T, I)."""
        raise NotImplementedError

    def gelu_erf(self, x: Array) -> Array:
        """(T, I) -> the exact gelu, x Phi(x), of each element: (T, I)."""
        raise NotImplementedError

    def encoder_attention(
        self, q: Array, k: Array, v: Array, scale: float, cu_seqlens: np.ndarray | None = None
    ) -> Array:
        """q, k, v (N, H, D) of one image's patches -> (N, H, D), each row seeing every key of its
        sequence: rows cu_seqlens[i] .. cu_seqlens[i+1] ((B+1,), host: Qwen's windows), or all N."""
        raise NotImplementedError

    def swap_blocks(self, src: Array, dst: Array, block_mapping: np.ndarray) -> None:
        """Copy whole blocks between the device pool and the CPU swap pool (NumPy), either way:
        dst[m[:, 1]] = src[m[:, 0]]."""
        raise NotImplementedError

    def copy_blocks(self, k_caches: list[Array], v_caches: list[Array], block_mapping: np.ndarray) -> None:
        raise NotImplementedError
