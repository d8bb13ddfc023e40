"""The worst-case forward pass that GPU memory sizing measures (rawpage/memory.py).

The largest step the scheduler can send: --max-num-batched-tokens prompt tokens
spread over as many sequences as --max-num-seqs allows, none past --max-model-len
(where the rotary tables stop: models/decoder.py limit_positions), every sequence asking
for logits (the LM head's output, (B, V), is the other large activation), and
the greedy argmax the sampler then takes on the device. The KV cache does not
exist yet, so each layer gets a one-block stand-in: nothing is stored (every
slot is -1) and attention reads that one block for every position, which
touches the same activation memory a real cache would.
"""

from __future__ import annotations

import numpy as np

from rawpage.backends.base import Backend
from rawpage.device_logits import DeviceLogits
from rawpage.forward_batch import BatchBuffer, HostBatch


def worst_case_batch(num_tokens: int, num_seqs: int, block_size: int, max_model_len: int) -> HostBatch:
    """num_tokens prompt tokens in min(num_seqs, num_tokens) sequences of nearly equal length, each at most max_model_len."""
    B = max(1, min(num_seqs, num_tokens))
    num_tokens = min(num_tokens, B * max_model_len)
    q_lens = np.full(B, num_tokens // B, np.int32)
    q_lens[: num_tokens % B] += 1
    qsl = np.zeros(B + 1, np.int32)
    np.cumsum(q_lens, out=qsl[1:])
    T = int(qsl[-1])
    width = -(-int(q_lens.max()) // block_size)
    return HostBatch(
        input_ids=np.zeros(T, np.int32),
        positions=(np.arange(T) - np.repeat(qsl[:-1], q_lens)).astype(np.int32),
        slot_mapping=np.full(T, -1, np.int32),
        seq_lens=q_lens,
        query_start_loc=qsl,
        logits_indices=(qsl[1:] - 1).astype(np.int32),
        block_tables=np.zeros((B, width), np.int32),
    )


def profile_run(model, backend: Backend, num_tokens: int, num_seqs: int, block_size: int, max_model_len: int) -> None:
    """One worst-case step, start to sampled token ids; returns when the device is done."""
    c = model.config
    stand_in = (1, block_size, c.num_kv_heads, c.head_dim)  # (NB=1, BS, Hkv, D)
    kv = [(backend.zeros(stand_in), backend.zeros(stand_in)) for _ in range(c.num_layers)]
    batch = BatchBuffer(backend, 0).upload(worst_case_batch(num_tokens, num_seqs, block_size, max_model_len))
    logits = DeviceLogits(backend, model.compute_logits(model.forward(batch, kv)))
    logits.argmax(np.arange(len(logits)))
    backend.synchronize()
