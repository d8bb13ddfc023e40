"""Greedy outputs of every family on cpu (numpy and native kernels) and sim, token for
token, so that a refactor that must not change behaviour can be checked (issue 32).

    python tools/greedy_snapshot.py --out /tmp/before.json          # record
    python tools/greedy_snapshot.py --check /tmp/before.json        # compare, exit 1 on any change

Models: the tiny random folder of each family (tests/tiny_families.py, tiny Llama
and Qwen2 with q/k/v bias included) and tiny Q4_1 and Q8_0 GGUFs, on --device cpu with --cpu-kernels numpy and native, and on --device sim;
and the default SmolLM2 GGUF on cpu, both kernel paths (skipped where it is not
installed). Batches of prompts run together, so batching and paging are in the path.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from rawpage import LLM, SamplingParams  # noqa: E402
from tests.tiny_families import FAMILIES, write_family  # noqa: E402
from tests.tiny_models import random_tensors, tiny_config, train_tokenizer, write_gguf, write_hf_folder  # noqa: E402

PROMPTS = ["hello world", "the quick brown fox jumps over", "def f(x):\n\treturn", "one two three four five six"]
DEFAULT_PROMPTS = ["What is the capital of Japan?", "Write a haiku about the sea.", "1, 2, 3, 4,"]


def runs(folders: dict[str, str]) -> list[tuple[str, str, dict]]:
    """(name, model, engine kwargs) for each configuration recorded."""
    out = []
    for family, folder in folders.items():
        for kernels in ("numpy", "native"):
            out.append((f"{family}/cpu-{kernels}", folder, {"device": "cpu", "cpu_kernels": kernels}))
        out.append((f"{family}/sim", folder, {"device": "sim"}))
    return out


def greedy(model: str, kwargs: dict, prompts: list[str], tokens: int, kv: str = "8MiB") -> list[list[int]]:
    llm = LLM(model, max_model_len=256, kv_cache_memory=kv, seed=0, **kwargs)
    params = SamplingParams(temperature=0.0, max_tokens=tokens, ignore_eos=True)
    outs = llm.generate(prompts, params, use_tqdm=False)
    return [list(o.outputs[0].token_ids) for o in outs]


def record(tmp: str) -> dict[str, list[list[int]]]:
    tok = train_tokenizer()
    cfg = tiny_config()
    qwen2 = tiny_config("qwen2", attention_bias=True)
    folders = {
        "llama": write_hf_folder(os.path.join(tmp, "llama"), cfg, random_tensors(cfg), tok),
        "qwen2": write_hf_folder(os.path.join(tmp, "qwen2"), qwen2, random_tensors(qwen2), tok),
    }
    for qtype in ("Q4_1", "Q8_0"):  # packed weights: kept in their blocks on cpu-native and sim
        gguf_cfg = tiny_config(hidden_size=128, intermediate_size=256)
        path = os.path.join(tmp, f"llama-{qtype}.gguf")
        folders[f"gguf-{qtype}"] = write_gguf(path, gguf_cfg, random_tensors(gguf_cfg), tok, qtype=qtype)
    for family in FAMILIES:
        folders[family] = write_family(os.path.join(tmp, family), family, tok=tok)
    result = {}
    for name, model, kwargs in runs(folders):
        result[name] = greedy(model, kwargs, PROMPTS, 24)
        print(name, result[name][0][:8], flush=True)
    try:
        from rawpage.loader.default_model import default_model_path  # noqa: PLC0415

        path = default_model_path()
    except Exception as e:  # noqa: BLE001
        print(f"default model skipped: {e}")
        return result
    for kernels in ("numpy", "native"):
        name = f"smollm2/cpu-{kernels}"
        result[name] = greedy(path, {"device": "cpu", "cpu_kernels": kernels}, DEFAULT_PROMPTS, 32, "64MiB")
        print(name, result[name][0][:8], flush=True)
    return result


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    g = p.add_mutually_exclusive_group(required=True)
    g.add_argument("--out", help="write the snapshot here")
    g.add_argument("--check", help="compare with this snapshot")
    args = p.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        now = record(tmp)
    if args.out:
        with open(args.out, "w") as f:
            json.dump(now, f, indent=0)
        print(f"wrote {len(now)} runs to {args.out}")
        return 0
    with open(args.check) as f:
        before = json.load(f)
    changed = [k for k in sorted(set(before) | set(now)) if before.get(k) != now.get(k)]
    for k in changed:
        print(f"CHANGED {k}: before {before.get(k)} now {now.get(k)}")
    print(f"{len(now) - len(changed)} of {len(set(before) | set(now))} runs identical")
    return 1 if changed else 0


if __name__ == "__main__":
    sys.exit(main())
