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

from rawpage.multimodal.image_input import ImageError, MediaPolicy, image_bytes_from_url, open_image

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


def load_images(sources: list[Any], policy: MediaPolicy) -> list[Any]:
    """PIL images from the sources (URLs decoded, PIL images as given)."""
    return [open_image(image_bytes_from_url(s, policy)) if isinstance(s, str) else s for s in sources]
