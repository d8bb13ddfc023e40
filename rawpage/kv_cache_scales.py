"""The per-tensor scales of an FP8 KV cache (--kv-cache-dtype fp8).

    stored = e4m3(k / k_scale),   k ~ k_scale * stored      (V likewise)

--kv-cache-scales calculate (the default) computes them once at load: one
prefill of CALIBRATION_TOKENS fixed pseudo-random token ids into a float KV
cache, and each scale maps CALIBRATION_MARGIN times the largest |K| (|V|) over
every layer onto e4m3's largest value (448), so that later prompts with larger
activations still do not saturate. --kv-cache-scales K,V (or one number for
both) sets them; vLLM's default, 1.0, is `--kv-cache-scales 1`.
"""

from __future__ import annotations

import numpy as np

from rawpage.backends.base import Backend
from rawpage.forward_batch import BatchBuffer, HostBatch
from rawpage.ops.kv_cache_fp8 import kv_scales_from_amax

CALIBRATION_TOKENS = 64
CALIBRATION_MARGIN = 2.0


def calibrate_kv_cache_scales(model, backend: Backend, block_size: int, vocab_size: int) -> np.ndarray:
    """(k_scale, v_scale) from one prefill into a float KV cache (see the module docstring)."""
    c = model.config
    T = CALIBRATION_TOKENS
    nb = -(-T // block_size)
    shape = (nb, block_size, c.num_kv_heads, c.head_dim)  # (NB, BS, Hkv, D)
    caches = [(backend.zeros(shape), backend.zeros(shape)) for _ in range(c.num_layers)]
    ids = np.random.default_rng(0).integers(0, vocab_size, T).astype(np.int32)
    batch = HostBatch(
        input_ids=ids,
        positions=np.arange(T, dtype=np.int32),
        slot_mapping=np.arange(T, dtype=np.int32),  # block i of the table is physical block i
        seq_lens=np.array([T], np.int32),
        query_start_loc=np.array([0, T], np.int32),
        logits_indices=np.array([T - 1], np.int32),
        block_tables=np.arange(nb, dtype=np.int32)[None],
    )
    model.forward(BatchBuffer(backend, 0).upload(batch), caches)
    k_amax = max(float(np.abs(backend.to_numpy(k)).max()) for k, _ in caches)
    v_amax = max(float(np.abs(backend.to_numpy(v)).max()) for _, v in caches)
    k_amax, v_amax = _largest_over_ranks(model, backend, k_amax, v_amax)
    return kv_scales_from_amax(CALIBRATION_MARGIN * k_amax, CALIBRATION_MARGIN * v_amax)


def _largest_over_ranks(model, backend: Backend, k_amax: float, v_amax: float) -> tuple[float, float]:
    """Under tensor parallelism each rank saw only its KV heads: every rank takes the
    largest over all of them, so the scales (and the tokens) are those of one rank."""
    tp = getattr(model, "tp", None)  # a rank's model (models/sharding.py apply_tensor_parallel)
    if tp is None:
        return k_amax, v_amax
    every = backend.to_numpy(tp.comm.all_gather(backend.asarray(np.array([[k_amax, v_amax]]), np.float32)))
    return float(every[0, 0::2].max()), float(every[0, 1::2].max())  # every: (1, 2 P), [k0, v0, k1, v1, ...]
