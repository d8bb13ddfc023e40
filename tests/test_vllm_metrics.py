"""Issue 42: the vllm:* series counted as vLLM counts them (rawpage/server/vllm_metrics.py),
fed from a real engine's steps: prompt tokens once, in full, at a request's first token;
tokens per step = computed prompt tokens + generated; the per-request histograms; the
waiting requests by reason; cache_config_info."""

from types import SimpleNamespace

from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from rawpage import LLM, SamplingParams
from rawpage.server.metrics import ServerMetrics
from rawpage.server.vllm_metrics import build_1_2_5_buckets

PROMPT = {"prompt_token_ids": list(range(5, 45))}  # 40 tokens: two full blocks of 16 can be cached
FIVE = SamplingParams(max_tokens=5, ignore_eos=True, temperature=0)


def samples(m: ServerMetrics) -> dict[str, float]:
    """{'name{label=value,...}': value} without the model_name and engine labels."""
    out = {}
    for family in text_string_to_metric_families(generate_latest(m.registry).decode()):
        for s in family.samples:
            labels = {k: v for k, v in s.labels.items() if k not in ("model_name", "engine")}
            key = s.name + ("{" + ",".join(f"{k}={v}" for k, v in sorted(labels.items())) + "}" if labels else "")
            out[key] = s.value
    return out


def run(llm: LLM, m: ServerMetrics, rid: str, prompt=PROMPT, params=FIVE) -> None:
    llm.engine.add_request(rid, prompt, params)
    while llm.engine.has_unfinished_requests():
        m.on_step(llm.engine, llm.engine.step())


def test_prompt_and_iteration_tokens_count_as_vllm_counts_them(tiny_model_dir):
    llm, m = LLM(tiny_model_dir, max_model_len=128), ServerMetrics("tiny")
    m.on_step(llm.engine, [])  # as the server does once the engine has loaded
    run(llm, m, "a")
    run(llm, m, "b")  # the same prompt: 32 of its 40 tokens come from the prefix cache
    s = samples(m)
    assert s["vllm:prompt_tokens_total"] == 80  # every prompt token, cached or not
    assert s["rawpage:prompt_tokens_total"] == 48  # ours: the tokens the model computed
    assert s["vllm:prompt_tokens_cached_total"] == 32
    assert s["vllm:prompt_tokens_by_source_total{source=local_cache_hit}"] == 32
    assert s["vllm:prompt_tokens_by_source_total{source=local_compute}"] == 48
    assert s["vllm:prompt_tokens_by_source_total{source=external_kv_transfer}"] == 0
    assert s["vllm:generation_tokens_total"] == s["rawpage:generation_tokens_total"] == 10
    # one sample per step that made a token: (40 + 1), 4 x 1, then (8 + 1), 4 x 1
    assert (s["vllm:iteration_tokens_total_count"], s["vllm:iteration_tokens_total_sum"]) == (10, 58)
    assert (s["vllm:request_prompt_tokens_count"], s["vllm:request_prompt_tokens_sum"]) == (2, 80)
    assert (s["vllm:request_generation_tokens_count"], s["vllm:request_generation_tokens_sum"]) == (2, 10)
    assert s["vllm:request_prefill_kv_computed_tokens_sum"] == 48
    assert (s["vllm:request_params_n_count"], s["vllm:request_params_n_sum"]) == (2, 2)
    assert s["vllm:request_params_max_tokens_sum"] == 10
    assert s["vllm:request_max_num_generation_tokens_sum"] == 10
    assert s["vllm:time_to_first_token_seconds_count"] == 2
    assert s["vllm:inter_token_latency_seconds_count"] == 8
    for name in ("e2e_request_latency", "request_queue_time", "request_prefill_time", "request_decode_time"):
        assert s[f"vllm:{name}_seconds_count"] == 2, name
    assert s["vllm:request_inference_time_seconds_count"] == s["vllm:request_time_per_output_token_seconds_count"] == 2
    assert s["vllm:request_success_total{finished_reason=length}"] == 2
    # vLLM's buckets: the token histograms go 1, 2, 5, ... up to --max-model-len
    assert "vllm:request_prompt_tokens_bucket{le=100.0}" in s and "vllm:request_prompt_tokens_bucket{le=200.0}" not in s
    assert "vllm:time_to_first_token_seconds_bucket{le=2560.0}" in s
    assert "vllm:e2e_request_latency_seconds_bucket{le=7680.0}" in s


def test_a_prefill_chunk_that_makes_no_token_counts_nothing(tiny_model_dir):
    llm, m = LLM(tiny_model_dir, max_model_len=128, max_num_batched_tokens=16), ServerMetrics("tiny")
    run(llm, m, "a")  # chunks of 16, 16, 8 (the last makes the first token), then 4 decode steps
    s = samples(m)
    assert s["rawpage:engine_steps_total"] == 7
    assert (s["vllm:iteration_tokens_total_count"], s["vllm:iteration_tokens_total_sum"]) == (5, 45)


def test_no_max_tokens_is_the_rest_of_the_context(tiny_model_dir):
    llm, m = LLM(tiny_model_dir, max_model_len=64), ServerMetrics("tiny")
    run(llm, m, "a", params=SamplingParams(max_tokens=None, ignore_eos=True))
    s = samples(m)
    assert s["vllm:request_params_max_tokens_sum"] == 64 - 40 == s["vllm:request_generation_tokens_sum"]


def test_waiting_by_reason_and_cache_config_info(tiny_model_dir):
    llm, m = LLM(tiny_model_dir, max_model_len=128), ServerMetrics("tiny")
    engine = llm.engine
    engine.add_request("compiling", PROMPT, FIVE)
    engine.requests["compiling"].seqs[0].grammar = SimpleNamespace(ready=False)  # its grammar is still compiling
    engine.add_request("free", {"prompt_token_ids": [7, 8, 9]}, FIVE)
    m.on_step(engine, engine.step())
    s = samples(m)
    assert s["vllm:num_requests_waiting"] == 1
    assert s["vllm:num_requests_waiting_by_reason{reason=deferred}"] == 1
    assert s["vllm:num_requests_waiting_by_reason{reason=capacity}"] == 0
    engine.abort_request("compiling")
    m.on_step(engine, engine.step())
    assert samples(m)["vllm:num_requests_waiting_by_reason{reason=deferred}"] == 0
    (info,) = [k for k in s if k.startswith("vllm:cache_config_info{")]
    labels = dict(kv.split("=", 1) for kv in info[len("vllm:cache_config_info{") : -1].split(","))
    bm = engine.block_manager
    assert labels["kv_cache_size_tokens"] == str(bm.num_blocks * bm.block_size)
    assert float(labels["kv_cache_max_concurrency"]) == bm.num_blocks * bm.block_size / 128
    assert (labels["block_size"], labels["enable_prefix_caching"]) == ("16", "True")


def test_build_1_2_5_buckets():
    assert build_1_2_5_buckets(100) == [1, 2, 5, 10, 20, 50, 100]
    assert build_1_2_5_buckets(8192)[-1] == 5000
