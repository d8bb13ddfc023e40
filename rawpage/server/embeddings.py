"""POST /v1/embeddings: text (or token ids) in, one vector per input out, in OpenAI's shape.

Needs a pooling engine (`rawpage serve MODEL --runner pooling`). Each input becomes one
engine request, all queued at once, so that the scheduler batches them like prompts.
A generating server answers with a 400 that says how to start one that embeds, and
a pooling server answers chat and completions with a 400 that says what it is.
"""

from __future__ import annotations

import base64
import uuid
from collections.abc import Awaitable, Callable
from typing import Any

import numpy as np
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from rawpage.outputs import EmbeddingRequestOutput
from rawpage.pooling.pooler import PoolingParams
from rawpage.server.protocol import APIError, Body
from rawpage.server.state import ServerState
from rawpage.server.streaming import final_outputs, unless_disconnected

Handler = Callable[[Request, ServerState], Awaitable[Response]]

ENCODING_FORMATS = ("float", "base64")


def input_check(state: ServerState) -> Callable[[list[int], PoolingParams], list[int]]:
    """The engine's check of one input, if it embeds; else a 400 that says how to start one that does."""
    check = state.info.check_input
    if check is None:
        raise APIError(
            f"'{state.model_name}' is served for generation; /v1/embeddings needs a pooling model: "
            f"start the server with `rawpage serve MODEL --runner pooling`",
            param="model",
        )
    return check


def generate_only(handler: Handler) -> Handler:
    """Wrap a chat or completions handler: a pooling server answers it with a 400."""

    async def wrapped(request: Request, state: ServerState) -> Response:
        if state.info.runner == "pooling":
            raise APIError(
                f"'{state.model_name}' is a pooling model (--runner pooling): it serves /v1/embeddings only; "
                "start the server without --runner pooling to generate text",
                param="model",
            )
        return await handler(request, state)

    return wrapped


async def _inputs(body: Body, state: ServerState) -> list[list[int]]:
    """'input': a string, a list of strings, a list of token ids, or a list of token-id
    lists; at most --max-prompts-per-request of them. Tokenization runs off the event loop,
    with the tokenizer's special tokens (Qwen3-Embedding's closing EOS) unless vLLM's
    add_special_tokens is false."""
    body.mark_read("input")
    x = body.data.get("input")
    limit = state.config.max_prompts_per_request
    is_ids = isinstance(x, list) and bool(x) and all(isinstance(t, int) and not isinstance(t, bool) for t in x)
    if isinstance(x, list) and not is_ids and len(x) > limit:
        raise APIError(f"'input' has {len(x)} inputs; the limit is {limit} (--max-prompts-per-request)", param="input")
    if isinstance(x, str):
        x = [x]
    if is_ids:
        return [x]
    if isinstance(x, list) and x and all(isinstance(s, str) for s in x):
        if not all(x):
            raise APIError("'input' must not contain an empty string", param="input")
        return await state.encode(x, add_special_tokens=body.bool("add_special_tokens", True))
    if isinstance(x, list) and x and all(isinstance(t, list) and _token_ids(t) for t in x):
        return x
    raise APIError(
        "'input' must be a non-empty string, a list of non-empty strings, a list of token ids, "
        "or a list of non-empty token-id lists",
        param="input",
    )


def _token_ids(x: list) -> bool:
    return bool(x) and all(isinstance(t, int) and not isinstance(t, bool) for t in x)


def _params(body: Body) -> tuple[PoolingParams, str]:
    """The pooling parameters and the encoding format; vLLM's extras normalize and truncate_prompt_tokens."""
    encoding = body.str("encoding_format", "float")
    if encoding not in ENCODING_FORMATS:
        raise APIError(f"'encoding_format' must be 'float' or 'base64', got {encoding!r}", param="encoding_format")
    params = PoolingParams(
        dimensions=body.int("dimensions", None, 1),
        normalize=body.bool("normalize", True),
        truncate_prompt_tokens=body.int("truncate_prompt_tokens", None, -1),
    )
    body.str("user")  # OpenAI's end-user id: accepted, not used
    return params, encoding


async def create_embedding(request: Request, state: ServerState) -> Response:
    body = await state.read_body(request)
    state.check_model(body)
    check_input = input_check(state)
    inputs = await _inputs(body, state)
    params, encoding = _params(body)
    priority = state.priority(body)
    body.reject_unread()
    try:
        inputs = [check_input(ids, params) for ids in inputs]  # truncated where asked
    except ValueError as e:
        raise APIError(str(e), param=getattr(e, "param", "input")) from None
    rid, tag = state.request_id(request, "embd"), uuid.uuid4().hex[:8]
    state.engine.check_capacity(len(inputs))
    streams = [
        state.engine.encode(f"{rid}#{i}#{tag}", {"prompt_token_ids": ids}, params, priority, state.owner(request))
        for i, ids in enumerate(inputs)
    ]
    finals = await unless_disconnected(request, final_outputs(streams))
    if len(finals) != len(inputs) or any(not f.finished or not f.outputs.embedding for f in finals):
        raise APIError("the server ended this request early (shutting down, or --request-timeout)", 503)
    return JSONResponse(_response(state.model_name, finals, encoding), headers={"X-Request-Id": rid})


def _response(model: str, finals: list[EmbeddingRequestOutput], encoding: str) -> dict[str, Any]:
    """OpenAI's CreateEmbeddingResponse: object, data, model, usage (prompt and total tokens)."""
    num_tokens = sum(len(f.prompt_token_ids) for f in finals)
    data = [
        {"object": "embedding", "index": i, "embedding": _encode(f.outputs.embedding, encoding)}
        for i, f in enumerate(finals)
    ]
    return {
        "object": "list",
        "data": data,
        "model": model,
        "usage": {"prompt_tokens": num_tokens, "total_tokens": num_tokens},
    }


def _encode(vector: list[float], encoding: str) -> list[float] | str:
    """base64: the little-endian float32 bytes, as OpenAI sends them (and its SDK decodes)."""
    if encoding == "float":
        return vector
    return base64.b64encode(np.asarray(vector, dtype="<f4").tobytes()).decode("ascii")
