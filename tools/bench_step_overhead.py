"""What one engine step costs the CPU, apart from the forward pass itself.

    python tools/bench_step_overhead.py                 # batch 256 decoding at context 1024
    python tools/bench_step_overhead.py --batch 64 --context 4096

Runs a tiny dummy model on --device cpu (so the forward pass is cheap) with
--batch sequences decoding together, and splits each step's wall time into
  build_batch   the runner's batch metadata (NumPy, the part a GPU waits on
                before its one host-to-device copy),
  upload        packing that metadata and the copy itself (here: into a NumPy buffer),
  forward       the model (tiny here; on a GPU, the GPU time),
  rest          scheduling, sampling, appending tokens, detokenizing, outputs.
build_batch + upload + rest is the host time a GPU step cannot hide.
"""

from __future__ import annotations

import rawpage  # noqa: F401  (first: it sets how long OpenBLAS spins before NumPy loads it)

# isort: split
import argparse
import json
import os
import statistics
import tempfile
import time

import numpy as np

TINY = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 16,
    "vocab_size": 1000,
    "max_position_embeddings": 16384,
    "eos_token_id": 2,
}


def timed(obj, name: str, into: list[float]) -> None:
    """Wrap obj.name so that each call's duration is appended to `into`."""
    fn = getattr(obj, name)

    def wrapper(*a, **k):
        t = time.perf_counter()
        out = fn(*a, **k)
        into.append(time.perf_counter() - t)
        return out

    setattr(obj, name, wrapper)


def main(argv: list[str] | None = None) -> dict:
    from rawpage.engine import LLMEngine
    from rawpage.engine_args import EngineArgs
    from rawpage.sampling_params import SamplingParams

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--context", type=int, default=1024)
    ap.add_argument("--steps", type=int, default=30)
    args = ap.parse_args(argv)
    with tempfile.TemporaryDirectory() as d:
        with open(os.path.join(d, "config.json"), "w") as f:
            json.dump(TINY, f)
        engine = LLMEngine(
            EngineArgs(
                model=d,
                load_format="dummy",
                device="cpu",
                max_num_seqs=args.batch,
                max_num_batched_tokens=8192,
                log_stats_interval=0,
            )
        )
    rng = np.random.default_rng(0)
    params = SamplingParams(temperature=0, max_tokens=args.steps + 4, ignore_eos=True)
    for i in range(args.batch):
        engine.add_request(str(i), {"prompt_token_ids": rng.integers(3, 1000, args.context).tolist()}, params)
    while any(s.num_output_tokens == 0 for r in engine.requests.values() for s in r.seqs):
        engine.step()
    runner = engine.runner
    build, upload, execute, walls = [], [], [], []
    timed(runner, "build_batch", build)
    timed(runner.buffer, "upload", upload)
    timed(runner, "execute", execute)
    for _ in range(args.steps):
        t = time.perf_counter()
        engine.step()
        walls.append(time.perf_counter() - t)

    def ms(xs: list[float]) -> float:
        return round(1e3 * statistics.median(xs), 3)

    forward = [e - b - u for e, b, u in zip(execute, build, upload)]
    result = {
        "batch": args.batch,
        "context": args.context,
        "step_ms": ms(walls),
        "build_batch_ms": ms(build),
        "upload_ms": ms(upload),
        "forward_ms": ms(forward),
        "rest_ms": ms([w - e for w, e in zip(walls, execute)]),
    }
    print(json.dumps(result, indent=1))
    return result


if __name__ == "__main__":
    main()
