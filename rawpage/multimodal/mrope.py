"""Qwen2.5-VL's M-RoPE positions (transformers' get_rope_index, for images): each token
has three rotary positions (t, h, w). A text token has p + shift in all three, where p
is its place in the sequence and shift what the images before it took away. An image
of m x m-merged grid (1, gh, gw) whose first soft token sits where text position s
would be takes (s, s + row, s + col) for its tokens in row-major order, and the text
after it resumes at s + max(gh, gw): so each image shifts later positions by
max(gh, gw) - gh * gw.

The positions are a function of the prompt's tokens and images alone, so prefix-cached
blocks hold the same K as a recompute would, and decode tokens only need the shift
after the last image (ModelRunner.build_batch computes them where it builds the batch).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from rawpage.multimodal.image_input import ImageInput


def merged_grid(image: ImageInput, merge: int) -> tuple[int, int]:
    """(gh, gw): the image's soft tokens a column and a row."""
    _, h, w = image.grid
    return h // merge, w // merge


def mrope_positions(start: int, n: int, images: Sequence[ImageInput], merge: int) -> np.ndarray:
    """(3, n) int32 (t, h, w) positions of sequence tokens start .. start+n-1, images in prompt order."""
    p = np.arange(start, start + n, dtype=np.int64)
    out = np.repeat(p[None], 3, axis=0)  # (3, n)
    shift = 0
    for image in images:
        gh, gw = merged_grid(image, merge)
        o, end = image.offset, image.offset + image.length
        inside = (p >= o) & (p < end)
        if inside.any():
            idx = p[inside] - o  # row-major over the (gh, gw) token grid
            base = o + shift
            out[0, inside] = base
            out[1, inside] = base + idx // gw
            out[2, inside] = base + idx % gw
        shift += max(gh, gw) - image.length
        out[:, p >= end] += max(gh, gw) - image.length
    return out.astype(np.int32)


def batch_mrope_positions(
    seqs: Sequence, starts: np.ndarray, qsl: np.ndarray, positions: np.ndarray, merge: int
) -> np.ndarray | None:
    """(3, T) positions of a flat batch (starts (B,) each sequence's first new position, qsl
    (B+1,) its rows, positions (T,) the plain ones); None where no sequence has an image."""
    if not any(s.request.images for s in seqs):
        return None
    out = np.repeat(positions[None], 3, axis=0)
    for i, s in enumerate(seqs):
        if s.request.images:
            a, b = int(qsl[i]), int(qsl[i + 1])
            out[:, a:b] = mrope_positions(int(starts[i]), b - a, s.request.images, merge)
    return out
