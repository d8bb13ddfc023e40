"""vLLM's mm_processor_kwargs: values that override the image processor's own
(preprocessor_config.json, or an mmproj's) for the whole server (--mm-processor-kwargs)
or for one request (the chat body's "mm_processor_kwargs", a prompt dict's, LLM.chat's
keyword); a request's are laid over the server's.

    Qwen2.5-VL:  {"min_pixels": N, "max_pixels": M}  the area smart_resize keeps each image within,
                                                    so its size and its number of soft tokens
    Gemma 3:     {"do_pan_and_scan": false}          what rawpage does anyway (no crops)

Any other key, for either family, is refused with the keys named: a kwarg that changed
nothing would look as if it had worked. A different resize makes other pixels (or another
grid), so the image's digest, and with it the prefix cache's block names, differ too.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from rawpage.multimodal.image_input import MAX_IMAGE_PIXELS, ImageError
from rawpage.multimodal.vision_config import VisionConfig

ACCEPTED = {"qwen2_5_vl": ("min_pixels", "max_pixels"), "gemma3": ("do_pan_and_scan",)}
FAMILY_NAMES = {"qwen2_5_vl": "Qwen2.5-VL", "gemma3": "Gemma 3"}


def with_processor_kwargs(vc: VisionConfig, kwargs: dict[str, Any] | None, where: str) -> VisionConfig:
    """vc with its processor overridden by kwargs; ImageError naming `where` (the flag or
    field) for a key the family's processor does not take, or a value it cannot use."""
    if not kwargs:
        return vc
    if not isinstance(kwargs, dict):
        raise ImageError(f"{where} must be a JSON object")
    accepted = ACCEPTED[vc.family]
    unknown = sorted(set(kwargs) - set(accepted))
    if unknown:
        raise ImageError(
            f"{where}: {', '.join(unknown)} not supported for {FAMILY_NAMES[vc.family]}; "
            f"rawpage's {FAMILY_NAMES[vc.family]} processor takes {', '.join(accepted)}"
        )
    if vc.family == "gemma3":
        if kwargs["do_pan_and_scan"] is not False:
            raise ImageError(f"{where}: do_pan_and_scan is not supported (each image is seen whole, at one size)")
        return vc
    proc = vc.processor
    lo, hi = (kwargs.get(k, getattr(proc, k)) for k in ("min_pixels", "max_pixels"))
    for name, n in (("min_pixels", lo), ("max_pixels", hi)):
        if not isinstance(n, int) or isinstance(n, bool) or not 1 <= n <= MAX_IMAGE_PIXELS:
            raise ImageError(f"{where}: {name} must be an integer from 1 to {MAX_IMAGE_PIXELS}, got {n!r}")
    if lo > hi:
        raise ImageError(f"{where}: min_pixels {lo} is over max_pixels {hi}")
    return replace(vc, processor=replace(proc, min_pixels=lo, max_pixels=hi))
