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
    """mean / median / p99 of one latency, in milliseconds; None when nothing was measured."""

    mean_ms: float | None
    median_ms: float | None
    p99_ms: float | None

    @classmethod
    def of(cls, seconds: list[float]) -> LatencyStats:
        if not seconds:
            return cls(None, None, None)
        ms = [s * 1000.0 for s in seconds]
        return cls(sum(ms) / len(ms), percentile(ms, 50), percentile(ms, 99))


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

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def summarize(records: list[RequestRecord], duration_s: float) -> BenchmarkSummary:
    """Aggregate the successful requests of one run that took `duration_s` seconds."""
    ok = [r for r in records if r.success]
    inputs = sum(r.input_tokens or 0 for r in ok)
    outputs = sum(r.output_tokens or 0 for r in ok)
    sources = Counter(r.token_count_source or "unknown" for r in ok)
    per_second = 1.0 / duration_s if duration_s > 0 else 0.0
    return BenchmarkSummary(
        completed=len(ok),
        failed=len(records) - len(ok),
        duration_s=duration_s,
        total_input_tokens=inputs,
        total_output_tokens=outputs,
        request_throughput=len(ok) * per_second,
        output_throughput=outputs * per_second,
        total_token_throughput=(inputs + outputs) * per_second,
        ttft=LatencyStats.of([t for r in ok if (t := ttft(r)) is not None]),
        tpot=LatencyStats.of([t for r in ok if (t := tpot(r)) is not None]),
        itl=LatencyStats.of([g for r in ok for g in inter_token_latencies(r)]),
        e2el=LatencyStats.of([e2e_latency(r) for r in ok]),
        output_len_mismatches=sum(1 for r in ok if r.output_tokens != r.target_output_tokens),
        token_count_sources=dict(sources),
    )


def format_summary(s: BenchmarkSummary, title: str = "Serving Benchmark Result") -> str:
    """The summary as the table `vllm bench serve` prints, so the two read side by side."""

    def row(label: str, value: float | int | None, fmt: str = ".2f") -> str:
        text = "n/a" if value is None else format(value, fmt)
        return f"{label:<40}{text:<10}"

    def section(name: str) -> str:
        return f"{name:-^50}"

    lines = [
        f"{' ' + title + ' ':=^50}",
        row("Successful requests:", s.completed, "d"),
        row("Failed requests:", s.failed, "d"),
        row("Benchmark duration (s):", s.duration_s),
        row("Total input tokens:", s.total_input_tokens, "d"),
        row("Total generated tokens:", s.total_output_tokens, "d"),
        row("Request throughput (req/s):", s.request_throughput),
        row("Output token throughput (tok/s):", s.output_throughput),
        row("Total token throughput (tok/s):", s.total_token_throughput),
    ]
    for name, key, stats in [
        ("Time to First Token", "TTFT", s.ttft),
        ("Time per Output Token (excl. 1st token)", "TPOT", s.tpot),
        ("Inter-token Latency", "ITL", s.itl),
        ("End-to-end Latency", "E2EL", s.e2el),
    ]:
        lines += [
            section(name),
            row(f"Mean {key} (ms):", stats.mean_ms),
            row(f"Median {key} (ms):", stats.median_ms),
            row(f"P99 {key} (ms):", stats.p99_ms),
        ]
    sources = ", ".join(f"{k} {v}" for k, v in sorted(s.token_count_sources.items())) or "n/a"
    lines += [
        section("Checks"),
        row("Outputs != max_tokens:", s.output_len_mismatches, "d"),
        f"{'Token counts from:':<40}{sources}",
        "=" * 50,
    ]
    return "\n".join(lines)
