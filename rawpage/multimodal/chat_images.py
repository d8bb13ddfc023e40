"""Images in chat messages, in OpenAI's shape, whichever API sent them: the servers turn
Anthropic's `image` blocks and Responses' `input_image` items into these parts too.

    {"type": "image_url", "image_url": {"url": "data:image/png;base64,..."}}   (or "image_url": "<url>")
    {"type": "image_pil", "image_pil": <PIL.Image>}                             (offline LLM.chat, as vLLM)

take_images gives the messages as a chat template takes them, each image part as
{"type": "image"} (the template writes the model's placeholder there), and the images'
sources in order; load_images decodes them within the limits (image_input.py).
"""

from __future__ import annotations

from typing import Any

from rawpage.multimodal.image_input import ImageError, MediaPolicy, decode_base64, local_file, open_image
from rawpage.multimodal.prompt_images import PromptImages

IMAGE_PART_TYPES = ("image_url", "image_pil")


def image_source(part: dict[str, Any], where: str) -> Any:
    """The URL (or, offline, the PIL image) of one image part, its shape checked."""
    if part["type"] == "image_pil":
        return part.get("image_pil")
    url = part.get("image_url")
    if isinstance(url, dict):
        if url.get("detail", "auto") not in ("auto", "low", "high"):
            raise ImageError(f"{where}.image_url.detail must be auto, low or high")
        url = url.get("url")
    if not isinstance(url, str) or not url:
        raise ImageError(f"{where}.image_url must be an object with a 'url' string")
    return url


def take_images(messages: list[dict[str, Any]]) -> tuple[list[dict[str, Any]], list[Any]]:
    """(messages for the template, image sources in order); messages without images as they are."""
    out, sources = [], []
    for i, m in enumerate(messages):
        content = m.get("content")
        if not isinstance(content, list) or not any(_is_image(p) for p in content):
            out.append(m)
            continue
        parts = []
        for j, p in enumerate(content):
            if _is_image(p):
                sources.append(image_source(p, f"messages[{i}].content[{j}]"))
                parts.append({"type": "image"})
            else:
                parts.append(p)
        out.append({**m, "content": parts})
    return out, sources


def _is_image(part: Any) -> bool:
    return isinstance(part, dict) and part.get("type") in IMAGE_PART_TYPES


def load_images(sources: list[Any], images: PromptImages) -> list[Any]:
    """PIL images from chat image parts' sources (URLs fetched and decoded, PIL images as
    given); the model and the count are checked before anything is fetched or decoded."""
    images.require_vision()
    images.check_count(len(sources))
    return [open_image(image_bytes_from_url(s, images.policy)) if isinstance(s, str) else s for s in sources]


def image_bytes_from_url(url: str, policy: MediaPolicy) -> bytes:
    """The encoded image an image_url names: a data URL, file:// under the allowed path,
    or http(s) from an allowed domain."""
    if url.startswith("data:"):
        header, sep, payload = url.partition(",")
        if not sep or not header.endswith(";base64"):
            raise ImageError("an image data URL must be data:image/<format>;base64,<data>")
        if "svg" in header.lower():
            raise ImageError("SVG images are not supported (send PNG, JPEG, WebP or GIF)")
        return decode_base64(payload)
    if url.startswith("file://"):
        return local_file(url[len("file://") :], policy)
    if url.startswith(("http://", "https://")):
        # imported here: http.client and ssl hold ~6 MB, and most servers never fetch an image
        from rawpage.multimodal.media_fetch import fetch_image

        return fetch_image(url, policy.allowed_media_domains)
    raise ImageError(f"unsupported image URL scheme in {url[:40]!r}: use a data URL (data:image/png;base64,...)")
