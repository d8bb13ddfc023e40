"""Record transformers' outputs for the tiny model of each family (tests/tiny_families.py).

    python tools/make_golden_families.py       # writes tests/data/golden_families.json

For each family: the logits' top 10 at every position of two prompts (one
shorter than the sliding window, one longer), and 32 greedy tokens after each.
transformers runs on the CPU in float32 with eager attention (the one that
soft-caps), recomputing the whole sequence at every greedy step, so its sliding
window is its mask and not a cache. rawpage's tests compare against this file
without torch (tests/test_families.py). Needs: pip install torch==2.13.0 transformers.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile

os.environ.setdefault("HF_HUB_OFFLINE", "1")
sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

from tests.tiny_families import FAMILIES, family_config, hub_tensors, weights_digest, write_family  # noqa: E402

TOP_K = 10
GREEDY_TOKENS = 32
PROMPT_LENGTHS = (9, 40)  # inside and across the 16-32-token windows; with 32 more, under 128 (Phi-3's short RoPE)


def prompts(vocab: int) -> list[list[int]]:
    rng = __import__("numpy").random.default_rng(17)
    return [[int(t) for t in rng.integers(3, vocab, n)] for n in PROMPT_LENGTHS]


def record_family(family: str) -> dict:
    import torch
    from transformers import AutoModelForCausalLM

    cfg = family_config(family)
    out: dict = {"weights": weights_digest(hub_tensors(cfg)), "cases": []}
    with tempfile.TemporaryDirectory() as d:
        folder = write_family(os.path.join(d, family), family)
        model, info = AutoModelForCausalLM.from_pretrained(
            folder, dtype=torch.float32, attn_implementation="eager", output_loading_info=True
        )
    model.eval()
    # Every weight must come from the file: a missing one would be random in transformers only.
    if info["missing_keys"] or info["unexpected_keys"]:
        raise SystemExit(f"{family}: missing {info['missing_keys']}, unexpected {info['unexpected_keys']}")
    for ids in prompts(cfg["vocab_size"]):
        with torch.no_grad():
            logits = model(torch.tensor([ids])).logits[0].float()  # (n, V)
            top = torch.topk(logits, TOP_K, dim=-1)
            seq = list(ids)
            for _ in range(GREEDY_TOKENS):
                seq.append(int(model(torch.tensor([seq])).logits[0, -1].argmax()))
        out["cases"].append(
            {
                "ids": ids,
                "top_ids": top.indices.tolist(),
                "top_logits": [[round(x, 6) for x in row] for row in top.values.tolist()],
                "greedy": seq[len(ids) :],
            }
        )
    return out


def record(families: list[str] | None = None) -> dict:
    import transformers

    data = {"transformers": transformers.__version__, "top_k": TOP_K, "families": {}}
    for family in families or list(FAMILIES):
        data["families"][family] = record_family(family)
        print(f"recorded {family}", file=sys.stderr)
    return data


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument(
        "--out", default=os.path.join(os.path.dirname(__file__), "..", "tests", "data", "golden_families.json")
    )
    ap.add_argument("families", nargs="*", help=f"default: all of {', '.join(FAMILIES)}")
    args = ap.parse_args()
    with open(args.out, "w") as f:
        json.dump(record(args.families), f, separators=(",", ":"))
    print(f"wrote {args.out}", file=sys.stderr)


if __name__ == "__main__":
    main()
