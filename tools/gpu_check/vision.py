"""Images on the device (issue 45): the tiny Gemma 3 vision-language model
(tests/tiny_vlm.py) against transformers' outputs recorded in
tests/data/golden_gemma3_vlm.json, as tests/test_vision.py checks them on the CPU.

    python -m tools.gpu_check.vision --device cuda --result-file vision.json

In float32 (the golden data's dtype), on --device cuda (or sim, which runs the same
kernels on the CPU; its test runs this file so):
  - the SigLIP encoder's image embeddings (our kernels: fused_add_layer_norm, gelu_tanh,
    full attention over the patches on the prefill kernel; the GEMMs on cuBLAS);
  - the logits at every position of the golden prompt with its two images in one chunk
    (image rows attend to each other both ways: the prefill kernels' key_end), at
    transformers' top 10, within the text families' tolerance;
  - the engine's 8 greedy tokens through LLM.generate with multi_modal_data, in 8-token
    chunks, against transformers' greedy tokens;
  - the encoder's median time for one image (tiny shapes: a smoke figure, not a benchmark);
  - the tiny Qwen2.5-VL of tests/tiny_qwen_vl.py against tests/data/golden_qwen25vl.json:
    its ViT's embeddings of both images (rms_norm, rope's 2D table, the windows' attention
    in one prefill launch a layer, silu_and_mul, gelu_erf) and the engine's greedy tokens.
Needs Pillow (tools/gpu_wheels.sh fetches it) and the tests folder of this tree.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from typing import Any

import numpy as np

from tools.gpu_check.common import write_json

GOLDEN = os.path.join(os.path.dirname(__file__), "..", "..", "tests", "data", "golden_gemma3_vlm.json")
QWEN_GOLDEN = os.path.join(os.path.dirname(GOLDEN), "golden_qwen25vl.json")
TOLERANCE = 1e-3  # max |logit difference| at transformers' top 10 (tests/test_vision.py)
ENCODER_TOLERANCE = 1e-4


def tiny_llm(folder: str, device: str, chunk: int) -> Any:  # a rawpage.LLM, imported late
    """A tiny model's engine in float32, 8-token blocks and prefill chunks of `chunk` tokens."""
    from rawpage import LLM

    return LLM(
        folder,
        device=device,
        dtype="float32",
        block_size=8,
        max_num_batched_tokens=chunk,
        max_num_seqs=4,
        gpu_memory_utilization=0.2,
    )


def run(device: str) -> dict:
    from tests.tiny_vlm import seeded_image, write_vlm

    with open(GOLDEN) as f:
        golden = json.load(f)
    ims = [seeded_image(*spec) for spec in golden["images"]]
    tmp = tempfile.mkdtemp()
    try:
        folder = write_vlm(os.path.join(tmp, "vlm"))
        # 8-token chunks, as tests/test_vision.py: the scheduler must not end a chunk inside an image
        llm = tiny_llm(folder, device, 8)
        result = _check(llm, golden, ims, device)
        del llm
        result.update(_check_qwen(device, os.path.join(tmp, "qwen")))
        result["ok"] = (
            result["ok"] and result["qwen_encoder_max_diff"] < ENCODER_TOLERANCE and result["qwen_greedy_matches"]
        )
        return result
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _check_qwen(device: str, folder: str) -> dict:
    """The tiny Qwen2.5-VL: its ViT's embeddings, and greedy tokens in 24-token chunks (as
    tests/test_vision_qwen.py runs them on the CPU)."""
    from rawpage import SamplingParams
    from rawpage.multimodal.image_input import image_input
    from tests.tiny_qwen_vl import write_qwen_vl
    from tests.tiny_vlm import seeded_image

    with open(QWEN_GOLDEN) as f:
        golden = json.load(f)
    ims = [seeded_image(*spec) for spec in golden["images"]]
    llm = tiny_llm(write_qwen_vl(folder), device, 24)
    model = llm.engine.runner.model
    inputs = [image_input(im, model.config.vision) for im in ims]
    got = [model.encode_image(inp.pixels, inp.grid).ravel() for inp in inputs]
    diff = max(float(np.abs(e - np.array(g)).max()) for e, g in zip(got, golden["image_embeddings"]))
    params = SamplingParams(temperature=0, max_tokens=len(golden["greedy"]))
    (out,) = llm.generate(
        {"prompt_token_ids": golden["ids"], "multi_modal_data": {"image": ims}}, params, use_tqdm=False
    )
    return {"qwen_encoder_max_diff": diff, "qwen_greedy_matches": list(out.outputs[0].token_ids) == golden["greedy"]}


def _check(llm, golden: dict, ims: list, device: str) -> dict:
    from rawpage import SamplingParams
    from rawpage.multimodal.image_input import image_input
    from rawpage.multimodal.mm_batch import MultimodalBatch
    from tests.model_harness import SingleSequence
    from tests.tiny_vlm import IMAGE

    model = llm.engine.runner.model
    pixels = [image_input(im, model.config.vision).pixels for im in ims]
    embeds = [model.encode_image(p) for p in pixels]
    encoder_diff = max(float(np.abs(e.ravel() - np.array(g)).max()) for e, g in zip(embeds, golden["image_embeddings"]))
    times = []
    for _ in range(5):
        model.backend.synchronize()
        t = time.perf_counter()
        model.encode_image(pixels[0])  # returns on the host: the work is done
        times.append(1e3 * (time.perf_counter() - t))

    ids = golden["ids"]  # the prompt with both images in one chunk, logits at every row
    runs = [i for i in range(len(ids)) if ids[i] == IMAGE and ids[i - 1] != IMAGE]
    n = model.config.vision.tokens_per_image
    key_end = np.full(len(ids), -1, np.int32)
    for r in runs:
        key_end[r : r + n] = r + n - 1
    rows = np.concatenate([np.arange(r, r + n) for r in runs])
    mm = MultimodalBatch(rows, np.concatenate(embeds), key_end)
    logits = SingleSequence(model, block_size=8).feed(ids, all_logits=True, mm=mm)
    top_ids, top = np.array(golden["top_ids"]), np.array(golden["top_logits"])
    logit_diff = float(np.abs(np.take_along_axis(logits, top_ids, axis=1) - top).max())

    params = SamplingParams(temperature=0, max_tokens=len(golden["greedy"]))
    prompt = {"prompt_token_ids": ids, "multi_modal_data": {"image": ims}}
    (out,) = llm.generate(prompt, params, use_tqdm=False)
    greedy = list(out.outputs[0].token_ids)
    return {
        "device": device,
        "dtype": "float32",
        "encoder_max_diff": encoder_diff,
        "logits_max_diff": logit_diff,
        "greedy": greedy,
        "greedy_matches": greedy == golden["greedy"],
        "encode_ms": statistics.median(times),
        "ok": encoder_diff < ENCODER_TOLERANCE and logit_diff < TOLERANCE and greedy == golden["greedy"],
    }


NAME = "tiny Gemma 3 VLM, 2 images, float32, vs transformers (and the tiny Qwen2.5-VL)"


def summary_rows(r: dict | None) -> list[tuple[str, str, str, str]]:
    """(check, figure, target, verdict) rows for summary.py's table."""
    target = f"logits <= {TOLERANCE:g}, embeddings <= {ENCODER_TOLERANCE:g}, greedy identical"
    if not r:
        return [(NAME, "not measured", target, "—")]
    fig = (
        f"logits {r['logits_max_diff']:.1e}, embeddings {r['encoder_max_diff']:.1e}, greedy "
        f"{'identical' if r['greedy_matches'] else 'DIFFERS'}; encoder {r['encode_ms']:.2f} ms an image; "
        f"Qwen2.5-VL embeddings {r.get('qwen_encoder_max_diff', float('nan')):.1e}, greedy "
        f"{'identical' if r.get('qwen_greedy_matches') else 'DIFFERS'}"
    )
    return [(f"{NAME} ({r['device']})", fig, target, "ok" if r["ok"] else "MISS")]


def failed(r: dict | None) -> list[str]:
    """Images off the golden data are a correctness failure of the check."""
    if r and not r["ok"]:
        return [f"vision: {summary_rows(r)[0][1]}"]
    return []


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default="cuda", choices=["cuda", "sim", "cpu"])
    ap.add_argument("--result-file")
    args = ap.parse_args(argv)
    result = run(args.device)
    write_json(args.result_file, {"vision": result})
    if not result["ok"]:
        print(f"vision: {summary_rows(result)[0][1]}", file=sys.stderr)
        raise SystemExit(1)
    return result


if __name__ == "__main__":
    main()
