"""Load-test an OpenAI-compatible server: `rawpage bench serve` under this tool's older defaults.

    python tools/bench_serving.py --base-url http://127.0.0.1:8000 \\
        --dataset random --random-input-len 64:256 --random-output-len 32:128 \\
        --num-prompts 100 --request-rate 4 --max-concurrency 16 --result-file out.json

The benchmark lives in rawpage/bench/serve.py (`rawpage bench serve --help`). Here the
defaults are the ones tools/compare.py and docs/benchmarks.md's runs were made with: chat
completions, 100 prompts of 64-256 tokens with 32-128 out, ignore_eos sent, and every
request's record in the result file.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

if __package__ in (None, ""):
    # Run as `python tools/bench_serving.py`: this checkout's rawpage, not an installed one.
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from rawpage.bench import serve  # noqa: E402
from rawpage.bench.client import CHAT_ENDPOINT  # noqa: E402

arrival_delays = serve.arrival_delays
OLDER_DEFAULTS = {
    "endpoint": CHAT_ENDPOINT,
    "num_prompts": 100,
    "random_input_len": "64:256",
    "random_output_len": "32:128",
    "ignore_eos": True,
    "save_detailed": True,
}


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    serve.add_cli_args(ap)
    ap.set_defaults(**OLDER_DEFAULTS)
    return ap


def main(argv: list[str] | None = None) -> int:
    ap = build_parser()
    args = ap.parse_args(argv)
    try:
        return serve.main(args)
    except ValueError as e:
        ap.error(str(e))


if __name__ == "__main__":
    sys.exit(main())
