"""Where a prompt's images go. The chat template writes one placeholder per image, and
the model's processor expands it into the image's N soft tokens, on the text, before
tokenizing:

    Gemma 3:     <start_of_image>  ->  \\n\\n <start_of_image> <image_soft_token> x N <end_of_image> \\n\\n
    Qwen2.5-VL:  <|vision_start|><|image_pad|><|vision_end|>  ->  <|vision_start|> <|image_pad|> x N_i <|vision_end|>

(transformers' Gemma3Processor and Qwen2_5_VLProcessor). Gemma's N is fixed; a Qwen
image's N_i = grid_h * grid_w / merge_size^2 depends on its size (ImageInput.length).
The soft-token positions then take the image's embeddings; place_images finds them in the ids.
"""

from __future__ import annotations

from dataclasses import replace

from rawpage.multimodal.image_input import ImageError, ImageInput
from rawpage.multimodal.vision_config import VisionConfig
from rawpage.text.tokenizer import Tokenizer


def _marker(vc: VisionConfig) -> int:
    """The token the chat template writes once per image."""
    return vc.boi_token_id if vc.family == "gemma3" else vc.image_token_id


def expand_image_text(text: str, images: list[ImageInput], vc: VisionConfig, tok: Tokenizer) -> str:
    """The prompt text with each image's placeholder expanded; one per image, in order."""
    boi, image, eoi = (tok.id_to_token(i) for i in (vc.boi_token_id, vc.image_token_id, vc.eoi_token_id))
    marker = tok.id_to_token(_marker(vc))
    pieces = text.split(marker)
    if len(pieces) - 1 != len(images):
        raise _count_error(len(pieces) - 1, len(images), vc, tok)
    if vc.family == "gemma3":
        return text.replace(boi, f"\n\n{boi}{image * vc.tokens_per_image}{eoi}\n\n")
    out = pieces[0]
    for im, rest in zip(images, pieces[1:]):
        out += image * im.length + rest
    return out


def _count_error(found: int, n: int, vc: VisionConfig, tok: Tokenizer, what: str = "") -> ImageError:
    """what: what was counted (a prompt's ids count runs of image tokens), else the placeholder."""
    boi, marker, eoi = (tok.id_to_token(i) for i in (vc.boi_token_id, _marker(vc), vc.eoi_token_id))
    where = marker if vc.family == "gemma3" else boi + marker + eoi
    return ImageError(
        f"the prompt has {found} {what or marker + ' placeholder(s)'} for {n} image(s); "
        f"put one {where} where each image goes (a chat template does this for image parts)"
    )


def expand_image_ids(
    ids: list[int], images: list[ImageInput], vc: VisionConfig, newlines: list[int], tok: Tokenizer
) -> list[int]:
    """Token ids with each bare placeholder expanded (a prompt given as ids); ids that
    already hold the soft tokens are returned as they are (Qwen: runs of each image's length).
    ImageError if the placeholders (or runs) and the images differ in number."""
    out = _expand_ids(ids, images, vc, newlines)
    found = len(_runs(out, vc.image_token_id))
    if found != len(images):
        raise _count_error(found, len(images), vc, tok, "image token run(s)")
    return out


def _expand_ids(ids: list[int], images: list[ImageInput], vc: VisionConfig, newlines: list[int]) -> list[int]:
    runs = _runs(ids, vc.image_token_id)
    if vc.family == "gemma3":
        if runs:
            return ids
        out: list[int] = []
        for t in ids:
            if t == vc.boi_token_id:
                out += [*newlines, t, *[vc.image_token_id] * vc.tokens_per_image, vc.eoi_token_id, *newlines]
            else:
                out.append(t)
        return out
    if len(runs) != len(images) or all(n == im.length for (_, n), im in zip(runs, images)):
        return ids  # as given (place_images refuses a mismatch)
    out, last = [], 0
    for (o, n), im in zip(runs, images):
        out += ids[last:o] + [vc.image_token_id] * (im.length if n == 1 else n)
        last = o + n
    return out + ids[last:]


def _runs(ids: list[int], token: int) -> list[tuple[int, int]]:
    """(offset, length) of each run of `token` in ids."""
    runs, i = [], 0
    while i < len(ids):
        if ids[i] == token:
            j = i
            while j < len(ids) and ids[j] == token:
                j += 1
            runs.append((i, j - i))
            i = j
        else:
            i += 1
    return runs


def place_images(ids: list[int], images: tuple[ImageInput, ...], vc: VisionConfig) -> tuple[ImageInput, ...]:
    """Each image with the offset of its run of soft tokens in ids: runs and images
    pair up in order, and must match in number and length."""
    runs = _runs(ids, vc.image_token_id)
    if len(runs) != len(images) or any(n != im.length for (_, n), im in zip(runs, images)):
        start = "<start_of_image>" if vc.family == "gemma3" else "<|vision_start|>"
        lengths = [im.length for im in images]
        each = f"each image is {lengths[0]}" if len(set(lengths)) == 1 else f"the images are {lengths}"
        raise ImageError(
            f"the prompt has {len(runs)} image token run(s) for {len(images)} image(s); "
            f"{each} image tokens after one {start}"
        )
    return tuple(replace(im, offset=o) for im, (o, _) in zip(images, runs))
