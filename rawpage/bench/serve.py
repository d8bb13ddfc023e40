"""`rawpage bench serve`: load-test an OpenAI-compatible server (rawpage, vLLM, llama-server,
llama-cpp-python), as `vllm bench serve` does, with its options and its table.

    rawpage bench serve --base-url http://127.0.0.1:8000 --dataset-name random \\
        --random-input-len 256 --random-output-len 64 --num-prompts 100 \\
        --max-concurrency 16 --ignore-eos --save-result --result-filename out.json

Requests arrive as a seeded Poisson process (--request-rate; gamma with --burstiness), or all
at once; at most --max-concurrency are in flight; every response is streamed and every chunk
timestamped. The summary (throughput; mean, median and percentiles of TTFT, TPOT, ITL and
end-to-end latency) uses vLLM's definitions (rawpage/bench/metrics.py). Token counts come from
the server's final `usage` chunk, else its /tokenize, else a local tokenizer.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import math
import os
import random
import sys
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from tqdm import tqdm

from rawpage.bench import http
from rawpage.bench.client import (
    CHAT_ENDPOINT,
    COMPLETIONS_ENDPOINT,
    Server,
    first_model,
    request_body,
    send_streaming,
)
from rawpage.bench.datasets import (
    CHAT_DATASET,
    BenchRequest,
    add_length_args,
    chat_requests,
    parse_range,
    random_requests,
)
from rawpage.bench.metrics import (
    METRICS,
    BenchmarkSummary,
    RequestRecord,
    RunInfo,
    e2e_latency,
    format_summary,
    inter_token_latencies,
    summarize,
    ttft,
)
from rawpage.bench.tokens import TokenCounter

# vLLM's --backend: the API it speaks, which sets --endpoint's default.
BACKENDS = {"openai": COMPLETIONS_ENDPOINT, "vllm": COMPLETIONS_ENDPOINT, "openai-chat": CHAT_ENDPOINT}
SAMPLING = {"top_p": float, "top_k": int, "min_p": float, "frequency_penalty": float, "presence_penalty": float}
SAMPLING |= {"repetition_penalty": float}


def add_cli_args(ap: argparse.ArgumentParser) -> None:
    """vLLM's options (and the older names of tools/bench_serving.py, kept as aliases)."""
    _add_server_args(ap.add_argument_group("server"))
    _add_workload_args(ap.add_argument_group("workload"))
    _add_sampling_args(ap.add_argument_group("sampling"))
    _add_load_args(ap.add_argument_group("load"))
    _add_output_args(ap.add_argument_group("output"))


def _add_server_args(g: argparse._ArgumentGroup) -> None:
    g.add_argument("--base-url", help="server address, without /v1 (default: http://--host:--port)")
    g.add_argument("--host", default="127.0.0.1", help="server host, without --base-url (default: %(default)s)")
    g.add_argument("--port", type=int, default=8000, help="server port, without --base-url (default: %(default)s)")
    g.add_argument(
        "--backend",
        default="openai",
        choices=sorted(BACKENDS),
        help="the API: openai (and vllm) = "
        "completions, openai-chat = chat completions; sets --endpoint's default (default: %(default)s)",
    )
    g.add_argument(
        "--endpoint", choices=[COMPLETIONS_ENDPOINT, CHAT_ENDPOINT], help="API to call (default: --backend's)"
    )
    g.add_argument("--model", help="model name to send (default: the first id in GET /v1/models)")
    g.add_argument("--served-model-name", help="model name to send, over --model (vLLM: --model names the tokenizer)")
    g.add_argument(
        "--api-key",
        default=os.environ.get("OPENAI_API_KEY"),
        help="send 'Authorization: Bearer KEY' (default: $OPENAI_API_KEY if set)",
    )
    g.add_argument("--header", metavar="KEY=VALUE", nargs="*", default=[], help="headers sent with every request")
    g.add_argument("--insecure", action="store_true", help="do not check an https server's certificate")
    g.add_argument(
        "--request-timeout",
        type=float,
        default=600.0,
        help="seconds one request may take before it counts as failed (default: %(default)s)",
    )


def _add_workload_args(g: argparse._ArgumentGroup) -> None:
    g.add_argument(
        "--dataset-name",
        "--dataset",
        default="random",
        choices=["random", "chat"],
        help="random: word prompts of set lengths; chat: multi-turn conversations from --dataset-path "
        "(default: %(default)s)",
    )
    g.add_argument(
        "--dataset-path",
        "--chat-dataset-path",
        type=Path,
        default=CHAT_DATASET,
        help='--dataset-name chat: JSONL of {"messages": [...]} conversations (default: the one shipped '
        "in rawpage/bench/data)",
    )
    g.add_argument("--num-prompts", type=int, default=1000, help="requests to send (default: %(default)s)")
    add_length_args(g, "--random-input-len", "--random-output-len")
    g.add_argument(
        "--random-prefix-len", type=int, default=0, help="tokens of a prefix every prompt shares (default: 0)"
    )
    g.add_argument(
        "--chat-output-len",
        help="--dataset-name chat: output tokens, N or LO:HI (default: the token length of the dataset's own reply)",
    )
    g.add_argument("--seed", type=int, default=0, help="seed for prompts, lengths and arrivals (default: %(default)s)")


def _add_sampling_args(g: argparse._ArgumentGroup) -> None:
    g.add_argument(
        "--ignore-eos",
        action=argparse.BooleanOptionalAction,
        default=False,
        help="send ignore_eos: every reply is exactly its output length (default: off)",
    )
    g.add_argument(
        "--temperature",
        type=float,
        default=0.0,
        help="sent with every request; a negative value sends "
        "none, leaving the server's default (default: %(default)s, greedy)",
    )
    for name, kind in SAMPLING.items():
        g.add_argument("--" + name.replace("_", "-"), type=kind, help=f"{name} sent with every request")
    g.add_argument(
        "--extra-body",
        type=json_object,
        default={},
        help="JSON object merged into every request "
        """body, e.g. '{"logit_bias": {"2": -100}}' for servers without ignore_eos""",
    )


def _add_load_args(g: argparse._ArgumentGroup) -> None:
    g.add_argument(
        "--request-rate",
        type=float,
        default=math.inf,
        help="mean requests per second; inf sends all at once (default: %(default)s)",
    )
    g.add_argument(
        "--burstiness",
        type=float,
        default=1.0,
        help="1: Poisson arrivals; lower is burstier, higher more even (gamma) (default: %(default)s)",
    )
    g.add_argument("--max-concurrency", type=int, help="most requests in flight; later arrivals wait (default: none)")
    g.add_argument("--skip-initial-test", action="store_true", help="send no short request first to check the server")
    g.add_argument("--disable-tqdm", action="store_true", help="no progress bar")


def _add_output_args(g: argparse._ArgumentGroup) -> None:
    g.add_argument(
        "--tokenizer",
        help="tokenizer.json, Hugging Face folder or .gguf to count tokens when the server "
        "reports none (default: rawpage's default model)",
    )
    g.add_argument(
        "--percentile-metrics",
        default="ttft,tpot,itl",
        help="metrics whose percentiles the table shows: ttft, tpot, itl, e2el (default: %(default)s)",
    )
    g.add_argument("--metric-percentiles", default="99", help="percentiles to show, e.g. 50,90,99 (default: 99)")
    g.add_argument("--save-result", action="store_true", help="write the result as JSON (also with a file name)")
    g.add_argument("--save-detailed", action="store_true", help="the result also holds every request's record")
    g.add_argument("--result-dir", help="folder for the result (default: here)")
    g.add_argument(
        "--result-filename",
        "--result-file",
        help="the result's file name (default: LABEL-RATEqps[-concurrencyN]-MODEL-DATE.json)",
    )
    g.add_argument("--label", default="", help="stored in the result; names the file (default: --backend)")
    g.add_argument("--metadata", metavar="KEY=VALUE", nargs="*", default=[], help="stored in the result")


def json_object(text: str) -> dict[str, Any]:
    try:
        value = json.loads(text)
    except json.JSONDecodeError as e:
        raise argparse.ArgumentTypeError(f"not valid JSON ({e}): {text!r}") from None
    if not isinstance(value, dict):
        raise argparse.ArgumentTypeError(f"expected a JSON object {{...}}, got {text!r}")
    return value


def check_args(args: argparse.Namespace) -> None:
    """Refuse what cannot run (ValueError) and settle the derived options in place."""
    checks = [
        (args.num_prompts >= 1, "--num-prompts must be at least 1"),
        (args.request_rate > 0, "--request-rate must be positive (inf sends all requests at once)"),
        (args.burstiness > 0, "--burstiness must be positive"),
        (args.max_concurrency is None or args.max_concurrency >= 1, "--max-concurrency must be at least 1"),
        (0 <= args.random_range_ratio < 1, "--random-range-ratio must be in [0, 1)"),
        (set(args.percentile_metrics.split(",")) <= set(METRICS), f"--percentile-metrics: one of {', '.join(METRICS)}"),
    ]
    for ok, message in checks:
        if not ok:
            raise ValueError(message)
    args.input_range = parse_range(args.random_input_len, args.random_range_ratio)
    args.output_range = parse_range(args.random_output_len, args.random_range_ratio)
    args.chat_output_range = parse_range(args.chat_output_len) if args.chat_output_len else None
    try:
        args.percentiles = tuple(float(p) for p in args.metric_percentiles.split(","))
    except ValueError:
        raise ValueError(f"--metric-percentiles: numbers, e.g. 50,90,99; got {args.metric_percentiles!r}") from None
    args.base_url = (args.base_url or f"http://{args.host}:{args.port}").rstrip("/")
    args.endpoint = args.endpoint or BACKENDS[args.backend]


def server_of(args: argparse.Namespace) -> Server:
    headers = {"Authorization": f"Bearer {args.api_key}"} if args.api_key else {}
    for pair in args.header:
        key, eq, value = pair.partition("=")
        if not eq:
            raise ValueError(f"--header {pair}: write KEY=VALUE")
        headers[key.strip()] = value.strip()
    return Server(args.base_url, headers, verify=not args.insecure, timeout=args.request_timeout)


def arrival_delays(num: int, rate: float, seed: int, burstiness: float = 1.0) -> list[float]:
    """Seconds to wait after sending each request before the next: Poisson arrivals at
    burstiness 1, gamma-distributed gaps of the same mean otherwise (vLLM's)."""
    if math.isinf(rate):
        return [0.0] * num
    rng = random.Random(seed)
    if burstiness == 1.0:
        return [rng.expovariate(rate) for _ in range(num)]
    return [rng.gammavariate(burstiness, 1.0 / (rate * burstiness)) for _ in range(num)]


def build_requests(args: argparse.Namespace) -> list[BenchRequest]:
    if args.dataset_name == "random":
        return random_requests(args.num_prompts, args.input_range, args.output_range, args.seed, args.random_prefix_len)
    return chat_requests(args.num_prompts, args.seed, args.chat_output_range, args.dataset_path)


def request_bodies(args: argparse.Namespace, requests: list[BenchRequest], model: str) -> list[dict[str, Any]]:
    temperature = args.temperature if args.temperature >= 0 else None
    sampling = {k: v for k in SAMPLING if (v := getattr(args, k)) is not None}
    extra = sampling | args.extra_body
    return [
        request_body(r, args.endpoint, model, r.output_tokens, args.ignore_eos, temperature, extra) for r in requests
    ]


async def run(args: argparse.Namespace) -> tuple[dict[str, Any], BenchmarkSummary, list[RequestRecord]]:
    """Send the workload; return the result file's contents, the summary and the records."""
    server = server_of(args)
    model = args.served_model_name or args.model or await first_model(server)
    counter = TokenCounter(server, model, args.tokenizer)
    requests = build_requests(args)
    for req in requests:
        if req.output_tokens == 0:  # chat dataset: as long as the dataset's own reply
            req.output_tokens = max(1, await counter.count_output(req.reference))
    bodies = request_bodies(args, requests, model)
    if not args.skip_initial_test:
        probe = RequestRecord(-1, 0.0)
        await send_streaming(server, args.endpoint, bodies[0] | {"max_tokens": 4}, probe)
        if not probe.success:
            raise ValueError(f"the initial test request to {args.base_url}{args.endpoint} failed: {probe.error}")
    concurrency = args.max_concurrency or "unlimited"
    print(
        f"{len(requests)} requests to {args.base_url}{args.endpoint} (model {model}), rate {args.request_rate} "
        f"req/s, burstiness {args.burstiness}, max concurrency {concurrency}",
        file=sys.stderr,
    )
    delays = arrival_delays(len(bodies), args.request_rate, args.seed, args.burstiness)
    records, duration = await send_all(server, args.endpoint, bodies, delays, args)
    # Counted after the clock stops, so that counting never competes with the load.
    for req, rec in zip(requests, records):
        if rec.success and rec.output_tokens is None:
            rec.output_tokens = await counter.count_output(rec.text)
            rec.input_tokens = await counter.count_input(req, args.endpoint == CHAT_ENDPOINT)
            rec.token_count_source = counter.source
    summary = summarize(records, duration, args.percentiles)
    return result_dict(args, model, summary, records), summary, records


async def send_all(
    server: Server, endpoint: str, bodies: list[dict[str, Any]], delays: list[float], args: argparse.Namespace
) -> tuple[list[RequestRecord], float]:
    """Start request i, wait delays[i], start the next...; return the records and the seconds
    from the first send to the last byte. A request that arrives while --max-concurrency are
    in flight waits, and its TTFT clock starts only when it is sent, as in vLLM's tool."""
    records = [RequestRecord(i, 0.0, target_output_tokens=b["max_tokens"]) for i, b in enumerate(bodies)]
    gate = asyncio.Semaphore(args.max_concurrency) if args.max_concurrency else contextlib.nullcontext()
    progress = tqdm(total=len(bodies), disable=args.disable_tqdm, file=sys.stderr)

    async def one(i: int) -> None:
        async with gate:
            await send_streaming(server, endpoint, bodies[i], records[i])
        progress.update(1)

    start = time.perf_counter()
    tasks = []
    for i, delay in enumerate(delays):
        tasks.append(asyncio.create_task(one(i)))
        if delay:
            await asyncio.sleep(delay)
    await asyncio.gather(*tasks)
    progress.close()
    return records, time.perf_counter() - start


def result_dict(
    args: argparse.Namespace, model: str, summary: BenchmarkSummary, records: list[RequestRecord]
) -> dict[str, Any]:
    """vLLM's result keys, rawpage's summary beside them; per request with --save-detailed."""
    result = {
        "date": datetime.now(timezone.utc).strftime("%Y%m%d-%H%M%S"),
        "backend": args.backend,
        "endpoint": args.endpoint,
        "label": args.label or args.backend,
        "model_id": model,
        "num_prompts": args.num_prompts,
        "request_rate": str(args.request_rate),  # JSON has no inf
        "burstiness": args.burstiness,
        "max_concurrency": args.max_concurrency,
        **dict(pair.partition("=")[::2] for pair in args.metadata),
        **summary.vllm_keys(),
        "config": config_dict(args, model),
        "summary": summary.to_dict(),
    }
    if args.save_detailed:
        result |= {
            "input_lens": [r.input_tokens for r in records],
            "output_lens": [r.output_tokens for r in records],
            "ttfts": [ttft(r) for r in records],
            "itls": [inter_token_latencies(r) for r in records],
            "generated_texts": [r.text for r in records],
            "errors": [r.error for r in records],
            "requests": [request_dict(rec) for rec in records],
        }
    return result


def config_dict(args: argparse.Namespace, model: str) -> dict[str, Any]:
    cfg = {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items() if not callable(v)}
    cfg["model"] = model
    cfg["api_key"] = "<redacted>" if args.api_key else None
    cfg["header"] = [h.partition("=")[0] + "=<redacted>" for h in args.header]
    cfg["request_rate"] = str(args.request_rate)  # JSON has no inf
    return cfg


def request_dict(rec: RequestRecord) -> dict[str, Any]:
    return {
        "index": rec.index,
        "success": rec.success,
        "error": rec.error,
        "input_tokens": rec.input_tokens,
        "output_tokens": rec.output_tokens,
        "target_output_tokens": rec.target_output_tokens,
        "token_count_source": rec.token_count_source,
        "ttft_s": ttft(rec),
        "e2e_s": e2e_latency(rec),
        "itl_s": inter_token_latencies(rec),
        "chunk_times_s": [t - rec.sent for t in rec.chunk_times],  # from the request's send
        "text": rec.text,
    }


def result_path(args: argparse.Namespace, result: dict[str, Any]) -> Path | None:
    """Where the result goes (vLLM's naming), or None when it is not to be saved."""
    if not (args.save_result or args.result_filename or args.result_dir):
        return None
    concurrency = f"-concurrency{args.max_concurrency}" if args.max_concurrency else ""
    model = str(result["model_id"]).split("/")[-1]
    name = (
        args.result_filename or f"{result['label']}-{args.request_rate}qps{concurrency}-{model}-{result['date']}.json"
    )
    return Path(args.result_dir or ".") / name


def main(args: argparse.Namespace) -> int:
    """Run the benchmark that `args` describes, print vLLM's table, save the result."""
    check_args(args)
    try:
        result, summary, records = asyncio.run(run(args))
    except (http.HTTPError, OSError, EOFError, asyncio.TimeoutError) as e:
        raise ValueError(f"cannot benchmark {args.base_url}: {type(e).__name__}: {e}") from None
    run_info = RunInfo(args.max_concurrency, args.request_rate, tuple(args.percentile_metrics.split(",")))
    print(format_summary(summary, run_info))
    path = result_path(args, result)
    if path is not None:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(result, indent=1) + "\n")
        print(f"wrote {path}", file=sys.stderr)
    if summary.completed == 0:
        errors = sorted({r.error for r in records})
        print(f"every request failed: {errors[:3]}", file=sys.stderr)
        return 1
    return 0
