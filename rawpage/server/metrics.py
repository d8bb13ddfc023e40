"""Prometheus metrics with vLLM's names under a `rawpage:` prefix, for /metrics. Those vLLM
exports with the same meaning are exported under its own `vllm:` names too (labels
`model_name` and vLLM's `engine="0"`), so vLLM's dashboards and autoscalers read rawpage
unchanged; the `vllm:` series that vLLM defines differently (prompt tokens, tokens per
step, latencies, per-request histograms) are vllm_metrics.py's, counted its way.

Gauges and counters are updated in the engine thread after every step (the
`on_step` hook of AsyncEngine); latencies are observed as tokens arrive.

The ORCA load report (`endpoint-load-metrics` response header) is built here too.
"""

from __future__ import annotations

import json
import time
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from rawpage.engine import LLMEngine
from rawpage.outputs import RequestOutput
from rawpage.server.vllm_metrics import VllmMetrics

_LATENCY_BUCKETS = (
    0.001,
    0.005,
    0.01,
    0.02,
    0.04,
    0.06,
    0.08,
    0.1,
    0.25,
    0.5,
    0.75,
    1.0,
    2.5,
    5.0,
    7.5,
    10.0,
    20.0,
    40.0,
    80.0,
    160.0,
)

# The metrics vLLM exports under the same name and meaning: these get a vllm: twin.
# (request_success too, made apart: vLLM's has a finished_reason label, ours has none.)
VLLM_NAMES = frozenset(
    {
        "num_requests_running",
        "num_requests_waiting",
        "kv_cache_usage_perc",
        "generation_tokens",
        "num_preemptions",
        "prefix_cache_queries",
        "prefix_cache_hits",
        "spec_decode_num_drafts",
        "spec_decode_num_draft_tokens",
        "spec_decode_num_accepted_tokens",
    }
)


VLLM_SUCCESS = ("vllm:request_success", "Count of successfully processed requests.")  # vLLM's name and help
# vllm:request_success_total's finished_reason values, as vLLM's (each series there from the start).
FINISHED_REASONS = ("stop", "length", "abort")


def _finished_reason(out: Any) -> str:
    """A finished request's finished_reason label: its (first) output's finish reason;
    a request that failed, or has no output, is an abort; an embedding is a stop."""
    if getattr(out, "error", None) is not None:
        return "abort"
    if not isinstance(out, RequestOutput):
        return "stop"
    reason = out.outputs[0].finish_reason if out.outputs else None
    return reason if reason in FINISHED_REASONS else "abort"


class _Twins:
    """One value under two names, rawpage:x and vllm:x: each update goes to both."""

    def __init__(self, *children: Any) -> None:
        self.children = children

    def set(self, value: float) -> None:
        for c in self.children:
            c.set(value)

    def inc(self, amount: float = 1.0) -> None:
        for c in self.children:
            c.inc(amount)

    def observe(self, value: float) -> None:
        for c in self.children:
            c.observe(value)


class ServerMetrics:
    def __init__(self, model_name: str) -> None:
        self.registry, self.model_name = CollectorRegistry(), model_name
        r, labels = self.registry, ["model_name"]
        self.vllm: VllmMetrics | None = None  # its buckets need --max-model-len: made once the engine has loaded

        def make(kind: type, name: str, doc: str, **kw: Any) -> _Twins:
            twins = [kind(f"rawpage:{name}", doc, labels, registry=r, **kw).labels(model_name)]
            if name in VLLM_NAMES:  # vLLM's labels: model_name and engine
                twins.append(kind(f"vllm:{name}", doc, [*labels, "engine"], registry=r, **kw).labels(model_name, "0"))
            return _Twins(*twins)

        def gauge(name: str, doc: str) -> _Twins:
            return make(Gauge, name, doc)

        def counter(name: str, doc: str) -> _Twins:
            return make(Counter, name, doc)

        def histogram(name: str, doc: str) -> _Twins:
            return make(Histogram, name, doc, buckets=_LATENCY_BUCKETS)

        self.running = gauge("num_requests_running", "Sequences in the running batch")
        self.waiting = gauge("num_requests_waiting", "Sequences waiting to be scheduled")
        self.swapped = gauge("num_requests_swapped", "Sequences swapped out to CPU memory")
        self.kv_usage = gauge("kv_cache_usage_perc", "Fraction of KV cache blocks in use (0 to 1)")
        self.prompt_tokens = counter("prompt_tokens", "Prompt tokens computed")
        self.generation_tokens = counter("generation_tokens", "Tokens generated")
        self.preemptions = counter("num_preemptions", "Sequences preempted")
        self.prefix_queries = counter("prefix_cache_queries", "Prompt tokens looked up in the prefix cache")
        self.prefix_hits = counter("prefix_cache_hits", "Prompt tokens found in the prefix cache")
        self.window_releases = counter(
            "kv_cache_window_released_blocks", "KV blocks released because they left every layer's sliding window"
        )
        self.swap_outs = counter("num_swap_outs", "Sequences swapped out to CPU memory")
        self.swap_ins = counter("num_swap_ins", "Sequences swapped back in")
        self.finished = counter("request_success", "Requests finished")
        reasons = Counter(*VLLM_SUCCESS, [*labels, "engine", "finished_reason"], registry=r)
        self.vllm_finished = {k: reasons.labels(model_name, "0", k) for k in FINISHED_REASONS}
        self.steps = counter("engine_steps", "Engine iterations that ran a forward pass")
        self._add_spec_metrics(counter, gauge)
        self.loop_lag = gauge("event_loop_lag_max_seconds", "Longest the HTTP event loop was late to wake")
        self.loop_lag_max = 0.0
        self.ttft = histogram("time_to_first_token_seconds", "Time from arrival to the first token")
        self.itl = histogram("inter_token_latency_seconds", "Time between tokens of one sequence")
        self.e2e = histogram("e2e_request_latency_seconds", "Time from arrival to the last token")
        self.orca = {"kv_cache_usage_perc": 0.0, "num_requests_waiting": 0.0}  # the ORCA report's values
        self._seen = dict.fromkeys(
            ["steps", "prompt", "gen", "preempt", "pq", "ph", "so", "si", "sd", "sdt", "sa", "st", "wr"], 0
        )  # counters' last values
        self._last_token: dict[str, float] = {}

    def orca_header(self, fmt: str) -> dict[str, str]:
        """vLLM's ORCA load report, for a request with `endpoint-load-metrics-format: text`
        (or json): {"endpoint-load-metrics": "TEXT named_metrics.kv_cache_usage_perc=0.1, ..."}.
        Any other format gets no header, as in vLLM."""
        kind = fmt.strip().lower()
        if kind == "text":
            return {
                "endpoint-load-metrics": "TEXT " + ", ".join(f"named_metrics.{k}={v}" for k, v in self.orca.items())
            }
        if kind == "json":
            return {"endpoint-load-metrics": "JSON " + json.dumps({"named_metrics": self.orca})}
        return {}

    def _add_spec_metrics(self, counter, gauge) -> None:
        """Speculative decoding (zero while it is off): acceptance rate = accepted / draft tokens."""
        self.spec_drafts = counter("spec_decode_num_drafts", "Sequence-steps that verified drafted tokens")
        self.spec_draft_tokens = counter("spec_decode_num_draft_tokens", "Drafted tokens verified")
        self.spec_accepted = counter("spec_decode_num_accepted_tokens", "Drafted tokens accepted")
        self.spec_draft_time = counter("spec_decode_draft_seconds", "Time spent proposing drafts")
        self.spec_rate = gauge("spec_decode_acceptance_rate", "Accepted / drafted tokens since start")
        self.spec_length = gauge("spec_decode_mean_accepted_length", "Tokens per verification step (1 + accepted)")

    def observe_loop_lag(self, lag: float) -> bool:
        """Record how late the event loop woke; True if that is a new worst."""
        if lag <= self.loop_lag_max:
            return False
        self.loop_lag_max = lag
        self.loop_lag.set(lag)
        return True

    def on_step(self, engine: LLMEngine, outputs: list[RequestOutput]) -> None:
        st, sc, bm = engine.stats, engine.scheduler, engine.block_manager
        if self.vllm is None:
            self.vllm = VllmMetrics(self.registry, self.model_name, engine)
        self.vllm.on_step(engine, outputs, st.last)
        if st.last is not None:
            self.running.set(st.last.num_running)
            self.waiting.set(st.last.num_waiting)
            self.swapped.set(st.last.num_swapped)
            self.kv_usage.set(st.last.kv_usage)
            self.orca = {
                "kv_cache_usage_perc": float(st.last.kv_usage),
                "num_requests_waiting": float(st.last.num_waiting),
            }
        self._count("steps", self.steps, st.steps_total)
        self._count("prompt", self.prompt_tokens, st.prompt_tokens_total)
        self._count("gen", self.generation_tokens, st.generation_tokens_total)
        self._count("preempt", self.preemptions, st.preemptions_total)
        self._count("pq", self.prefix_queries, bm.prefix_queries)
        self._count("ph", self.prefix_hits, bm.prefix_hits)
        self._count("wr", self.window_releases, bm.num_window_releases)
        self._count("so", self.swap_outs, sc.num_swap_outs)
        self._count("si", self.swap_ins, sc.num_swap_ins)
        if engine.spec is not None:
            self._count_spec(engine.spec.stats)
        now = time.monotonic()
        for out in outputs:
            rid, m = out.request_id, out.metrics
            if isinstance(out, RequestOutput) and any(o.delta_token_ids for o in out.outputs):  # not embeddings
                last = self._last_token.get(rid)
                if last is None and m is not None and m.first_token_time is not None:
                    self.ttft.observe(m.first_token_time - m.arrival_time)
                elif last is not None:
                    self.itl.observe(now - last)
                self._last_token[rid] = now
            if out.finished:
                self._last_token.pop(rid, None)
                self.finished.inc()
                self.vllm_finished[_finished_reason(out)].inc()
                if m is not None and m.finished_time is not None:
                    self.e2e.observe(m.finished_time - m.arrival_time)

    def _count_spec(self, sp) -> None:
        self._count("sd", self.spec_drafts, sp.num_drafts)
        self._count("sdt", self.spec_draft_tokens, sp.num_draft_tokens)
        self._count("sa", self.spec_accepted, sp.num_accepted_tokens)
        self._count("st", self.spec_draft_time, sp.draft_seconds)
        self.spec_rate.set(sp.acceptance_rate)
        self.spec_length.set(sp.mean_accepted_length)

    def _count(self, key: str, counter: _Twins, total: float) -> None:
        if total > self._seen[key]:
            counter.inc(total - self._seen[key])
            self._seen[key] = total
