"""Checks a request must pass before it is queued: each failure names the field, the
limit, and the flag that changes it. A request that passes can run to completion."""

from __future__ import annotations

from concurrent.futures import Future
from dataclasses import dataclass

from rawpage.engine_args import EngineArgs
from rawpage.errors import InvalidRequestError
from rawpage.memory import size_text
from rawpage.sampling_params import SamplingParams

EMPTY_PROMPT = "Either prompt or prompt_embeds must be provided and non-empty."  # vLLM's words: clients match them


@dataclass(frozen=True)
class CheckedPrompt:
    """LLMEngine.check_prompt's verdict: add_request queues a request it passed without checking again."""

    prompt_token_ids: list[int]
    params: SamplingParams
    priority: int
    cache_salt: str | None
    grammar: Future | None  # Future[CompiledGrammar], compiling since check_prompt
    refusal: InvalidRequestError | None = None  # why the request cannot run, if it cannot
    images: tuple = ()  # its ImageInputs, placed on their soft tokens (rawpage/multimodal/prompt_images.py)


def check_request(
    ids: list[int], params: SamplingParams, max_model_len: int, vocab_size: int, args: EngineArgs
) -> None:
    """Refuse anything that could not run to the end: token ids outside the vocabulary (in
    the prompt, stop_token_ids, logit_bias, logprob_token_ids or allowed_token_ids), more
    logprobs or samples than the flags allow, and prompts that leave no room under
    --max-model-len."""
    n, limit, V = len(ids), max_model_len, vocab_size
    if n == 0:
        raise InvalidRequestError(f"the prompt is empty; give at least one token. {EMPTY_PROMPT}", "prompt")
    lists = (params.stop_token_ids, params.logit_bias or (), params.allowed_token_ids or ())
    for name, given in zip(("stop_token_ids", "logit_bias", "allowed_token_ids"), lists):
        if len(given) > V:  # bounded before any scan: a longer list must repeat ids or leave the vocabulary
            raise InvalidRequestError(
                f"{name} has {len(given)} entries, more than the vocabulary size ({V}); give each token id once",
                name,
            )
    for name, given in (
        ("prompt", ids),
        ("stop_token_ids", params.stop_token_ids),
        ("logit_bias", list(params.logit_bias or ())),
        ("logprob_token_ids", params.logprob_token_ids or []),
        ("allowed_token_ids", params.allowed_token_ids or []),
    ):
        bad = [t for t in given if not 0 <= t < V]
        if bad:  # all of logit_bias's keys named, as vLLM; else the first 5
            shown = ", ".join(str(t)[:24] for t in (bad if name == "logit_bias" else bad[:5]))
            raise InvalidRequestError(f"{name}: token ids [{shown}] are out of vocabulary (not in [0, {V}))", name)
    for name in ("logprobs", "prompt_logprobs"):
        k = getattr(params, name)
        if k is not None and k > args.max_logprobs:
            raise InvalidRequestError(f"{name} is {k}, more than --max-logprobs {args.max_logprobs}", name)
    if params.n > args.max_num_seqs:
        raise InvalidRequestError(
            f"n is {params.n}, more than --max-num-seqs {args.max_num_seqs}: the sequences of one request "
            "must fit in one batch",
            "n",
        )
    if params.max_tokens is None and n >= limit:
        raise InvalidRequestError(
            f"the prompt has {_tokens(n)}, which leaves no room for output under --max-model-len {limit}", "prompt"
        )
    total = n + (params.max_tokens or 0)
    if total > limit:
        raise InvalidRequestError(
            f"the prompt ({_tokens(n)}) plus max_tokens ({params.max_tokens}) is {_tokens(total)}, "
            f"more than --max-model-len {limit}; shorten the prompt or lower max_tokens",
            "prompt",
        )
    check_output_memory(params, n, limit, args.max_request_output_memory)
    # Startup guaranteed that one --max-model-len sequence fits in the pool, so any
    # request that passes these checks can run to completion, if need be alone.


# What a request's outputs hold in the server until its reply is sent (the reply's JSON
# included), measured with tools/measure_output_memory.py (SECURITY.md): per generated token
# per choice; per token that reports logprobs (its entry's dict and the reply's item), and per
# logprob entry (top_logprobs + 1 a token; prompt_logprobs + 1 a prompt token).
OUTPUT_BYTES_PER_TOKEN = 256
LOGPROB_BYTES_PER_TOKEN = 400
LOGPROB_BYTES_PER_ENTRY = 640


def output_memory(params: SamplingParams, prompt_len: int, max_model_len: int) -> int:
    """Bytes the request's outputs may reach: n choices of max_tokens tokens (up to the context
    limit if none), each with its logprob entries, plus the prompt's logprob entries."""
    tokens = params.n * (params.max_tokens or max(0, max_model_len - prompt_len))
    reporting, entries = 0, 0  # tokens that report logprobs, and their entries
    if params.logprobs is not None:
        reporting, entries = tokens, tokens * (len(params.logprob_token_ids or ()) or params.logprobs + 1)
    if params.prompt_logprobs is not None:
        reporting, entries = reporting + prompt_len, entries + prompt_len * (params.prompt_logprobs + 1)
    return tokens * OUTPUT_BYTES_PER_TOKEN + reporting * LOGPROB_BYTES_PER_TOKEN + entries * LOGPROB_BYTES_PER_ENTRY


def check_output_memory(params: SamplingParams, prompt_len: int, max_model_len: int, limit: int) -> None:
    """Refuse a request whose outputs could outgrow --max-request-output-memory (issue 44)."""
    need = output_memory(params, prompt_len, max_model_len)
    if need <= limit:
        return
    lp = f", logprobs {params.logprobs}" if params.logprobs is not None else ""
    lp += f", prompt_logprobs {params.prompt_logprobs}" if params.prompt_logprobs is not None else ""
    param = "logprobs" if params.logprobs is not None else "prompt_logprobs" if lp else "max_tokens"
    raise InvalidRequestError(
        f"this request's outputs could take {size_text(need)} (n {params.n}, max_tokens "
        f"{params.max_tokens or max_model_len - prompt_len}{lp}), more than --max-request-output-memory "
        f"{size_text(limit)}; lower n, max_tokens or logprobs",
        param,
    )


def check_salt_and_priority(prompt: object, cache_salt: str | None, priority: int, policy: str) -> str | None:
    """The request's cache salt (given, or a dict prompt's "cache_salt"); a `priority` is
    refused unless the engine schedules by priority (otherwise a client jumps the queue)."""
    if priority and policy != "priority":
        raise InvalidRequestError(
            "priority needs --scheduling-policy priority; this engine schedules first come, first served", "priority"
        )
    if isinstance(prompt, dict) and cache_salt is None:
        cache_salt = prompt.get("cache_salt")
    if cache_salt is not None and (not isinstance(cache_salt, str) or not cache_salt):
        raise InvalidRequestError("cache_salt must be a non-empty string", "cache_salt")
    return cache_salt


def _tokens(n: int) -> str:
    return f"{n} token" if n == 1 else f"{n} tokens"


def check_params_type(params: list) -> None:
    """LLM.generate: a dict where SamplingParams belongs gets one line, not an AttributeError."""
    for p in params:
        if not isinstance(p, SamplingParams):
            raise TypeError(
                f"sampling_params must be a SamplingParams or a list of them, got {type(p).__name__}; "
                "write SamplingParams(**your_dict)"
            )


def check_messages(conversations: list) -> None:
    """LLM.chat: every message is a dict with a 'role' and a 'content' (or tool calls)."""
    for conv in conversations:
        for i, m in enumerate(conv):
            if not isinstance(m, dict) or "role" not in m:
                raise ValueError(f"messages[{i}] must be a dict with a 'role' and a 'content'")
            if m.get("content") is None and not m.get("tool_calls"):
                raise ValueError(f"messages[{i}] ({m['role']}) has no 'content'; give it a 'content' string")
