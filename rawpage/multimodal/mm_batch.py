"""One step's images, as the forward pass sees them: which rows of the flat batch take
an image's soft tokens instead of their token embeddings, and how far each row sees.

An image of a prompt is ImageInput (rawpage/multimodal/image_input.py): its N soft
tokens sit at prompt positions offset .. offset+N-1. A step computes tokens
start .. start+n-1 of a sequence; the rows it shares with an image take that image's
embeddings, which the EncoderCache computes once per image content. Gemma 3's image
tokens see their whole image (key_end); Qwen2.5-VL's attend causally, and take the
M-RoPE positions of rawpage/multimodal/mrope.py.
"""

from __future__ import annotations

import logging
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from rawpage.multimodal.image_input import ImageInput
    from rawpage.sequence import Sequence

logger = logging.getLogger("rawpage")


@dataclass(frozen=True)
class MultimodalBatch:
    rows: np.ndarray  # (M,) rows of the batch that take image embeddings
    embeds: np.ndarray  # (M, dim) float32, their embeddings
    # (T,) last key position a row sees beyond its own: its image's last token, or -1; None where
    # images attend causally (AttentionMetadata.key_end: every backend's attention takes it)
    key_end: np.ndarray | None
    positions: np.ndarray | None = None  # (3, T) M-RoPE (t, h, w) positions of every row (Qwen2.5-VL)


class EncoderCache:
    """Image embeddings by content digest, least recently used out past max_bytes: the
    encoder runs once per image, however many requests, chunks or recomputes show it. Each
    encode is logged with its time ("image encoded in N ms"; tools/compare_vision.py reads it)."""

    def __init__(
        self, encode: Callable[[np.ndarray, tuple[int, int, int]], np.ndarray], max_bytes: int = 256 << 20
    ) -> None:
        """encode(pixels, grid): the model's encode_image."""
        self.encode, self.max_bytes = encode, max_bytes
        self.entries: OrderedDict[str, np.ndarray] = OrderedDict()
        self.num_bytes = self.hits = self.misses = 0

    def get(self, image: ImageInput) -> np.ndarray:
        """(N, dim) float32 soft tokens of the image."""
        emb = self.entries.get(image.digest)
        if emb is not None:
            self.hits += 1
            self.entries.move_to_end(image.digest)
            return emb
        self.misses += 1
        t0 = time.perf_counter()
        emb = self.encode(image.pixels, image.grid)
        logger.info("image encoded in %.0f ms (%d tokens)", (time.perf_counter() - t0) * 1e3, emb.shape[0])
        self.entries[image.digest] = emb
        self.num_bytes += emb.nbytes
        while self.num_bytes > self.max_bytes and len(self.entries) > 1:
            self.num_bytes -= self.entries.popitem(last=False)[1].nbytes
        return emb


def build_mm_batch(
    scheduled: list[tuple[Sequence, int]],
    starts: np.ndarray,
    qsl: np.ndarray,
    cache: EncoderCache,
    bidirectional: bool = True,
    positions: np.ndarray | None = None,
) -> MultimodalBatch | None:
    """The step's image rows: scheduled (sequence, n new tokens), starts (B,) the first new
    token's position of each, qsl (B+1,) where each sequence's rows begin. None: no image.
    bidirectional: an image's rows see the whole image; positions: (3, T) M-RoPE ones, passed on."""
    rows, embeds = [], []
    key_end = np.full(int(qsl[-1]), -1, np.int32)  # (T,)
    for i, (seq, n) in enumerate(scheduled):
        a = int(starts[i])
        for image in seq.request.images:
            lo, hi = max(image.offset, a), min(image.offset + image.length, a + n)
            if lo >= hi:
                continue
            first = int(qsl[i]) + lo - a  # the batch row of token lo
            rows.append(np.arange(first, first + hi - lo))
            embeds.append(cache.get(image)[lo - image.offset : hi - image.offset])
            key_end[first : first + hi - lo] = image.offset + image.length - 1
    if not rows:
        return None
    return MultimodalBatch(np.concatenate(rows), np.concatenate(embeds), key_end if bidirectional else None, positions)
