"""Record reference outputs of the default model with Hugging Face transformers.

    python tools/make_golden.py            # writes tests/data/golden_smollm2.json

transformers is an independent implementation: its own GGUF reader (it
un-permutes q/k and dequantizes itself), its own tokenizer conversion, its own
Llama forward in torch. rawpage's tests compare against this file without
needing torch. Needs: pip install torch==2.13.0 transformers accelerate gguf.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

os.environ.setdefault("HF_HUB_OFFLINE", "1")

LOGIT_PROMPTS = [
    "The capital of France is",
    "def fibonacci(n):\n    if n < 2:\n        return n\n",
    "Numbers: 1234567890 and 3.14159, then   several   spaces.",
    "日本語のテキスト, émojis 😀🎉 and Ünïcödé.",
    "<|im_start|>user\nHi!<|im_end|>\n<|im_start|>assistant\n",
]
CHAT_PROMPTS = [
    "What is the capital of France?",
    "Write a haiku about the sea.",
    "List three primary colors.",
    "Explain what a CPU does in one sentence.",
    "How many legs does a spider have?",
]
TOP_K = 10
GREEDY_TOKENS = 32


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", help="GGUF file (default: the embedded SmolLM2 GGUF)")
    ap.add_argument(
        "--out",
        default=os.path.join(os.path.dirname(__file__), "..", "tests", "data", "golden_smollm2.json"),
    )
    args = ap.parse_args()
    json.dump(record(args.model), open(args.out, "w"), indent=1)
    print(f"wrote {args.out}", file=sys.stderr)


def record(model_path: str | None = None) -> dict:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from rawpage.loader.default_model import default_model_path

    path = model_path or default_model_path()
    folder, name = os.path.split(path)
    tok = AutoTokenizer.from_pretrained(folder, gguf_file=name)
    model = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=torch.float32).eval()
    out: dict = {"model": name, "top_k": TOP_K, "logits": [], "greedy": []}
    with torch.no_grad():
        for text in LOGIT_PROMPTS:
            ids = tok(text, add_special_tokens=True).input_ids
            logits = model(torch.tensor([ids])).logits[0]  # (n, V)
            top = torch.topk(logits, TOP_K, dim=-1)
            out["logits"].append(
                {
                    "prompt": text,
                    "ids": ids,
                    "top_ids": top.indices.tolist(),
                    "top_logits": top.values.tolist(),
                }
            )
        for question in CHAT_PROMPTS:
            msgs = [{"role": "user", "content": question}]
            ids = tok.apply_chat_template(msgs, add_generation_prompt=True, tokenize=True, return_dict=True)[
                "input_ids"
            ]
            seq = list(ids)
            for _ in range(GREEDY_TOKENS):  # plain greedy, no EOS stop, full recompute: nothing clever
                seq.append(int(model(torch.tensor([seq])).logits[0, -1].argmax()))
            gen = seq[len(ids) :]
            out["greedy"].append({"question": question, "prompt_ids": ids, "tokens": gen, "text": tok.decode(gen)})
    return out


if __name__ == "__main__":
    main()
