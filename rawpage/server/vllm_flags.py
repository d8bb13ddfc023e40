"""vLLM's `vllm serve` flags that rawpage has no counterpart for, declared once with the
reason, so that a pasted vLLM command line runs and says what it ignores.

    rawpage serve M --disable-frontend-multiprocessing --api-server-count 4

starts, and logs one warning per such flag:

    --api-server-count has no effect: one process serves ...

A flag whose other values would change what the server returns (a different tokenizer,
RoPE overrides, code loaded into the server) is refused before the model loads, with its
reason; values that mean what rawpage does anyway (`--tokenizer-mode auto`) pass with the
warning. vLLM flags rawpage does implement are ordinary flags (EngineArgs, ServerConfig).
"""

from __future__ import annotations

import argparse
import logging
from dataclasses import dataclass

logger = logging.getLogger("rawpage")


@dataclass(frozen=True)
class VllmFlag:
    why: str  # why it has no effect here, or (refused) why rawpage cannot honour it
    switch: bool = False  # takes no value: --x, or --no-x (which asks for nothing and is quiet)
    refused: bool = False  # its values would change results: refused unless in `same`
    same: tuple[str, ...] = ()  # refused flags: the values that mean what rawpage does anyway
    aliases: tuple[str, ...] = ()  # vLLM's short spellings (-asc)
    same_as: str | None = None  # refused flags: a value equal to this rawpage flag's is what rawpage does
    many: bool = False  # takes one or more values (vLLM's list flags: --device-ids 0 1)


ONE_PROCESS = (
    "one process serves: the event loop hands requests to the engine's thread (rawpage/server/async_engine.py)"
)
NO_EFFECT: dict[str, VllmFlag] = {
    # the API server's processes and logs
    "disable-frontend-multiprocessing": VllmFlag(ONE_PROCESS, switch=True),
    "api-server-count": VllmFlag(ONE_PROCESS, aliases=("-asc",)),
    "headless": VllmFlag(ONE_PROCESS + "; there is no engine-only mode", switch=True),
    "enable-log-requests": VllmFlag(
        "requests are logged by default (--disable-log-requests turns it off)", switch=True
    ),
    "max-log-len": VllmFlag("request log lines carry no prompt text to shorten"),
    "enable-log-outputs": VllmFlag("rawpage logs no generated text", switch=True),
    "log-error-stack": VllmFlag("a failing request's traceback is always logged", switch=True),
    "log-config-file": VllmFlag("logs use rawpage's format; --log-level and --uvicorn-log-level set them"),
    "disable-fastapi-docs": VllmFlag("the server is Starlette: it has no /docs, /redoc or /openapi.json", switch=True),
    "enable-request-id-headers": VllmFlag("every response already carries X-Request-Id", switch=True),
    "h11-max-header-count": VllmFlag("a request head is limited by size (--h11-max-incomplete-event-size)"),
    "enable-sleep-mode": VllmFlag("rawpage has no /sleep and /wake_up routes", switch=True),
    "enable-prompt-embeds": VllmFlag("prompts are text or token ids; prompt_embeds is refused", switch=True),
    "otlp-traces-endpoint": VllmFlag("rawpage exports no OpenTelemetry traces; /metrics has the timings"),
    "collect-detailed-traces": VllmFlag("rawpage exports no OpenTelemetry traces", many=True),
    # where the engine runs
    "distributed-executor-backend": VllmFlag(
        "tensor-parallel ranks are always processes on this machine (vLLM's mp); --ray serves replicas"
    ),
    "worker-use-ray": VllmFlag("rawpage has no Ray workers; --ray serves whole replicas on Ray Serve", switch=True),
    "engine-use-ray": VllmFlag("rawpage has no Ray engine; --ray serves whole replicas on Ray Serve", switch=True),
    "data-parallel-size": VllmFlag(
        "one engine serves; for replicas use --ray --num-replicas N, or servers behind a balancer (docs/deploy.md)",
        aliases=("-dp",),
    ),
    "enable-expert-parallel": VllmFlag("MoE experts are split by --tensor-parallel-size", switch=True),
    "disable-custom-all-reduce": VllmFlag("rawpage has no custom all-reduce kernel to turn off", switch=True),
    "max-parallel-loading-workers": VllmFlag("each rank reads its own shard of the weights"),
    "ray-workers-use-nsight": VllmFlag("rawpage has no Ray workers", switch=True),
    "cpu-offload-gb": VllmFlag("weights stay on the device that runs them"),
    "kv-transfer-config": VllmFlag("rawpage moves no KV cache between servers: every prompt is prefilled here"),
    "kv-events-config": VllmFlag("KV cache events are published on GET /v1/engine/events, not ZMQ"),
    # how steps are scheduled and run: speed, never the tokens
    "use-v2-block-manager": VllmFlag("there is one block manager", switch=True),
    "num-scheduler-steps": VllmFlag("the scheduler plans one step at a time"),
    "scheduler-delay-factor": VllmFlag("the scheduler admits waiting requests at every step"),
    "async-scheduling": VllmFlag("each step is scheduled after the last one's outputs", switch=True),
    "disable-async-output-proc": VllmFlag("outputs are detokenized in the engine thread after each step", switch=True),
    "num-lookahead-slots": VllmFlag("speculative decoding reserves its own slots (--speculative-config)"),
    "max-num-partial-prefills": VllmFlag("chunked prefill is bounded by --max-num-batched-tokens alone"),
    "max-long-partial-prefills": VllmFlag("chunked prefill is bounded by --max-num-batched-tokens alone"),
    "long-prefill-token-threshold": VllmFlag("chunked prefill is bounded by --max-num-batched-tokens alone"),
    "disable-hybrid-kv-cache-manager": VllmFlag("there is one KV cache manager", switch=True),
    "prefix-caching-hash-algo": VllmFlag("KV blocks are always named by SHA-256 (rawpage/block_hash.py)"),
    "calculate-kv-scales": VllmFlag("--kv-cache-scales calculate (the default) computes the FP8 scales", switch=True),
    "compilation-config": VllmFlag(
        "rawpage uses no torch.compile; decode steps replay recorded graphs (--enforce-eager turns that off)",
        aliases=("-O",),
    ),
    "cuda-graph-sizes": VllmFlag("decode graphs are recorded for batch sizes 1, 2, 4, then every 8"),
    "max-seq-len-to-capture": VllmFlag("decode graphs serve every length"),
    "model-impl": VllmFlag("one decoder (models/decoder.py) implements every family"),
    "guided-decoding-backend": VllmFlag("structured outputs always compile with llguidance"),
    "structured-outputs-config": VllmFlag("structured outputs always compile with llguidance"),
    "enable-reasoning": VllmFlag("--reasoning-parser alone turns reasoning output on", switch=True),
    "hf-token": VllmFlag("hub downloads read $HF_TOKEN (or `huggingface-cli login`'s token); set that instead"),
    "code-revision": VllmFlag("rawpage never runs code from a model repository"),
    "use-tqdm-on-load": VllmFlag("loading logs its own progress", switch=True),
    # values that would change results: refused, unless they mean what rawpage does
    "tokenizer-mode": VllmFlag(
        "rawpage tokenizes with the model's tokenizer.json (Hugging Face's fast tokenizer), the 'auto' and 'hf' "
        "modes; another tokenizer could split text differently",
        refused=True,
        same=("auto", "hf"),
    ),
    "response-role": VllmFlag("replies always have the role 'assistant'", refused=True, same=("assistant",)),
    "logits-processors": VllmFlag("rawpage loads no logits processors into the server", refused=True, many=True),
    "middleware": VllmFlag("rawpage loads no ASGI middleware into the server", refused=True, many=True),
    "tool-parser-plugin": VllmFlag("rawpage's tool parsers are built in (--tool-call-parser)", refused=True),
    "config": VllmFlag("rawpage reads no YAML config file; give its flags on the command line", refused=True),
    "task": VllmFlag(
        "rawpage picks the task with --runner: generate (the default) or pooling (embeddings)",
        refused=True,
        same=("auto", "generate"),
    ),
    "tokenizer-revision": VllmFlag(
        "the tokenizer is read from the model's own files, at --revision", refused=True, same_as="revision"
    ),
    "disable-sliding-window": VllmFlag(
        "rawpage keeps the model's sliding window; a --max-model-len at or below the window gives what vLLM's flag "
        "gives (it caps the length at the window)",
        switch=True,
        refused=True,
    ),
}


def _group(why: str, names: str, refused: bool = False, same: tuple[str, ...] = ()) -> dict[str, VllmFlag]:
    """Rows that share a reason; a name written +name is a switch, name* takes several values."""
    return {n.strip("+*"): VllmFlag(why, n.startswith("+"), refused, same, many=n.endswith("*")) for n in names.split()}


# The rest of `vllm serve --help` (vllm/engine/arg_utils.py, entrypoints/openai/cli_args.py at the
# commit vLLM's tests come from), grouped by why each has no effect here, or is refused.
NO_EFFECT.update(
    _group(
        "one engine in one process serves (no data parallelism, nodes or custom workers); "
        "replicas: --ray --num-replicas N, or servers behind a balancer (docs/deploy.md)",
        "data-parallel-address data-parallel-backend +data-parallel-external-lb +data-parallel-hybrid-lb "
        "+data-parallel-multi-port-external-lb data-parallel-rank data-parallel-rpc-port data-parallel-size-local "
        "data-parallel-start-rank data-parallel-supervisor-port dp-supervisor-probe-failure-threshold "
        "dp-supervisor-probe-interval-s dp-supervisor-probe-timeout-s +disable-nccl-for-dp-synchronization nnodes "
        "node-rank master-addr master-port distributed-timeout-seconds cpu-distributed-timeout-seconds +numa-bind "
        "numa-bind-cpus* numa-bind-nodes* device-ids*",
    )
    | _group(
        "each sequence's attention runs on one rank (no context parallelism)",
        "decode-context-parallel-size prefill-context-parallel-size dcp-comm-backend dcp-kv-cache-interleave-size "
        "cp-kv-cache-interleave-size",
    )
    | _group(
        "MoE experts are split by --tensor-parallel-size (no expert parallelism or load balancer)",
        "all2all-backend +enable-eplb eplb-config expert-placement-strategy +enable-elastic-ep +enable-ep-weight-filter "
        "moe-backend +enable-bf16x3-router-gemm",
    )
    | _group(
        "rawpage picks its own kernels and graphs (no torch.compile, FlashInfer or backend choice); "
        "--enforce-eager turns decode graphs off",
        "+enable-dbo dbo-decode-token-threshold dbo-prefill-token-threshold ubatch-size cudagraph-capture-sizes* "
        "max-cudagraph-capture-size +cudagraph-metrics optimization-level performance-mode kernel-config linear-backend "
        "attention-backend attention-config mamba-backend gdn-prefill-backend ir-op-priority jit-monitor-mode "
        "+jit-monitor-verbose +enable-flashinfer-autotune +enable-cumem-allocator +enable-layerwise-nvtx-tracing "
        "+disable-cascade-attn +use-fp64-gumbel +kv-sharing-fast-prefill profiler-config",
    )
    | _group(
        "rawpage's image input (Gemma 3 on the CPU) has none of these multimodal settings; an image's tokens "
        "are never split across prefill chunks",
        "media-io-kwargs mm-encoder-attn-backend mm-encoder-attn-dtype "
        "mm-encoder-fp8-scale-path mm-encoder-fp8-scale-save-margin mm-encoder-fp8-scale-save-path +mm-encoder-only "
        "mm-encoder-tp-mode mm-ipc-gpu-memory-gb mm-processor-cache-gb mm-processor-cache-type "
        "mm-shm-cache-max-object-size-mb mm-tensor-ipc +interleave-mm-strings +enable-mm-embeds +language-model-only "
        "+skip-mm-profiling video-pruning-rate +disable-chunked-mm-input +enable-tower-connector-lora default-mm-loras "
        "+enable-flash-late-interaction",
    )
    | _group(
        "rawpage serves no Mamba or hybrid state-space models",
        "mamba-block-size mamba-cache-dtype mamba-cache-mode mamba-cache-philox-rounds mamba-ssm-cache-dtype "
        "+enable-mamba-cache-stochastic-rounding",
    )
    | _group(
        "the KV cache and weights stay in this server's memory (--swap-space is its CPU tier); nothing is offloaded "
        "or transferred",
        "kv-offloading-backend kv-offloading-size offload-backend offload-group-size offload-num-in-group "
        "offload-params offload-prefetch-step cpu-offload-params ec-transfer-config weight-transfer-config "
        "prefix-match-unit +kv-cache-metrics kv-cache-metrics-sample",
    )
    | _group(
        "weights load as rawpage reads them (safetensors memory maps or GGUF), whatever these loading options say",
        "ignore-patterns* model-loader-extra-config pt-load-map-location safetensors-load-strategy "
        "safetensors-prefetch-block-size safetensors-prefetch-num-threads +allow-deprecated-quantization "
        "+fail-on-environ-validation",
    )
    | _group(
        "LoRA adapters run with rawpage's own layout (--max-loras, --max-lora-rank)",
        "lora-dtype +fully-sharded-loras +enable-moe-shared-loras +enable-mixed-moe-lora-format +specialize-active-lora",
    )
    | _group(
        'speculative decoding is set with --speculative-config \'{"method": ..., "num_speculative_tokens": ...}\'',
        "spec-method spec-model spec-tokens",
    )
    | _group(
        "logs and metrics are rawpage's: one line per request, a stats line while busy, /metrics",
        "+aggregate-engine-logging +enable-log-deltas +enable-logging-iteration-details disable-access-log-for-endpoints "
        "+enable-mfu-metrics show-hidden-metrics-for-version fingerprint-mode fingerprint-value +enable-offline-docs",
    )
    | _group(
        "the scheduler admits by --max-num-seqs and --max-num-batched-tokens at every step",
        "max-num-scheduled-tokens prefill-schedule-interval +scheduler-reserve-full-isl watermark stream-interval "
        "renderer-num-workers",
    )
    | _group(
        "a feature rawpage does not have; the responses or prompts would differ from vLLM's",
        "+skip-tokenizer-init +tokens-only tool-server +exclude-tools-when-tool-choice-none default-chat-template-kwargs "
        "reasoning-config +enable-return-routed-experts +enable-per-request-metrics logprobs-mode diffusion-config "
        "+grpc",
        refused=True,
    )
    | _group(
        "rawpage reads the model's own config.json, weights and modules as they are",
        "config-format hf-config-path quantization-config model-class-overrides pooler-config lora-target-modules* "
        "kv-cache-dtype-skip-layers* override-attention-dtype additional-config",
        refused=True,
    )
    | _group(
        "the chat template gets each message's content as rawpage renders it",
        "chat-template-content-format",
        refused=True,
        same=("auto",),
    )
    | _group(
        "rawpage loads no code into the server",
        "scheduler-cls worker-cls worker-extension-cls io-processor-plugin reasoning-parser-plugin",
        refused=True,
    )
    | _group("a model becomes a pooling model with --runner pooling", "convert", refused=True, same=("auto", "none"))
    | _group(
        "TLS uses Python's default ciphers, and certificates are read at startup",
        "ssl-ciphers +enable-ssl-refresh",
        refused=True,
    )
)


def add_vllm_flags(parser: argparse.ArgumentParser) -> None:
    """Every NO_EFFECT flag, in two --help groups: those that only warn, and those refused."""
    inert = parser.add_argument_group("vLLM flags with no effect here (each one given logs a warning saying why)")
    refused = parser.add_argument_group("vLLM flags refused (their values would change results)")
    for name, f in NO_EFFECT.items():
        group = refused if f.refused else inert
        kwargs = {"action": argparse.BooleanOptionalAction} if f.switch else {"metavar": "VALUE"}
        if f.many:
            kwargs["nargs"] = "+"
        allowed = f" (accepted: {', '.join(f.same)})" if f.same else ""
        group.add_argument("--" + name, *f.aliases, dest=_dest(name), default=None, help=f.why + allowed, **kwargs)


def check_vllm_flags(args: argparse.Namespace) -> None:
    """Refuse (ValueError) a refused flag given another value; log one warning for each
    other NO_EFFECT flag given (a switch turned off asks for nothing and stays quiet)."""
    for name, f in NO_EFFECT.items():
        value = getattr(args, _dest(name), None)
        if value is None or value is False:
            continue
        shown = " ".join(value) if isinstance(value, list) else value  # a list flag: as typed
        if f.refused and value not in (*f.same, *_same_as(args, f)):
            raise ValueError(f"--{name} {shown}: not supported: {f.why}; leave --{name} out")
        if f.refused:
            logger.warning("--%s %s has no effect: it is what rawpage does", name, shown)
        else:
            logger.warning("--%s has no effect: %s", name, f.why)


def _same_as(args: argparse.Namespace, f: VllmFlag) -> tuple[str, ...]:
    """--tokenizer-revision X with --revision X (or "main" with none): the files rawpage reads anyway."""
    if f.same_as is None:
        return ()
    return (getattr(args, f.same_as, None) or "main",)


def _dest(name: str) -> str:
    return "vllm_" + name.replace("-", "_")
