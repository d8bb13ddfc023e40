"""An image from a request, decoded within limits and made into the tower's input.

    data URL / file under --allowed-local-media-path / http(s) from --allowed-media-domains
    (multimodal/chat_images.py, media_fetch.py) / PIL image / NumPy (H, W, C) uint8 array
      -> bytes (at most MAX_IMAGE_BYTES) -> header read: format in IMAGE_FORMATS,
         width x height at most MAX_IMAGE_PIXELS (a decompression bomb stops here,
         before a pixel is decoded) -> RGB (transparency over white)
      -> resize to the processor's size -> x * rescale -> (x - mean) / std -> (3, S, S)
      -> Qwen2.5-VL: patches flattened as Qwen2VLImageProcessor lays them (patchify)

as transformers' image processor does from preprocessor_config.json. Its digest
(SHA-256 of its grid and those float32 pixels) names the image in the encoder cache
and in the prefix cache's block names. Pillow is the optional extra `rawpage[vision]`.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import io
import os
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from rawpage.multimodal.vision_config import ImageProcessorConfig, VisionConfig

MAX_IMAGE_BYTES = 20 << 20  # an encoded image, as OpenAI's API allows
MAX_IMAGE_PIXELS = 8192 * 8192  # width x height, read from the header before decoding
IMAGE_FORMATS = ("PNG", "JPEG", "WEBP", "GIF")  # what OpenAI's and Anthropic's APIs take


class ImageError(ValueError):
    """A request's image cannot be used: the servers answer 400 with this message."""


@dataclass(frozen=True)
class ImageInput:
    """One image of a prompt: its preprocessed pixels and where its soft tokens sit."""

    digest: str  # SHA-256 of grid and pixels: the encoder cache's key, and part of the KV block names
    pixels: np.ndarray = field(repr=False)  # (3, S, S) float32, normalized; Qwen: (t*h*w, 3 Tp P P) patches
    offset: int = 0  # prompt position of its first soft token
    length: int = 0  # N soft tokens
    grid: tuple[int, int, int] = (1, 1, 1)  # Qwen: (t, h, w) patches, the processor's image_grid_thw


@dataclass(frozen=True)
class MediaPolicy:
    """Where image URLs may point (vLLM's --allowed-local-media-path, --allowed-media-domains);
    data URLs always work."""

    allowed_local_media_path: str | None = None
    allowed_media_domains: tuple[str, ...] = ()


def _pil() -> Any:
    try:
        from PIL import Image
    except ImportError:
        raise ImageError("image input needs Pillow: pip install 'rawpage[vision]'") from None
    return Image


def decode_base64(payload: str) -> bytes:
    if len(payload) > MAX_IMAGE_BYTES * 4 // 3 + 4:
        raise ImageError(f"image is over {MAX_IMAGE_BYTES} bytes")
    try:
        return base64.b64decode(payload, validate=True)
    except (binascii.Error, ValueError):
        raise ImageError("image data is not valid base64") from None


def local_file(path: str, policy: MediaPolicy) -> bytes:
    """A file:// URL's bytes, if its real path is under --allowed-local-media-path."""
    root = policy.allowed_local_media_path
    if not root:
        raise ImageError("file:// image URLs need the server to run with --allowed-local-media-path")
    real, base = os.path.realpath(path), os.path.realpath(root)
    if os.path.commonpath([real, base]) != base:
        raise ImageError(f"file:// image URLs must be under --allowed-local-media-path {root}")
    try:
        if os.path.getsize(real) > MAX_IMAGE_BYTES:
            raise ImageError(f"image is over {MAX_IMAGE_BYTES} bytes")
        with open(real, "rb") as f:
            return f.read()
    except OSError as e:
        raise ImageError(f"cannot read image file {path}: {e.strerror}") from None


def open_image(data: bytes) -> Any:
    """A PIL image from encoded bytes, refused before decoding if its format or size is not allowed."""
    Image = _pil()
    if len(data) > MAX_IMAGE_BYTES:
        raise ImageError(f"image is {len(data)} bytes, over the limit of {MAX_IMAGE_BYTES}")
    head = data[:256].lstrip().lower()
    if head.startswith((b"<svg", b"<?xml")) or b"<svg" in head:
        raise ImageError("SVG images are not supported (send PNG, JPEG, WebP or GIF)")
    try:
        im = Image.open(io.BytesIO(data), formats=IMAGE_FORMATS)  # reads the header only
    except Image.DecompressionBombError:  # Pillow's own guard, past 2 x its MAX_IMAGE_PIXELS
        raise ImageError(f"image is larger than {MAX_IMAGE_PIXELS} pixels (width x height)") from None
    except Exception:  # UnidentifiedImageError, or a header Pillow cannot parse
        raise ImageError(f"image data is not a decodable {', '.join(IMAGE_FORMATS)} image") from None
    check_size(im.size)
    try:
        im.load()
    except Exception as e:  # a truncated or corrupt body
        raise ImageError(f"image data could not be decoded ({type(e).__name__})") from None
    return im


def check_size(size: tuple[int, int]) -> None:
    w, h = size
    if w < 1 or h < 1 or w * h > MAX_IMAGE_PIXELS:
        raise ImageError(f"image is {w}x{h} pixels; at most {MAX_IMAGE_PIXELS} pixels (width x height) are accepted")


def as_pil(im: Any) -> Any:
    """A PIL image as it is, or one from vLLM's other image form: a NumPy uint8 array of
    (H, W, 3) RGB, (H, W, 4) RGBA or (H, W) grey pixels."""
    Image = _pil()
    if isinstance(im, np.ndarray):
        if im.dtype != np.uint8 or not (im.ndim == 2 or (im.ndim == 3 and im.shape[2] in (3, 4))):
            raise ImageError(
                f"an image array must be uint8 of shape (H, W, 3) RGB, (H, W, 4) RGBA or (H, W) grey; "
                f"got {im.dtype} {im.shape}"
            )
        check_size((im.shape[1], im.shape[0]))
        return Image.fromarray(np.ascontiguousarray(im))
    if not isinstance(im, Image.Image):
        raise ImageError(f"an image must be a PIL.Image.Image or a NumPy uint8 array, not {type(im).__name__}")
    return im


def check_aspect(w: int, h: int, proc: ImageProcessorConfig) -> None:
    if max(w, h) > 200 * min(w, h) and proc.min_pixels:
        raise ImageError(f"image is {w}x{h} pixels; its aspect ratio must be under 200 (Qwen2-VL's processor)")


def preprocess(im: Any, proc: ImageProcessorConfig) -> np.ndarray:
    """A PIL image (or array) -> (3, height, width) float32, as the checkpoint's image processor makes it."""
    Image = _pil()
    im = as_pil(im)
    check_size(im.size)
    if "A" in im.getbands() or im.info.get("transparency") is not None:  # over white, as transformers does
        rgba = im.convert("RGBA")
        im = Image.alpha_composite(Image.new("RGBA", rgba.size, (255, 255, 255, 255)), rgba)
    w, h = im.size
    check_aspect(w, h, proc)
    im = im.convert("RGB").resize(proc.target_size(w, h), resample=Image.Resampling(proc.resample))
    x = np.asarray(im, dtype=np.float32) * np.float32(proc.rescale_factor)  # (H, W, 3)
    x = (x - np.asarray(proc.image_mean, np.float32)) / np.asarray(proc.image_std, np.float32)
    return np.ascontiguousarray(x.transpose(2, 0, 1))


def patchify(x: np.ndarray, vc: VisionConfig) -> tuple[np.ndarray, tuple[int, int, int]]:
    """Qwen2VLImageProcessor's patches: the image (3, H, W) repeated Tp times in time, cut
    into P x P patches ordered by m x m merge group (row-major groups, row-major inside
    one), each flattened as (3, Tp, P, P). Returns ((t*h*w, 3 Tp P P), grid (t, h, w))."""
    P, m, Tp = vc.patch_size, vc.spatial_merge_size, vc.temporal_patch_size
    C, H, W = x.shape
    gh, gw = H // P, W // P
    frames = np.broadcast_to(x, (Tp, C, H, W))  # one image: grid_t = 1
    p = frames.reshape(1, Tp, C, gh // m, m, P, gw // m, m, P)
    p = p.transpose(0, 3, 6, 4, 7, 2, 1, 5, 8)  # (t, h/m, w/m, m, m, C, Tp, P, P)
    return np.ascontiguousarray(p.reshape(gh * gw, C * Tp * P * P)), (1, gh, gw)


def tokens_for(size: tuple[int, int], vc: VisionConfig) -> int:
    """N soft tokens an image of size (width, height) becomes, known before it is resized."""
    if vc.family != "qwen2_5_vl":
        return vc.tokens_per_image
    check_aspect(*size, vc.processor)
    w, h = vc.processor.target_size(*size)
    return (w // vc.patch_size) * (h // vc.patch_size) // vc.spatial_merge_size**2


def image_input(im: Any, vc: VisionConfig) -> ImageInput:
    """An ImageInput (not yet placed in a prompt) from a PIL image (or array): its pixels
    as the model's processor makes them, and its number of soft tokens."""
    pixels, grid, n = preprocess(im, vc.processor), (1, 1, 1), vc.tokens_per_image
    if vc.family == "qwen2_5_vl":
        pixels, grid = patchify(pixels, vc)
        n = grid[0] * grid[1] * grid[2] // vc.spatial_merge_size**2
    digest = hashlib.sha256(np.asarray(grid, np.int64).tobytes() + pixels.tobytes()).hexdigest()
    return ImageInput(digest, pixels, length=n, grid=grid)
