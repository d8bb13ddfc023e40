"""One step's images, as the forward pass sees them: which rows of the flat batch take
an image's soft tokens instead of their token embeddings, and how far each row sees.

An image of a prompt is ImageInput (rawpage/multimodal/image_input.py): its N soft
tokens sit at prompt positions offset .. offset+N-1. A step computes tokens
start .. start+n-1 of a sequence; the rows it shares with an image take that image's
embeddings, which the EncoderCache computes once per image content.
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
    seqs: np.ndarray  # (B',) the batch's sequences with image rows this step
    key_end: np.ndarray  # (T,) last key position a row sees beyond its own: its image's last token, or -1

    @property
    def spans(self) -> tuple[np.ndarray, np.ndarray]:
        """(seqs, key_end): what ops/paged_attention.image_attention redoes."""
        return self.seqs, self.key_end


class EncoderCache:
    """Image embeddings by content digest, least recently used out past max_bytes: the
    encoder runs once per image, however many requests, chunks or recomputes show it. Each
    encode is logged with its time ("image encoded in N ms"; tools/compare_vision.py reads it)."""

    def __init__(self, encode: Callable[[np.ndarray], np.ndarray], max_bytes: int = 256 << 20) -> None:
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
        emb = self.encode(image.pixels)
        logger.info("image encoded in %.0f ms (%d tokens)", (time.perf_counter() - t0) * 1e3, emb.shape[0])
        self.entries[image.digest] = emb
        self.num_bytes += emb.nbytes
        while self.num_bytes > self.max_bytes and len(self.entries) > 1:
            self.num_bytes -= self.entries.popitem(last=False)[1].nbytes
        return emb


def build_mm_batch(
    scheduled: list[tuple[Sequence, int]], starts: np.ndarray, qsl: np.ndarray, cache: EncoderCache
) -> MultimodalBatch | None:
    """The step's image rows: scheduled (sequence, n new tokens), starts (B,) the first new
    token's position of each, qsl (B+1,) where each sequence's rows begin. None: no image."""
    rows, embeds, seqs = [], [], []
    key_end = np.full(int(qsl[-1]), -1, np.int32)  # (T,)
    for i, (seq, n) in enumerate(scheduled):
        a, touched = int(starts[i]), False
        for image in seq.request.images:
            lo, hi = max(image.offset, a), min(image.offset + image.length, a + n)
            if lo >= hi:
                continue
            first = int(qsl[i]) + lo - a  # the batch row of token lo
            rows.append(np.arange(first, first + hi - lo))
            embeds.append(cache.get(image)[lo - image.offset : hi - image.offset])
            key_end[first : first + hi - lo] = image.offset + image.length - 1
            touched = True
        if touched:
            seqs.append(i)
    if not seqs:
        return None
    return MultimodalBatch(np.concatenate(rows), np.concatenate(embeds), np.array(seqs), key_end)
