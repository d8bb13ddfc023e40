"""Decode steps replayed from graphs, one graph per shape bucket: the policy (which
shapes get a graph, padding, when a step may replay one). The mechanism, recording
and replaying a graph, is the backend's: CUDA graphs on CuPy
(rawpage/backends/cuda_graph_capture.py), recorded kernel calls on the CPU
(rawpage/backends/cpu.py NativeGraph, rawpage/native/graph.c).

A shape is (batch size, query length q): a graph runs `size` sequences of exactly q
query tokens each. q = 1 is a plain decode step; with speculative decoding, q = k + 1
is a verification step (each sequence's new token and up to k drafts, which the
forward pass sees as a short chunk). A step of B sequences whose chunks are all at
most q tokens is padded up to the smallest bucket >= B of the smallest such q and
replayed from that graph. (A short prefill tail may ride along: it is the same
computation.)

Decode buckets are 1, 2, 4, then every multiple of 8 up to --max-num-seqs (vLLM's
choice): padding wastes at most 7 rows, and a decode step costs about the same at 57
rows as at 64, because it is bound by reading the weights. Verification buckets are
the decode buckets of at most VERIFY_GRAPH_MAX_TOKENS tokens (size x q), and always
batch 1. Below that a step is short enough that ~400 launches from Python are a
large part of it. Above it the step is compute-bound (by the H200's datasheet, an
8B step's GEMMs outlast its weight reads from about 150 to 200 tokens), launch time
is a few percent, and speculating at such batches rarely pays. Their temporaries
come from the pool all graphs share (cuda_graph_capture.py), so they add at most the
activations of 512 tokens (under 100 MiB at the 8B shape), and each capture costs
about what a decode capture does (k = 4 and 256 sequences: 15 graphs besides the 35
decode graphs).

Padding, the same for every q. Sequence i's q rows are the LAST q positions of its
context, seq_len - q .. seq_len - 1 (the attention contract: a chunk is the end of
its context), its n real tokens last, so that they keep their positions; the q - n
rows before them are padding: token 0, slot -1 (write_kv skips it), and their output
rows are dropped. They attend to earlier positions of the same context, whose K/V
are already in the cache, and change nothing: each query row's attention is its own,
and every other op works row by row. That needs seq_len >= q (else a padding row
would sit at a negative position): a step with a shorter context runs eagerly.
Padding sequences (past B) are q rows at positions 0 .. q-1 that store nothing, with
seq_len q, no LoRA adapter (slot -1) and a block-table row of block 0. Block-table
entries released by a sliding window (NULL_BLOCK, -1) become block 0: a padding row
may look further back than the window of its sequence's real rows, and must read a
valid block (what it reads is dropped with it). For q = 1 this is exactly a decode
padding row: one token at position 0 that attends to one key.

With --enable-lora the graphs capture the LoRA kernels too: each sequence's
adapter slot is part of the uploaded metadata, so a replay reads the new step's
slots and the slots' weights as they are now (loading an adapter is a copy into
a slot that never moves).

Capture happens once, at startup, for every shape, largest first (so that the
smaller graphs' temporaries fit in memory the larger ones already took from
the graph pool). Each capture runs on views of the graphs' own BatchBuffer at
the offsets that shape's uploads will use, with the longest context the engine
allows as the host-side fact that picks the attention launch, so that the
frozen launch is valid for every later batch. (q > 1 goes to the prefill
attention kernel, whose grid is (ceil(q / 64), H, size) whatever the contexts:
it reads seq_lens and query_start_loc from the device.)

On the CPU with its kernels, a graph is the pass's kernel calls, recorded and
replayed in one C call (backends/cpu.py NativeGraph), for decode batches up to 8
(Backend.graph_max_batch). Such a recording misses any NumPy work the pass does, so
each one is checked against a fresh run on other inputs before it is used
(check_replay); a pass that cannot be recorded raises GraphNotCaptured, and the
runner then runs every step eagerly, with one log line.
On sim, Backend.capture_graph returns a Graph that simply runs the forward pass
again; the engine does not use graphs there, but the tests drive this same
bookkeeping (bucket choice, padding, buffer reuse) through it.
"""

from __future__ import annotations

import bisect
import logging
import time
from collections.abc import Callable
from dataclasses import replace

import numpy as np

from rawpage.backends.base import Array, Backend, Graph, GraphNotCaptured
from rawpage.forward_batch import BatchBuffer, ForwardBatch, HostBatch

logger = logging.getLogger("rawpage")

VERIFY_GRAPH_MAX_TOKENS = 512  # size x q of the largest verification graph (see above)

Shape = tuple[int, int]  # (batch size, query tokens per sequence)


def graph_batch_sizes(max_num_seqs: int) -> list[int]:
    """The decode buckets: 1, 2, 4, 8, 16, 24, ... up to max_num_seqs (always included)."""
    sizes = [s for s in (1, 2, 4) if s < max_num_seqs] + list(range(8, max_num_seqs, 8))
    return sorted(set(sizes) | {max_num_seqs})


def graph_shapes(max_num_seqs: int, num_speculative_tokens: int = 0) -> list[Shape]:
    """Every shape to capture: the decode buckets with q = 1 and, with speculative decoding,
    those of at most VERIFY_GRAPH_MAX_TOKENS tokens with q = k + 1 (at least batch 1)."""
    sizes = graph_batch_sizes(max_num_seqs)
    shapes = [(s, 1) for s in sizes]
    if num_speculative_tokens:
        q = num_speculative_tokens + 1
        shapes += [(s, q) for s in sizes if s == 1 or s * q <= VERIFY_GRAPH_MAX_TOKENS]
    return shapes


def pick_bucket(sizes: list[int], batch_size: int) -> int | None:
    """The smallest bucket that holds batch_size sequences; None if none does."""
    i = bisect.bisect_left(sizes, batch_size)
    return sizes[i] if i < len(sizes) else None


def padded_rows(hb: HostBatch, query_len: int) -> np.ndarray:
    """(T,): the row of the padded batch (pad_batch) that each of hb's tokens moves to.
    Sequence i's n_i tokens end its q rows: token t goes to t + (i + 1) q - query_start_loc[i+1]."""
    T = len(hb.input_ids)
    if T == len(hb.seq_lens) * query_len:  # every chunk fills its q rows (a decode step): none moves
        return np.arange(T, dtype=np.int32)
    shift = np.arange(query_len, query_len * (len(hb.seq_lens) + 1), query_len) - hb.query_start_loc[1:]  # (B,)
    return (np.arange(T) + np.repeat(shift, np.diff(hb.query_start_loc))).astype(np.int32)


def pad_batch(hb: HostBatch, size: int, query_len: int, width: int) -> HostBatch:
    """hb's B sequences as `size` sequences of query_len rows each, with `width`
    block-table columns; the padding is the module docstring's. logits_indices covers
    every row (size * query_len)."""
    (B, W), q, n = hb.block_tables.shape, query_len, hb.query_lens
    if B > size or W > width or (B and (n.max() > q or hb.seq_lens.min() < q)):
        raise ValueError(
            f"cannot pad a batch of {B} sequences (chunks of up to {n.max(initial=0)} tokens, "
            f"{W} blocks wide) to {size} sequences of {q} tokens, {width} blocks wide"
        )
    T = len(hb.input_ids)
    rows = slice(0, T) if T == B * q else padded_rows(hb, q)  # (T,) where each token goes

    def per_row(a: np.ndarray, out: np.ndarray) -> np.ndarray:
        out[rows] = a
        return out

    seq_lens = np.full(size, q, np.int32)  # (size,)
    seq_lens[:B] = hb.seq_lens
    last_q = ((seq_lens - q)[:, None] + np.arange(q, dtype=np.int32)).reshape(-1)  # (size*q,) positions
    tables = np.zeros((size, width), np.int32)
    np.maximum(hb.block_tables, 0, out=tables[:B, :W])  # NULL_BLOCK -> block 0
    lora_slots = np.full(size, -1, np.int32)
    lora_slots[:B] = hb.lora_slots
    return HostBatch(
        input_ids=per_row(hb.input_ids, np.zeros(size * q, np.int32)),
        positions=per_row(hb.positions, last_q),
        slot_mapping=per_row(hb.slot_mapping, np.full(size * q, -1, np.int32)),
        seq_lens=seq_lens,
        query_start_loc=np.arange(0, size * q + 1, q, dtype=np.int32),
        logits_indices=np.arange(size * q, dtype=np.int32),
        block_tables=tables,
        lora_slots=lora_slots,
    )


class DecodeGraphs:
    """Captures the model's forward pass per shape (batch size, query length) and replays it.

    pick(hb) says which graph a step replays (None: run it eagerly); run(hb, shape)
    returns what model.forward would: the final hidden states of the rows
    hb.logits_indices names, (N, dim)."""

    def __init__(
        self,
        model,
        backend: Backend,
        kv_caches: list[tuple[Array, Array]],
        shapes: list[Shape],
        max_model_len: int,
        block_size: int,
        before_forward: Callable[[ForwardBatch], None] | None = None,
    ) -> None:
        """shapes: (batch size, query length) pairs (graph_shapes). before_forward(batch) runs
        ahead of each captured forward pass (the LoRA slots read the batch's lora_slots,
        graph inputs like the rest of the metadata)."""
        self.backend = backend
        self.sizes: dict[int, list[int]] = {}  # query length -> its batch-size buckets, ascending
        for q, size in sorted({(q, size) for size, q in shapes}):
            self.sizes.setdefault(q, []).append(size)
        self.width = -(-max_model_len // block_size)  # block-table columns of every captured batch
        # The graphs' own metadata buffer, sized for the largest shape: it must never
        # move, while the runner's buffer for eager steps grows with the batch.
        capacity = max(4 * s * q + 3 * s + 1 + s * self.width for s, q in shapes)
        self.buffer = BatchBuffer(backend, capacity=capacity)
        self.graphs: dict[Shape, Graph] = {}
        self.num_replays: dict[Shape, int] = dict.fromkeys(sorted(set(shapes)), 0)
        start = time.perf_counter()

        def forward(batch: ForwardBatch) -> Array:
            if before_forward is not None:
                before_forward(batch)
            return model.forward(batch, kv_caches)

        for size, q in sorted(self.num_replays, key=lambda s: (s[0] * s[1], s), reverse=True):
            empty = HostBatch(*(np.zeros(0, np.int32) for _ in range(6)), np.zeros((0, 1), np.int32))
            batch = self.buffer.upload(pad_batch(empty, size, q, self.width))
            # Freeze the attention launch for the longest context any sequence can reach.
            batch.attn = replace(batch.attn, max_seq_len=max_model_len)
            graph = backend.capture_graph(lambda batch=batch: forward(batch))  # GraphNotCaptured: see ModelRunner
            if graph.needs_check:
                check_replay(graph, batch, forward, backend, model.config.vocab_size)
            self.graphs[size, q] = graph
        self.buffer.frozen = True
        self._log_captured(time.perf_counter() - start)

    def _log_captured(self, seconds: float) -> None:
        held = self.backend.graph_memory_bytes()  # outside the memory plan: see memory.py
        what = [f"{len(self.sizes.get(1, []))} decode graphs (batch sizes {_ranges(self.sizes.get(1, []))})"]
        what += [
            f"{len(sizes)} verification graphs ({q} query tokens a sequence, batch sizes {_ranges(sizes)})"
            for q, sizes in self.sizes.items()
            if q > 1
        ]
        logger.info("captured %s in %.1f s; their temporaries hold %.0f MiB", " and ".join(what), seconds, held / 2**20)

    def pick(self, hb: HostBatch) -> Shape | None:
        """The shape hb replays from: the smallest query length that holds every chunk (and
        no more than the shortest context), then the smallest batch bucket; None: eager."""
        B = len(hb.seq_lens)
        if B == 0 or hb.block_tables.shape[1] > self.width:
            return None
        longest = 1 if hb.is_decode else int(hb.query_lens.max())
        for q, sizes in self.sizes.items():  # ascending q
            if longest <= q and (q == 1 or q <= hb.seq_lens.min()):
                size = pick_bucket(sizes, B)
                if size is not None:
                    return size, q
        return None

    def run(self, hb: HostBatch, shape: Shape) -> Array:
        """Replays the graph of `shape` (from pick(hb)) for hb: (N, dim), hb's logits rows."""
        size, q = shape
        self.buffer.upload(pad_batch(hb, size, q, self.width))
        self.num_replays[shape] += 1
        hidden = self.graphs[shape].replay()  # (size * q, dim): every row of the padded batch
        rows = padded_rows(hb, q)[hb.logits_indices]  # (N,)
        if np.array_equal(rows, np.arange(len(rows))):
            return hidden[: len(rows)]
        return hidden[self.backend.asarray(rows, np.int64)]


def check_replay(
    graph: Graph, batch: ForwardBatch, forward: Callable[[ForwardBatch], Array], backend: Backend, vocab: int
) -> None:
    """A recording that replays only its kernel calls (Graph.needs_check) misses any other
    work the pass did: that work's result would be frozen at capture. So the pass runs
    again on other token ids, and its replay must give the same bits; GraphNotCaptured if
    not. (The capture batch is padding: slot -1, so neither run writes the KV cache.)"""
    n = int(batch.input_ids.shape[0])
    backend.copy_from_host(batch.input_ids, (np.arange(1, n + 1, dtype=np.int32) * 7919) % vocab)
    expected = backend.to_numpy(forward(batch)).copy()
    replayed = backend.to_numpy(graph.replay())
    if not np.array_equal(expected, replayed):
        raise GraphNotCaptured(
            f"a replay of the {len(batch.host_seq_lens)}-sequence step differs from running it "
            "(the pass does work outside the recorded kernel calls)"
        )


def _ranges(sizes: list[int]) -> str:
    return f"{sizes[0]}..{sizes[-1]}" if len(sizes) > 3 else str(sizes)
