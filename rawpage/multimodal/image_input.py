"""An image from a request, decoded within limits and made into the tower's input.

    data URL / file under --allowed-local-media-path / http(s) from --allowed-media-domains
    (multimodal/chat_images.py, media_fetch.py) / PIL image
      -> bytes (at most MAX_IMAGE_BYTES) -> header read: format in IMAGE_FORMATS,
         width x height at most MAX_IMAGE_PIXELS (a decompression bomb stops here,
         before a pixel is decoded) -> RGB (transparency over white)
      -> resize to the processor's size -> x * rescale -> (x - mean) / std -> (3, S, S)

as transformers' image processor does from preprocessor_config.json. Its digest
(SHA-256 of those float32 pixels) names the image in the encoder cache and in the
prefix cache's block names. Pillow is the optional extra `rawpage[vision]`.
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

from rawpage.multimodal.vision_config import ImageProcessorConfig

MAX_IMAGE_BYTES = 20 << 20  # an encoded image, as OpenAI's API allows
MAX_IMAGE_PIXELS = 8192 * 8192  # width x height, read from the header before decoding
IMAGE_FORMATS = ("PNG", "JPEG", "WEBP", "GIF")  # what OpenAI's and Anthropic's APIs take


class ImageError(ValueError):
    """A request's image cannot be used: the servers answer 400 with this message."""


@dataclass(frozen=True)
class ImageInput:
    """One image of a prompt: its preprocessed pixels and where its soft tokens sit."""

    digest: str  # SHA-256 of the pixels: the encoder cache's key, and part of the KV block names
    pixels: np.ndarray = field(repr=False)  # (3, S, S) float32, normalized
    offset: int = 0  # prompt position of its first soft token
    length: int = 0  # N soft tokens


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


def preprocess(im: Any, proc: ImageProcessorConfig) -> np.ndarray:
    """A PIL image -> (3, height, width) float32, as the checkpoint's image processor makes it."""
    Image = _pil()
    if not isinstance(im, Image.Image):
        raise ImageError(f"an image must be a PIL.Image.Image, not {type(im).__name__}")
    check_size(im.size)
    if "A" in im.getbands() or im.info.get("transparency") is not None:  # over white, as transformers does
        rgba = im.convert("RGBA")
        im = Image.alpha_composite(Image.new("RGBA", rgba.size, (255, 255, 255, 255)), rgba)
    im = im.convert("RGB").resize((proc.width, proc.height), resample=Image.Resampling(proc.resample))
    x = np.asarray(im, dtype=np.float32) * np.float32(proc.rescale_factor)  # (H, W, 3)
    x = (x - np.asarray(proc.image_mean, np.float32)) / np.asarray(proc.image_std, np.float32)
    return np.ascontiguousarray(x.transpose(2, 0, 1))


def image_input(im: Any, proc: ImageProcessorConfig) -> ImageInput:
    """An ImageInput (not yet placed in a prompt) from a PIL image."""
    pixels = preprocess(im, proc)
    return ImageInput(hashlib.sha256(pixels.tobytes()).hexdigest(), pixels)
