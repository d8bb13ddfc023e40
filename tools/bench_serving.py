"""Load-test an OpenAI-compatible server: rawpage, vLLM, llama-server, llama-cpp-python.

    python tools/bench_serving.py --base-url http://127.0.0.1:8000 \\
        --dataset random --random-input-len 64:256 --random-output-len 32:128 \\
        --num-prompts 100 --request-rate 4 --max-concurrency 16 --result-file out.json

Like `vllm bench serve`: requests arrive as a seeded Poisson process (or all at once),
at most --max-concurrency are in flight, every response is streamed and every chunk
timestamped, and the summary (throughput; mean, median and p99 of TTFT, TPOT, ITL and
end-to-end latency) uses vLLM's definitions, see tools/bench_metrics.py. Token counts
come from the server's final `usage` chunk, else its /tokenize, else a local tokenizer.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import math
import random
import sys
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

if __package__ in (None, ""):
    # Run as `python tools/bench_serving.py`: make `tools.*` importable from the repo root.
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import httpx  # noqa: E402

from tools.bench_client import (  # noqa: E402
    CHAT_ENDPOINT,
    COMPLETIONS_ENDPOINT,
    first_model,
    request_body,
    send_streaming,
)
from tools.bench_datasets import (  # noqa: E402
    CHAT_DATASET,
    BenchRequest,
    chat_requests,
    parse_range,
    random_requests,
)
from tools.bench_metrics import (  # noqa: E402
    BenchmarkSummary,
    RequestRecord,
    e2e_latency,
    format_summary,
    inter_token_latencies,
    summarize,
    ttft,
)
from tools.bench_tokens import TokenCounter  # noqa: E402


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    g = ap.add_argument_group("server")
    g.add_argument(
        "--base-url",
        default="http://127.0.0.1:8000",
        help="server address, without /v1 (default: %(default)s)",
    )
    g.add_argument(
        "--endpoint",
        default=CHAT_ENDPOINT,
        choices=[CHAT_ENDPOINT, COMPLETIONS_ENDPOINT],
        help="API to call (default: %(default)s)",
    )
    g.add_argument("--model", help="model name to send (default: the first id in GET /v1/models)")
    g.add_argument("--api-key", help="send 'Authorization: Bearer KEY'")
    g.add_argument(
        "--request-timeout",
        type=float,
        default=600.0,
        help="seconds one request may take before it counts as failed (default: %(default)s)",
    )

    g = ap.add_argument_group("workload")
    g.add_argument(
        "--dataset",
        default="random",
        choices=["random", "chat"],
        help="random: word prompts of set lengths; chat: multi-turn conversations from --chat-dataset-path (default: %(default)s)",
    )
    g.add_argument("--num-prompts", type=int, default=100, help="requests to send (default: %(default)s)")
    g.add_argument(
        "--random-input-len",
        default="64:256",
        help="prompt length in tokens, N or LO:HI drawn uniformly (default: %(default)s)",
    )
    g.add_argument(
        "--random-output-len",
        default="32:128",
        help="output length in tokens, N or LO:HI drawn uniformly (default: %(default)s)",
    )
    g.add_argument(
        "--chat-dataset-path",
        type=Path,
        default=CHAT_DATASET,
        help='JSONL of {"messages": [...]} conversations (default: the one shipped in tools/data)',
    )
    g.add_argument(
        "--chat-output-len",
        help="output length N or LO:HI for the chat dataset (default: the token length of the dataset's own reply)",
    )
    g.add_argument(
        "--seed",
        type=int,
        default=0,
        help="seed for prompts, lengths and arrival times (default: %(default)s)",
    )
    g.add_argument(
        "--temperature",
        type=float,
        default=0.0,
        help="sampling temperature sent with every request; a negative value sends none, leaving the server's default (default: %(default)s)",
    )
    g.add_argument(
        "--no-ignore-eos",
        dest="ignore_eos",
        action="store_false",
        help="do not send ignore_eos: requests may stop before max_tokens at the model's end of sequence",
    )

    g.add_argument(
        "--extra-body",
        type=json_object,
        default={},
        help="""JSON object merged into every request body, e.g. '{"top_p": 0.9}'; for servers without ignore_eos, '{"logit_bias": {"2": -100}}' bans SmolLM2's end token instead""",
    )

    g = ap.add_argument_group("load")
    g.add_argument(
        "--request-rate",
        type=float,
        default=math.inf,
        help="mean requests per second of a Poisson arrival process; inf sends all at once (default: %(default)s)",
    )
    g.add_argument(
        "--max-concurrency",
        type=int,
        help="most requests in flight at once; later arrivals wait (default: no limit)",
    )
    g.add_argument(
        "--skip-initial-test",
        action="store_true",
        help="do not send one short request first to check the server answers",
    )

    g = ap.add_argument_group("output")
    g.add_argument(
        "--tokenizer",
        help="tokenizer.json, Hugging Face folder or .gguf to count tokens when the server reports none (default: rawpage's default model)",
    )
    g.add_argument(
        "--result-file",
        type=Path,
        help="write config, per-request records and summary as JSON here",
    )
    g.add_argument(
        "--label",
        default="",
        help="free text stored in the result file, e.g. the server and its flags",
    )
    return ap


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = build_parser()
    args = ap.parse_args(argv)
    if args.num_prompts < 1:
        ap.error("--num-prompts must be at least 1")
    if args.request_rate <= 0:
        ap.error("--request-rate must be positive (inf sends all requests at once)")
    if args.max_concurrency is not None and args.max_concurrency < 1:
        ap.error("--max-concurrency must be at least 1")
    try:
        args.random_input_len = parse_range(args.random_input_len)
        args.random_output_len = parse_range(args.random_output_len)
        args.chat_output_len = parse_range(args.chat_output_len) if args.chat_output_len else None
    except ValueError as e:
        ap.error(str(e))
    args.base_url = args.base_url.rstrip("/")
    return args


def json_object(text: str) -> dict[str, Any]:
    try:
        value = json.loads(text)
    except json.JSONDecodeError as e:
        raise argparse.ArgumentTypeError(f"not valid JSON ({e}): {text!r}") from None
    if not isinstance(value, dict):
        raise argparse.ArgumentTypeError(f"expected a JSON object {{...}}, got {text!r}")
    return value


def arrival_delays(num: int, rate: float, seed: int) -> list[float]:
    """Seconds to wait after sending each request before the next: Poisson arrivals."""
    if math.isinf(rate):
        return [0.0] * num
    rng = random.Random(seed)
    return [rng.expovariate(rate) for _ in range(num)]


def build_requests(args: argparse.Namespace) -> list[BenchRequest]:
    if args.dataset == "random":
        return random_requests(args.num_prompts, args.random_input_len, args.random_output_len, args.seed)
    return chat_requests(args.num_prompts, args.seed, args.chat_output_len, args.chat_dataset_path)


async def run(args: argparse.Namespace) -> tuple[dict[str, Any], BenchmarkSummary]:
    """Send the workload; return the result file's contents and the summary."""
    headers = {"Authorization": f"Bearer {args.api_key}"} if args.api_key else {}
    # No connection cap, so queueing happens only where --max-concurrency puts it; no
    # proxy from the environment, since benchmarked servers are usually local.
    limits = httpx.Limits(max_connections=None, max_keepalive_connections=64)
    timeout = httpx.Timeout(args.request_timeout, connect=30.0)
    async with httpx.AsyncClient(headers=headers, limits=limits, timeout=timeout, trust_env=False) as client:
        model = args.model or await first_model(client, args.base_url)
        counter = TokenCounter(client, args.base_url, model, args.tokenizer)
        requests = build_requests(args)
        for req in requests:
            if req.output_tokens == 0:  # chat dataset: as long as the dataset's own reply
                req.output_tokens = max(1, await counter.count_output(req.reference))
        temperature = args.temperature if args.temperature >= 0 else None
        bodies = [
            request_body(r, args.endpoint, model, r.output_tokens, args.ignore_eos, temperature, args.extra_body)
            for r in requests
        ]
        url = f"{args.base_url}{args.endpoint}"
        if not args.skip_initial_test:
            probe = RequestRecord(-1, 0.0)
            await send_streaming(client, url, bodies[0] | {"max_tokens": 4}, args.endpoint, probe)
            if not probe.success:
                raise SystemExit(f"initial test request to {url} failed: {probe.error}")

        print(
            f"{len(requests)} requests to {url} (model {model}), rate {args.request_rate} req/s, "
            f"max concurrency {args.max_concurrency or 'unlimited'}",
            file=sys.stderr,
        )
        delays = arrival_delays(len(bodies), args.request_rate, args.seed)
        records, duration = await send_all(client, url, args.endpoint, bodies, delays, args.max_concurrency)

        # Counted after the clock stops, so retokenizing never competes with the load.
        for req, rec in zip(requests, records):
            if rec.success and rec.output_tokens is None:
                rec.output_tokens = await counter.count_output(rec.text)
                rec.input_tokens = await counter.count_input(req, args.endpoint == CHAT_ENDPOINT)
                rec.token_count_source = counter.source

    summary = summarize(records, duration)
    result = {
        "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "label": args.label,
        "config": config_dict(args, model),
        "summary": summary.to_dict(),
        "requests": [request_dict(rec) for rec in records],
    }
    return result, summary


async def send_all(
    client: httpx.AsyncClient,
    url: str,
    endpoint: str,
    bodies: list[dict[str, Any]],
    delays: list[float],
    max_concurrency: int | None,
) -> tuple[list[RequestRecord], float]:
    """Start request i, wait delays[i], start the next...; return the records and the seconds
    from the first send to the last byte. A request that arrives while max_concurrency are in
    flight waits, and its TTFT clock starts only when it is sent, as in vLLM's tool."""
    records = [RequestRecord(i, 0.0, target_output_tokens=b["max_tokens"]) for i, b in enumerate(bodies)]
    gate = asyncio.Semaphore(max_concurrency) if max_concurrency else contextlib.nullcontext()

    async def one(i: int) -> None:
        async with gate:
            await send_streaming(client, url, bodies[i], endpoint, records[i])

    start = time.perf_counter()
    tasks = []
    for i, delay in enumerate(delays):
        tasks.append(asyncio.create_task(one(i)))
        if delay:
            await asyncio.sleep(delay)
    await asyncio.gather(*tasks)
    return records, time.perf_counter() - start


def config_dict(args: argparse.Namespace, model: str) -> dict[str, Any]:
    cfg = {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()}
    cfg["model"] = model
    cfg["api_key"] = "<redacted>" if args.api_key else None
    cfg["request_rate"] = str(args.request_rate)  # JSON has no inf
    return cfg


def request_dict(rec: RequestRecord) -> dict[str, Any]:
    first = ttft(rec)
    return {
        "index": rec.index,
        "success": rec.success,
        "error": rec.error,
        "input_tokens": rec.input_tokens,
        "output_tokens": rec.output_tokens,
        "target_output_tokens": rec.target_output_tokens,
        "token_count_source": rec.token_count_source,
        "ttft_s": first,
        "e2e_s": e2e_latency(rec),
        "itl_s": inter_token_latencies(rec),
        "chunk_times_s": [t - rec.sent for t in rec.chunk_times],  # from the request's send
        "text": rec.text,
    }


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    result, summary = asyncio.run(run(args))
    print(format_summary(summary))
    if args.result_file:
        args.result_file.parent.mkdir(parents=True, exist_ok=True)
        args.result_file.write_text(json.dumps(result, indent=1) + "\n")
        print(f"wrote {args.result_file}", file=sys.stderr)
    if summary.completed == 0:
        errors = {r["error"] for r in result["requests"]}
        print(f"every request failed: {sorted(errors)[:3]}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
