"""Where a prompt's images go: Gemma 3's chat template writes <start_of_image> for each
image, and its processor expands that into the image's soft tokens:

    <start_of_image>  ->  \\n\\n <start_of_image> <image_soft_token> x N <end_of_image> \\n\\n

(transformers' Gemma3Processor, on the text, before tokenizing). The N soft-token
positions then take the image's embeddings; place_images finds them in the ids.
"""

from __future__ import annotations

from dataclasses import replace

from rawpage.multimodal.image_input import ImageError, ImageInput
from rawpage.multimodal.vision_config import VisionConfig
from rawpage.text.tokenizer import Tokenizer


def expand_image_text(text: str, num_images: int, vc: VisionConfig, tok: Tokenizer) -> str:
    """The prompt text with each <start_of_image> expanded; one per image, in order."""
    boi, image, eoi = (tok.id_to_token(i) for i in (vc.boi_token_id, vc.image_token_id, vc.eoi_token_id))
    found = text.count(boi)
    if found != num_images:
        raise ImageError(
            f"the prompt has {found} {boi} placeholder(s) for {num_images} image(s); "
            f"put one {boi} where each image goes (a chat template does this for image parts)"
        )
    return text.replace(boi, f"\n\n{boi}{image * vc.tokens_per_image}{eoi}\n\n")


def expand_image_ids(ids: list[int], vc: VisionConfig, newlines: list[int]) -> list[int]:
    """Token ids with each bare <start_of_image> expanded (a prompt given as ids); ids that
    already hold the soft tokens are returned as they are."""
    if vc.image_token_id in ids:
        return ids
    out: list[int] = []
    for t in ids:
        if t == vc.boi_token_id:
            out += [*newlines, t, *[vc.image_token_id] * vc.tokens_per_image, vc.eoi_token_id, *newlines]
        else:
            out.append(t)
    return out


def place_images(ids: list[int], images: tuple[ImageInput, ...], vc: VisionConfig) -> tuple[ImageInput, ...]:
    """Each image with the offset of its run of N soft tokens in ids: runs and images
    pair up in order, and must match in number and length."""
    runs, i = [], 0
    while i < len(ids):
        if ids[i] == vc.image_token_id:
            j = i
            while j < len(ids) and ids[j] == vc.image_token_id:
                j += 1
            runs.append((i, j - i))
            i = j
        else:
            i += 1
    if len(runs) != len(images) or any(n != vc.tokens_per_image for _, n in runs):
        raise ImageError(
            f"the prompt has {len(runs)} image token run(s) for {len(images)} image(s); each image is "
            f"{vc.tokens_per_image} image tokens after one <start_of_image>"
        )
    return tuple(replace(im, offset=o, length=n) for im, (o, n) in zip(images, runs))
