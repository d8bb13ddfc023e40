"""The engine's one handling of a prompt's images, for every entry point (LLM.generate's
multi_modal_data, LLM.chat's and the servers' image parts): images become ImageInputs,
the prompt's placeholders are expanded, and each image is placed on its soft tokens
and checked against the model and the limits, or refused with InvalidRequestError.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from rawpage.errors import InvalidRequestError
from rawpage.multimodal.image_input import ImageError, ImageInput, MediaPolicy, as_pil, image_input, tokens_for
from rawpage.multimodal.placeholders import expand_image_ids, expand_image_text, place_images
from rawpage.multimodal.processor_kwargs import with_processor_kwargs
from rawpage.multimodal.vision_config import VisionConfig
from rawpage.text.tokenizer import Tokenizer

if TYPE_CHECKING:
    from rawpage.engine_args import EngineArgs

DEFAULT_IMAGES_PER_PROMPT = 8  # --limit-mm-per-prompt's default for images


class PromptImages:
    def __init__(
        self,
        vision: VisionConfig | None,
        tok: Tokenizer,
        model_name: str,
        args: EngineArgs,
        device: str = "cpu",
        no_vision: str = "it has no vision tower",
    ) -> None:
        """args: --limit-mm-per-prompt ({"image": N}), --max-num-batched-tokens (an image's
        tokens are computed in one step, so they must fit one), --mm-processor-kwargs (laid
        over the model's processor config here, at startup); device: the backend's name
        (for that flag's default); no_vision: why a model without vision has none."""
        served_kwargs = getattr(args, "mm_processor_kwargs", None)
        if served_kwargs and vision is None:
            raise ValueError(f"--mm-processor-kwargs: model {model_name!r} does not take images ({no_vision})")
        if vision is not None:
            vision = with_processor_kwargs(vision, served_kwargs, "--mm-processor-kwargs")
        self.vision, self.tok, self.model_name, self.device = vision, tok, model_name, device
        self.no_vision = no_vision
        self.max_chunk = args.batched_tokens(device)
        self.max_images = (args.limit_mm_per_prompt or {}).get("image", DEFAULT_IMAGES_PER_PROMPT)
        # where image URLs may point
        self.policy = MediaPolicy(args.allowed_local_media_path, tuple(args.allowed_media_domains or ()))

    @property
    def accepted(self) -> bool:
        """Whether prompts may hold images here (what require_vision lets through)."""
        return self.vision is not None

    def require_vision(self) -> VisionConfig:
        if self.vision is None:
            raise ImageError(f"model {self.model_name!r} does not take images ({self.no_vision}); send text only")
        return self.vision

    def check_count(self, n: int) -> None:
        if n > self.max_images:
            raise ImageError(
                f"the prompt has {n} images; at most {self.max_images} are allowed (--limit-mm-per-prompt "
                f"'{{\"image\": {self.max_images}}}')"
            )

    def inputs(self, images: list[Any], mm_processor_kwargs: dict[str, Any] | None = None) -> list[ImageInput]:
        """PIL images (or uint8 arrays) -> ImageInputs (not yet placed), processed with the
        request's mm_processor_kwargs over the server's; ImageInputs (LLM.chat's, already
        made) as they are."""
        vc = with_processor_kwargs(self.require_vision(), mm_processor_kwargs, "mm_processor_kwargs")
        self.check_count(len(images))
        try:
            return [im if isinstance(im, ImageInput) else self._input(as_pil(im), vc) for im in images]
        except ValueError as e:  # a size the processor refuses
            raise ImageError(str(e)) from None

    def _input(self, im: Any, vc: VisionConfig) -> ImageInput:
        n = tokens_for(im.size, vc)  # refused before resizing, since min_pixels can upscale
        if n > self.max_chunk:
            raise ImageError(
                f"the image would be {n} tokens, more than --max-num-batched-tokens {self.max_chunk}: "
                "an image's tokens are computed in one step (a smaller max_pixels in mm_processor_kwargs "
                "makes fewer)"
            )
        return image_input(im, vc)

    def from_multi_modal_data(self, data: Any, mm_processor_kwargs: dict[str, Any] | None = None) -> list[ImageInput]:
        """vLLM's prompt["multi_modal_data"]: {"image": a PIL image or uint8 array, or a list of them}."""
        if not isinstance(data, dict) or set(data) - {"image"}:
            raise ImageError('multi_modal_data must be {"image": image or [images]}; rawpage takes images only')
        images = data.get("image")
        return self.inputs(images if isinstance(images, list) else [images], mm_processor_kwargs)

    def expand_text(self, text: str, images: list[ImageInput], always: bool = False) -> str:
        """The text's placeholders expanded, one per image; always: check their number even
        with no images (multi_modal_data {"image": []} with a placeholder is refused)."""
        if not images and not always:
            return text
        return expand_image_text(text, images, self.require_vision(), self.tok)

    def expand_ids(self, ids: list[int], images: list[ImageInput]) -> list[int]:
        newlines = self.tok.encode("\n\n", add_special_tokens=False)
        return expand_image_ids(ids, images, self.require_vision(), newlines, self.tok)

    def place(self, ids: list[int], images: tuple[ImageInput, ...]) -> tuple[ImageInput, ...]:
        """The images placed on their soft tokens; InvalidRequestError if they cannot be."""
        if not images:
            return ()
        try:
            vc = self.require_vision()
            self.check_count(len(images))
            placed = place_images(ids, images, vc)
        except ImageError as e:
            raise InvalidRequestError(str(e), "prompt") from None
        longest = max(im.length for im in placed)
        if longest > self.max_chunk:
            raise InvalidRequestError(
                f"an image is {longest} tokens, more than --max-num-batched-tokens {self.max_chunk}: "
                "an image's tokens are computed in one step",
                "prompt",
            )
        return placed
