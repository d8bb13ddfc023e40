"""Bodies whose input is text or token ids, parsed once into their typed requests
(request.py): /v1/completions, /v1/embeddings, /tokenize and /detokenize. A text input
stays text here; its handler tokenizes it off the event loop.
"""

from __future__ import annotations

from rawpage.pooling.pooler import PoolingParams
from rawpage.request_checks import EMPTY_PROMPT
from rawpage.sampling_params import SamplingParams
from rawpage.server.chat_input import parse_messages
from rawpage.server.guided import structured_outputs_from
from rawpage.server.protocol import (
    APIError,
    Body,
    OutputOptions,
    check_prompt_logprobs,
    logprob_token_ids,
    logprobs_count,
    output_options,
    sampling_params,
)
from rawpage.server.request import (
    NO_EFFECT_FIELDS,
    CompletionRequest,
    EmbeddingRequest,
    TokenizeRequest,
    cache_salt,
    default_max_tokens,
    fim_params,
    parse_model,
    priority,
    prompt_truncation,
    render_options,
    served_name,
    truncation_side,
)
from rawpage.server.state import RenderOptions, ServerState

ENCODING_FORMATS = ("float", "base64")


def parse_completion(body: Body, state: ServerState, rid: str) -> CompletionRequest:
    """A completion body -> its CompletionRequest: every field read, the rest refused."""
    lora = parse_model(body, state)
    prompts = _prompts(body, state.config.max_prompts_per_request)
    suffix = body.str("suffix") or None  # "" asks for no middle: a plain completion, as OpenAI's
    out = output_options(body, state.config)
    echo = bool(body.bool("echo", False))
    params = _sampling_params(body, state, out, echo)
    if suffix is not None:
        params = fim_params(state, params, "suffix")
        if echo or not all(isinstance(p, str) for p in prompts):
            raise APIError(
                "'suffix' needs text prompts and no 'echo': the prompt is the code before the gap", param="suffix"
            )
    if body.int("best_of", None, 1) not in (None, params.n):
        raise APIError("'best_of' other than n is not supported", param="best_of")
    prio, salt = priority(body, state), cache_salt(body)
    cut = prompt_truncation(body, state, params, "max_tokens")
    body.reject_unread(NO_EFFECT_FIELDS)
    return CompletionRequest(rid, prompts, params, out, echo, served_name(state, lora), lora, prio, salt, cut, suffix)


def _prompts(body: Body, limit: int) -> tuple[str | list[int], ...]:
    """'prompt' may be a string, a list of strings, a list of token ids, or a list of lists;
    at most --max-prompts-per-request of them."""
    body.mark_read("prompt")
    p = body.data.get("prompt")
    if isinstance(p, list) and p and not all(isinstance(x, int) for x in p) and len(p) > limit:
        raise APIError(
            f"'prompt' has {len(p)} prompts; the limit is {limit} (--max-prompts-per-request)", param="prompt"
        )
    if isinstance(p, str) and p:
        p = [p]
    if isinstance(p, list) and p:
        if all(isinstance(x, str) and x for x in p):
            return tuple(p)
        if _token_ids(p):
            return (p,)
        if all(isinstance(x, list) and all(isinstance(t, int) and not isinstance(t, bool) for t in x) for x in p):
            return tuple(p)
    raise APIError(
        f"'prompt' must be a non-empty string, list of strings, or list of token ids. {EMPTY_PROMPT}", param="prompt"
    )


def _sampling_params(body: Body, state: ServerState, out: OutputOptions, echo: bool) -> SamplingParams:
    """logprobs (-1: the whole vocabulary, as in vLLM) and vLLM's prompt_logprobs; an echo
    with logprobs brings the prompt's logprobs too."""
    limit, vocab = state.info.max_logprobs, state.info.vocab_size
    logprobs = logprobs_count(body, "logprobs", limit, vocab)
    prompt_logprobs = logprobs_count(body, "prompt_logprobs", limit, vocab)
    check_prompt_logprobs(prompt_logprobs, out.stream)
    if prompt_logprobs is None and echo and logprobs is not None:
        prompt_logprobs = logprobs
    return sampling_params(
        body,
        body.int("max_tokens", default_max_tokens(state, 16), 1),
        logprobs,
        prompt_logprobs=prompt_logprobs,
        config=state.config,
        structured_outputs=structured_outputs_from(body),
        defaults=state.info.sampling_defaults,
        logprob_token_ids=logprob_token_ids(body, logprobs is not None, "'logprobs' (any count)"),
    )


def parse_embedding(body: Body, state: ServerState) -> EmbeddingRequest:
    """An embeddings body -> its EmbeddingRequest; a generating server refuses it (input_check)."""
    parse_model(body, state)
    input_check(state)
    inputs, add_special_tokens = _inputs(body, state.config.max_prompts_per_request)
    encoding = body.str("encoding_format", "float")
    if encoding not in ENCODING_FORMATS:
        raise APIError(f"'encoding_format' must be 'float' or 'base64', got {encoding!r}", param="encoding_format")
    params = PoolingParams(  # vLLM's extras: normalize, truncate_prompt_tokens and truncation_side
        dimensions=body.int("dimensions", None, 1),
        normalize=body.bool("normalize", True),
        truncate_prompt_tokens=body.int("truncate_prompt_tokens", None, -1),
        truncation_side=truncation_side(body, "right"),  # vLLM's side for pooling models: the start stays
    )
    body.str("user")  # OpenAI's end-user id: accepted, not used
    prio = priority(body, state)
    body.reject_unread()
    return EmbeddingRequest(inputs, add_special_tokens, params, encoding, prio)


def input_check(state: ServerState) -> None:
    """A 400 that says how to start a server that embeds, unless this one does."""
    if state.info.check_input is None:
        raise APIError(
            f"'{state.model_name}' is served for generation; /v1/embeddings needs a pooling model: "
            f"start the server with `rawpage serve MODEL --runner pooling`",
            param="model",
        )


def _inputs(body: Body, limit: int) -> tuple[tuple[str | list[int], ...], bool]:
    """'input': a string, a list of strings, a list of token ids, or a list of token-id
    lists; at most --max-prompts-per-request of them. Texts get the tokenizer's special
    tokens (Qwen3-Embedding's closing EOS) unless vLLM's add_special_tokens is false."""
    body.mark_read("input")
    x = body.data.get("input")
    is_ids = isinstance(x, list) and bool(x) and _token_ids(x)
    if isinstance(x, list) and not is_ids and len(x) > limit:
        raise APIError(f"'input' has {len(x)} inputs; the limit is {limit} (--max-prompts-per-request)", param="input")
    if isinstance(x, str):
        x = [x]
    if is_ids:
        return (x,), True
    if isinstance(x, list) and x and all(isinstance(s, str) for s in x):
        if not all(x):
            raise APIError("'input' must not contain an empty string", param="input")
        return tuple(x), bool(body.bool("add_special_tokens", True))
    if isinstance(x, list) and x and all(isinstance(t, list) and _token_ids(t) for t in x):
        return tuple(x), True
    raise APIError(
        "'input' must be a non-empty string, a list of non-empty strings, a list of token ids, "
        "or a list of non-empty token-id lists",
        param="input",
    )


def _token_ids(x: list) -> bool:
    return bool(x) and all(isinstance(t, int) and not isinstance(t, bool) for t in x)


def parse_tokenize(body: Body, state: ServerState) -> TokenizeRequest:
    """vLLM's /tokenize: {"prompt": str} or {"messages": [...]} (rendered as chat renders them)."""
    parse_model(body, state)
    if "messages" in body.data:
        render, messages = render_options(body, state.config), parse_messages(body)
        return TokenizeRequest(None, messages, render, False, bool(body.bool("return_token_strs", False)))
    prompt = body.str("prompt")
    if prompt is None:
        raise APIError("give 'prompt' (a string) or 'messages'", param="prompt")
    add_special_tokens = bool(body.bool("add_special_tokens", True))
    return TokenizeRequest(
        prompt, None, RenderOptions(), add_special_tokens, bool(body.bool("return_token_strs", False))
    )


def parse_detokenize(body: Body, state: ServerState) -> list[int]:
    """vLLM's /detokenize: 'tokens', ids in the vocabulary."""
    parse_model(body, state)
    ids = body.int_list("tokens")
    vocab = state.info.vocab_size
    if any(not 0 <= t < vocab for t in ids):
        raise APIError(f"'tokens' must be ids in [0, {vocab})", param="tokens")
    return ids
