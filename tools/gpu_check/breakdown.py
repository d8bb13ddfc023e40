"""Where one decode step's GPU time goes, kernel by kernel, through Nsight Compute.

    python -m tools.gpu_check.breakdown --batches 1,256 --result-file out.json

For each batch, a child process builds the Llama-3-8B-shaped dummy model
(eager, so every kernel is a launch of its own), prefills BATCH sequences of
--context tokens, decodes a few steps, and then runs one more step between
cudaProfilerStart and cudaProfilerStop. The child runs under

    ncu --clock-control none --profile-from-start off --metrics gpu__time_duration.sum --csv --print-units base

so ncu times exactly that step's kernels at the GPU's normal clocks, one metric,
one replay pass each. The CSV is summed by kernel family (the dtype and head-size
suffixes dropped, every cuBLAS/CUTLASS GEMM kernel in one "gemm" family).
Without ncu on PATH (or in /usr/local/cuda/bin) the step says so and records no
figures.
"""

from __future__ import annotations

import argparse
import csv
import os
import re
import shutil
import subprocess
import sys
import time
from collections import Counter

from tools.gpu_check.common import write_json

NCU_ARGS = [
    "--clock-control",
    "none",
    "--profile-from-start",
    "off",
    "--metrics",
    "gpu__time_duration.sum",
    "--csv",
    "--print-units",
    "base",
]
GEMM = re.compile(r"gemm|cutlass|nvjet|xmma|sm\d+_", re.I)


def family(kernel: str) -> str:
    """A kernel's family: 'paged_attention_decode_bf16_d128(...)' -> 'paged_attention_decode'."""
    if GEMM.search(kernel):
        return "gemm (cuBLAS)"
    name = kernel.split("(")[0].strip()
    return re.sub(r"_(bf16|f16|f32)(_d\d+)*(_\w+)?$", "", name)


def parse_ncu_csv(text: str) -> dict:
    """ncu's --csv output (with --print-units base: durations in ns) -> the step's
    kernel count, total ms and families sorted by time."""
    rows = csv.DictReader(line for line in text.splitlines() if line.startswith('"'))
    ns, launches = Counter(), Counter()
    for r in rows:
        if r.get("Metric Name") != "gpu__time_duration.sum":
            continue
        unit = r.get("Metric Unit", "ns")
        value = float(r["Metric Value"].replace(",", ""))
        value *= {"ns": 1, "nsecond": 1, "usecond": 1e3, "us": 1e3, "msecond": 1e6, "ms": 1e6}.get(unit, 1)
        fam = family(r["Kernel Name"])
        ns[fam] += value
        launches[fam] += 1
    total = sum(ns.values())
    if not total:
        raise ValueError(
            "no gpu__time_duration.sum rows in ncu's output (was the step bracketed by cudaProfilerStart?)"
        )
    families = [
        {"name": f, "launches": launches[f], "ms": round(v / 1e6, 6), "share": round(v / total, 4)}
        for f, v in ns.most_common()
    ]
    return {"kernels": sum(launches.values()), "total_ms": round(total / 1e6, 6), "families": families}


def find_ncu() -> str | None:
    return shutil.which("ncu") or next(
        (p for p in ("/usr/local/cuda/bin/ncu", "/opt/nvidia/nsight-compute/ncu") if os.access(p, os.X_OK)), None
    )


def run_step(batch: int, context: int, config: str, device: str = "cuda") -> int:
    """The profiled child: one eager decode step at `batch` between profilerStart/Stop
    (device cpu: the same steps without a profiler, for the tests). Returns how many
    sequences that step decoded."""
    import numpy as np

    from rawpage import LLM, SamplingParams

    # A pool just big enough: no memory profiling run, a quick start under ncu.
    blocks = max(batch, 2) * (-(-(context + 64) // 16))
    dtype = "bfloat16" if device == "cuda" else "float32"
    llm = LLM(
        config,
        load_format="dummy",
        device=device,
        dtype=dtype,
        max_num_seqs=max(batch, 1),
        max_model_len=context + 64,
        enforce_eager=True,
        num_gpu_blocks_override=blocks,
    )
    engine = llm.engine
    rng = np.random.default_rng(0)
    params = SamplingParams(temperature=0, max_tokens=32, ignore_eos=True)
    vocab = engine.model_config.vocab_size
    for i in range(batch):
        engine.add_request(f"b{i}", {"prompt_token_ids": rng.integers(100, vocab, context).tolist()}, params)
    while any(s.num_output_tokens == 0 for r in engine.requests.values() for s in r.seqs):
        engine.step()  # prefill
    for _ in range(3):
        engine.step()  # decode warm-up: kernels loaded, cuBLAS heuristics cached
    decoding = sum(len(r.seqs) for r in engine.requests.values())
    if device != "cuda":
        engine.step()
        return decoding
    import cupy

    cupy.cuda.Device().synchronize()
    cupy.cuda.runtime.profilerStart()
    engine.step()
    cupy.cuda.Device().synchronize()
    cupy.cuda.runtime.profilerStop()
    return decoding


def profile(ncu: str, batch: int, args, timeout: float) -> dict:
    cmd = [
        ncu,
        *NCU_ARGS,
        sys.executable,
        "-m",
        "tools.gpu_check.breakdown",
        "--run-step",
        str(batch),
        "--context",
        str(args.context),
        "--config",
        args.config,
    ]
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return {"error": f"ncu did not finish within {timeout:.0f}s"}
    if out.returncode != 0:
        return {"error": f"ncu exit {out.returncode}: {(out.stderr or out.stdout)[-2000:]}"}
    try:
        return {"batch": batch, "context": args.context, **parse_ncu_csv(out.stdout)}
    except ValueError as e:
        return {"error": f"{e}; ncu said: {out.stdout[-2000:]}"}


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--batches", default="1,256")
    ap.add_argument("--context", type=int, default=1024)
    ap.add_argument("--config", default="tools/configs/llama-3-8b/config.json")
    ap.add_argument("--timeout", type=float, default=240, help="seconds for all batches together")
    ap.add_argument("--run-step", type=int, metavar="BATCH", help=argparse.SUPPRESS)  # the child, under ncu
    ap.add_argument("--result-file")
    args = ap.parse_args(argv)
    if args.run_step is not None:
        run_step(args.run_step, args.context, args.config)
        return {}
    ncu = find_ncu()
    result = {}
    deadline = time.monotonic() + args.timeout
    for batch in (int(b) for b in args.batches.split(",")):
        left = deadline - time.monotonic()
        if not ncu:
            result[f"breakdown_b{batch}"] = {"skipped": "ncu not found"}
        elif left < 5:
            result[f"breakdown_b{batch}"] = {"skipped": f"out of time (--timeout {args.timeout:.0f}s)"}
        else:
            result[f"breakdown_b{batch}"] = profile(ncu, batch, args, left)
        write_json(args.result_file, result)  # after each batch: a cut-off step keeps what it has
    return result


if __name__ == "__main__":
    main()
