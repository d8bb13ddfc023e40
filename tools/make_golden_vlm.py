"""Record transformers' outputs for the tiny Gemma 3 vision-language model (tests/tiny_vlm.py).

    python tools/make_golden_vlm.py       # writes tests/data/golden_gemma3_vlm.json

Two seeded images go through transformers' own Gemma 3 image processor (the PIL
one: bilinear resize, rescale, normalize), and the token ids of a prompt with both
images (each <start_of_image>, 4 soft tokens, <end_of_image>) through
Gemma3ForConditionalGeneration on the CPU in float32 with eager attention, with the
token_type_ids that make each image's tokens attend to each other both ways.
Recorded: the processor's pixel values, the projected image embeddings, the top 10
logits at every position and 8 greedy tokens (the whole sequence recomputed each
step). rawpage's tests compare against this file without torch
(tests/test_vision.py). Needs: pip install torch transformers pillow.
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


def record() -> dict:
    import torch
    import transformers
    from transformers import Gemma3ForConditionalGeneration
    from transformers.models.gemma3.image_processing_pil_gemma3 import Gemma3ImageProcessorPil

    cfg = vlm_config()
    with tempfile.TemporaryDirectory() as d:
        folder = write_vlm(os.path.join(d, "vlm"))
        model, info = Gemma3ForConditionalGeneration.from_pretrained(
            folder, dtype=torch.float32, attn_implementation="eager", output_loading_info=True
        )
        processor = Gemma3ImageProcessorPil.from_pretrained(folder)
    model.eval()
    if info["missing_keys"] or info["unexpected_keys"]:
        raise SystemExit(f"missing {info['missing_keys']}, unexpected {info['unexpected_keys']}")
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


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument(
        "--out", default=os.path.join(os.path.dirname(__file__), "..", "tests", "data", "golden_gemma3_vlm.json")
    )
    args = ap.parse_args()
    with open(args.out, "w") as f:
        json.dump(record(), f, separators=(",", ":"))
    print(f"wrote {args.out}", file=sys.stderr)


if __name__ == "__main__":
    main()
