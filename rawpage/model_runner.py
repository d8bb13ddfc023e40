"""ModelRunner: owns the model and the paged KV cache, and runs one scheduled batch.

It turns the scheduler's list of (sequence, new tokens) into the flat arrays the
model reads (input_ids, positions, slot_mapping, block_tables, seq_lens,
query_start_loc), built with vectorized NumPy and copied to the device once,
then runs the forward pass and returns the logits rows the engine asked for.
"""

from __future__ import annotations

import numpy as np

from rawpage.backends.base import Array, Backend
from rawpage.config import ModelConfig
from rawpage.forward_batch import ForwardBatch
from rawpage.sequence import Sequence


def kv_bytes_per_block(config: ModelConfig, block_size: int, itemsize: int) -> int:
    """K and V, every layer: 2 * L * BS * Hkv * D * bytes."""
    return 2 * config.num_layers * block_size * config.num_kv_heads * config.head_dim * itemsize


class ModelRunner:
    def __init__(self, model, backend: Backend, block_size: int, num_blocks: int, num_cpu_blocks: int = 0) -> None:
        c = model.config
        self.model, self.backend, self.block_size = model, backend, block_size
        shape = (num_blocks, block_size, c.num_kv_heads, c.head_dim)  # (NB, BS, Hkv, D)
        self.kv_caches: list[tuple[Array, Array]] = [
            (backend.zeros(shape), backend.zeros(shape)) for _ in range(c.num_layers)
        ]
        # The swap pool: the same layout in host memory, (NB_cpu, BS, Hkv, D) per layer.
        cpu_shape = (num_cpu_blocks, block_size, c.num_kv_heads, c.head_dim)
        dtype = self.kv_caches[0][0].dtype
        self.cpu_caches = [(np.zeros(cpu_shape, dtype), np.zeros(cpu_shape, dtype)) for _ in range(c.num_layers)]

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

    def build_batch(self, scheduled: list[tuple[Sequence, int]], logits_rows: list[np.ndarray]) -> ForwardBatch:
        """scheduled: (sequence, n new tokens) pairs; logits_rows[i]: which of sequence i's
        n rows need logits (indices into its chunk)."""
        bs = self.block_size
        seqs = [s for s, _ in scheduled]
        q_lens = np.array([n for _, n in scheduled], dtype=np.int32)  # (B,)
        starts = np.array([s.num_computed_tokens for s in seqs], dtype=np.int32)  # (B,)
        qsl = np.zeros(len(seqs) + 1, dtype=np.int32)
        np.cumsum(q_lens, out=qsl[1:])
        T = int(qsl[-1])
        input_ids = np.fromiter(
            (t for s, n in scheduled for t in s.token_ids[s.num_computed_tokens : s.num_computed_tokens + n]),
            dtype=np.int32,
            count=T,
        )
        seq_of_token = np.repeat(np.arange(len(seqs)), q_lens)  # (T,)
        positions = (np.arange(T, dtype=np.int32) - qsl[:-1][seq_of_token] + starts[seq_of_token]).astype(np.int32)
        max_blocks = max(len(s.block_table) for s in seqs)
        block_tables = np.zeros((len(seqs), max_blocks), dtype=np.int32)  # (B, max_blocks), 0-padded
        for i, s in enumerate(seqs):
            block_tables[i, : len(s.block_table)] = s.block_table
        slot_mapping = (block_tables[seq_of_token, positions // bs] * bs + positions % bs).astype(np.int32)
        seq_lens = starts + q_lens
        logits_indices = np.concatenate([qsl[i] + r for i, r in enumerate(logits_rows)]).astype(np.int32)
        b = self.backend
        return ForwardBatch(
            input_ids=b.asarray(input_ids, np.int32),
            positions=b.asarray(positions, np.int32),
            slot_mapping=b.asarray(slot_mapping, np.int32),
            block_tables=b.asarray(block_tables, np.int32),
            seq_lens=b.asarray(seq_lens, np.int32),
            query_start_loc=b.asarray(qsl, np.int32),
            logits_indices=b.asarray(logits_indices, np.int32),
            host_query_lens=q_lens,
            host_seq_lens=seq_lens,
        )

    def execute(self, scheduled: list[tuple[Sequence, int]], logits_rows: list[np.ndarray]) -> np.ndarray:
        """Run one forward pass; returns float32 logits (N, V) for the requested rows, in order."""
        batch = self.build_batch(scheduled, logits_rows)
        hidden = self.model.forward(batch, self.kv_caches)
        if len(batch.host_query_lens) == 0 or hidden.shape[0] == 0:
            return np.zeros((0, self.model.config.vocab_size), dtype=np.float32)
        return self.backend.to_numpy(self.model.compute_logits(hidden)).astype(np.float32, copy=False)
