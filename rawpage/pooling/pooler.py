"""Pooler: one vector per sequence, from the last layer's hidden states (after the final norm).

    last   the row of the sequence's last token (decoder embedding models: Qwen3-Embedding)
    mean   the average of every token's row
    cls    the row of its first token

A long input is prefilled in chunks over several steps, so pooling is incremental:
each chunk asks the forward pass only for the rows its pooling type needs (`rows`),
and `add` folds them into the request's running state (a sum for mean; the chosen
row for last and cls). A chunk that starts at position 0 resets that state, so a
sequence preempted and recomputed from scratch is pooled once, not twice.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field

import numpy as np

from rawpage.errors import UnsupportedModelError
from rawpage.sequence import Request, Sequence

# sentence-transformers' Pooling config -> our pooling type (1_Pooling/config.json)
_ST_MODES = {"pooling_mode_lasttoken": "last", "pooling_mode_mean_tokens": "mean", "pooling_mode_cls_token": "cls"}


@dataclass
class PoolingParams:
    """vLLM's PoolingParams for embeddings: what to do with a pooled vector.

    dimensions: keep the first `dimensions` entries, then normalise (Matryoshka).
    normalize: L2-normalise the vector (the embedding models' convention).
    truncate_prompt_tokens: keep only k tokens of a longer input; -1 = --max-model-len of
        them; None = a longer input is refused.
    truncation_side: which k stay: "right" (the default, vLLM's for pooling models) keeps
        the first k, "left" the last k (rawpage/prompt_truncation.py)."""

    dimensions: int | None = None
    normalize: bool = True
    truncate_prompt_tokens: int | None = None
    truncation_side: str = "right"


@dataclass
class PoolingRequest(Request):
    """A pooling engine's request: one sequence, whose prompt is pooled into one vector.
    (Its `params` stay the default SamplingParams: the scheduler reads n and prompt_logprobs.)"""

    pooling_params: PoolingParams = field(default_factory=PoolingParams)
    pooled: np.ndarray | None = None  # (dim,) float64: the running sum (mean), else the chosen row


def checkpoint_pooling_type(folder: str) -> str | None:
    """The pooling a sentence-transformers checkpoint was trained with: modules.json names
    its Pooling module's folder, whose config.json sets one pooling_mode_* flag. None when
    the checkpoint has no such config (or is a single GGUF file)."""
    modules_path = os.path.join(folder, "modules.json")
    if not os.path.isfile(modules_path):
        return None
    with open(modules_path) as f:
        modules = json.load(f)
    pooling = [m for m in modules if m.get("type", "").endswith(".Pooling")]
    config_path = os.path.join(folder, pooling[0].get("path", "1_Pooling") if pooling else "", "config.json")
    if not pooling or not os.path.isfile(config_path):
        return None
    with open(config_path) as f:
        config = json.load(f)
    modes = [name for name, on in config.items() if name.startswith("pooling_mode_") and on is True]
    found = [_ST_MODES[m] for m in modes if m in _ST_MODES]
    if len(modes) != 1 or not found:
        raise UnsupportedModelError(
            f"{config_path} asks for pooling {modes}; rawpage pools with one of last, mean or cls: "
            "choose one with --pooling-type"
        )
    return found[0]


def resolve_pooling_type(pooling_type: str, model_path: str) -> str:
    """--pooling-type, where `auto` reads the checkpoint's config and otherwise means last."""
    if pooling_type != "auto":
        return pooling_type
    return (checkpoint_pooling_type(model_path) if os.path.isdir(model_path) else None) or "last"


class Pooler:
    def __init__(self, pooling_type: str) -> None:
        assert pooling_type in ("last", "mean", "cls"), pooling_type
        self.pooling_type = pooling_type

    def rows(self, seq: Sequence, n: int) -> np.ndarray:
        """Which of the n rows of the sequence's next chunk the pooling needs (indices into
        the chunk): all of them for mean, its first token's for cls, its last token's for last."""
        start = seq.num_computed_tokens
        if self.pooling_type == "mean":
            return np.arange(n)
        if self.pooling_type == "cls":
            return np.zeros(1 if start == 0 else 0, dtype=np.int64)
        return np.array([n - 1]) if start + n == seq.num_tokens else np.zeros(0, dtype=np.int64)

    def add(self, req: PoolingRequest, start: int, hidden: np.ndarray) -> None:
        """Fold a chunk's rows (the ones `rows` asked for), hidden (R, dim), into the
        request's state; `start` is the chunk's first position."""
        if self.pooling_type == "mean":  # a running sum in float64, divided once at the end
            chunk_sum = hidden.sum(axis=0, dtype=np.float64)  # (dim,)
            req.pooled = chunk_sum if start == 0 or req.pooled is None else req.pooled + chunk_sum
        elif len(hidden):
            req.pooled = hidden[0].astype(np.float64)  # (dim,)

    def vector(self, req: PoolingRequest) -> list[float]:
        """The finished vector: averaged (mean), cut to `dimensions`, then L2-normalised."""
        params = req.pooling_params
        v = req.pooled / req.seqs[0].num_tokens if self.pooling_type == "mean" else req.pooled  # (dim,)
        if params.dimensions is not None:
            v = v[: params.dimensions]
        if params.normalize:
            v = v / max(float(np.linalg.norm(v)), 1e-12)  # as torch's F.normalize: eps keeps zero at zero
        return v.astype(np.float32).tolist()
