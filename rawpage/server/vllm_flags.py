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
    "collect-detailed-traces": VllmFlag("rawpage exports no OpenTelemetry traces"),
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
    "mm-processor-kwargs": VllmFlag("rawpage serves text-only models"),
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
    "rope-scaling": VllmFlag("rawpage reads RoPE scaling from the model's config.json only", refused=True),
    "rope-theta": VllmFlag("rawpage reads rope_theta from the model's config.json only", refused=True),
    "hf-overrides": VllmFlag("rawpage reads the model's config.json as it is", refused=True),
    "override-generation-config": VllmFlag(
        "rawpage applies no generation config; send sampling parameters with each request", refused=True
    ),
    "logits-processors": VllmFlag("rawpage loads no logits processors into the server", refused=True),
    "middleware": VllmFlag("rawpage loads no ASGI middleware into the server", refused=True),
    "tool-parser-plugin": VllmFlag("rawpage's tool parsers are built in (--tool-call-parser)", refused=True),
    "config": VllmFlag("rawpage reads no YAML config file; give its flags on the command line", refused=True),
}


def add_vllm_flags(parser: argparse.ArgumentParser) -> None:
    """Every NO_EFFECT flag, in two --help groups: those that only warn, and those refused."""
    inert = parser.add_argument_group("vLLM flags with no effect here (each one given logs a warning saying why)")
    refused = parser.add_argument_group("vLLM flags refused (their values would change results)")
    for name, f in NO_EFFECT.items():
        group = refused if f.refused else inert
        kwargs = {"action": argparse.BooleanOptionalAction} if f.switch else {"metavar": "VALUE"}
        allowed = f" (accepted: {', '.join(f.same)})" if f.same else ""
        group.add_argument("--" + name, *f.aliases, dest=_dest(name), default=None, help=f.why + allowed, **kwargs)


def check_vllm_flags(args: argparse.Namespace) -> None:
    """Refuse (ValueError) a refused flag given another value; log one warning for each
    other NO_EFFECT flag given (a switch turned off asks for nothing and stays quiet)."""
    for name, f in NO_EFFECT.items():
        value = getattr(args, _dest(name), None)
        if value is None or value is False:
            continue
        if f.refused and value not in f.same:
            raise ValueError(f"--{name} {value}: not supported: {f.why}; leave --{name} out")
        if f.refused:
            logger.warning("--%s %s has no effect: it is what rawpage does", name, value)
        else:
            logger.warning("--%s has no effect: %s", name, f.why)


def _dest(name: str) -> str:
    return "vllm_" + name.replace("-", "_")
