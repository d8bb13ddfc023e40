"""Serving metrics from recorded timestamps: TTFT, TPOT, ITL, end-to-end latency, throughput.

Pure functions over `RequestRecord`s, so they can be tested on made-up timestamps.
The definitions follow vLLM's `vllm bench serve`, so numbers compare across tools:

  TTFT  = first content chunk - request sent
  ITL   = gap between two consecutive content chunks (every gap of every request, pooled)
  TPOT  = (e2e - TTFT) / (output_tokens - 1), only for requests with 2+ output tokens
  E2EL  = last byte received - request sent
  throughput = totals over successful requests / benchmark duration

One difference: a chunk counts as the first token only when it carries text. vLLM
also counts a chat stream's opening `{"role": "assistant"}` chunk, which some servers
send before running the model at all, and which would make TTFT look instant.
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import asdict, dataclass, field
from typing import Any


@dataclass
class RequestRecord:
    """What one request did. Times are seconds from `time.perf_counter()`."""

    index: int
    sent: float  # when the request was written to the socket
    chunk_times: list[float] = field(default_factory=list)  # arrival of each chunk with text
    finished: float = 0.0  # when the stream ended (or failed)
    success: bool = False
    error: str = ""
    text: str = ""
    target_output_tokens: int = 0  # max_tokens we asked for
    input_tokens: int | None = None
    output_tokens: int | None = None
    token_count_source: str = ""  # "usage", "server /tokenize", "tokenizer", or "" if unknown


def ttft(rec: RequestRecord) -> float | None:
    return rec.chunk_times[0] - rec.sent if rec.chunk_times else None


def e2e_latency(rec: RequestRecord) -> float:
    return rec.finished - rec.sent


def inter_token_latencies(rec: RequestRecord) -> list[float]:
    t = rec.chunk_times
    return [b - a for a, b in zip(t, t[1:])]


def tpot(rec: RequestRecord) -> float | None:
    """Mean time per output token after the first; None when there is no second token."""
    first = ttft(rec)
    n = rec.output_tokens
    if first is None or n is None or n < 2:
        return None
    return (e2e_latency(rec) - first) / (n - 1)


def percentile(values: list[float], p: float) -> float:
    """p-th percentile with linear interpolation between ranks (NumPy's default method)."""
    if not values:
        raise ValueError("percentile of an empty list")
    xs = sorted(values)
    rank = (len(xs) - 1) * p / 100.0
    lo = math.floor(rank)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (rank - lo)


@dataclass
class LatencyStats:
    """mean / median / standard deviation / percentiles of one latency, in milliseconds; None
    when nothing was measured. percentiles_ms: "99" -> the 99th percentile (--metric-percentiles)."""

    mean_ms: float | None
    median_ms: float | None
    p99_ms: float | None
    std_ms: float | None = None
    percentiles_ms: dict[str, float] = field(default_factory=dict)

    @classmethod
    def of(cls, seconds: list[float], percentiles: tuple[float, ...] = (99.0,)) -> LatencyStats:
        if not seconds:
            return cls(None, None, None)
        ms = [s * 1000.0 for s in seconds]
        mean = sum(ms) / len(ms)
        std = math.sqrt(sum((x - mean) ** 2 for x in ms) / len(ms))  # NumPy's np.std, as vLLM reports
        chosen = {percentile_name(p): percentile(ms, p) for p in percentiles}
        return cls(mean, percentile(ms, 50), percentile(ms, 99), std, chosen)


def percentile_name(p: float) -> str:
    """99.0 -> '99', 99.9 -> '99.9': how vLLM names a percentile in its table and result keys."""
    return str(int(p)) if int(p) == p else str(p)


@dataclass
class BenchmarkSummary:
    completed: int
    failed: int
    duration_s: float
    total_input_tokens: int
    total_output_tokens: int
    request_throughput: float  # successful requests / s
    output_throughput: float  # output tokens / s
    total_token_throughput: float  # (input + output) tokens / s
    ttft: LatencyStats
    tpot: LatencyStats
    itl: LatencyStats
    e2el: LatencyStats
    # Honesty checks: requests whose output length differs from max_tokens (a server
    # that ignores `ignore_eos` stops early), and where the token counts came from.
    output_len_mismatches: int
    token_count_sources: dict[str, int]
    # vLLM's peaks, over one-second windows from the first send: tokens (chunks with text)
    # that arrived in the busiest second, and the most requests in flight in any second.
    max_output_tokens_per_s: float = 0.0
    max_concurrent_requests: int = 0

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def vllm_keys(self) -> dict[str, Any]:
        """The summary under the flat names of `vllm bench serve`'s result file."""
        out: dict[str, Any] = {
            "duration": self.duration_s,
            "completed": self.completed,
            "failed": self.failed,
            "total_input_tokens": self.total_input_tokens,
            "total_output_tokens": self.total_output_tokens,
            "request_throughput": self.request_throughput,
            "output_throughput": self.output_throughput,
            "total_token_throughput": self.total_token_throughput,
            "max_output_tokens_per_s": self.max_output_tokens_per_s,
            "max_concurrent_requests": self.max_concurrent_requests,
        }
        for key in METRICS:
            stats: LatencyStats = getattr(self, key)
            out |= {f"mean_{key}_ms": stats.mean_ms, f"median_{key}_ms": stats.median_ms, f"std_{key}_ms": stats.std_ms}
            out |= {f"p{p}_{key}_ms": v for p, v in stats.percentiles_ms.items()}
        return out


# vLLM's latency metrics: key -> (the name in the table, its section's title).
METRICS = {
    "ttft": ("TTFT", "Time to First Token"),
    "tpot": ("TPOT", "Time per Output Token (excl. 1st token)"),
    "itl": ("ITL", "Inter-token Latency"),
    "e2el": ("E2EL", "End-to-end Latency"),
}


def summarize(
    records: list[RequestRecord], duration_s: float, percentiles: tuple[float, ...] = (99.0,)
) -> BenchmarkSummary:
    """Aggregate the successful requests of one run that took `duration_s` seconds."""
    ok = [r for r in records if r.success]
    inputs = sum(r.input_tokens or 0 for r in ok)
    outputs = sum(r.output_tokens or 0 for r in ok)
    sources = Counter(r.token_count_source or "unknown" for r in ok)
    per_second = 1.0 / duration_s if duration_s > 0 else 0.0
    tokens_per_s, in_flight = peaks(records)
    return BenchmarkSummary(
        completed=len(ok),
        failed=len(records) - len(ok),
        duration_s=duration_s,
        total_input_tokens=inputs,
        total_output_tokens=outputs,
        request_throughput=len(ok) * per_second,
        output_throughput=outputs * per_second,
        total_token_throughput=(inputs + outputs) * per_second,
        ttft=LatencyStats.of([t for r in ok if (t := ttft(r)) is not None], percentiles),
        tpot=LatencyStats.of([t for r in ok if (t := tpot(r)) is not None], percentiles),
        itl=LatencyStats.of([g for r in ok for g in inter_token_latencies(r)], percentiles),
        e2el=LatencyStats.of([e2e_latency(r) for r in ok], percentiles),
        output_len_mismatches=sum(1 for r in ok if r.output_tokens != r.target_output_tokens),
        token_count_sources=dict(sources),
        max_output_tokens_per_s=tokens_per_s,
        max_concurrent_requests=in_flight,
    )


def peaks(records: list[RequestRecord]) -> tuple[float, int]:
    """(chunks with text in the busiest second, most requests in flight in any second), in
    one-second windows from the first send, as vLLM counts them."""
    sent = [r for r in records if r.finished]  # every request that ran
    if not sent:
        return 0.0, 0
    t0 = min(r.sent for r in sent)
    seconds = int(max(r.finished for r in sent) - t0) + 1
    tokens, running = [0] * seconds, [0] * seconds
    for r in sent:
        for t in r.chunk_times:
            tokens[min(int(t - t0), seconds - 1)] += 1
        for second in range(int(r.sent - t0), min(int(r.finished - t0), seconds - 1) + 1):
            running[second] += 1
    return float(max(tokens)), max(running)


@dataclass
class RunInfo:
    """What the table says of the run's setup, beside its results (as vLLM's does)."""

    max_concurrency: int | None = None
    request_rate: float = math.inf
    metrics: tuple[str, ...] = ("ttft", "tpot", "itl")  # --percentile-metrics
    title: str = "Serving Benchmark Result"


def format_summary(s: BenchmarkSummary, run: RunInfo | None = None) -> str:
    """The summary as the table `vllm bench serve` prints, so the two read side by side;
    rawpage's checks (early stops, where token counts came from) close it."""
    run = run or RunInfo()
    lines = [
        f"{' ' + run.title + ' ':=^50}",
        _row("Successful requests:", s.completed),
        _row("Failed requests:", s.failed),
    ]
    if run.max_concurrency is not None:
        lines.append(_row("Maximum request concurrency:", run.max_concurrency))
    if not math.isinf(run.request_rate):
        lines.append(_row("Request rate configured (RPS):", run.request_rate))
    lines += [
        _row("Benchmark duration (s):", s.duration_s),
        _row("Total input tokens:", s.total_input_tokens),
        _row("Total generated tokens:", s.total_output_tokens),
        _row("Request throughput (req/s):", s.request_throughput),
        _row("Output token throughput (tok/s):", s.output_throughput),
        _row("Peak output token throughput (tok/s):", s.max_output_tokens_per_s),
        _row("Peak concurrent requests:", float(s.max_concurrent_requests)),
        _row("Total token throughput (tok/s):", s.total_token_throughput),
    ]
    for key in run.metrics:
        name, title = METRICS[key]
        stats: LatencyStats = getattr(s, key)
        lines += [
            f"{title:-^50}",
            _row(f"Mean {name} (ms):", stats.mean_ms),
            _row(f"Median {name} (ms):", stats.median_ms),
        ]
        lines += [_row(f"P{p} {name} (ms):", v) for p, v in stats.percentiles_ms.items()] or [
            _row(f"P99 {name} (ms):", None)
        ]
    sources = ", ".join(f"{k} {v}" for k, v in sorted(s.token_count_sources.items())) or "n/a"
    lines += [
        f"{'Checks':-^50}",
        _row("Outputs != max_tokens:", s.output_len_mismatches),
        f"{'Token counts from:':<40} {sources}",
        "=" * 50,
    ]
    return "\n".join(lines)


def _row(label: str, value: float | int | None) -> str:
    """One line of the table, as vLLM prints it: the label in 40 columns, a space, the value
    (a float with two decimals, a count as it is; n/a when nothing was measured)."""
    text = "n/a" if value is None else f"{value:.2f}" if isinstance(value, float) else str(value)
    return f"{label:<40} {text:<10}"
