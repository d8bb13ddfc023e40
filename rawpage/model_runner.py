"""ModelRunner: owns the model and the paged KV cache, and runs one scheduled batch.

It turns the scheduler's list of (sequence, new tokens) into the flat arrays the
model reads (input_ids, positions, slot_mapping, block_tables, seq_lens,
query_start_loc), built with vectorized NumPy and copied to the device once
(rawpage/forward_batch.py), then runs the forward pass (a decode or verification
step replays a graph when it has them, CUDA's or the CPU's recorded kernel calls:
rawpage/decode_graphs.py) and returns the
logits rows the engine asked for, still on the device (rawpage/device_logits.py).
"""

from __future__ import annotations

import itertools
import logging
from dataclasses import dataclass

import numpy as np

from rawpage.backends.base import Array, Backend, GraphNotCaptured
from rawpage.config import ModelConfig
from rawpage.decode_graphs import DecodeGraphs
from rawpage.device_logits import DeviceLogits
from rawpage.forward_batch import BatchBuffer, HostBatch
from rawpage.lora.manager import LoRAManager
from rawpage.models.weight_source import Model
from rawpage.multimodal.mm_batch import EncoderCache, build_mm_batch
from rawpage.multimodal.mrope import batch_mrope_positions
from rawpage.sequence import Sequence

logger = logging.getLogger("rawpage")


def kv_bytes_per_block(config: ModelConfig, block_size: int, itemsize: int) -> int:
    """K and V, every layer: 2 * L * BS * Hkv * D * bytes."""
    return 2 * config.num_layers * block_size * config.num_kv_heads * config.head_dim * itemsize


@dataclass(frozen=True)
class KVPool:
    """The KV pool's numbers: num_blocks blocks of block_size tokens on the device (every
    layer's K and V), and num_cpu_blocks more in host memory for swapped-out sequences."""

    block_size: int
    num_blocks: int
    num_cpu_blocks: int = 0


class ModelRunner:
    def __init__(
        self,
        model: Model,
        backend: Backend,
        pool: KVPool,
        graph_shapes: list[tuple[int, int]] | None = None,
        max_model_len: int | None = None,
        lora: LoRAManager | None = None,
    ) -> None:
        """graph_shapes: capture a graph for each (batch size, query tokens a sequence) (decode_graphs.
        graph_shapes); None runs every step eagerly. KV caches: uint8 if FP8 scales are set, else backend.kv_cache_dtype (None: the model's).
        lora: the adapter slots (--enable-lora)."""
        c = model.config
        kv_cache_dtype = np.uint8 if backend.kv_scales is not None else backend.kv_cache_dtype
        block_size = pool.block_size
        self.model, self.backend, self.block_size, self.lora = model, backend, block_size, lora
        shape = (pool.num_blocks, block_size, c.num_kv_heads, c.head_dim)  # (NB, BS, Hkv, D)
        self.kv_caches: list[tuple[Array, Array]] = [
            (backend.zeros(shape, kv_cache_dtype), backend.zeros(shape, kv_cache_dtype)) for _ in range(c.num_layers)
        ]
        # The swap pool: the same layout in host memory, (NB_cpu, BS, Hkv, D) per layer.
        cpu_shape = (pool.num_cpu_blocks, block_size, c.num_kv_heads, c.head_dim)
        dtype = self.kv_caches[0][0].dtype
        self.cpu_caches = [(np.zeros(cpu_shape, dtype), np.zeros(cpu_shape, dtype)) for _ in range(c.num_layers)]
        self.buffer = BatchBuffer(backend)
        # a vision-language model's image embeddings, by image content (rawpage/multimodal/mm_batch.py)
        self.encoder_cache = EncoderCache(model.encode_image) if c.vision is not None else None
        # Qwen2.5-VL: m, its merge size, for M-RoPE positions around images (rawpage/multimodal/mrope.py)
        self.mrope_merge = c.vision.spatial_merge_size if c.vision is not None and c.mrope_section else 0
        self.graphs = None
        if graph_shapes:
            max_len = max_model_len or c.max_position_embeddings
            set_lora = lora.set_batch if lora else None
            try:
                self.graphs = DecodeGraphs(model, backend, self.kv_caches, graph_shapes, max_len, block_size, set_lora)
            except GraphNotCaptured as e:  # the CPU's recordings need every op of the pass to be a kernel
                logger.info("decode steps run eagerly: %s", e)

    def swap(self, swap_out: list[tuple[int, int]], swap_in: list[tuple[int, int]]) -> None:
        """Swap-outs first: their GPU blocks may already be promised to someone else."""
        for mapping, to_cpu in ((swap_out, True), (swap_in, False)):
            if not mapping:
                continue
            m = np.array(mapping, dtype=np.int64)
            for (k, v), (ck, cv) in zip(self.kv_caches, self.cpu_caches):
                for src, dst in ((k, ck), (v, cv)) if to_cpu else ((ck, k), (cv, v)):
                    self.backend.swap_blocks(src, dst, m)

    def copy_blocks(self, copies: list[tuple[int, int]]) -> None:
        """Copy-on-write: give each (src, dst) block pair identical contents in every layer."""
        if copies:
            k, v = zip(*self.kv_caches)
            self.backend.copy_blocks(list(k), list(v), np.array(copies, dtype=np.int64))

    def build_batch(self, scheduled: list[tuple[Sequence, int]], logits_rows: list[np.ndarray]) -> HostBatch:
        """scheduled: (sequence, n new tokens) pairs; logits_rows[i]: which of sequence i's
        n rows need logits (indices into its chunk). Python touches each sequence a few
        times and each token once (its id); everything else is whole-array NumPy."""
        bs = self.block_size
        seqs = [s for s, _ in scheduled]
        B = len(seqs)
        q_lens = np.fromiter((n for _, n in scheduled), np.int32, B)  # (B,)
        starts = np.fromiter((s.num_computed_tokens for s in seqs), np.int32, B)  # (B,)
        qsl = np.zeros(B + 1, dtype=np.int32)
        np.cumsum(q_lens, out=qsl[1:])
        T = int(qsl[-1])
        new_tokens = (s.token_ids[a : a + n] for s, a, n in zip(seqs, starts.tolist(), q_lens.tolist()))
        input_ids = np.fromiter(itertools.chain.from_iterable(new_tokens), np.int32, T)  # (T,)
        seq_of_token = np.repeat(np.arange(B), q_lens)  # (T,)
        positions = (np.arange(T, dtype=np.int32) - qsl[:-1][seq_of_token] + starts[seq_of_token]).astype(np.int32)
        # Block tables, (B, max_blocks) zero-padded: one flat copy of every table, scattered by index.
        n_blocks = np.fromiter((len(s.block_table) for s in seqs), np.int64, B)
        flat = np.fromiter(itertools.chain.from_iterable(s.block_table for s in seqs), np.int32, int(n_blocks.sum()))
        block_tables = np.zeros((B, int(n_blocks.max())), dtype=np.int32)
        row_of_block = np.repeat(np.arange(B), n_blocks)
        col_of_block = np.arange(flat.size) - np.repeat(np.cumsum(n_blocks) - n_blocks, n_blocks)
        block_tables[row_of_block, col_of_block] = flat
        slot_mapping = (block_tables[seq_of_token, positions // bs] * bs + positions % bs).astype(np.int32)
        logits_indices = np.concatenate([qsl[i] + r for i, r in enumerate(logits_rows)]).astype(np.int32)
        # M-RoPE: (3, T) where a sequence has images; text rows (all a graph replays) keep t in positions
        mrope = batch_mrope_positions(seqs, starts, qsl, positions, self.mrope_merge) if self.mrope_merge else None
        rope_positions = positions if mrope is None else mrope[0]
        hb = HostBatch(input_ids, rope_positions, slot_mapping, starts + q_lens, qsl, logits_indices, block_tables)
        if self.encoder_cache is not None and any(s.request.images for s in seqs):
            bidirectional = self.model.config.vision.bidirectional
            hb.mm = build_mm_batch(scheduled, starts, qsl, self.encoder_cache, bidirectional, mrope)
        return hb

    def execute(self, scheduled: list[tuple[Sequence, int]], logits_rows: list[np.ndarray]) -> DeviceLogits:
        """Run one forward pass; returns the logits (N, V) of the requested rows, in order."""
        hb = self.build_batch(scheduled, logits_rows)
        if self.lora is not None:  # adapters into slots; their slot indices go up with the batch
            hb.lora_slots = self.lora.activate([s.request.lora for s, _ in scheduled])
        return self.run(hb)

    def run(self, hb: HostBatch) -> DeviceLogits:
        """The forward pass of a built batch (on a tensor-parallel worker, logits data None: rank 0 samples)."""
        # (batch size, query length); a step with image rows runs eagerly (a graph replays token embeddings)
        shape = self.graphs.pick(hb) if self.graphs is not None and hb.mm is None else None
        if shape is not None:
            hidden = self.graphs.run(hb, shape)  # (N, dim), replayed from the padded batch's graph
        else:
            batch = self.buffer.upload(hb)
            if self.lora is not None:
                self.lora.set_batch(batch)
            hidden = self.model.forward(batch, self.kv_caches)  # (N, dim)
        if hidden.shape[0] == 0:
            return DeviceLogits(self.backend, self.backend.zeros((0, self.model.config.vocab_size), np.float32))
        return DeviceLogits(self.backend, self.model.compute_logits(hidden))
