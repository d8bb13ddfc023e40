"""Decode steps replayed from CUDA graphs, one graph per batch-size bucket: the policy
(which batch sizes get a graph, padding, when a step may replay one). The mechanism,
recording and replaying a graph on CuPy, is rawpage/backends/cuda_graph_capture.py.

A pure decode step (every sequence has one new token) of B sequences is padded
up to the smallest bucket >= B and replayed from that bucket's graph. Buckets
are 1, 2, 4, then every multiple of 8 up to --max-num-seqs (vLLM's choice):
padding wastes at most 7 rows, and a decode step costs about the same at 57
rows as at 64, because it is bound by reading the weights.

A padding row is a one-token sequence that attends to one key and stores
nothing: token 0 at position 0, slot -1 (write_kv skips it), seq_len 1. Its
block-table row is whatever an earlier step left there, always a valid block
id, it has no LoRA adapter (slot -1), and its output row is dropped.

With --enable-lora the graphs capture the LoRA kernels too: each sequence's
adapter slot is part of the uploaded metadata, so a replay reads the new step's
slots and the slots' weights as they are now (loading an adapter is a copy into
a slot that never moves).

Capture happens once, at startup, for every bucket, largest first (so that the
smaller graphs' temporaries fit in memory the larger ones already took from
the graph pool). Each capture runs on views of the graphs' own BatchBuffer at
the offsets that bucket's uploads will use, with the longest context the engine
allows as the host-side fact that picks the attention launch, so that the
frozen launch is valid for every later batch.

On cpu and sim, Backend.capture_graph returns a Graph that simply runs the
forward pass again; the engine does not use graphs there, but the tests drive
this same bookkeeping (bucket choice, padding, buffer reuse) through it.
"""

from __future__ import annotations

import bisect
import logging
import time
from collections.abc import Callable

import numpy as np

from rawpage.backends.base import Array, Backend, Graph
from rawpage.batch_buffer import BatchBuffer, HostBatch
from rawpage.forward_batch import ForwardBatch

logger = logging.getLogger("rawpage")


def graph_batch_sizes(max_num_seqs: int) -> list[int]:
    """The buckets: 1, 2, 4, 8, 16, 24, ... up to max_num_seqs (always included)."""
    sizes = [s for s in (1, 2, 4) if s < max_num_seqs] + list(range(8, max_num_seqs, 8))
    return sorted(set(sizes) | {max_num_seqs})


def pick_bucket(sizes: list[int], batch_size: int) -> int | None:
    """The smallest bucket that holds batch_size sequences; None if none does."""
    i = bisect.bisect_left(sizes, batch_size)
    return sizes[i] if i < len(sizes) else None


def pad_decode_batch(hb: HostBatch, size: int, width: int) -> HostBatch:
    """A decode batch of B sequences as `size` rows with `width` block-table columns.
    Rows past B are padding (see the module docstring); logits_indices covers every row."""
    B = len(hb.seq_lens)
    if (B and not hb.is_decode) or B > size or hb.block_tables.shape[1] > width:
        raise ValueError(f"cannot pad a batch of {B} sequences, {hb.block_tables.shape[1]} blocks wide, to {size}")

    def padded(a: np.ndarray, fill: int) -> np.ndarray:
        out = np.full(size, fill, np.int32)
        out[:B] = a
        return out

    tables = np.zeros((size, width), np.int32)
    tables[:B, : hb.block_tables.shape[1]] = hb.block_tables
    return HostBatch(
        input_ids=padded(hb.input_ids, 0),
        positions=padded(hb.positions, 0),
        slot_mapping=padded(hb.slot_mapping, -1),
        seq_lens=padded(hb.seq_lens, 1),
        query_start_loc=np.arange(size + 1, dtype=np.int32),
        logits_indices=np.arange(size, dtype=np.int32),
        block_tables=tables,
        lora_slots=padded(hb.lora_slots, -1),
    )


class DecodeGraphs:
    """Captures the model's decode forward pass per bucket and replays it.

    run(hb) returns the final hidden states of every row of the padded batch,
    (bucket, dim); row i is sequence i of hb for i < B."""

    def __init__(
        self,
        model,
        backend: Backend,
        kv_caches: list[tuple[Array, Array]],
        sizes: list[int],
        max_model_len: int,
        block_size: int,
        before_forward: Callable[[ForwardBatch], None] | None = None,
    ) -> None:
        """before_forward(batch) runs ahead of each captured forward pass (the LoRA slots
        read the batch's lora_slots, graph inputs like the rest of the metadata)."""
        self.backend = backend
        self.sizes = sorted(sizes)
        self.width = -(-max_model_len // block_size)  # block-table columns of every captured batch
        # The graphs' own metadata buffer, sized for the largest bucket: it must never
        # move, while the runner's buffer for eager steps grows with the batch.
        largest = self.sizes[-1]
        self.buffer = BatchBuffer(backend, capacity=7 * largest + 1 + largest * self.width)
        self.graphs: dict[int, Graph] = {}
        self.num_replays = dict.fromkeys(self.sizes, 0)
        start = time.perf_counter()

        def forward(batch: ForwardBatch) -> Array:
            if before_forward is not None:
                before_forward(batch)
            return model.forward(batch, kv_caches)

        for size in reversed(self.sizes):
            empty = HostBatch(*(np.zeros(0, np.int32) for _ in range(6)), np.zeros((0, 1), np.int32))
            batch = self.buffer.upload(pad_decode_batch(empty, size, self.width))
            # Freeze the attention launch for the longest context any sequence can reach.
            batch.host_seq_lens = np.full(size, max_model_len, np.int32)
            self.graphs[size] = backend.capture_graph(lambda batch=batch: forward(batch))
        self.buffer.frozen = True
        held = backend.graph_memory_bytes()  # outside the memory plan: see memory.py
        logger.info(
            "captured %d decode graphs (batch sizes %s) in %.1f s; their temporaries hold %.0f MiB",
            len(self.sizes),
            _ranges(self.sizes),
            time.perf_counter() - start,
            held / 2**20,
        )

    def can_run(self, hb: HostBatch) -> bool:
        fits = pick_bucket(self.sizes, len(hb.seq_lens)) is not None and hb.block_tables.shape[1] <= self.width
        return hb.is_decode and fits

    def run(self, hb: HostBatch) -> Array:
        size = pick_bucket(self.sizes, len(hb.seq_lens))
        self.buffer.upload(pad_decode_batch(hb, size, self.width))
        self.num_replays[size] += 1
        return self.graphs[size].replay()


def _ranges(sizes: list[int]) -> str:
    return f"{sizes[0]}..{sizes[-1]}" if len(sizes) > 3 else str(sizes)
