"""The `vllm:` series whose definition is vLLM's own rather than a copy of ours: counted
from each step's outputs the way vLLM's output processor counts them
(vllm/v1/metrics/stats.py, loggers.py at the commit vLLM's tests come from), with
vLLM's names, help, buckets and labels (`model_name`, `engine="0"`).

vLLM's accounting, which differs from rawpage's own `rawpage:` counters:
- A prompt counts once, in full, at the step that makes its first token: all its tokens
  in vllm:prompt_tokens, those it computed (not found in the prefix cache) in
  vllm:iteration_tokens_total. A prefill chunk that makes no token, and a preempted
  sequence computing its tokens again, count nothing (rawpage:prompt_tokens counts
  every token the model computed).
- vllm:iteration_tokens_total has one sample per step that made a token or finished a
  request: computed prompt tokens + tokens generated.
- A request's times: queued from arrival to its first scheduling, prefill from then to its
  first token, decode from its first token to its last, inference from its first
  scheduling to its last token (preemptions inside each interval are part of it).
- n > 1: rawpage counts the request once, with all its tokens (vLLM counts each of its n
  samples as a request, and observes n and the longest sample's length once).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from rawpage.outputs import RequestOutput
from rawpage.stats import StepStats

# vLLM's buckets (loggers.py).
TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0)
TTFT_BUCKETS += (20.0, 40.0, 80.0, 160.0, 640.0, 2560.0)
ITL_BUCKETS = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0)
ITL_BUCKETS += (40.0, 80.0)
REQUEST_LATENCY_BUCKETS = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0)
REQUEST_LATENCY_BUCKETS += (120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0)
ITERATION_BUCKETS = (1, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384)
N_BUCKETS = (1, 2, 5, 10, 20)
WAITING_REASONS = ("capacity", "deferred")  # deferred: over --max-loras, or its grammar still compiling
PROMPT_SOURCES = ("local_compute", "local_cache_hit", "external_kv_transfer")  # the last is always 0 here


# (attribute, vLLM's name after "vllm:", its help, its buckets); "tokens": 1, 2, 5, ... up to --max-model-len.
HISTOGRAMS: tuple[tuple[str, str, str, Any], ...] = (
    ("iteration_tokens", "iteration_tokens_total", "Histogram of number of tokens per engine_step.", ITERATION_BUCKETS),
    ("request_prompt", "request_prompt_tokens", "Number of prefill tokens processed.", "tokens"),
    ("request_generation", "request_generation_tokens", "Number of generation tokens processed.", "tokens"),
    (
        "request_max_generation",
        "request_max_num_generation_tokens",
        "Histogram of maximum number of requested generation tokens.",
        "tokens",
    ),
    ("params_n", "request_params_n", "Histogram of the n request parameter.", N_BUCKETS),
    ("params_max_tokens", "request_params_max_tokens", "Histogram of the max_tokens request parameter.", "tokens"),
    (
        "prefill_kv_computed",
        "request_prefill_kv_computed_tokens",
        "Histogram of new KV tokens computed during prefill (excluding cached tokens).",
        "tokens",
    ),
    ("ttft", "time_to_first_token_seconds", "Histogram of time to first token in seconds.", TTFT_BUCKETS),
    ("itl", "inter_token_latency_seconds", "Histogram of inter-token latency in seconds.", ITL_BUCKETS),
    (
        "tpot",
        "request_time_per_output_token_seconds",
        "Histogram of time_per_output_token_seconds per request.",
        ITL_BUCKETS,
    ),
    ("e2e", "e2e_request_latency_seconds", "Histogram of e2e request latency in seconds.", REQUEST_LATENCY_BUCKETS),
    (
        "queue",
        "request_queue_time_seconds",
        "Histogram of time spent in WAITING phase for request.",
        REQUEST_LATENCY_BUCKETS,
    ),
    (
        "inference",
        "request_inference_time_seconds",
        "Histogram of time spent in RUNNING phase for request.",
        REQUEST_LATENCY_BUCKETS,
    ),
    (
        "prefill",
        "request_prefill_time_seconds",
        "Histogram of time spent in PREFILL phase for request.",
        REQUEST_LATENCY_BUCKETS,
    ),
    (
        "decode",
        "request_decode_time_seconds",
        "Histogram of time spent in DECODE phase for request.",
        REQUEST_LATENCY_BUCKETS,
    ),
)


def build_1_2_5_buckets(max_value: int) -> list[int]:
    """1, 2, 5, 10, 20, 50, ... up to max_value (vLLM's token-count buckets, from --max-model-len)."""
    out, scale = [], 1
    while True:
        for m in (1, 2, 5):
            if m * scale > max_value:
                return out
            out.append(m * scale)
        scale *= 10


@dataclass
class _Progress:
    """One request as vLLM's RequestStateStats sees it (epoch seconds)."""

    max_tokens: int | None
    first_token: float = 0.0
    last_token: float = 0.0


class VllmMetrics:
    """Updated in the engine thread after every step (ServerMetrics.on_step)."""

    def __init__(self, registry: CollectorRegistry, model_name: str, engine: Any) -> None:
        """Once the engine has loaded (its first on_step): the token buckets follow --max-model-len."""
        self.registry, self.model_name = registry, model_name
        self._progress: dict[str, _Progress] = {}
        c, h = self._counter, self._histogram
        self.waiting_by_reason = self._labelled(
            Gauge,
            "vllm:num_requests_waiting_by_reason",
            "Number of waiting requests by reason. Reason labels: 'capacity' = waiting for scheduling capacity; "
            "'deferred' = deferred by transient constraints (LoRA budget, KV transfer, blocked status). "
            "Sum of all reasons equals vllm:num_requests_waiting.",
            "reason",
            WAITING_REASONS,
        )
        self.prompt_tokens = c("vllm:prompt_tokens", "Number of prefill tokens processed.")
        self.prompt_by_source = self._labelled(
            Counter, "vllm:prompt_tokens_by_source", "Number of prompt tokens by source.", "source", PROMPT_SOURCES
        )
        self.prompt_cached = c("vllm:prompt_tokens_cached", "Number of cached prompt tokens (local + external).")
        counts = build_1_2_5_buckets(engine.max_model_len)
        for attr, name, doc, buckets in HISTOGRAMS:  # "tokens": vLLM's 1-2-5 buckets up to --max-model-len
            setattr(self, attr, h("vllm:" + name, doc, counts if buckets == "tokens" else buckets))
        self._cache_config_info(engine)

    def _labelled(self, kind: type, name: str, doc: str, label: str, values: tuple[str, ...]) -> dict[str, Any]:
        family = kind(name, doc, ["model_name", "engine", label], registry=self.registry)
        return {v: family.labels(self.model_name, "0", v) for v in values}

    def _counter(self, name: str, doc: str) -> Any:
        return Counter(name, doc, ["model_name", "engine"], registry=self.registry).labels(self.model_name, "0")

    def _histogram(self, name: str, doc: str, buckets: Any) -> Any:
        h = Histogram(name, doc, ["model_name", "engine"], buckets=buckets, registry=self.registry)
        return h.labels(self.model_name, "0")

    def _cache_config_info(self, engine: Any) -> None:
        """vllm:cache_config_info, a gauge at 1 whose labels are vLLM's CacheConfig fields that
        mean something here (str() of each, as vLLM's)."""
        args, memory, bm = engine.args, engine.memory, engine.block_manager
        info = {
            "block_size": bm.block_size,
            "cache_dtype": args.kv_cache_dtype,
            "calculate_kv_scales": args.kv_cache_scales == "calculate",
            "enable_prefix_caching": args.enable_prefix_caching,
            "gpu_memory_utilization": args.gpu_memory_utilization,
            "kv_cache_max_concurrency": memory.max_full_length_seqs,
            "kv_cache_memory_bytes": args.kv_cache_memory,
            "kv_cache_size_tokens": memory.num_tokens,
            "num_cpu_blocks": bm.num_cpu_blocks,
            "num_gpu_blocks": bm.num_blocks,
            "num_gpu_blocks_override": args.num_gpu_blocks_override,
            "prefix_caching_hash_algo": "sha256",
            "sliding_window": memory.sliding_window,
            "engine": "0",
        }
        gauge = Gauge(
            "vllm:cache_config_info", "Information of the LLMEngine CacheConfig", list(info), registry=self.registry
        )
        gauge.labels(**{k: str(v) for k, v in info.items()}).set(1)

    def on_step(self, engine: Any, outputs: list, last: StepStats | None) -> None:
        if last is not None:
            self.waiting_by_reason["capacity"].set(last.num_waiting - last.num_waiting_deferred)
            self.waiting_by_reason["deferred"].set(last.num_waiting_deferred)
        for seq, _ in getattr(engine, "batch", None) or []:  # the requests this step ran, first seen
            req = seq.request
            if req.request_id not in self._progress:  # max_tokens as vLLM sets it: else the rest of the context
                limit = getattr(req.params, "max_tokens", None) or engine.max_model_len - len(req.prompt_token_ids)
                self._progress[req.request_id] = _Progress(limit)
        now, computed, generated, active = time.time(), 0, 0, False
        for out in outputs:
            if not isinstance(out, RequestOutput):  # an embedding: counted by ServerMetrics alone
                self._progress.pop(out.request_id, None)
                continue
            new = sum(len(o.delta_token_ids) for o in out.outputs)
            p = self._progress.setdefault(out.request_id, _Progress(None))
            if new and not p.first_token:  # its prompt counts now, in full (vLLM's is_prefilling)
                computed += self._prefilled(out, now)
                p.first_token = now
            elif new:
                self.itl.observe(now - p.last_token)
            if new:
                p.last_token = now
            generated += new
            active = active or bool(new) or out.finished
            if out.finished:
                self._finished(out, self._progress.pop(out.request_id), now)
        if active:
            self.iteration_tokens.observe(computed + generated)

    def _prefilled(self, out: RequestOutput, now: float) -> int:
        """The prompt of a request that made its first token: returns its computed tokens."""
        total, cached = len(out.prompt_token_ids), out.num_cached_tokens
        self.prompt_tokens.inc(total)
        self.prompt_by_source["local_compute"].inc(total - cached)
        self.prompt_by_source["local_cache_hit"].inc(cached)
        self.prompt_cached.inc(cached)
        if out.metrics is not None:
            self.ttft.observe(now - out.metrics.arrival_time)
        return total - cached

    def _finished(self, out: RequestOutput, p: _Progress, now: float) -> None:
        lengths = [len(o.token_ids) for o in out.outputs]
        generated = sum(lengths)
        m = out.metrics
        if m is not None:
            scheduled = m.first_scheduled_time or now  # never scheduled (aborted while waiting): no run time
            last = p.last_token or scheduled
            first = p.first_token or last
            self.e2e.observe(now - m.arrival_time)
            self.queue.observe(scheduled - m.arrival_time)
            self.prefill.observe(first - scheduled)
            self.decode.observe(last - first)
            self.inference.observe(last - scheduled)
            self.tpot.observe((last - first) / (generated - 1) if generated > 1 else 0.0)
        self.prefill_kv_computed.observe(len(out.prompt_token_ids) - out.num_cached_tokens)
        self.request_prompt.observe(len(out.prompt_token_ids))
        self.request_generation.observe(generated)
        self.request_max_generation.observe(max(lengths, default=0))
        self.params_n.observe(max(1, len(out.outputs)))
        if p.max_tokens:
            self.params_max_tokens.observe(p.max_tokens)
