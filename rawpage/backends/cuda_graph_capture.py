"""CUDA graphs on CuPy: record a decode forward pass once, replay it with one launch.
This is the mechanism; which steps are captured is rawpage/decode_graphs.py.

A decode step of a 32-layer model is ~400 kernel launches (and cuBLAS calls)
issued from Python; at small batch the GPU finishes each one faster than Python
issues the next. A graph replays them all from one cudaGraphLaunch.

What a replay assumes, and how it holds:
- Inputs are read from the same device addresses every time: the runner
  captures on views of its metadata buffer and rewrites that buffer in place
  before each replay (rawpage/forward_batch.py). Weights and KV caches never move.
- The graph's own temporaries come from a memory pool of its own
  (`GraphMemory`), shared by all captured graphs. Nothing outside a capture
  allocates from it, so no live array can ever sit where a replay writes. Graphs
  may share temporaries with one another because replays run one at a time, in
  stream order.
- Launch choices made on the host (the decode kernel's split count, grids)
  are frozen at capture. The runner captures with the longest context the
  engine allows, so each frozen choice is valid for every later batch.
- cuBLAS is called through ctypes on CuPy's handle, whose stream is bound
  before the capture and never inside it (rawpage/backends/cublas_ctypes.py):
  CuPy's own wrapper refuses to run during a capture.
- Nothing in the forward pass synchronizes with the host or reads device
  memory from Python; the capture would fail loudly if it did.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from rawpage.backends.base import Graph
from rawpage.backends.cublas_ctypes import default_gemm


class GraphMemory:
    """The pool that graph temporaries live in, and the stream graphs are captured on
    (capture cannot happen on the legacy default stream)."""

    def __init__(self) -> None:
        import cupy

        self.pool = cupy.cuda.MemoryPool()
        self.stream = cupy.cuda.Stream(non_blocking=True)

    def held_bytes(self) -> int:
        return int(self.pool.total_bytes())


class CudaGraph(Graph):
    """fn recorded as a CUDA graph. `replay()` launches it on the current stream and
    returns the output array allocated during capture (the same array every time).
    It replays every GPU operation the pass issued, so it needs no check (needs_check)."""

    def __init__(self, fn: Callable[[], Any], memory: GraphMemory) -> None:
        import cupy

        device = cupy.cuda.Device()
        device.synchronize()  # the input buffers were written on another stream
        with cupy.cuda.using_allocator(memory.pool.malloc), memory.stream:
            # Warm-up run: compiles and loads every kernel, sizes cuBLAS's workspace
            # and grows the pool, so that the capture itself allocates nothing new.
            fn()
            memory.stream.synchronize()
            # A cuBLAS handle's stream must not change inside a capture: the warm-up bound
            # it to the capture stream (if it had GEMMs; otherwise bind it now), so the
            # captured GEMMs skip setStream (cublas_ctypes.py).
            default_gemm().ensure_bound(cupy.cuda.device.get_cublas_handle(), memory.stream)
            memory.stream.begin_capture()
            try:
                self.output = fn()
            finally:
                self.graph = memory.stream.end_capture()
        self.graph.upload(memory.stream)
        memory.stream.synchronize()

    def replay(self) -> Any:
        import cupy

        self.graph.launch(cupy.cuda.get_current_stream())
        return self.output
