"""Offline throughput: `rawpage bench throughput` under this tool's older defaults.

    python tools/bench_throughput.py                      # rawpage: 64 requests, prompts 32-512, outputs 32-256
    python tools/bench_throughput.py --static-batching    # rawpage with fixed batches: nothing admitted until done
    python tools/bench_throughput.py --backend transformers   # HF generate on static, padded batches (needs torch)
    python tools/bench_throughput.py --backend llama-cpp      # llama-cpp-python, one sequence at a time

The benchmark lives in rawpage/bench/throughput.py (`rawpage bench throughput --help`). Here
the defaults are the ones tools/compare.py and docs/benchmarks.md's runs were made with: 64
requests, prompts of 32-512 tokens, 32-256 out, batches of 32 on --device cpu, ids drawn
below SmolLM2's vocabulary (49152).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

if __package__ in (None, ""):
    # Run as `python tools/bench_throughput.py`: this checkout's rawpage, not an installed one.
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from rawpage.bench import throughput  # noqa: E402

make_workload = throughput.make_workload
OLDER_DEFAULTS = {
    "num_prompts": 64,
    "input_len": "32:512",
    "output_len": "32:256",
    "max_num_seqs": 32,
    "device": "cpu",
    "vocab": throughput.DEFAULT_VOCAB,
}


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    throughput.add_cli_args(ap)
    ap.set_defaults(**OLDER_DEFAULTS)
    args = ap.parse_args(argv)
    try:
        result = throughput.measure(args)
    except ValueError as e:
        ap.error(str(e))
    throughput.report(result, args.output_json)
    return result


if __name__ == "__main__":
    main()
