"""Record transformers' outputs for the tiny vision-language models (tests/tiny_vlm.py,
tests/tiny_qwen_vl.py).

    python tools/make_golden_vlm.py                        # writes tests/data/golden_gemma3_vlm.json
    python tools/make_golden_vlm.py --family qwen2_5_vl    # writes tests/data/golden_qwen25vl.json

Two seeded images go through transformers' own Gemma 3 image processor (the PIL
one: bilinear resize, rescale, normalize), and the token ids of a prompt with both
images (each <start_of_image>, 4 soft tokens, <end_of_image>) through
Gemma3ForConditionalGeneration on the CPU in float32 with eager attention, with the
token_type_ids that make each image's tokens attend to each other both ways.
Recorded: the processor's pixel values, the projected image embeddings, the top 10
logits at every position and 8 greedy tokens (the whole sequence recomputed each
step). rawpage's tests compare against this file without torch
(tests/test_vision.py).

Qwen2.5-VL: the same two images through Qwen2VLImageProcessor (smart_resize to two
different sizes, bicubic, patches flattened with their grid_thw), a prompt of text,
<|vision_start|> <|image_pad|> x N_i <|vision_end|> for each image and text, through
Qwen2_5_VLForConditionalGeneration (eager attention, causal). Recorded as well: the
M-RoPE position ids of get_rope_index (tests/test_vision_qwen.py).
Needs: pip install torch transformers pillow.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile

os.environ.setdefault("HF_HUB_OFFLINE", "1")
sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

from tests.tiny_families import weights_digest  # noqa: E402
from tests.tiny_vlm import BOI, EOI, IMAGE, seeded_image, vlm_config, vlm_tensors, write_vlm  # noqa: E402

TOP_K = 10
GREEDY_TOKENS = 8
IMAGES = ((5, 45, 37), (6, 20, 50))  # (seed, width, height): one wider, one taller than square


def prompt_ids() -> list[int]:
    """bos, text, image 1, text, image 2, text: the images' soft tokens as the processor lays them."""
    rng = __import__("numpy").random.default_rng(23)
    text = [[int(t) for t in rng.integers(3, 390, n)] for n in (5, 3, 4)]
    image = [BOI] + [IMAGE] * vlm_config()["mm_tokens_per_image"] + [EOI]
    return [1] + text[0] + image + text[1] + image + text[2]


def reference(write, model_class, processor_class):
    """(transformers' model in float32 with eager attention, its image processor), loaded
    from the folder `write` makes; every weight must be used."""
    import torch

    with tempfile.TemporaryDirectory() as d:
        folder = write(os.path.join(d, "vlm"))
        model, info = model_class.from_pretrained(
            folder, dtype=torch.float32, attn_implementation="eager", output_loading_info=True
        )
        processor = processor_class.from_pretrained(folder)
    model.eval()
    if info["missing_keys"] or info["unexpected_keys"]:
        raise SystemExit(f"missing {info['missing_keys']}, unexpected {info['unexpected_keys']}")
    return model, processor


def record() -> dict:
    import torch
    import transformers
    from transformers import Gemma3ForConditionalGeneration
    from transformers.models.gemma3.image_processing_pil_gemma3 import Gemma3ImageProcessorPil

    cfg = vlm_config()
    model, processor = reference(write_vlm, Gemma3ForConditionalGeneration, Gemma3ImageProcessorPil)
    images = [seeded_image(*spec) for spec in IMAGES]
    pixel_values = processor(images, return_tensors="pt")["pixel_values"].float()  # (2, 3, S, S)
    ids = prompt_ids()
    with torch.no_grad():
        features = model.model.get_image_features(pixel_values).pooler_output  # (2, tokens, dim)

        def logits(seq: list[int]) -> torch.Tensor:
            t = torch.tensor([seq])
            return model(input_ids=t, pixel_values=pixel_values, token_type_ids=(t == IMAGE).long()).logits[0]

        top = torch.topk(logits(ids), TOP_K, dim=-1)
        seq = list(ids)
        for _ in range(GREEDY_TOKENS):
            seq.append(int(logits(seq)[-1].argmax()))
    return {
        "transformers": transformers.__version__,
        "weights": weights_digest(vlm_tensors(cfg)),
        "images": [list(spec) for spec in IMAGES],
        "pixel_values": [[round(x, 5) for x in pv.flatten().tolist()] for pv in pixel_values],
        "image_embeddings": [[round(x, 6) for x in f.flatten().tolist()] for f in features],
        "ids": ids,
        "top_ids": top.indices.tolist(),
        "top_logits": [[round(x, 6) for x in row] for row in top.values.tolist()],
        "greedy": seq[len(ids) :],
    }


def record_qwen() -> dict:
    import torch
    import transformers
    from transformers import Qwen2_5_VLForConditionalGeneration
    from transformers.models.qwen2_vl.image_processing_qwen2_vl import Qwen2VLImageProcessor

    from tests.tiny_qwen_vl import IMAGE_PAD, VISION_END, VISION_START, qwen_vl_config, qwen_vl_tensors, write_qwen_vl

    model, processor = reference(write_qwen_vl, Qwen2_5_VLForConditionalGeneration, Qwen2VLImageProcessor)
    images = [seeded_image(*spec) for spec in IMAGES]
    out = processor(images, return_tensors="pt")
    pixel_values, grid = out["pixel_values"].float(), out["image_grid_thw"]  # (sum S, 3 Tp P P), (2, 3)
    sizes = [int(g.prod()) for g in grid]
    tokens = [n // 4 for n in sizes]  # merge 2 x 2
    rng = __import__("numpy").random.default_rng(23)
    text = [[int(t) for t in rng.integers(3, 390, n)] for n in (5, 3, 4)]
    ids = text[0]
    for n, rest in zip(tokens, text[1:]):
        ids = ids + [VISION_START] + [IMAGE_PAD] * n + [VISION_END] + rest
    with torch.no_grad():
        features = model.model.get_image_features(pixel_values, grid)  # per image (N_i, dim)
        positions, deltas = model.model.get_rope_index(torch.tensor([ids]), grid, None, None)

        def logits(seq: list[int]) -> torch.Tensor:
            return model(input_ids=torch.tensor([seq]), pixel_values=pixel_values, image_grid_thw=grid).logits[0]

        top = torch.topk(logits(ids), TOP_K, dim=-1)
        seq, steps = list(ids), []
        for _ in range(GREEDY_TOKENS):  # decode positions continue past the images' shift
            last = torch.log_softmax(logits(seq)[-1], dim=-1)
            best = torch.topk(last, 5)
            steps.append([best.indices.tolist(), [round(x, 5) for x in best.values.tolist()]])
            seq.append(int(last.argmax()))
    starts = [0, sizes[0]]
    return {
        "transformers": transformers.__version__,
        "weights": weights_digest(qwen_vl_tensors(qwen_vl_config())),
        "images": [list(spec) for spec in IMAGES],
        "grid_thw": grid.tolist(),
        "pixel_values": [
            [round(x, 5) for x in pixel_values[a : a + n].flatten().tolist()] for a, n in zip(starts, sizes)
        ],
        "image_embeddings": [[round(x, 6) for x in f.flatten().tolist()] for f in features],
        "ids": ids,
        "rope_positions": positions[:, 0].tolist(),  # (3, L): t, h, w
        "rope_delta": int(deltas[0, 0]),
        "top_ids": top.indices.tolist(),
        "top_logits": [[round(x, 6) for x in row] for row in top.values.tolist()],
        "greedy": seq[len(ids) :],
        "greedy_logprobs": steps,  # each step's top 5 (ids, log-probabilities)
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--family", choices=("gemma3", "qwen2_5_vl"), default="gemma3")
    ap.add_argument("--out", help="default: tests/data/golden_gemma3_vlm.json or golden_qwen25vl.json")
    args = ap.parse_args()
    name = "golden_gemma3_vlm.json" if args.family == "gemma3" else "golden_qwen25vl.json"
    args.out = args.out or os.path.join(os.path.dirname(__file__), "..", "tests", "data", name)
    with open(args.out, "w") as f:
        json.dump(record() if args.family == "gemma3" else record_qwen(), f, separators=(",", ":"))
    print(f"wrote {args.out}", file=sys.stderr)


if __name__ == "__main__":
    main()
